"""Comparing models: leaderboard, paired tests, threshold curves, paper tables, the HTML report (issue 12).

One sweep of 3 tiny BERTs (seeds 1-3) x 3 fill-mask diff thresholds on 40 CrowS-Pairs pairs runs through the real
stage functions (prepare, score, metric, aggregate_run); its outputs are checked against computations written here:
McNemar against statsmodels, Holm and the paired bootstrap by plain loops, leaderboard ranks by hand.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from biasflow import stages
from biasflow.registry import get_loader, get_metric
from biasflow.report.leaderboard import leaderboard, leaderboard_latex, leaderboard_markdown, wide_frame
from biasflow.report.categories import category_labels, natural_sorted, sort_by_category
from biasflow.report.paper import paper_latex, paper_markdown, paper_tables
from biasflow.report.published import compare
from biasflow.stats.paired import holm, mcnemar_exact, paired_bootstrap
from conftest import ROOT, build_tiny_bert
from biasflow.registry import metric_options_from

SEEDS = (1, 2, 3)
THRESHOLDS = (0.000002, 0.000005, 0.00002)  # a random tiny BERT's candidate probabilities are ~1e-5 apart
N_BOOT = 10


# ----------------------------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("a, b", [
    ([1, 1, 1, 1, 1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1, 0, 1, 0]),   # b=6, c=1
    ([1, 0, 1, 0, 1, 0, 1, 1], [0, 1, 0, 1, 0, 1, 1, 1]),               # b=3, c=3
    ([1] * 30 + [0] * 5, [0] * 20 + [1] * 10 + [0] * 5),               # b=20, c=0
    ([1, 0, 1], [1, 0, 1]),                                            # no discordant item
])
def test_mcnemar_exact_matches_statsmodels(a, b):
    from statsmodels.stats.contingency_tables import mcnemar

    got = mcnemar_exact(a, b)
    x, y = np.asarray(a, bool), np.asarray(b, bool)
    table = [[np.sum(x & y), np.sum(x & ~y)], [np.sum(~x & y), np.sum(~x & ~y)]]
    assert (got["b"], got["c"]) == (table[0][1], table[1][0])
    assert got["p_value"] == pytest.approx(mcnemar(table, exact=True).pvalue, rel=1e-12)


def test_mcnemar_by_hand_and_bad_input():
    # b=6, c=1: two-sided exact p = 2 * P(X <= 1 | n=7, 1/2) = 2 * (1 + 7) / 128
    assert mcnemar_exact([1] * 6 + [0], [0] * 6 + [1])["p_value"] == pytest.approx(16 / 128)
    with pytest.raises(ValueError, match="paired"):
        mcnemar_exact([1, 0], [1])


def test_holm_by_hand():
    # sorted p: .005*4=.02, .01*3=.03, .03*2=.06, .04*1=.04 -> monotone: .02, .03, .06, .06
    got = holm([0.01, 0.04, 0.03, 0.005, float("nan")])
    assert got[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(got[4])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_paired_bootstrap_resamples_items_once_for_both_models():
    """Two models with the same per-item outcome: every replicate's difference is 0 (independent resamples would
    not give that), and only items both models have are used."""
    rng = np.random.default_rng(1)
    base = pd.DataFrame({"item_id": range(30), "category": ["a"] * 10 + ["b"] * 20, "y": rng.integers(0, 2, 30)})
    rate = lambda df: pd.DataFrame({"metric": ["rate"], "category": ["overall"],  # noqa: E731
                                    "value": [100 * df["y"].mean()]})
    other = pd.concat([base, pd.DataFrame({"item_id": [99], "category": ["a"], "y": [1]})])
    res = paired_bootstrap({"A": base, "B": other}, {"A": rate, "B": rate}, ["rate"], n_boot=50, seed=3)
    r = res.iloc[0]
    assert (r["diff"], r.ci_low, r.ci_high, r.n_items, r.n_boot) == (0.0, 0.0, 0.0, 30, 50)
    assert r.p_boot == 1.0


# ----------------------------------------------------------------------------------------------- categories
def test_natural_category_order_and_self_explaining_labels():
    assert natural_sorted(["weat10", "weat2", "overall", "weat1", "t10", "t9"]) == [
        "overall", "t9", "t10", "weat1", "weat2", "weat10"]
    df = sort_by_category(pd.DataFrame({"category": ["weat10", "weat2", "overall", "weat1"], "v": [1, 2, 3, 4]}))
    assert df["category"].tolist() == ["overall", "weat1", "weat2", "weat10"]
    weat = category_labels(get_loader("weat_lists")({}, {"tests": ["weat1", "weat10"]}))
    assert weat["weat1"] == "weat1: Flowers vs Insects, Pleasant vs Unpleasant"
    assert weat["weat10"].startswith("weat10: ")
    cbs = category_labels(get_loader("cbs_templates")({}, {}))
    assert cbs["t0"] == "t0: People from [TARGET] are [ATTRIBUTES]."
    assert len(cbs) == 10 and all(v.startswith(f"{k}: ") for k, v in cbs.items())


# ----------------------------------------------------------------------------------------------- paper tables
def experiment(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / "experiment" / f"{name}.yaml").read_text())["experiment"]


def test_paper_tables_keep_the_published_layout():
    ss, weat = experiment("nadeem2021_stereoset"), experiment("caliskan2017_weat")
    ours = pd.DataFrame([  # a run of bert_base_cased on dev, intrasentence overall only
        {"model": "bert_base_cased", "metric_family": "stereoset", "metric": f"intrasentence_{m}",
         "category": "overall", "value": v, "ci_low": lo, "ci_high": hi, "n": 2106, "config_hash": "h1"}
        for m, v, lo, hi in [("lms", 84.00, 83.0, 85.0), ("ss", 60.00, 58.0, 62.0), ("icat", 67.00, 65.0, 69.0)]])
    comparison = compare(ours, [ss, weat], splits={"h1": "dev"})
    tables = {t.experiment: t for t in paper_tables([ss, weat, ss], comparison)}
    t = tables["nadeem2021_stereoset"]
    assert t.row_header == ["model", "task", "category"] and t.columns == ["lms", "ss", "icat"]
    assert t.rows[0][0] == ["gpt2", "intrasentence", "overall"]  # the published order
    bert = dict((tuple(labels), cells) for labels, cells in t.rows)[("bert-base-cased", "intrasentence", "overall")]
    # published bert-base-cased intrasentence overall: LMS 83.02 (inside [83, 85]), SS 58.68 (inside [58, 62])
    assert bert["lms"] == {"paper": "83.02", "ours": "84.00", "ci": "[83.00, 85.00]", "delta": "+0.98",
                           "in_ci": True}
    assert bert["icat"]["delta"] == "-1.61" and bert["icat"]["in_ci"]  # 68.61 lies inside [65, 69]
    assert bert["ss"]["delta"] == "+1.32" and bert["ss"]["in_ci"]
    assert (t.matched, t.total) == (3, 7 * 33)  # 7 published models x 33 numbers; ours for 3 of them
    w = tables["caliskan2017_weat"]
    assert [labels for labels, _ in w.rows] == [[f"weat{i}"] for i in range(1, 11)]  # the paper's Table 1 order
    assert w.columns == ["glove_840b_300d"] and w.rows[0][1]["glove_840b_300d"]["paper"] == "1.50"
    md = paper_markdown(list(tables.values()))
    assert "| model | task | category | lms paper | lms ours | lms Δ |" in md
    assert "| bert-base-cased | intrasentence | overall | 83.02 | 84.00 [83.00, 85.00] | +0.98 ✓ |" in md
    assert "| weat1 | 1.50 | – | – |" in md
    mixed = {"name": "e", "metric_family": "fam", "metric": "d", "value_columns": ["lms", "ss"],
             "published": [{"model": "m", "values": {"t1": 1.5}}, {"model": "m", "values": {"x": {"overall": 2.0}}},
                           {"model": "m", "values": {"intra": {"overall": [80.0, 55.0]}}}]}
    (m,) = paper_tables([mixed], pd.DataFrame())
    assert m.row_header == ["model"] and m.columns == ["d / t1", "x / overall", "intra_lms / overall",
                                                       "intra_ss / overall"]
    tex = paper_latex(list(tables.values()))
    assert tex.count(r"\toprule") == 2 and r"\multicolumn{3}{c}{lms}" in tex and r"\cmidrule(lr){4-6}" in tex
    assert r"bert-base-cased & intrasentence & overall & 83.02 & 84.00 [83.00, 85.00] & +0.98 $\checkmark$" in tex


# ----------------------------------------------------------------------------------------------- the sweep
@pytest.fixture(scope="module")
def sweep(tmp_path_factory, crows_csv):
    """3 tiny BERTs x 3 diff thresholds on 40 pairs, through prepare, score, metric and aggregate_run."""
    from biasflow.plan import Plan, build_plan

    root = tmp_path_factory.mktemp("sweep")
    plans = []
    for seed in SEEDS:
        overrides = ["model=local_masked_lm", f"model.path={build_tiny_bert(root / f'bert{seed}', seed=seed)}",
                     f"model.name=tiny_bert_{seed}", "model.lowercase=true", "model.device=cpu", "metric=[crows_pairs]",
                     "benchmark.crows_pairs.limit=40", "metric.crows_pairs.filter_threshold=0",
                     "metric.crows_pairs.fill_mask_top_k=null",
                     "metric.crows_pairs.diff_threshold=" + ",".join(map(str, THRESHOLDS)),
                     f"stats.n_boot={N_BOOT}", f"paths.results={root / 'results'}", "tracking.enabled=false"]
        if seed == 1:
            overrides.append("+model.demo=true")  # the report must say that a demo model is in the run
        plans.append(build_plan(overrides, multirun=True))
    plan = Plan(jobs=[j for p in plans for j in p.jobs], sweep=[s for p in plans for s in p.sweep],
                tracking=plans[0].tracking, paths=plans[0].paths, skipped=[], benchmarks=plans[0].benchmarks)
    plan_path = plan.write()
    for job in plan.jobs:
        spec = get_metric(job.metric)
        if not Path(job.items_path).exists():
            stages.prepare(job.benchmark, job.benchmark_cfg, {"csv": str(crows_csv)}, job.items_path)
        scores = job.scores_path(spec.score_keys)
        if not Path(scores).exists():
            stages.score(job.score_params(spec.score_keys), job.items_path, scores, str(root / "results" / "cache"))
        stages.metric(job.params(), job.items_path, scores, job.metric_dir)
    stages.aggregate_run(plan_path, plan.run_dir)
    return Path(plan.run_dir)


def overall(run: Path) -> pd.DataFrame:
    agg = pd.read_parquet(run / "aggregate.parquet")
    plan = json.loads((run / "plan.json").read_text())
    threshold = {j["cfg_hash"]: j["metric_cfg"]["diff_threshold"] for j in plan["jobs"]}
    agg = agg[agg.category == "overall"]
    return agg.assign(threshold=agg.config_hash.map(threshold))


UNBIASED = {"metric_score": 50, "stereo_score": 50, "antistereo_score": 50, "fill_mask_pass_rate": 100}


def test_leaderboard_ranks_models_within_each_threshold(sweep):
    agg = overall(sweep)
    board = pd.read_csv(sweep / "leaderboard.csv")
    assert len(board) == len(SEEDS) * len(THRESHOLDS) * len(UNBIASED)
    assert set(board.model) == {f"tiny_bert_{s}" for s in SEEDS}
    got = board.merge(agg, on=["config_hash", "metric"], suffixes=("", "_agg"))
    assert len(got) == len(board) and np.allclose(got.value, got.value_agg, equal_nan=True)
    assert (got.goal == got.metric.map(UNBIASED)).all()
    tests = pd.read_csv(sweep / "paired_tests.csv")

    def p_holm(metric, a, b):  # the paired test of the two rows, found by models and values
        for x, y in ((a, b), (b, a)):
            hit = tests[(tests.metric == metric) & (tests.model_a == x.model) & (tests.model_b == y.model)
                        & np.isclose(tests.value_a, x.value, atol=1e-9) & np.isclose(tests.value_b, y.value, atol=1e-9)]
            if len(hit):
                return float(hit.p_holm.iloc[0])
        raise AssertionError(f"no paired test of {metric} between {a.model} and {b.model}")

    marked = 0
    for (_, metric), df in got.groupby(["threshold", "metric"]):
        far = (df.value - UNBIASED[metric]).abs()
        order = df.assign(far=far).sort_values("far", kind="stable")
        if far.nunique() > 1:
            # marked only where the paired test separates the best from the next (the worst from the previous)
            best_sig = p_holm(metric, order.iloc[0], order.iloc[1]) < 0.05
            worst_sig = p_holm(metric, order.iloc[-1], order.iloc[-2]) < 0.05
            assert df.loc[df.best, "model"].tolist() == ([order.model.iloc[0]] if best_sig else [])
            assert df.loc[df.worst, "model"].tolist() == ([order.model.iloc[-1]] if worst_sig else [])
            assert df.marks.nunique() == 1 and ("significant" in df.marks.iloc[0])
            if not best_sig and not worst_sig:
                assert df.marks.iloc[0].startswith("no significant difference")
            marked += best_sig + worst_sig
        else:
            assert not df.best.any() and not df.worst.any()
    assert marked == 0  # 10 bootstrap draws and 40 pairs of random tiny BERTs: no difference is significant
    # rows: thresholds in increasing order, within each the model closest to 50 on metric_score first
    ms = got[got.metric == "metric_score"]
    assert ms.threshold.tolist() == sorted(ms.threshold)
    for _, df in ms.groupby("threshold"):
        assert (df.value - 50).abs().is_monotonic_increasing
    md = (sweep / "leaderboard.md").read_text()
    assert "| model | setting | metric_score | stereo_score | antistereo_score | fill_mask_pass_rate |" in md
    assert "| *unbiased value* | | 50 | 50 | 50 | 100 |" in md
    assert "**" not in md.split("\n", 1)[1] and "Marks (paired tests): every column (metric_score, stereo_score, " \
        "antistereo_score, fill_mask_pass_rate): no significant difference between the best and the next model" in md

    # the same run where every paired test were significant: the closest and the farthest model are marked. Two
    # random tiny BERTs often tie on a rate, and which ones tie depends on the CPU's float32 kernels (under AVX2
    # tiny_bert_3's metric_score is 22.5 as tiny_bert_1's, 25.0 under AVX-512), so the rule is checked, not one
    # outcome: one model marked at each end, one at the smallest (the largest) distance
    plan = json.loads((sweep / "plan.json").read_text())
    every = tests.assign(p_holm=0.001, significant=True)
    board = leaderboard(plan, pd.read_parquet(sweep / "aggregate.parquet"), every)
    got = board.merge(agg, on=["config_hash", "metric"], suffixes=("", "_agg"))
    for (_, metric), df in got.groupby(["threshold", "metric"]):
        far = (df.value - UNBIASED[metric]).abs()
        if far.nunique() > 1:
            closest, farthest = df.loc[far == far.min(), "model"].tolist(), df.loc[far == far.max(), "model"].tolist()
            best, worst = df.loc[df.best, "model"].tolist(), df.loc[df.worst, "model"].tolist()
            assert len(best) == len(worst) == 1 and best[0] in closest and worst[0] in farthest
            assert "best vs next: significant (p Holm = 0.001)" in df.marks.iloc[0]
        else:
            assert not df.best.any() and not df.worst.any()
    md = leaderboard_markdown(board)
    assert "Marks (paired tests): metric_score (diff_threshold=2e-06): best vs next: significant" in md
    best = board[(board.metric == "metric_score") & board.best].iloc[0]  # the first row, unless tied
    assert f"| {best.model} | {best.setting} | **{best.value:.2f} [{best.ci_low:.2f}, {best.ci_high:.2f}]** |" \
        in leaderboard_markdown(board)
    assert r"\textbf{" in leaderboard_latex(board)
    # the API's view: models x metrics, one row per (model, setting), value and CI of every headline metric
    wide = wide_frame(pd.read_csv(sweep / "leaderboard.csv"))
    assert wide.shape == (len(SEEDS) * len(THRESHOLDS), len(UNBIASED) * 3)
    for r in board.itertuples(index=False):
        for stat in ("value", "ci_low", "ci_high"):
            assert wide.at[(r.model, r.setting), ("crows_pairs", r.metric, stat)] == pytest.approx(
                getattr(r, stat), nan_ok=True)
    tex = (sweep / "leaderboard.tex").read_text()
    assert all(tex.count(rule) == 1 for rule in (r"\toprule", r"\midrule", r"\bottomrule"))
    assert r"tiny\_bert\_2" in tex and "paired test against the next model" in tex


def holm_loop(p: list[float]) -> list[float]:
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def test_paired_tests_against_statsmodels_and_a_plain_bootstrap_loop(sweep):
    from statsmodels.stats.contingency_tables import mcnemar

    tests = pd.read_csv(sweep / "paired_tests.csv", keep_default_na=False, na_values=[""])
    agg = overall(sweep)
    per_item = pd.read_parquet(sweep / "per_item.parquet")
    pll = per_item[per_item.variant == "pll"]
    pairs = [("tiny_bert_1", "tiny_bert_2"), ("tiny_bert_1", "tiny_bert_3"), ("tiny_bert_2", "tiny_bert_3")]
    ms = tests[tests.metric == "metric_score"]
    # the PLL score does not depend on the threshold: compared once per pair, not once per threshold
    assert list(zip(ms.model_a, ms.model_b)) == pairs and (ms.setting == "(every setting)").all()
    first_threshold = min(THRESHOLDS, key=lambda t: json.dumps({"metric.diff_threshold": t}))
    for r in ms.itertuples(index=False):
        ya, yb = (pll[(pll.model == m) & (pll.config_hash.isin(agg[(agg.model == m) & (
            agg.threshold == first_threshold)].config_hash))].set_index("item_id").stereo_preferred.astype(bool)
            for m in (r.model_a, r.model_b))
        table = [[np.sum(ya & yb), np.sum(ya & ~yb)], [np.sum(~ya & yb), np.sum(~ya & ~yb)]]
        assert (r.discordant_a, r.discordant_b) == (table[0][1], table[1][0])
        assert r.test == "McNemar exact"
        assert r.p_value == pytest.approx(mcnemar(table, exact=True).pvalue, rel=1e-9)
        va, vb = (agg[(agg.model == m) & (agg.metric == "metric_score")].value.iloc[0] for m in (r.model_a, r.model_b))
        assert r.diff == pytest.approx(va - vb) and r.n_items == 40
        # the paired bootstrap by a plain loop: items resampled within their category (categories in sorted
        # order, items in table order) with the stats seed, the same resample for both models
        rng = np.random.default_rng(0)
        strata = {}
        for item, cat in zip(ya.index, pll.drop_duplicates("item_id").set_index("item_id").loc[ya.index, "category"]):
            strata.setdefault(cat, []).append(item)
        diffs = []
        for _ in range(N_BOOT):
            picked = []
            for cat in sorted(strata):
                picked += [strata[cat][i] for i in rng.integers(0, len(strata[cat]), size=len(strata[cat]))]
            diffs.append(100 * sum(ya[i] for i in picked) / len(picked) - 100 * sum(yb[i] for i in picked)
                         / len(picked))
        assert (r.ci_low, r.ci_high) == pytest.approx((np.quantile(diffs, 0.025), np.quantile(diffs, 0.975)))
    # the fill-mask pass rate changes with the threshold: its comparisons are per threshold, by bootstrap
    fm = tests[tests.metric == "fill_mask_pass_rate"]
    assert (fm.test == "paired bootstrap").all() and fm.discordant_a.isna().all()
    assert any(s.startswith("diff_threshold=") for s in fm.setting)
    assert np.allclose(tests.p_holm, holm_loop(tests.p_value.tolist()))
    assert (tests.significant == (tests.p_holm < 0.05)).all()
    md = (sweep / "paired_tests.md").read_text()
    r = ms.iloc[0]
    assert (f"| {r.model_a} ({r.value_a:.2f}) | {r.model_b} ({r.value_b:.2f}) | {r['diff']:.2f} [{r.ci_low:.2f}, "
            f"{r.ci_high:.2f}] | 40 | McNemar exact | {r.discordant_a:.0f} / {r.discordant_b:.0f} |") in md


def test_threshold_curve_one_line_per_model(sweep):
    curves = pd.read_csv(sweep / "curves.csv")
    agg = overall(sweep)
    # metric_score does not move with the threshold, the pass rate does
    assert set(curves.metric) == {"fill_mask_pass_rate"} and set(curves.option) == {"diff_threshold"}
    assert len(curves) == len(SEEDS) * len(THRESHOLDS)
    for model, df in curves.groupby("line"):
        assert sorted(df.x) == sorted(THRESHOLDS)
        want = agg[(agg.model == model) & (agg.metric == "fill_mask_pass_rate")].set_index("threshold")
        assert np.allclose(df.set_index("x").value, want.loc[df.x, "value"])
        assert np.allclose(df.set_index("x").ci_high, want.loc[df.x, "ci_high"])
    assert (sweep / "plots" / "curve__crows_pairs__diff_threshold__fill_mask_pass_rate.png").stat().st_size > 10_000
    assert "![crows_pairs: fill_mask_pass_rate vs diff_threshold]" in (sweep / "report.md").read_text()


def test_html_report_is_self_contained_and_logged_to_mlflow(sweep, tmp_path):
    from mlflow.tracking import MlflowClient

    from biasflow.tracking.mlflow_log import log_plan

    html = (sweep / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)  # nothing fetched from outside
    assert "<script" not in html
    imgs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    # a curve, 9 bar plots, the models side by side
    assert len(imgs) == 1 + 9 + 1 and all(src.startswith("data:image/png;base64,") for src in imgs)
    assert "Demo model." in html and "tiny_bert_3" in html
    plan = json.loads((sweep / "plan.json").read_text())
    plan["tracking"] = {"enabled": True, "experiment": "biasflow", "uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                        "artifact_location": str(tmp_path / "artifacts")}
    record = log_plan(plan, sweep)
    client = MlflowClient(tracking_uri=plan["tracking"]["uri"])
    logged = {a.path for a in client.list_artifacts(record["parent_run_id"])}
    assert {"report.html", "leaderboard.md", "leaderboard.csv", "leaderboard.tex", "paired_tests.csv",
            "curves.csv"} <= logged
    local = client.download_artifacts(record["parent_run_id"], "report.html", str(tmp_path / "dl"))
    assert Path(local).read_text() == html


# ----------------------------------------------------------------------------------------------- Chromium
CHROMIUM = Path("/usr/bin/chromium")


def chromium() -> str:
    if CHROMIUM.exists():
        return str(CHROMIUM)
    if os.environ.get("CI") == "true":
        pytest.fail("/usr/bin/chromium is missing in CI (.ci/run installs it: apt-get install -y chromium)")
    pytest.skip("needs headless Chromium at /usr/bin/chromium: apt-get install chromium")


def test_html_report_in_headless_chromium(sweep, tmp_path):
    """Chromium opens the report offline and shows the models, their numbers, the warning and the plots."""
    import matplotlib.image

    exe = chromium()
    url = (sweep / "report.html").as_uri()
    common = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars"]
    dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True, timeout=180, check=True).stdout
    assert "<h1>biasflow run" in dom and 'role="alert"' in dom and "Demo model." in dom
    board = pd.read_csv(sweep / "leaderboard.csv")
    for model in (f"tiny_bert_{s}" for s in SEEDS):
        row = board[(board.model == model) & (board.metric == "metric_score")].iloc[0]
        assert f"<td>{model}</td>" in dom
        assert f"{row.value:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]</td>" in dom
    assert "McNemar exact" in dom and "Paired tests between models" in dom
    assert "Marks (paired tests): every column (metric_score, stereo_score, antistereo_score, fill_mask_pass_rate): " \
        "no significant difference" in dom
    shot = tmp_path / "report.png"
    subprocess.run(common + ["--window-size=1280,3000", f"--screenshot={shot}", url], capture_output=True,
                   timeout=180, check=True)
    pixels = (matplotlib.image.imread(shot)[..., :3] * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(p) for p in np.unique(pixels, axis=0)}
    assert (255, 247, 230) in colours  # the warning box
    assert (31, 119, 180) in colours   # the first line of the threshold curve: the embedded plot was drawn


def test_stereoset_pairs_are_tested_on_the_pro_choice_per_example(tmp_path):
    """Two models' StereoSet examples (hand-made): McNemar on "stereotype scored above anti-stereotype" per example,
    the SS difference from the metric's own aggregate."""
    from biasflow.report.compare import paired_tests

    spec = get_metric("stereoset")
    rng = np.random.default_rng(7)
    n = 60
    base = pd.DataFrame({"item_id": [f"ex{i}" for i in range(n)], "category": rng.choice(["gender", "race"], n),
                         "task": ["intrasentence"] * 40 + ["intersentence"] * 20,
                         "target": rng.choice(["t1", "t2", "t3"], n), "related": 2})
    pro = {"A": rng.integers(0, 2, n), "B": rng.integers(0, 2, n)}
    jobs, aggs, items = [], [], []
    for model in ("A", "B"):
        per = base.assign(pro=pro[model], model=model, config_hash=f"h{model}", metric_family="stereoset")
        agg = spec.aggregate(per, metric_options_from("stereoset", {})).assign(model=model, config_hash=f"h{model}", metric_family="stereoset")
        items.append(per)
        aggs.append(agg)
        jobs.append({"metric": "stereoset", "cfg_hash": f"h{model}", "model_key": f"{model}-0",
                     "benchmark": "stereoset", "model": {"name": model}, "metric_cfg": {}, "benchmark_cfg": {},
                     "mode": "parity", "stats": {"n_boot": 5, "seed": 0, "level": 0.95}})
    tests = paired_tests({"plan_hash": "x", "jobs": jobs}, pd.concat(aggs), pd.concat(items)).set_index("metric")
    intra = base.task == "intrasentence"
    a, b = pro["A"][intra].astype(bool), pro["B"][intra].astype(bool)
    row = tests.loc["intrasentence_ss"]
    assert (row.test, row.discordant_a, row.discordant_b) == ("McNemar exact", np.sum(a & ~b), np.sum(~a & b))
    ss = {m: agg.set_index(["metric", "category"]).at[("intrasentence_ss", "overall"), "value"]
          for m, agg in zip("AB", aggs)}
    assert row["diff"] == pytest.approx(ss["A"] - ss["B"])
    both = tests.loc["overall_ss"]
    assert both.discordant_a == np.sum((pro["A"] == 1) & (pro["B"] == 0))  # both tasks pooled
    assert tests.loc["overall_icat", "test"] == "paired bootstrap"


def test_a_comparison_without_values_is_left_out(tmp_path):
    """A metric one model has no value for (here B's items are all intrasentence, so B has no intersentence SS) is no
    comparison: no row saying "significant: no" with empty numbers."""
    from biasflow.report.compare import paired_rows, paired_tests

    spec = get_metric("stereoset")
    rng = np.random.default_rng(3)
    n = 40
    jobs, aggs, items = [], [], []
    for model, tasks in (("A", ["intrasentence"] * 20 + ["intersentence"] * 20), ("B", ["intrasentence"] * 40)):
        per = pd.DataFrame({"item_id": [f"ex{i}" for i in range(n)], "category": rng.choice(["gender", "race"], n),
                            "task": tasks, "target": rng.choice(["t1", "t2"], n), "related": 2,
                            "pro": rng.integers(0, 2, n)}).assign(model=model, config_hash=f"h{model}",
                                                                 metric_family="stereoset")
        agg = spec.aggregate(per, metric_options_from("stereoset", {})).assign(model=model, config_hash=f"h{model}", metric_family="stereoset")
        items.append(per)
        aggs.append(agg)
        jobs.append({"metric": "stereoset", "cfg_hash": f"h{model}", "model_key": f"{model}-0",
                     "benchmark": "stereoset", "model": {"name": model}, "metric_cfg": {}, "benchmark_cfg": {},
                     "mode": "parity", "stats": {"n_boot": 5, "seed": 0, "level": 0.95}})
    tests = paired_tests({"plan_hash": "x", "jobs": jobs}, pd.concat(aggs), pd.concat(items))
    assert "intrasentence_ss" in set(tests["metric"]) and "intersentence_ss" not in set(tests["metric"])
    assert tests["diff"].notna().all()
    _, rows = paired_rows(tests)
    assert all(row[-1] in ("yes", "no") for row in rows)


def test_both_report_formats_name_the_machine_that_scored(sweep):
    """Issue 46: no CPU line in the provenance, and report.md had no provenance section."""
    from biasflow.provenance import cpu_description

    md = (sweep / "report.md").read_text()
    section = md.split("\n## Provenance\n", 1)[1]
    assert "| model key | model | kind | source | revision | scored on |" in section
    assert cpu_description().split(",")[0] in section and "crows_pairs/" in section  # the CPU, the data file
    html = (sweep / "report.html").read_text()
    assert cpu_description().split(",")[0] in html.split('id="provenance"', 1)[1]
