"""The MLflow UI and search API on a large store: is a sweep of 10,000 child runs usable in the browser?

Opens a store written by ``benchmarks/mlflow_scale.py --keep-store`` (one parent run, N children, the sqlite store
the pipeline uses by default) with ``mlflow server`` on 127.0.0.1 (one worker), then times, from the project root:

* the REST API (``/api/2.0/mlflow/runs/search``, as any client reads a team server): the parent by its tags, one
  child by its ``biasflow.job`` tag, the parent's children (``tags.mlflow.parentRunId = '<id>'``: the first page of
  1,000, then all pages), and the page of 100 runs the runs list asks for first;
* headless Chromium (driven over the DevTools protocol as ``tests/test_mlflow_ui.py`` drives it): the experiment's runs
  list (until the table shows the parent run), the parent run's page (its description: the report), its report and
  aggregate table in the artifact viewer, one child's page and its metrics tab; each page timed until the text that
  says it is there shows, a screenshot of each (PNG, half size) in ``--out``.

    python benchmarks/mlflow_scale.py --children 10000 --impl after --keep-store benchmarks/out/mlflow_store
    python benchmarks/mlflow_ui_scale.py --store benchmarks/out/mlflow_store/after-10000

Writes ``--out``/mlflow_ui_scale.json (timings, load averages, the first characters of each page's text) and the
screenshots; prints the timings. Needs Chromium (``apt-get install chromium``). A page that does not show its text
within ``--timeout`` seconds is reported as timed out, with what it showed.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from mlflow_services import Browser, _stop, _wait_for, free_port  # noqa: E402  (the tests' browser and server)


def rest(url: str, path: str, body: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    response = requests.post(f"{url}/api/2.0/mlflow/{path}", json=body, timeout=600)
    response.raise_for_status()
    return time.perf_counter() - start, response.json()


def tag(run: dict, key: str) -> str | None:
    return next((t["value"] for t in run["data"].get("tags", []) if t["key"] == key), None)


# the expander button of the run whose name is given (MLflow 3's runs table: the Run Name cell's first button)
EXPAND = """(() => { const name = [...document.querySelectorAll('a span')].find(e => e.textContent === %s);
  const cell = name && name.closest('[role=gridcell]');
  const button = cell && cell.querySelector('button');
  if (button) { button.click(); return true; } return false; })()"""


def wait_text(browser: Browser, ready, timeout: float) -> str:
    """The page's visible text once ``ready(text)``, or at ``timeout``, without navigating."""
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        result = browser.loop.run_until_complete(browser._call(
            "Runtime.evaluate", returnByValue=True, expression="document.body ? document.body.innerText : ''"))
        text = result["result"].get("value") or ""
        if ready(text):
            break
        time.sleep(0.25)
    return text


def shot(browser: Browser, path: Path) -> None:
    """A screenshot of the page, half size, a second after it showed its text (the page settles)."""
    time.sleep(1)
    data = browser.loop.run_until_complete(browser._call(
        "Page.captureScreenshot", format="png", clip={"x": 0, "y": 0, "width": 1600, "height": 1200, "scale": 0.5}))
    path.write_bytes(base64.b64decode(data["data"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, default=ROOT / "benchmarks/out/mlflow_store/after-10000",
                    help="folder with mlflow.db (and the artifacts it names)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/out/mlflow_ui_scale")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a page may take to show its text")
    a = ap.parse_args()
    db = a.store.resolve() / "mlflow.db"
    if not db.exists():
        raise SystemExit(f"{db} not found: write it with benchmarks/mlflow_scale.py --keep-store")
    a.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"store": str(db), "cores": os.cpu_count(), "load_start": os.getloadavg()[0], "rest": {},
                    "pages": {}}
    timings = result["rest"]
    work = Path(tempfile.mkdtemp(prefix="biasflow-mlflow-ui-"))
    port = free_port()
    log = work / "server.log"
    with open(log, "w") as fh:
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                                   "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                  stdout=fh, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    browser = None
    try:
        start = time.perf_counter()
        url = f"http://127.0.0.1:{port}"
        _wait_for(f"{url}/health", server, log, 300)
        timings["server start s"] = time.perf_counter() - start

        # --- the search API ------------------------------------------------------------------------------------
        start = time.perf_counter()
        exp = requests.get(f"{url}/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "biasflow"},
                           timeout=60).json()["experiment"]
        timings["experiments/get-by-name s"] = time.perf_counter() - start
        exp_id = exp["experiment_id"]
        s, body = rest(url, "runs/search", {"experiment_ids": [exp_id], "max_results": 10,
                                            "filter": "tags.`biasflow.role` = 'parent'"})
        timings["search: the parent by its tag s"] = s
        parent = body["runs"][0]
        parent_id, plan_hash = parent["info"]["run_id"], tag(parent, "biasflow.plan_hash")
        # the parent's aggregate table for the artifact viewer (tables/aggregate_first_20000.json when cut)
        table = next(t["path"] for t in json.loads(tag(parent, "mlflow.loggedArtifacts") or "[]")
                     if t["path"].startswith("tables/aggregate"))
        s, body = rest(url, "runs/search", {"experiment_ids": [exp_id], "max_results": 100,
                                            "order_by": ["attributes.start_time DESC"]})
        timings["search: the first 100 runs (as the runs list asks) s"] = s
        filt = f"tags.mlflow.parentRunId = '{parent_id}'"
        s, body = rest(url, "runs/search", {"experiment_ids": [exp_id], "max_results": 1000, "filter": filt})
        timings["search: the parent's children, first page of 1,000 s"] = s
        child = body["runs"][len(body["runs"]) // 2]
        child_id, job = child["info"]["run_id"], tag(child, "biasflow.job")
        child_name = child["info"]["run_name"]
        n, token, start = len(body["runs"]), body.get("next_page_token"), time.perf_counter()
        while token:
            _, body = rest(url, "runs/search", {"experiment_ids": [exp_id], "max_results": 1000, "filter": filt,
                                                "page_token": token})
            n, token = n + len(body["runs"]), body.get("next_page_token")
        timings["search: all the parent's children s"] = s + time.perf_counter() - start
        timings["children found"] = n
        s, body = rest(url, "runs/search", {"experiment_ids": [exp_id], "max_results": 1,
                                            "filter": f"tags.`biasflow.job` = '{job}'"})
        timings["search: one child by its biasflow.job tag s"] = s
        assert body["runs"][0]["info"]["run_id"] == child_id
        start = time.perf_counter()
        requests.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": parent_id}, timeout=60).raise_for_status()
        timings["runs/get: the parent s"] = time.perf_counter() - start
        result.update(experiment_id=exp_id, parent_run_id=parent_id, parent_table=table, child_run_id=child_id,
                      child_name=child_name, load_after_rest=os.getloadavg()[0])

        # --- the pages, in headless Chromium -------------------------------------------------------------------
        browser = Browser(work)
        ui = f"{url}/#/experiments/{exp_id}"
        pages = [
            # the runs list: when the table shows (its "N matching runs" line), when it shows the parent run
            ("runs_list", f"{ui}?workflowType=machine_learning", ["matching runs", f"plan-{plan_hash}"]),
            ("parent", f"{ui}/runs/{parent_id}", ["Description", f"biasflow run {plan_hash}"]),
            ("parent_report", f"{ui}/runs/{parent_id}/artifactPath/report.md", ["A synthetic plan"]),
            ("parent_aggregate", f"{ui}/runs/{parent_id}/artifactPath/{table}", ["View as table"]),
            ("child", f"{ui}/runs/{child_id}", [child_name, "metric_score.overall"]),
            ("child_metrics", f"{ui}/runs/{child_id}/model-metrics", ["Model metrics", "metric_score.age\n"]),
        ]
        for name, page_url, expected in pages:
            browser.text("about:blank", timeout=1)  # each page from a fresh load of the app (no state kept)
            load = os.getloadavg()[0]
            seen: dict[str, float] = {}
            start = time.perf_counter()

            def ready(text: str, expected=expected, seen=seen, start=start) -> bool:
                for e in expected:
                    if e in text and e not in seen:
                        seen[e] = round(time.perf_counter() - start, 2)
                return len(seen) == len(expected)

            text = browser.text(page_url, ready, timeout=a.timeout)
            seconds = time.perf_counter() - start
            shown = len(seen) == len(expected)
            entry = {"url": page_url, "shown": shown, "s": round(seconds, 2), "seen_after_s": seen}
            shot(browser, a.out / f"{name}.png")
            if name == "runs_list" and shown:  # open the parent's children (the row's expander)
                before = text.count("org_model_")
                start = time.perf_counter()
                clicked = browser.loop.run_until_complete(browser._call(
                    "Runtime.evaluate", returnByValue=True, expression=EXPAND % json.dumps(f"plan-{plan_hash}")))
                grown = wait_text(browser, lambda t: t.count("org_model_") > before, a.timeout) \
                    if clicked["result"].get("value") else text
                entry["expand"] = {"clicked": bool(clicked["result"].get("value")),
                                   "children_shown": grown.count("org_model_") > before,
                                   "s": round(time.perf_counter() - start, 2), "text": grown[:4000]}
                shot(browser, a.out / "runs_list_expanded.png")
            entry.update(load=[load, os.getloadavg()[0]], text=text[:4000])
            result["pages"][name] = entry
            print(f"{name:>17}: {'shown' if shown else 'TIMED OUT'} after {seconds:6.1f} s {seen} "
                  f"(load {load:.1f})" + (f"; expanded: {entry['expand']['children_shown']} after "
                                          f"{entry['expand']['s']} s" if "expand" in entry else ""), flush=True)
    finally:
        if browser is not None:
            browser.close()
        _stop(server)
    result["load_end"] = os.getloadavg()[0]
    for key, value in timings.items():
        print(f"{key:>55}: {value:.3f}" if isinstance(value, float) else f"{key:>55}: {value}")
    print(f"load average {result['load_start']:.1f} at start, {result['load_end']:.1f} at end; {os.cpu_count()} cores")
    (a.out / "mlflow_ui_scale.json").write_text(json.dumps(result, indent=1))
    return 0 if all(p["shown"] for p in result["pages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
