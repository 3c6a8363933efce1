"""The run report's per-rule time table, from Snakemake benchmark records at the paths the rules write."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from biasflow.plan import build_plan
from biasflow.report.tables import write_run_report
from biasflow.report.timing import benchmark_file, plan_jobs, read_benchmark

from conftest import ROOT

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


@pytest.fixture
def plan_doc(tmp_path, monkeypatch) -> dict:
    monkeypatch.setenv("BIASFLOW_CONF", str(ROOT / "conf"))
    plan = build_plan(["metric=[crows_pairs,crows_pairs_biasbench]", f"paths.results={tmp_path}/results"])
    return json.loads(Path(plan.write()).read_text())


def agg_table(doc: dict) -> pd.DataFrame:
    return pd.DataFrame([{"model": j["model"]["name"], "benchmark": j["benchmark"], "metric_family": j["metric"],
                          "metric": "metric_score", "category": "overall", "value": 55.0, "ci_low": 50.0,
                          "ci_high": 60.0, "n": 10, "config_hash": j["cfg_hash"]} for j in doc["jobs"]])


def test_every_job_of_the_plan_is_accounted_for(plan_doc):
    jobs = list(plan_jobs(plan_doc))
    by_rule = pd.Series([r for r, _ in jobs]).value_counts().to_dict()
    # two metrics on one benchmark: one prepare, a score and a metric job each; the demo model's build and the two
    # BOLD files it trains on beside the CrowS-Pairs file
    assert by_rule == {"download": 1 + 2, "build_demo_model": 1, "prepare": 1, "score": 2, "metric": 2}
    results = plan_doc["paths"]["results"]
    metric_keys = sorted(k for r, k in jobs if r == "metric")
    assert metric_keys == sorted(str(Path(j["metric_dir"]).relative_to(f"{results}/metrics"))
                                 for j in plan_doc["jobs"])
    assert ("download", "crows_pairs/crows_pairs_anonymized.csv") in jobs


def test_report_shows_per_rule_times_when_records_exist(plan_doc, tmp_path):
    out = Path(plan_doc["paths"]["results"]) / "runs" / plan_doc["plan_hash"]
    write_run_report(plan_doc, agg_table(plan_doc), pd.DataFrame({"item_id": ["a"]}), out)
    assert "Stage times" not in (out / "report.md").read_text()  # no records yet: no table

    results = plan_doc["paths"]["results"]
    seconds = {"download": 1.0, "build_demo_model": 120.25, "prepare": 2.0, "score": 30.0, "metric": 4.0}
    for rule, key in plan_jobs(plan_doc):
        path = Path(benchmark_file(results, rule, key))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER + f"{seconds[rule]}\t0:00:01\t{100 + seconds[rule]}\t1\t1\t1\t0\t0\t50\t"
                                 f"{seconds[rule] / 2}\n")
    write_run_report(plan_doc, agg_table(plan_doc), pd.DataFrame({"item_id": ["a"]}), out)
    report = (out / "report.md").read_text()
    assert "## Stage times" in report
    assert "| build_demo_model | 1 | 120.2 | 120.2 | 60.1 | 220 |" in report
    assert "| metric | 2 | 8.0 | 4.0 | 4.0 | 104 |" in report
    assert "| download | 3 | 3.0 | 1.0 | 1.5 | 101 |" in report
    section = report.split("## Stage times", 1)[1]
    assert section.index("| download |") < section.index("| score |") < section.index("| metric |")
    times = pd.read_csv(out / "stage_times.csv", dtype={"job": str})  # a plan hash can be all digits
    assert len(times) == 9 and set(times.rule) == set(seconds)


def test_the_aggregate_job_times_itself(plan_doc):
    """The aggregate job writes the report before Snakemake records it: its own row comes from its clock."""
    import time

    out = Path(plan_doc["paths"]["results"]) / "runs" / plan_doc["plan_hash"]  # no benchmark records at all
    write_run_report(plan_doc, agg_table(plan_doc), pd.DataFrame({"item_id": ["a"]}), out,
                     started=(time.time() - 7.5, time.process_time()))
    times = pd.read_csv(out / "stage_times.csv", dtype={"job": str})  # a plan hash can be all digits
    assert times.rule.tolist() == ["aggregate"] and times.job.tolist() == [plan_doc["plan_hash"]]
    assert 7.5 <= times.wall_s.iloc[0] < 60 and times.max_rss_mb.iloc[0] > 10
    assert "| aggregate | 1 | " in (out / "report.md").read_text().split("## Stage times", 1)[1]


def test_unreadable_or_missing_record_is_skipped(tmp_path):
    assert read_benchmark(tmp_path / "missing.tsv") is None
    (tmp_path / "empty.tsv").write_text(HEADER)
    assert read_benchmark(tmp_path / "empty.tsv") is None
    (tmp_path / "na.tsv").write_text(HEADER + "0.5\t0:00:00\tNA\tNA\tNA\tNA\tNA\tNA\tNA\tNA\n")
    rec = read_benchmark(tmp_path / "na.tsv")
    assert rec["wall_s"] == 0.5 and rec["max_rss_mb"] != rec["max_rss_mb"]  # NaN, not an error


def test_every_rule_writes_a_benchmark_record():
    """Each rule of workflow/rules/ has a benchmark: directive through benchmark_file (what the report reads)."""
    import re

    text = "\n".join(p.read_text() for p in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    rules = re.findall(r"^rule (\w+):", text, flags=re.M)
    assert set(rules) == {"plan", "download", "prepare", "score", "metric", "build_demo_model", "aggregate",
                          "log_mlflow"}
    for rule in rules:
        body = text.split(f"rule {rule}:", 1)[1].split("\nrule ", 1)[0]
        assert f'benchmark_file(RESULTS, "{rule}",' in body, rule


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_run_span_reads_times_of_any_resolution(unit, tmp_path, monkeypatch):
    """Issue 44 item 4: pandas 3 parses text to datetime64[us]; the span was read as if in nanoseconds (a start in
    January 1970). Whatever resolution the stage records' times have, the span is in seconds since the epoch."""
    from biasflow.report import timing

    end = pd.Timestamp("2025-03-04 05:06:07")
    finished = pd.Series([end - pd.Timedelta(seconds=30), end]).astype(f"datetime64[{unit}]")
    monkeypatch.setattr(timing, "stage_times", lambda plan: pd.DataFrame(
        {"rule": ["prepare", "metric"], "job": ["a", "b"], "wall_s": [10.0, 5.0], "finished": finished}))
    (tmp_path / timing.RUN_TIMES).write_text(json.dumps({"started": end.timestamp() - 1, "finished":
                                                         end.timestamp() + 2.5}))
    start, stop = timing.run_span({}, tmp_path)
    assert start == pytest.approx(end.timestamp() - 40) and stop == pytest.approx(end.timestamp() + 2.5)
    assert start == pytest.approx(1741064727 - 40)  # 2025-03-04 05:06:07 UTC, not a day of 1970


def test_stage_record_times_read_back_to_the_millisecond(tmp_path):
    """The tables' finishing times are text; read back they give the time written, to the millisecond, under the
    resolution pandas parses them to."""
    import os

    from biasflow.report.timing import clock_text, epoch_seconds

    now = 1741064767.123456
    assert clock_text(now) == "2025-03-04 05:06:07.123"
    assert epoch_seconds([clock_text(now)]).iloc[0] == pytest.approx(now, abs=1e-3)
    path = tmp_path / "rec.tsv"
    path.write_text(HEADER + "0.5\t0:00:00\tNA\tNA\tNA\tNA\tNA\tNA\tNA\tNA\n")
    os.utime(path, (now, now))
    assert epoch_seconds([read_benchmark(path)["finished"]]).iloc[0] == pytest.approx(now, abs=1e-3)
