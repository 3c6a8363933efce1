"""Planning and the cheap stages do not import torch or transformers (a second or more per process, paid by every
Snakemake job and by the Snakefile parse); the torch-free names they use instead agree with the scorers'."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from conftest import ROOT

HEAVY = ("torch", "transformers", "sentence_transformers")

# What a Snakemake job of each cheap rule does, in one fresh interpreter: plan (the Snakefile's work), prepare the
# real CrowS-Pairs file, the metric stage with its bootstrap, the run table and report, MLflow's parameter mapping.
SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import pandas as pd
    from biasflow.workflow import load_plan
    from biasflow import stages
    from biasflow.tracking.mlflow_log import job_params_and_tags

    tmp = Path(sys.argv[1])
    plan, lookups = load_plan({"overrides": ["metric=[crows_pairs]", "metric.crows_pairs.variants=[pll]",
                                             f"paths.results={tmp}/results", "stats.n_boot=50"]})
    job = plan.jobs[0]
    bench = job.benchmark_cfg
    stages.prepare("crows_pairs", bench, {"csv": sys.argv[2]}, str(tmp / "prepared.parquet"))
    scores = tmp / "scores.parquet"
    pd.read_parquet(tmp / "scores_in.parquet").to_parquet(scores)
    stages.metric(job.params(), str(tmp / "items.parquet"), str(scores), job.metric_dir)
    stages.write_plan(lookups.staged_plan, lookups.plan_path)
    stages.aggregate_run(lookups.plan_path, plan.run_dir)
    job_params_and_tags(json.loads(Path(lookups.plan_path).read_text())["jobs"][0])
    print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
""").replace("HEAVY", repr(HEAVY))


def test_planning_and_cheap_stages_import_no_torch(tmp_path, crows_csv):
    from test_crows_metric import items_and_scores

    items, scores = items_and_scores()
    items.to_parquet(tmp_path / "items.parquet")
    scores.to_parquet(tmp_path / "scores_in.parquet")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(crows_csv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    report = next((tmp_path / "results" / "runs").glob("*/report.md")).read_text()
    assert "## crows_pairs" in report


def test_registry_and_plan_import_no_torch():
    code = ("import sys, json, biasflow.plan, biasflow.workflow, biasflow.cli\n"
            "from biasflow.registry import load_all, METRICS\nload_all()\n"
            f"print(json.dumps([len(METRICS), sorted(m for m in {HEAVY!r} if m in sys.modules)]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    n_metrics, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    assert n_metrics >= 15 and heavy == []


def test_torch_free_names_agree_with_the_scorers():
    from biasflow import score_kinds as K
    from biasflow.scoring import causal, fill_mask, masked

    assert K.MASK_PLACEHOLDER == fill_mask.MASK_PLACEHOLDER
    assert K.MASK_CANDIDATES_KIND == fill_mask.KIND
    assert K.PLL_KIND == masked.PLL_KIND
    assert (K.CAUSAL_KIND, K.FIRST_TOKEN_MODES) == (causal.CAUSAL_KIND, causal.FIRST_TOKEN_MODES)
    grid = [(p, r, n, k) for p in (0.0, 0.3) for r in (0, 4, 5, 9) for n in (1, 2) for k in (None, 1, 5, 10)]
    assert [K.top_k_probability(*g) for g in grid] == [fill_mask.top_k_probability(*g) for g in grid]


def test_config_fingerprint_still_importable_from_models_hf(tmp_path):
    from biasflow.models import fingerprint, hf

    cfg = {"name": "x", "kind": "masked_lm", "path": "/m", "dtype": "float32", "device": "cpu", "order": 3}
    assert hf.config_fingerprint is fingerprint.config_fingerprint
    assert hf.config_fingerprint(cfg) == fingerprint.config_fingerprint(dict(cfg, device="cuda", batch_tokens=1))
    (tmp_path / "w.bin").write_bytes(np.arange(10, dtype=np.int64).tobytes())
    assert hf.local_weights_digest(tmp_path) == fingerprint.local_weights_digest(tmp_path)
