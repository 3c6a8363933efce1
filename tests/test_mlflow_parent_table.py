"""The parent run's aggregate table in MLflow's artifact viewer (issue 48 item 4): 20,000 rows took 54 s and more to
show there, so the parent logs the first ``PARENT_TABLE_ROWS`` rows as its JSON table, named so; aggregate.csv and
aggregate.parquet, logged beside it, hold every row. A child's tables keep the children's cap (``TABLE_ROWS``)."""
from __future__ import annotations

import json

import pandas as pd
from test_mlflow_scale import write_sweep

from biasflow.tracking import mlflow_log


def parent_tables(client, run_id: str) -> dict[str, pd.DataFrame]:
    """The parent's JSON tables as the viewer reads them (by the run's mlflow.loggedArtifacts tag)."""
    listed = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    out = {}
    for entry in listed:
        path = client.download_artifacts(run_id, entry["path"])
        with open(path) as fh:
            split = json.load(fh)
        out[entry["path"]] = pd.DataFrame(split["data"], columns=split["columns"])
    return out


def test_the_parents_aggregate_table_keeps_its_first_rows_and_the_files_keep_all(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setattr(mlflow_log, "PARENT_TABLE_ROWS", 30)  # the rule at a test's size (5,000 in use)
    for rows, expected in ((30, "tables/aggregate.json"), (31, "tables/aggregate_first_30.json")):
        plan, run_dir = write_sweep(tmp_path / str(rows), 2)
        agg = pd.DataFrame({"model": [f"model_{i // 10:03d}" for i in range(rows)], "metric": "metric_score",
                            "category": "overall", "value": range(rows), "ci_low": 0.0, "ci_high": 1.0, "n": 20,
                            "config_hash": "x"})
        agg.to_parquet(run_dir / "aggregate.parquet")
        agg.to_csv(run_dir / "aggregate.csv", index=False)
        logged = mlflow_log.log_plan(plan, run_dir)
        client = MlflowClient(tracking_uri=plan["tracking"]["uri"])
        tables = parent_tables(client, logged["parent_run_id"])
        assert list(tables) == [expected]
        assert tables[expected]["value"].tolist() == list(range(min(rows, 30)))  # the first rows, in order
        whole = pd.read_parquet(client.download_artifacts(logged["parent_run_id"], "aggregate.parquet"))
        assert len(whole) == rows  # every row in the file beside it
        # a child's tables are not cut by the parent's cap
        child = next(iter(logged["children"].values()))
        assert "tables/aggregate.json" in client.get_run(child).data.tags["mlflow.loggedArtifacts"]
