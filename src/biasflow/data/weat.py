"""WEAT word lists -> items table (one row per word of each test's four sets).

The ten original tests (Caliskan et al. 2017) ship with the package (``biasflow/resources/weat/weatN.json``, the
sent-bias format: ``{"targ1"|"targ2"|"attr1"|"attr2": {"category": ..., "examples": [...]}}``). A benchmark config
may point ``lists_dir`` at a folder of such files (``.json`` or ``.jsonl``: sent-bias's ``.jsonl`` test files hold
one JSON object) to run other tests, and ``tests`` to pick a subset.

Items: ``item_id`` (``<test>/<set>/<position>``), ``benchmark``, ``split``, ``category`` (the test), ``test``,
``set`` (targ1, targ2, attr1, attr2), ``set_category`` (e.g. Flowers), ``position`` (order in the list), ``word``.
"""
from __future__ import annotations

import json
import logging
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from biasflow.io import read_text_utf8
from biasflow.errors import ConfigError, DataFormatError
from biasflow.registry import register_loader
from pydantic import Field

from biasflow.schema import USER_FILE, BenchmarkConfig

log = logging.getLogger(__name__)

SETS = ("targ1", "targ2", "attr1", "attr2")
_TEST_FILE = re.compile(r"^(?P<test>.+)\.jsonl?$")


def _sort_key(test: str) -> tuple:
    # weat2 before weat10, as sent-bias's test_sort_key
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", test))


def packaged_lists_dir() -> Path:
    return Path(str(resources.files("biasflow").joinpath("resources/weat")))


def read_test_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(read_text_utf8(path, "WEAT word list"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise DataFormatError(f"{path}: expected a JSON object with keys {list(SETS)}")
    for name in SETS:
        entry = data.get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("examples"), list):
            raise DataFormatError(f"{path}: key {name!r} must be an object with an 'examples' list")
        bad = [i for i, w in enumerate(entry["examples"]) if not isinstance(w, str) or not w.strip()]
        if bad:
            raise DataFormatError(f"{path}: {name}.examples[{bad[0]}] is not a non-empty string")
        if not entry["examples"]:
            raise DataFormatError(f"{path}: {name}.examples is empty")
    return data


def test_files(lists_dir: Path, tests: Iterable[str] | None = None) -> dict[str, Path]:
    if not lists_dir.is_dir():
        raise ConfigError(f"benchmark.weat.lists_dir={str(lists_dir)!r} is not a folder")
    found = {}
    for p in sorted(lists_dir.iterdir()):
        if p.name.startswith(".") or not p.name.endswith((".json", ".jsonl")):
            continue
        m = _TEST_FILE.match(p.name)
        if not m or not re.fullmatch(r"[\w.+-]+", m["test"]):  # a test name is a label of tables and paths
            log.warning("WEAT list file %r in %s skipped: a test's name (the file name without .json) may hold only "
                        "letters, digits and . + - _", p.name, lists_dir)
            continue
        found[m["test"]] = p
    if tests:
        unknown = sorted(set(tests) - set(found))
        if unknown:
            raise ConfigError(f"benchmark.weat.tests: no list file for {unknown} in {lists_dir}; "
                              f"known: {sorted(found, key=_sort_key)}")
        found = {t: found[t] for t in tests}
    if not found:
        raise ConfigError(f"no WEAT test files (*.json, *.jsonl) in {lists_dir}")
    return {t: found[t] for t in sorted(found, key=_sort_key)}


def lists_to_items(tests: Mapping[str, Mapping[str, Any]], benchmark: str = "weat") -> pd.DataFrame:
    rows = []
    for test, data in tests.items():
        for name in SETS:
            for pos, word in enumerate(data[name]["examples"]):
                rows.append({"item_id": f"{test}/{name}/{pos}", "benchmark": benchmark, "split": "test",
                             "category": test, "test": test, "set": name,
                             "set_category": str(data[name].get("category", name)), "position": pos,
                             "word": word.strip()})
    return pd.DataFrame(rows)


class WEATLists(BenchmarkConfig):
    """The options of the WEAT word lists loader."""

    lists_dir: Optional[str] = Field(None, json_schema_extra=USER_FILE)  # a folder of list files (null: packaged)
    tests: Optional[list[str]] = None  # the tests to read (null = all)


@register_loader("weat_lists", options=WEATLists)
def load_weat_lists(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    """Items table of the WEAT lists: the packaged ones unless ``lists_dir`` (or a ``lists_dir`` file) is given."""
    cfg = cfg or {}
    lists_dir = cfg.get("lists_dir") or (files or {}).get("lists_dir")
    lists_dir = Path(lists_dir).expanduser() if lists_dir else packaged_lists_dir()
    paths = test_files(lists_dir, cfg.get("tests"))
    return lists_to_items({t: read_test_file(p) for t, p in paths.items()}, cfg.get("name", "weat"))
