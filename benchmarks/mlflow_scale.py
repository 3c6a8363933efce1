"""Logging a large sweep to MLflow: seconds per 100 child runs, in total, and peak memory, for this code and for the
code before the MLflow scaling change (issue 48 item 4), measured in the same run on the same synthetic plan.

Writes a synthetic finished plan (no model runs): N jobs = models x 10 metric configs (14 real metric names, the
CrowS-Pairs one at 3 thresholds), each with what a real job leaves for MLflow: an aggregate table of 24 rows (two
metrics x 12 categories, value and CI: 72 MLflow metrics), a per-item table of 300 rows, config.yaml,
score_meta.json with provenance, metric_meta.json; about 25 params and 40 tags per child, a dataset input. Then, in
a fresh process per measurement (so peak RSS is the logger's own), logs it with ``log_plan`` into a new store, and
logs it again (the resumable, idempotent re-run: every child found and updated, none created):

    python benchmarks/mlflow_scale.py                           # 100 and 1,000 children, sqlite, this code and before
    python benchmarks/mlflow_scale.py --children 100 --store server    # a local `mlflow server` on 127.0.0.1
    python benchmarks/mlflow_scale.py --children 10000 --impl after    # the real 10,000 (31 + 12 min, 2 busy cores)

``--before REF`` (default f10cb7d, the last commit before the change) names the code to compare with: its
``tracking/mlflow_log.py`` is loaded from git beside the current one. Stores: ``sqlite`` (the default embedded
store), ``file`` (MLflow's ./mlruns file store, in maintenance mode), ``server`` (``mlflow server`` on 127.0.0.1
backed by sqlite, artifacts proxied over HTTP). ``--check N`` compares all that N jobs log, before and after.
``--keep-store DIR`` writes each store to ``DIR/<impl>-<N>/`` and keeps it (the 10,000-child store that
``benchmarks/mlflow_ui_scale.py`` opens in the UI).
10,000 is extrapolated linearly from the largest N measured (``*``) unless measured. Prints the machine load
(1-minute average before and after each measurement).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("crows_pairs", "crows_pairs_aul", "crows_pairs_biasbench", "stereoset", "winobias", "lpbs", "cbs", "weat",
           "seat", "langfair_stereotype", "helm_representation", "honest", "winobias_mc", "crows_pairs_causal")
# 10 metric configs per model: 7 metrics, and CrowS-Pairs at 3 thresholds
CONFIGS = [(m, None) for m in METRICS[1:8]] + [("crows_pairs", t) for t in (0.05, 0.1, 0.2)]
CATEGORIES = ("overall", "race-color", "gender", "socioeconomic", "nationality", "religion", "age",
              "sexual-orientation", "physical-appearance", "disability", "other", "unknown")


def write_plan(root: Path, n: int) -> Path:
    """A finished plan of ``n`` jobs on disk; returns its run folder."""
    import numpy as np
    import pandas as pd

    results = root / "results"
    items = results / "items" / "crows_pairs-0000.parquet"
    items.parent.mkdir(parents=True)
    (items.parent / f"{items.name}.meta.json").write_text(json.dumps(
        {"benchmark": "crows_pairs", "rows": 1508, "files": {"csv": {
            "path": "/data/crows_pairs_anonymized.csv", "sha256": "ab" * 32,
            "source": "https://raw.githubusercontent.com/nyu-mll/crows-pairs/master/data/crows_pairs_anonymized.csv",
            "rows": 1508}}}))
    rng = np.random.default_rng(0)
    per_item = pd.DataFrame({"item_id": np.arange(300), "category": [CATEGORIES[1 + i % 11] for i in range(300)],
                             "score": rng.random(300), "more": rng.random(300) > 0.5})
    jobs, aggs = [], []
    t0 = time.time() - 86400
    for i in range(n):
        model_i, (metric, threshold) = divmod(i, len(CONFIGS))[0], CONFIGS[i % len(CONFIGS)]
        name = f"org_model_{model_i:04d}"
        cfg_hash = f"{i:012x}"
        mdir = results / "metrics" / f"{name}-0123abcd" / metric / cfg_hash
        mdir.mkdir(parents=True)
        values = rng.random(len(CATEGORIES) * 2) * 100
        agg = pd.DataFrame({"model": name, "benchmark": "crows_pairs",
                            "metric": ["metric_score"] * len(CATEGORIES) + ["stereotype_score"] * len(CATEGORIES),
                            "category": list(CATEGORIES) * 2, "value": values, "ci_low": values - 2,
                            "ci_high": values + 2, "n": 100, "config_hash": cfg_hash})
        agg.to_parquet(mdir / "aggregate.parquet")
        per_item.to_parquet(mdir / "per_item.parquet")
        (mdir / "config.yaml").write_text(f"metric: {metric}\nmodel: {name}\n")
        (mdir / "score_meta.json").write_text(json.dumps({
            "provenance": {"model.revision": "0" * 40, "model.dtype": "float32", "torch": "2.13.0",
                           "transformers": "4.57.0", "score.device": "cpu"},
            "started": t0 + i, "finished": t0 + i + 5}))
        (mdir / "metric_meta.json").write_text(json.dumps({"started": t0 + i + 6, "finished": t0 + i + 9}))
        metric_cfg = {"variant": metric, "plot_metric": "metric_score", "n_categories": 11, "direction": "stereo",
                      "definition": "nangia2020"}
        if threshold is not None:
            metric_cfg["diff_threshold"] = threshold
        jobs.append({"metric": metric, "model_key": f"{name}-0123abcd", "cfg_hash": cfg_hash,
                     "metric_dir": str(mdir), "items_path": str(items),
                     "model": {"name": name, "kind": "masked_lm", "hub_id": f"org/model-{model_i}",
                               "revision": "0" * 40, "lowercase": True, "dtype": "float32", "device": "auto",
                               "batch_tokens": 8192, "max_length": 512},
                     "metric_cfg": metric_cfg, "benchmark": "crows_pairs",
                     "benchmark_cfg": {"limit": None, "split": "test", "language": "en", "files": {}},
                     "stats": {"n_boot": 1000, "seed": 0, "level": 0.95}, "mode": "parity"})
        if i < 2000:  # the run's aggregate table: enough rows to stand for it (logged to the parent)
            aggs.append(agg)
    run_dir = results / "runs" / "abcdef123456"
    run_dir.mkdir(parents=True)
    table = pd.concat(aggs)
    table.to_csv(run_dir / "aggregate.csv", index=False)
    table.to_parquet(run_dir / "aggregate.parquet")
    (run_dir / "report.md").write_text("# biasflow run abcdef123456\n\nA synthetic plan "
                                       "(benchmarks/mlflow_scale.py).\n")
    plan = {"plan_hash": run_dir.name, "paths": {"results": str(results), "resources": str(root / "resources")},
            "tracking": {"uri": "sqlite:///unused.db", "experiment": "biasflow", "enabled": True,
                         "artifact_location": str(root / "mlartifacts")},
            "sweep": [{"overrides": ["model=...", "metric=[...]"], "config": {}}], "skipped": [], "jobs": jobs}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    return run_dir


def load_impl(impl: str, before: str):
    if impl == "after":
        from biasflow.tracking import mlflow_log

        return mlflow_log
    source = subprocess.run(["git", "show", f"{before}:src/biasflow/tracking/mlflow_log.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="biasflow-before-")) / "mlflow_log_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("biasflow.tracking.mlflow_log_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def worker(a) -> None:
    """One measurement in this process: log the plan twice (new store, then the re-run); print JSON."""
    import logging

    logging.disable(logging.WARNING)
    impl = load_impl(a.impl, a.before)
    run_dir = Path(a.run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["tracking"]["artifact_location"] = str(Path(a.store_dir) / "mlartifacts")
    out = {"load_before": os.getloadavg()[0]}
    for key in ("first", "again"):
        cpu = time.process_time()
        start = time.perf_counter()
        record = impl.log_plan(plan, run_dir, uri=a.uri)
        out[key] = time.perf_counter() - start
        out[f"{key}_cpu"] = time.process_time() - cpu
        if a.once:
            break
    out["children"] = len(record["children"])
    # what the code before paid per child on top: one search for the child by its tags, in a store of N children
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=a.uri)
    jids = list(record["children"])[:: max(1, len(record["children"]) // 10)][:10]
    start = time.perf_counter()
    for jid in jids:
        client.search_runs([record["experiment_id"]], max_results=1, filter_string=(
            f"tags.`biasflow.job` = '{jid}' and tags.`mlflow.parentRunId` = '{record['parent_run_id']}'"))
    out["search_ms"] = 1000 * (time.perf_counter() - start) / len(jids)
    out["load_after"] = os.getloadavg()[0]
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out))


def snapshot(uri: str, root: Path) -> dict:
    """Everything logged, in comparable form: per job id, its run's name, times, status, params, tags (ids
    masked), metric histories, dataset inputs and artifact files (paths and bytes); the parent likewise."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("biasflow")
    runs = client.search_runs([exp.experiment_id], max_results=50000)
    ids = {r.info.run_id: r.data.tags.get("biasflow.job", "parent") for r in runs}
    out = {}
    for r in runs:
        files = {}
        base = Path(r.info.artifact_uri.removeprefix("file://"))
        for f in sorted(base.rglob("*")) if base.is_dir() else []:
            if f.is_file():
                files[str(f.relative_to(base))] = f.read_bytes()
        out[ids[r.info.run_id]] = {
            "name": r.info.run_name, "times": (r.info.start_time, r.info.end_time), "status": r.info.status,
            "params": r.data.params,
            # the checkout's state may change between two loggings (another engineer's commit): not compared
            "tags": {k: ids.get(v, v) for k, v in r.data.tags.items() if not k.startswith("mlflow.source.git")},
            "metrics": {k: [(m.value, m.timestamp, m.step) for m in client.get_metric_history(r.info.run_id, k)]
                        for k in r.data.metrics},
            "inputs": [(d.dataset.name, d.dataset.digest, d.dataset.source, d.dataset.profile,
                        [(t.key, t.value) for t in d.tags]) for d in r.inputs.dataset_inputs],
            "files": files}
    return out


def check(n: int, before: str) -> int:
    """Log one plan of ``n`` jobs with the code before and with this code (twice each, the second a re-run), into
    two sqlite stores; compare everything logged."""
    import logging

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="biasflow-mlflow-check-") as tmp:
        run_dir = write_plan(Path(tmp) / "plan", n)
        plan = json.loads((run_dir / "plan.json").read_text())
        snaps = {}
        for impl in ("before", "after"):
            module = load_impl(impl, before)
            store = Path(tmp) / impl
            plan["tracking"]["artifact_location"] = str(store / "mlartifacts")
            uri = f"sqlite:///{store / 'mlflow.db'}"
            for _ in range(2):
                module.log_plan(plan, run_dir, uri=uri)
            snaps[impl] = snapshot(uri, store)
        a, b = snaps["before"], snaps["after"]
        differences = [(job, key) for job in sorted(set(a) | set(b)) for key in ("name", "times", "status",
                                                                                   "params", "tags", "metrics",
                                                                                   "inputs", "files")
                       if a.get(job, {}).get(key) != b.get(job, {}).get(key)]
        for job, key in differences[:20]:
            x, y = a.get(job, {}).get(key), b.get(job, {}).get(key)
            if isinstance(x, dict) and isinstance(y, dict):
                x, y = ({k: v for k, v in d.items() if other.get(k) != v} for d, other in ((x, y), (y, x)))
            print(f"DIFFERS: {job} {key}:\n  before {str(x)[:600]}\n  after  {str(y)[:600]}")
        print(f"{len(a)} runs before, {len(b)} after; {len(differences)} differences")
        return 1 if differences else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(store: Path):
    import requests

    port = free_port()
    store.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--artifacts-destination", str(store / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return proc, f"http://127.0.0.1:{port}"
        except requests.RequestException:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("mlflow server did not start")
        time.sleep(0.5)


def measure(impl: str, run_dir: Path, store_kind: str, before: str, once: bool, tmp: Path,
            keep: Path | None = None) -> dict:
    if keep is None:
        store = Path(tempfile.mkdtemp(prefix=f"store-{impl}-", dir=tmp))
    else:  # written where it stays (the artifact paths in the store are absolute)
        store = keep
        store.mkdir(parents=True)
    server = None
    if store_kind == "sqlite":
        uri = f"sqlite:///{store / 'mlflow.db'}"
    elif store_kind == "file":
        uri = (store / "mlruns").as_uri()
    else:
        server, uri = start_server(store)
    try:
        cmd = [sys.executable, __file__, "--worker", "--impl", impl, "--before", before, "--run-dir", str(run_dir),
               "--uri", uri, "--store-dir", str(store)] + (["--once"] if once else [])
        env = dict(os.environ, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
        if store_kind == "file":  # MLflow 3.x refuses its file store unless asked
            env["MLFLOW_ALLOW_FILE_STORE"] = "true"
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise SystemExit(f"{impl} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])
    finally:
        if server is not None:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
        if keep is None:
            shutil.rmtree(store, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--children", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--store", choices=("sqlite", "file", "server"), default="sqlite")
    ap.add_argument("--impl", nargs="+", default=["before", "after"], choices=("before", "after"))
    ap.add_argument("--before", default="f10cb7d", help="git ref of the code to compare with")
    ap.add_argument("--once", action="store_true", help="log once (no re-run)")
    ap.add_argument("--keep-store", type=Path, metavar="DIR",
                    help="write each store to DIR/<impl>-<N>/ and keep it (mlflow.db, mlartifacts/), e.g. for "
                         "benchmarks/mlflow_ui_scale.py")
    ap.add_argument("--check", type=int, metavar="N", help="compare all that N jobs log, before and after")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--uri", help=argparse.SUPPRESS)
    ap.add_argument("--store-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.check:
        return check(a.check, a.before)
    if a.worker:
        a.impl = a.impl[0]
        worker(a)
        return 0
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; store: {a.store}")
    print(f"{'code':>6} {'children':>8} {'log s':>8} {'s/100':>6} {'CPU s':>7} {'re-run s':>8} {'s/100':>6} "
          f"{'CPU s':>7} {'peak MB':>7} {'load':>9} {'1 search ms':>11}")
    rows: dict[str, list[tuple[int, dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="biasflow-mlflow-scale-") as tmp:
        for n in a.children:
            run_dir = write_plan(Path(tmp) / f"plan{n}", n)
            for impl in a.impl:
                r = measure(impl, run_dir, a.store, a.before, a.once, Path(tmp),
                            a.keep_store.resolve() / f"{impl}-{n}" if a.keep_store else None)
                rows.setdefault(impl, []).append((n, r))
                again = r.get("again")
                print(f"{impl:>6} {n:>8} {r['first']:>8.1f} {100 * r['first'] / n:>6.2f} {r['first_cpu']:>7.1f} "
                      f"{again if again is not None else float('nan'):>8.1f} "
                      f"{100 * (again or float('nan')) / n:>6.2f} {r.get('again_cpu', float('nan')):>7.1f} "
                      f"{r['peak_mb']:>7.0f} "
                      f"{r['load_before']:>4.1f}-{r['load_after']:<4.1f} {r.get('search_ms', float('nan')):>11.0f}",
                      flush=True)
            shutil.rmtree(run_dir.parents[2], ignore_errors=True)
    for impl, measured in rows.items():
        n, r = max(measured, key=lambda x: x[0])
        if n < 10_000:
            print(f"{impl:>6} {10_000:>7}* {r['first'] * 10_000 / n:>8.0f} {100 * r['first'] / n:>6.2f} "
                  f"{'':>7} {(r.get('again') or float('nan')) * 10_000 / n:>8.0f}   (extrapolated from {n})")
    if {"before", "after"} <= rows.keys():
        for (n, b), (_, f) in zip(rows["before"], rows["after"]):
            ratio = b["first"] / f["first"]
            again = (b["again"] / f["again"]) if b.get("again") and f.get("again") else float("nan")
            cpu = b["first_cpu"] / f["first_cpu"]
            cpu_again = (b["again_cpu"] / f["again_cpu"]) if b.get("again_cpu") and f.get("again_cpu") \
                else float("nan")
            print(f"before/after at {n}: first logging {ratio:.1f}x wall, {cpu:.1f}x CPU; re-run {again:.1f}x wall, "
                  f"{cpu_again:.1f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
