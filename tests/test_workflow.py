"""The whole Snakemake workflow on a tiny model and a 20-pair CrowS-Pairs slice, checked through files and MLflow.

One module-scoped project copy is run through the scenarios a user relies on: a 3-value threshold sweep scores
once; a re-run does nothing; deleting one metric output re-runs only that metric (and the run-level tables);
changing a threshold never re-runs the model; MLflow holds exactly the aggregate table's numbers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, project_copy, snakemake_job_stats

pytestmark = pytest.mark.slow

SWEEP = ["metric=[crows_pairs]", "model=tiny_bert", "benchmark.crows_pairs.limit=20", "stats.n_boot=50",
         "metric.crows_pairs.diff_threshold=0.05,0.1,0.2", "metric.crows_pairs.filter_threshold=0.0"]


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_bert_dir, crows_csv):
    work = project_copy(tmp_path_factory.mktemp("project"),
                        {"crows_pairs/crows_pairs_anonymized.csv": crows_csv})
    (work / "conf" / "model" / "tiny_bert.yaml").write_text(
        f"name: tiny_bert\nkind: masked_lm\npath: {tiny_bert_dir}\nlowercase: true\ndtype: float32\n"
        f"device: cpu\nbatch_tokens: 2048\n")
    return work


def snakemake(project: Path, overrides, multirun=False, dry_run=False, extra=()):
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(project),
           "--cores", "2", "--config", f"overrides={json.dumps(list(overrides))}", f"multirun={str(multirun).lower()}"]
    if dry_run:
        cmd.append("--dry-run")
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd + list(extra), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def run_dir(project: Path, overrides, multirun) -> Path:
    env_conf = os.environ.get("BIASFLOW_CONF")
    os.environ["BIASFLOW_CONF"] = str(project / "conf")
    try:
        from biasflow.plan import build_plan

        return Path(build_plan(overrides, multirun=multirun).run_dir)
    finally:
        if env_conf is None:
            os.environ.pop("BIASFLOW_CONF")
        else:
            os.environ["BIASFLOW_CONF"] = env_conf


SWEPT_WINDOW: list[float] = []  # the wall-clock time before and after the sweep's Snakemake run


@pytest.fixture(scope="module")
def swept(project):
    SWEPT_WINDOW[:] = [time.time()]
    out = snakemake(project, SWEEP, multirun=True)
    SWEPT_WINDOW.append(time.time())
    return out, run_dir(project, SWEEP, True)


def test_threshold_sweep_scores_once(project, swept):
    out, _ = swept
    jobs = snakemake_job_stats(out)
    assert jobs["score"] == 1 and jobs["metric"] == 3 and jobs["aggregate"] == 1
    parts = list((project / "results" / "cache").rglob("part-*.parquet"))
    # one cache write per request kind (parity fill-mask: token_str)
    assert sorted(p.parent.name for p in parts) == ["mask_token_str", "pll"]


def test_aggregate_table_and_report(swept):
    _, rdir = swept
    agg = pd.read_parquet(rdir / "aggregate.parquet")
    assert list(agg.columns[:9]) == ["model", "benchmark", "metric", "category", "value", "ci_low", "ci_high", "n",
                                     "config_hash"]
    assert agg.config_hash.nunique() == 3
    overall = agg[(agg.metric == "metric_score") & (agg.category == "overall")]
    assert (overall.n == 20).all() and overall.value.nunique() == 1  # thresholds do not touch the PLL score
    rates = agg[(agg.metric == "fill_mask_pass_rate") & (agg.category == "overall")].sort_values("config_hash")
    assert len(rates) == 3
    assert ((overall.ci_low <= overall.value) & (overall.value <= overall.ci_high)).all()
    per_item = pd.read_parquet(rdir / "per_item.parquet")
    items = pd.read_parquet(next((rdir.parents[1] / "items").glob("crows_pairs-*.parquet")))
    joined = per_item[per_item.variant == "pll"].merge(items, on="item_id")
    assert len(joined) == 3 * 20  # per-item rows join back to the source rows by item id
    assert (rdir / "report.md").read_text().count("## crows_pairs / tiny_bert") == 1
    assert list((rdir / "plots").glob("*.png"))


def test_report_times_every_stage_from_snakemake_benchmarks(swept):
    _, rdir = swept
    times = pd.read_csv(rdir / "stage_times.csv")
    assert times.rule.value_counts().to_dict() == {"metric": 3, "prepare": 1, "score": 1, "aggregate": 1}
    assert (times.wall_s > 0).all()
    section = (rdir / "report.md").read_text().split("## Stage times", 1)[1]
    assert "| score | 1 |" in section and "| metric | 3 |" in section and "| aggregate | 1 |" in section


def test_mlflow_metrics_equal_the_aggregate_table(swept):
    from mlflow.tracking import MlflowClient

    _, rdir = swept
    record = json.loads((rdir / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    agg = pd.read_parquet(rdir / "aggregate.parquet")
    assert len(record["children"]) == 3
    for job_id, run_id in record["children"].items():
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == record["parent_run_id"]
        assert run.data.params["metric.diff_threshold"] in {"0.05", "0.1", "0.2"}
        assert "dataset.csv.sha256" in run.data.tags and run.data.tags["model.revision"].startswith("local:")
        assert run.data.tags["mlflow.source.name"] == "snakemake"  # the entry point; the command in a tag
        assert run.data.tags["biasflow.command"].startswith("snakemake ")
        # the run lasts as long as the job's work: its scoring start to its metric stage's end
        mdir = rdir.parents[1] / "metrics" / job_id
        started = json.loads((mdir / "score_meta.json").read_text())["started"]
        finished = json.loads((mdir / "metric_meta.json").read_text())["finished"]
        assert (run.info.start_time, run.info.end_time) == (int(started * 1000), int(finished * 1000))
        rows = agg[agg.config_hash == job_id.rsplit("/", 1)[1]].dropna(subset=["value"])
        expected = {f"{r.metric}.{r.category}": r.value for r in rows.itertuples()}
        logged = {k: v for k, v in run.data.metrics.items() if not k.endswith(("_ci_low", "_ci_high"))}
        assert logged == pytest.approx(expected)
        artifacts = {a.path for a in client.list_artifacts(run_id)}
        assert {"aggregate.parquet", "per_item.parquet", "config.yaml"} <= artifacts
    # the parent lasts the run (first stage record to the written report), inside the run's wall-clock window
    # (issue 44: the benchmark records' times, parsed by pandas 3 to datetime64[us], put its start in 1970)
    parent = client.get_run(record["parent_run_id"]).info
    low, high = int(SWEPT_WINDOW[0] * 1000), int(SWEPT_WINDOW[1] * 1000) + 1
    assert low <= parent.start_time <= parent.end_time <= high, (low, parent.start_time, parent.end_time, high)


def test_rerun_does_nothing_and_mlflow_stays_idempotent(project, swept):
    out = snakemake(project, SWEEP, multirun=True, dry_run=True)
    assert snakemake_job_stats(out) == {}
    _, rdir = swept
    (rdir / "mlflow.json").unlink()
    snakemake(project, SWEEP, multirun=True)
    from mlflow.tracking import MlflowClient

    record = json.loads((rdir / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    parents = client.search_runs([record["experiment_id"]],
                                 filter_string=f"tags.`biasflow.plan_hash` = '{rdir.name}'")
    assert len([r for r in parents if r.data.tags.get("biasflow.role") == "parent"]) == 1
    assert len(parents) == 1 + 3  # logging twice updated the same runs


def test_deleting_one_metric_output_reruns_only_that_metric(project, swept):
    _, rdir = swept
    plan = json.loads((rdir / "plan.json").read_text())
    victim = Path(plan["jobs"][1]["metric_dir"]) / "aggregate.parquet"
    victim.unlink()
    jobs = snakemake_job_stats(snakemake(project, SWEEP, multirun=True, dry_run=True))
    assert jobs.get("metric") == 1 and "score" not in jobs and "prepare" not in jobs


def test_changing_a_threshold_never_reruns_the_model(project, swept):
    single = [o for o in SWEEP if "diff_threshold" not in o] + ["metric.crows_pairs.diff_threshold=0.3"]
    out = snakemake(project, single)
    jobs = snakemake_job_stats(out)
    assert jobs.get("metric") == 1 and "score" not in jobs


def test_rerun_with_reordered_overrides_logs_to_the_same_mlflow_runs(project, swept):
    """The same plan asked for with the overrides in another order re-logs (plan.json changed) without conflict."""
    _, rdir = swept
    first = json.loads((rdir / "mlflow.json").read_text())
    reordered = list(reversed(SWEEP))
    assert run_dir(project, reordered, True) == rdir
    snakemake(project, reordered, multirun=True)  # before: log_mlflow failed, "Changing param values is not allowed"
    record = json.loads((rdir / "mlflow.json").read_text())
    assert record["parent_run_id"] == first["parent_run_id"] and record["children"] == first["children"]


def test_interrupted_scoring_resumes_without_redoing_finished_work(project, tiny_bert_dir):
    """A killed score job leaves its finished cache chunks; the restart computes only the rest."""
    from biasflow.models import load_model
    from biasflow.scoring.answer import answer_requests
    from biasflow.scoring.cache import AnswerCache
    from biasflow.interface.requests import PseudoLogLikelihood

    model = load_model({"name": "t", "kind": "masked_lm", "path": str(tiny_bert_dir), "device": "cpu"})
    items = pd.read_parquet(next((project / "results" / "items").glob("crows_pairs-*.parquet")))
    requests = [PseudoLogLikelihood(t) for t in items.sent_more]
    root = project / "interrupt-cache"
    answer_requests(requests[:12], model.cfg, root, model=model, progress=False)  # finished before the kill
    parts = AnswerCache(root, model.fingerprint, "pll").store.parts()
    table = answer_requests(requests, model.cfg, root, model=model, progress=False)
    after = AnswerCache(root, model.fingerprint, "pll")
    assert len(table) == len(set(items.sent_more)) and len(after.store.parts()) == len(parts) + 1
    assert len(after.keys()) == len(table)
