"""How long MLflow's artifact viewer takes to show a JSON table, against its rows: the size of the parent run's
aggregate table (``TABLE_ROWS`` in ``src/biasflow/tracking/mlflow_log.py``).

A scratch sqlite store with one run per size, each with one table written as the pipeline writes the parent's
aggregate table (``front_columns``, pandas "split" JSON under ``tables/``, listed in the run's
``mlflow.loggedArtifacts`` tag, which makes the viewer draw a table), rows shaped as ``aggregate.csv``'s (model,
benchmark, metric, category, value, CI, n, config hash). ``mlflow server`` (127.0.0.1, one worker) serves it, and
headless Chromium (``tests/mlflow_services.Browser``, as ``benchmarks/mlflow_ui_scale.py`` drives it) opens each
run's table from a blank page, timed until the viewer shows its "View as table" switch and the first row's model.

    python benchmarks/mlflow_table_rows.py                    # 1,000, 2,000, 5,000, 20,000 rows
    python benchmarks/mlflow_table_rows.py --rows 2000,20000

Prints the seconds per size; ``--out``/mlflow_table_rows.json keeps them with the load averages.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from mlflow_services import Browser, _stop, _wait_for, free_port  # noqa: E402  (the tests' browser and server)


def aggregate_rows(n: int) -> pd.DataFrame:
    """``n`` rows shaped as the run's aggregate table (seeded values)."""
    rng = np.random.default_rng(0)
    categories = ["overall", "race-color", "gender", "socioeconomic", "nationality", "religion", "age"]
    metrics = ["metric_score", "stereo_score", "antistereo_score", "fill_mask_pass_rate"]
    i = np.arange(n)
    value = rng.random(n) * 100
    return pd.DataFrame({"model": [f"model_{k:04d}" for k in i // 28], "model_key": [f"model_{k:04d}-{k:08x}"
                                                                                     for k in i // 28],
                         "benchmark": "crows_pairs", "metric_family": "crows_pairs",
                         "metric": [metrics[k] for k in (i // 7) % 4], "category": [categories[k] for k in i % 7],
                         "value": value, "ci_low": value - 1.5, "ci_high": value + 1.5, "n": 1508,
                         "config_hash": [f"f0m{k:06d}" for k in i // 28]})


def main() -> int:
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    from biasflow.tracking.mlflow_log import front_columns

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1000,2000,5000,20000", help="table sizes, comma-separated")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a table may take to show")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/out")
    a = ap.parse_args()
    sizes = [int(s) for s in a.rows.split(",") if s]
    work = Path(tempfile.mkdtemp(prefix="biasflow-table-rows-"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("tables", artifact_location=(work / "artifacts").as_uri())
    runs = {}
    for n in sizes:
        run = client.create_run(exp, run_name=f"{n}_rows").info.run_id
        folder = work / f"table-{n}"
        folder.mkdir()
        path = folder / "aggregate.json"
        front_columns(aggregate_rows(n)).to_json(path, orient="split", index=False, date_format="iso",
                                                 default_handler=str)
        client.log_artifact(run, str(path), artifact_path="tables")
        client.set_tag(run, MLFLOW_LOGGED_ARTIFACTS, json.dumps([{"path": "tables/aggregate.json", "type": "table"}]))
        runs[n] = (run, path.stat().st_size)
    port = free_port()
    log = work / "server.log"
    with open(log, "w") as fh:
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                                   "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                  stdout=fh, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    results, browser = [], None
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for(f"{url}/health", server, log, 300)
        browser = Browser(work)
        for n in sizes:
            run, size = runs[n]
            browser.text("about:blank", timeout=1)  # each table from a fresh load of the app
            load = os.getloadavg()[0]
            seen: dict[str, float] = {}
            start = time.perf_counter()
            expected = ("View as table", "model_0000")

            def ready(text: str, seen=seen, start=start) -> bool:
                for e in expected:
                    if e in text and e not in seen:
                        seen[e] = round(time.perf_counter() - start, 2)
                return len(seen) == len(expected)

            browser.text(f"{url}/#/experiments/{exp}/runs/{run}/artifactPath/tables/aggregate.json", ready,
                         timeout=a.timeout)
            shown = len(seen) == len(expected)
            results.append({"rows": n, "json_mb": round(size / 1e6, 2), "shown": shown,
                            "s": round(time.perf_counter() - start, 2), "seen_after_s": seen,
                            "load": [load, os.getloadavg()[0]]})
            print(f"{n:>6} rows ({size / 1e6:.2f} MB): {'shown' if shown else 'TIMED OUT'} after "
                  f"{results[-1]['s']:.1f} s {seen} (load {load:.1f})", flush=True)
    finally:
        if browser is not None:
            browser.close()
        _stop(server)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "mlflow_table_rows.json").write_text(json.dumps({"cores": os.cpu_count(), "runs": results}, indent=1))
    return 0 if all(r["shown"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
