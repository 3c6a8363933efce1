"""The pipeline glue: Hydra config, the deterministic split, the Snakemake rules (dry run), MLflow metrics."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from biasflow.lmchallenge import pipeline
from biasflow.lmchallenge.logs import read_log
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.tracking import metrics_of

ROOT = Path(__file__).resolve().parents[2]


def test_config_defaults_and_overrides():
    cfg = pipeline.load_config("default", ["data.test_limit=7", "shards=3"])
    assert cfg["data"]["test_limit"] == 7 and cfg["shards"] == 3
    assert {"ngram2", "ngram3"} <= set(cfg["models"])
    assert "--order 2" in cfg["models"]["ngram2"]["command"] and "--order 3" in cfg["models"]["ngram3"]["command"]
    with pytest.raises(ValueError, match="no LM Challenge config"):
        pipeline.load_config("nope")


def test_prepare_split_and_sharded_run(tmp_path):
    doc = {"g": {"A": [f"Alpha number {i} is here.\nSecond line {i}." for i in range(10)]}}
    raw = tmp_path / "x_wiki.json"
    raw.write_text(json.dumps(doc))
    out = {k: str(tmp_path / f"{k}.txt") for k in ("train", "test", "vocab")}
    pipeline.prepare([str(raw)], out["train"], out["test"], out["vocab"], {"test_every": 4, "test_limit": 3})
    train, test = Path(out["train"]).read_text().splitlines(), Path(out["test"]).read_text().splitlines()
    assert len(train) == 15 and test == ["Second line 1.", "Second line 3.", "Second line 5."]
    assert "Alpha" in Path(out["vocab"]).read_text().split() and "1" not in Path(out["vocab"]).read_text().split()
    cfg = pipeline.load_config("default", ["shards=2"])
    parts = []
    for k in range(2):
        parts.append(str(tmp_path / f"we.{k}.log"))
        pipeline.run(cfg, "ngram2", "we", out["train"], out["test"], out["vocab"], parts[-1], shard=(k, 2))
    pipeline.concat(parts, str(tmp_path / "we.log"))
    single = str(tmp_path / "single.log")
    pipeline.run(cfg, "ngram2", "we", out["train"], out["test"], out["vocab"], single)
    assert stats(read_log(str(tmp_path / "we.log"))) == stats(read_log(single))
    s = pipeline.summarise(single, str(tmp_path / "s.json"), str(tmp_path / "s.html"))
    assert s["tokens"] == 12 and s["entropy"]["hit"] == 1.0  # 3 x "Second line N .", all seen in training


def test_metrics_for_mlflow_are_flat_numbers():
    m = metrics_of({"fingerprint": "abc", "tokens": 5, "skipped": None,
                    "prediction": {"hit1": 0.5, "mrr": 0.25}, "entropy": {"fingerprint": "f", "mean": 2.0}})
    assert m == {"tokens": 5.0, "prediction.hit1": 0.5, "prediction.mrr": 0.25, "entropy.mean": 2.0}


@pytest.mark.skipif(shutil.which("snakemake") is None and not Path(sys.executable).with_name("snakemake").exists(),
                    reason="snakemake not installed")
def test_rules_dry_run(tmp_path):
    exe = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    proc = subprocess.run(
        [exe, "-s", str(ROOT / "workflow/rules/lmchallenge.smk"), "-n", "--cores", "1", "lmchallenge",
         "--config", f"lmc_results={tmp_path}/r", f"lmc_resources={tmp_path}/res"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout + proc.stderr
    for rule in ("lmc_fetch", "lmc_prepare", "lmc_run_shard", "lmc_concat", "lmc_stats", "lmc_summary", "lmc_mlflow"):
        assert rule in text
    assert "ngram3/wc.shard1.log" in text


def test_names_that_become_folders_are_checked(tmp_path):
    from biasflow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"name='\.\./\.\./escape' is not a valid name"):
        pipeline.load_config("default", ["name=../../escape"])
    (tmp_path / "lmchallenge").mkdir()
    (tmp_path / "lmchallenge" / "evil.yaml").write_text(
        'name: ok\nmodels:\n  "../../x": {command: "true", games: [wc]}\ntracking: {enabled: false}\n')
    with pytest.raises(ConfigError, match=r"models\.\.\./\.\./x="):
        pipeline.load_config("evil", [], conf_dir=tmp_path)
