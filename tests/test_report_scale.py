"""The run report at many models (issue 48 item 3): the paired design (all pairs, adjacent, reference; Holm over the
tests run), the switch from all pairs to adjacent above ``stats.all_pairs_up_to`` models, and tables that show the
top and bottom of a long ranking with the count of the rows they leave out.

Per-item tables are made here (seeded CrowS-Pairs- and WinoBias-shaped rows, no scoring). At 3 models the default
design must give exactly the tables the report gave before designs existed: ``fixtures/report_scale/`` was written
by that code (commit f10cb7d) from ``synthetic_run(3)`` (``python tests/test_report_scale.py`` writes it with the code
it imports).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasflow.registry import get_metric
from biasflow.registry import metric_options_from

GOLDEN = Path(__file__).parent / "fixtures" / "report_scale"
CATEGORIES = ("age", "gender", "race-color", "religion")


def per_item_table(family: str, model: int, n: int, stereo: float = 0.6) -> pd.DataFrame:
    """A seeded per-item table as the family's metric stage writes it; ``stereo``: the share of pairs whose
    stereotypical sentence scores higher (CrowS-Pairs' metric_score is about 100 x this)."""
    rng = np.random.default_rng([model, len(family)])
    category = np.array(CATEGORIES)[np.arange(n) % len(CATEGORIES)]
    if family == "winobias":
        kept = rng.random(n) < 0.8
        return pd.DataFrame({"item_id": [f"w{i}" for i in range(n)], "category": [f"type{1 + i % 2}_{s}" for i, s in
                                                                                 enumerate(["pro", "anti"] * (n // 2))],
                             "type": [1 + i % 2 for i in range(n)], "stereotype": ["pro", "anti"] * (n // 2),
                             "variant": "langtest", "kept": kept, "passed": kept & (rng.random(n) < 0.6),
                             "correct": rng.choice([0.0, 0.5, 1.0], n)})
    preferred = rng.permutation(np.arange(n) < round(stereo * n))  # exactly that share
    more = rng.integers(-80, -20, n) / 2.0
    less = np.where(preferred, more - 1.0, more + 1.0)
    pll = pd.DataFrame({"item_id": [f"p{i}" for i in range(n)], "category": category, "direction": "stereo",
                        "variant": "pll", "score_more": more, "score_less": less, "tie": False,
                        "stereo_preferred": preferred.astype(int)})
    fm = pll[["item_id", "category", "direction"]].assign(variant="fill_mask", p_more=rng.random(n),
                                                          p_less=rng.random(n), kept=rng.random(n) < 0.7)
    fm["passed"] = fm["kept"] & ((fm["p_more"] - fm["p_less"]).abs() <= 0.3)
    return pd.concat([pll, fm], ignore_index=True)


def synthetic_run(n_models: int, families=("crows_pairs", "winobias"), n_items: int = 48, n_boot: int = 40,
                  stats: dict | None = None, stereo=None, mode: str = "parity"):
    """plan, aggregate and per-item tables of ``n_models`` models as the aggregate stage reads them."""
    from biasflow.registry import metric_options
    from biasflow.schema import filled_options

    jobs, aggs, items = [], [], []
    for m in range(n_models):
        name, key = f"model_{m:02d}", f"model_{m:02d}-{m:08x}"
        for family in families:
            cfg = {k: v for k, v in filled_options(metric_options(family), {}).items()
                   if k not in ("benchmark", "default_model", "run_mode")}
            cfg_hash = f"{family[:4]}{m:08d}"
            jobs.append({"metric": family, "model": {"name": name, "kind": "masked_lm"}, "model_key": key,
                         "cfg_hash": cfg_hash, "metric_cfg": cfg, "benchmark": family, "benchmark_cfg": {},
                         "mode": mode, "stats": {"n_boot": n_boot, "seed": 0, "level": 0.95, **(stats or {})},
                         "metric_dir": f"/nonexistent/{cfg_hash}", "items_path": None})
            per_item = per_item_table(family, m, n_items, stereo(m) if stereo else 0.6)
            agg = get_metric(family).aggregate(per_item, metric_options_from(family, {**cfg, "run_mode": mode}))
            agg = agg.assign(ci_low=agg["value"] - 1.0, ci_high=agg["value"] + 1.0)
            labels = {"model": name, "model_key": key, "benchmark": family, "metric_family": family,
                      "config_hash": cfg_hash}
            aggs.append(agg.assign(**labels))
            items.append(per_item.assign(**labels))
    plan = {"plan_hash": f"synthetic{n_models:03d}", "jobs": jobs, "sweep": [], "skipped": [], "tracking": {},
            "paths": {"results": "/nonexistent"}}
    return plan, pd.concat(aggs, ignore_index=True), pd.concat(items, ignore_index=True)


def report_tables(plan, agg, per_item) -> dict[str, pd.DataFrame | str]:
    from biasflow.report.compare import paired_markdown, paired_tests
    from biasflow.report.leaderboard import leaderboard, leaderboard_latex, leaderboard_markdown

    tests = paired_tests(plan, agg, per_item)
    board = leaderboard(plan, agg, tests)
    return {"paired_tests": tests, "leaderboard": board, "paired_tests.md": paired_markdown(tests),
            "leaderboard.md": leaderboard_markdown(board), "leaderboard.tex": leaderboard_latex(board, "x")}


# ----------------------------------------------------------------------------------------------- today's tables
def test_the_default_design_gives_todays_tables_at_three_models():
    got = report_tables(*synthetic_run(3))
    for name, table in got.items():
        if isinstance(table, str):
            assert table == (GOLDEN / name).read_text(), name
        else:  # every number bit for bit
            pd.testing.assert_frame_equal(table.reset_index(drop=True), pd.read_parquet(GOLDEN / f"{name}.parquet"),
                                          check_exact=True)
    assert set(got["paired_tests"].groupby("metric").size()) == {3}  # every pair of the 3 on every metric


# ----------------------------------------------------------------------------------------------- the designs
def test_design_by_the_number_of_models():
    from biasflow.report.compare import paired_design
    from biasflow.schema import StatsConfig

    assert [paired_design(StatsConfig(), n) for n in (2, 20, 21, 1000)] == ["all_pairs"] * 2 + ["adjacent"] * 2
    assert paired_design(StatsConfig(all_pairs_up_to=3), 4) == "adjacent"
    assert paired_design(StatsConfig(paired="all_pairs"), 1000) == "all_pairs"
    assert paired_design(StatsConfig(paired="reference", paired_reference="m"), 3) == "reference"
    with pytest.raises(ValueError, match="paired_reference"):
        StatsConfig(paired="reference")
    # a reference beside the adjacent pairs: both, where the design is adjacent (every pair holds it below)
    assert [paired_design(StatsConfig(paired_reference="m"), n) for n in (20, 21)] == ["all_pairs",
                                                                                      "adjacent+reference"]
    assert paired_design(StatsConfig(paired="adjacent", paired_reference="m"), 3) == "adjacent+reference"
    with pytest.raises(ValueError, match="paired_reference"):
        StatsConfig(paired="all_pairs", paired_reference="m")


def test_the_paired_design_is_the_reports_alone():
    """Setting the paired-test design changes no metric job (its folder and params hold the bootstrap settings
    only: nothing re-runs), the report reads it from the plan, and a sweep over it is refused (one report per plan)."""
    import json

    from biasflow.errors import ConfigError
    from biasflow.plan import build_plan
    from biasflow.report.explain import stats_of

    overrides = ["model=bert_base_uncased,roberta_base", "metric=[crows_pairs]"]
    default = build_plan(overrides, multirun=True)
    adjacent = build_plan([*overrides, "stats.paired=adjacent"], multirun=True)
    assert [j.params() for j in adjacent.jobs] == [j.params() for j in default.jobs]
    assert adjacent.plan_hash == default.plan_hash
    assert stats_of(json.loads(adjacent.to_json())).paired == "adjacent"
    assert stats_of(json.loads(default.to_json())).paired == "auto"
    with pytest.raises(ConfigError, match=r"stats.paired is swept"):
        build_plan([*overrides, "stats.paired=adjacent,all_pairs"], multirun=True)


def holm_by_hand(p: list[float]) -> list[float]:
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


# metric_score of the 4 models: about 100 x these shares; distance to 50: model_03 < model_00 < model_01 < model_02
STEREO = {0: 0.55, 1: 0.25, 2: 0.95, 3: 0.48}


def test_adjacent_design_tests_each_model_against_the_next_in_each_ranking():
    plan, agg, per_item = synthetic_run(4, families=("crows_pairs",), n_items=200,
                                        stats={"paired": "adjacent"}, stereo=STEREO.get)
    from biasflow.report.compare import paired_tests

    tests = paired_tests(plan, agg, per_item)
    overall = agg[(agg.category == "overall")]
    for metric, goal in (("metric_score", 50.0), ("stereo_score", 50.0), ("fill_mask_pass_rate", 100.0)):
        v = overall[overall.metric == metric].set_index("model")["value"]
        ranked = list((v - goal).abs().sort_values(kind="stable").index)
        got = tests[tests.metric == metric]
        assert list(zip(got.model_a, got.model_b)) == list(zip(ranked, ranked[1:])), metric
    # by hand: metric_score 55, 25, 95, 48 -> distances to 50 of 5, 25, 45, 2
    assert overall[overall.metric == "metric_score"]["value"].tolist() == [55.0, 25.0, 95.0, 48.0]
    got = tests[tests.metric == "metric_score"]
    assert list(zip(got.model_a, got.model_b)) == [("model_03", "model_00"), ("model_00", "model_01"),
                                                   ("model_01", "model_02")]
    assert set(tests.metric) == {"metric_score", "stereo_score", "antistereo_score", "fill_mask_pass_rate"} - {
        m for m in ("antistereo_score",) if overall[overall.metric == m]["value"].isna().all()}
    # Holm over exactly the tests run (3 per metric), not over the 6 pairs of 4 models
    assert len(tests) == 3 * tests.metric.nunique()
    assert tests.p_holm.tolist() == pytest.approx(holm_by_hand(tests.p_value.tolist()), abs=1e-15)
    # the leaderboard's best and worst marks find their tests
    from biasflow.report.leaderboard import leaderboard

    board = leaderboard(plan, agg, tests)
    marks = board.loc[board.metric == "metric_score", "marks"].iloc[0]
    assert "not tested" not in marks and "best vs next" in marks
    assert board.loc[(board.metric == "metric_score") & board.worst, "model"].tolist() == ["model_02"]


def test_reference_design_tests_each_model_against_the_reference():
    plan, agg, per_item = synthetic_run(4, families=("crows_pairs",), n_items=200,
                                        stats={"paired": "reference", "paired_reference": "model_01"},
                                        stereo=STEREO.get)
    from biasflow.report.compare import design_notes, paired_tests

    tests = paired_tests(plan, agg, per_item)
    for metric, got in tests.groupby("metric"):
        assert list(zip(got.model_a, got.model_b)) == [("model_00", "model_01"), ("model_02", "model_01"),
                                                       ("model_03", "model_01")], metric
    assert tests.p_holm.tolist() == pytest.approx(holm_by_hand(tests.p_value.tolist()), abs=1e-15)
    # each pair's numbers are those of the same pair under all pairs
    every = paired_tests({**plan, "jobs": [{**j, "stats": {"n_boot": 40, "seed": 0, "level": 0.95}}
                                           for j in plan["jobs"]]}, agg, per_item)
    key = ["metric", "model_a", "model_b"]
    both = tests.merge(every.assign(model_a=every.model_b, model_b=every.model_a, diff=-every["diff"],
                                    ci_low=-every.ci_high, ci_high=-every.ci_low)
                       .pipe(lambda d: pd.concat([d, every])), on=key, suffixes=("", "_all"))
    assert len(both) == len(tests)
    for c in ("diff", "ci_low", "ci_high", "p_value"):
        assert np.allclose(both[c], both[c + "_all"], equal_nan=True), c
    notes = design_notes(plan, tests)
    assert "against the reference model_01" in notes[0] and f"over the {len(tests)} tests run" in notes[-1]
    # a reference that is no model of the run: no test, and the report says why
    plan["jobs"] = [{**j, "stats": {**j["stats"], "paired_reference": "nobody"}} for j in plan["jobs"]]
    assert paired_tests(plan, agg, per_item).empty
    assert "stats.paired_reference=nobody is not one of these models" in design_notes(plan, tests)[0]


# metric_score about 55, 25, 95, 48, 62, 40: distances to 50 of 5, 25, 45, 2, 12, 10
SIX = {0: 0.55, 1: 0.25, 2: 0.95, 3: 0.48, 4: 0.62, 5: 0.40}


def test_adjacent_and_reference_design_tests_both_each_pair_once():
    """``stats.paired_reference`` beside the adjacent design: each model against the next in each ranking and
    against the reference, a pair both name tested once, Holm over every test run; each pair's numbers are those it
    has under either design alone."""
    from statsmodels.stats.multitest import multipletests

    from biasflow.report.compare import design_notes, paired_tests

    reference = "model_01"
    plan, agg, per_item = synthetic_run(6, families=("crows_pairs",), n_items=200,
                                        stats={"paired": "adjacent", "paired_reference": reference}, stereo=SIX.get)
    tests = paired_tests(plan, agg, per_item)
    overall = agg[agg.category == "overall"]
    for metric, got in tests.groupby("metric"):
        goal = 100.0 if metric == "fill_mask_pass_rate" else 50.0
        v = overall[overall.metric == metric].set_index("model")["value"].dropna()
        ranked = list((v - goal).abs().sort_values(kind="stable").index)
        adjacent = {frozenset(p) for p in zip(ranked, ranked[1:])}
        to_reference = {frozenset((m, reference)) for m in ranked if m != reference}
        pairs = [frozenset(p) for p in zip(got.model_a, got.model_b)]
        assert len(pairs) == len(set(pairs)), metric  # each pair once
        assert set(pairs) == adjacent | to_reference, metric
        assert len(pairs) < len(adjacent) + len(to_reference)  # the reference's neighbours: named by both
    # Holm over everything tested, as statsmodels computes it
    assert tests.p_holm.tolist() == pytest.approx(multipletests(tests.p_value, method="holm")[1], abs=1e-15)
    assert tests.p_holm.tolist() == pytest.approx(holm_by_hand(tests.p_value.tolist()), abs=1e-15)
    # each pair's numbers are its numbers under the adjacent design and under the reference design
    for design in ({"paired": "adjacent"}, {"paired": "reference", "paired_reference": reference}):
        alone = paired_tests({**plan, "jobs": [{**j, "stats": {"n_boot": 40, "seed": 0, "level": 0.95, **design}}
                                               for j in plan["jobs"]]}, agg, per_item)
        # a pair either design names the other way round: its difference and CI with the opposite sign
        flipped = alone.assign(model_a=alone.model_b, model_b=alone.model_a, value_a=alone.value_b,
                               value_b=alone.value_a, diff=-alone["diff"], ci_low=-alone.ci_high, ci_high=-alone.ci_low)
        both = pd.concat([alone, flipped]).merge(tests, on=["metric", "model_a", "model_b"], suffixes=("", "_both"))
        assert len(both) == len(alone), design
        for c in ("value_a", "value_b", "diff", "ci_low", "ci_high", "p_value"):
            # (a flipped CI's quantiles agree to rounding)
            assert np.allclose(both[c], both[c + "_both"], rtol=0, atol=1e-12, equal_nan=True), (design, c)
    notes = design_notes(plan, tests)
    assert "and against the reference model_01, each pair once" in notes[0]
    assert f"over the {len(tests)} tests run" in notes[-1]


# ----------------------------------------------------------------------------------------------- 50 models
def test_a_model_lacking_items_changes_only_its_own_pairs():
    """Each pair is compared on the items its two models both have: a model whose table lacks items (an item the
    metric could not score for it) leaves the other pairs' values, CIs and p-values as in a run without it, and its
    own pairs' value, difference, CI, n_items and McNemar counts all come from the same items."""
    from biasflow.report.compare import paired_tests
    from biasflow.stats.paired import mcnemar_exact

    plan, agg, per_item = synthetic_run(4, families=("crows_pairs",), n_items=120, stats={"paired": "all_pairs"},
                                        stereo=STEREO.get)
    complete = paired_tests(plan, agg, per_item)
    lacking = per_item["model"].eq("model_02") & per_item["item_id"].isin([f"p{i}" for i in range(0, 120, 3)])
    short = per_item[~lacking].reset_index(drop=True)
    got = paired_tests(plan, agg, short)  # all_pairs: no ranking read
    key = ["model_a", "model_b", "metric"]
    others = got[(got.model_a != "model_02") & (got.model_b != "model_02")].set_index(key)
    want = complete.set_index(key).loc[others.index]
    assert len(others) == 3 * got.metric.nunique()
    pd.testing.assert_frame_equal(others.drop(columns=["p_holm", "significant"]),
                                  want.drop(columns=["p_holm", "significant"]), check_exact=True)
    assert (others["n_items"] == 120).all()
    mine = got[(got.model_a == "model_02") | (got.model_b == "model_02")]
    assert (mine["n_items"] == 80).all() and len(mine) == 3 * got.metric.nunique()
    pll = short[short.variant == "pll"].set_index("item_id")
    for r in mine[mine.metric == "metric_score"].itertuples():
        a = pll[pll.model == r.model_a]["stereo_preferred"]
        b = pll[pll.model == r.model_b]["stereo_preferred"]
        both = a.index.intersection(b.index)
        assert len(both) == 80
        # the value of each side is its rate on the shared items; the difference's sign follows McNemar's counts
        assert r.value_a == pytest.approx(100 * a.loc[both].mean()) and r.value_b == pytest.approx(
            100 * b.loc[both].mean())
        mc = mcnemar_exact(a.loc[both].to_numpy(), b.loc[both].to_numpy())
        assert (r.discordant_a, r.discordant_b, r.p_value) == (mc["b"], mc["c"], mc["p_value"])
        assert np.sign(r.diff) == np.sign(mc["b"] - mc["c"])


def test_values_the_same_distance_from_the_goal_tie():
    """A third and two thirds of the pairs (metric_score 33.33 and 66.67) are both 16.67 from 50 on paper, not in
    floats (16.666666666666664 and 16.66666666666667): they share a rank, and in the ranking the adjacent design
    tests and in the leaderboard's rows they come by model name."""
    from biasflow.report.compare import paired_tests, ranking
    from biasflow.report.leaderboard import leaderboard

    plan, agg, per_item = synthetic_run(3, families=("crows_pairs",), n_items=120, stats={"paired": "adjacent"},
                                        stereo=[2 / 3, 1 / 3, 0.45].__getitem__)
    # model_00 is 16.67 over 50, model_01 as far under it, and model_01 the smaller float: it came first before
    overall = agg[agg.category == "overall"]
    values = overall[overall.metric == "metric_score"].set_index("model")["value"]
    assert abs(values["model_00"] - 50) != abs(values["model_01"] - 50)  # the floats differ in their last bits
    order = dict(zip(overall["config_hash"], overall["model"]))
    assert [order[h] for h in ranking(overall, "metric_score")] == ["model_02", "model_00", "model_01"]
    board = leaderboard(plan, agg, paired_tests(plan, agg, per_item))
    ranks = board[board.metric == "metric_score"].set_index("model")["rank"]
    assert ranks.to_dict() == {"model_02": 1.0, "model_00": 2.0, "model_01": 2.0}
    assert list(dict.fromkeys(board["model"])) == ["model_02", "model_00", "model_01"]
    tests = paired_tests(plan, agg, per_item)
    got = tests[tests.metric == "metric_score"]
    assert list(zip(got.model_a, got.model_b)) == [("model_02", "model_00"), ("model_00", "model_01")]


def test_paired_tests_compute_under_the_runs_mode():
    """Under run.mode=corrected WinoBias' pass rate counts the kept examples only (parity: all): the paired tests'
    values are the leaderboard's, computed in the job's mode, not in the default one."""
    from biasflow.report.compare import paired_tests

    plan, agg, per_item = synthetic_run(3, families=("winobias",), n_items=60, mode="corrected")
    tests = paired_tests(plan, agg, per_item)
    overall = agg[agg.category == "overall"].set_index(["model", "metric"])["value"]
    assert len(tests)
    for r in tests.itertuples():
        assert (r.value_a, r.value_b) == (overall[(r.model_a, r.metric)], overall[(r.model_b, r.metric)]), r
    parity = synthetic_run(3, families=("winobias",), n_items=60)[1]
    assert not np.allclose(parity["value"].fillna(0), agg["value"].fillna(0))  # the mode changes these numbers


def scattered(m: int) -> float:
    """A stereotype share per model that spreads metric_score over 30-70 out of model order."""
    return 0.3 + 0.4 * ((m * 37) % 50) / 50


def shown_models(markdown: str) -> list[str]:
    return re.findall(r"^\| (model_\d\d) \|", markdown, flags=re.M)


def ends_of_each_ranking(board: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """Each ranked column's best and worst model, by leaderboard.csv's own distance to the unbiased value."""
    out = {}
    for metric, rows in board[board.distance.notna()].groupby("metric"):
        ranked = rows.sort_values("distance", kind="stable").model.tolist()
        out[metric] = (ranked[0], ranked[-1])
    return out


def test_fifty_models_report_shows_the_ends_of_each_ranking(tmp_path):
    from biasflow.report.tables import write_run_report

    plan, agg, per_item = synthetic_run(50, families=("crows_pairs",), n_items=40, n_boot=20, stereo=scattered)
    write_run_report(plan, agg, per_item, tmp_path)
    board = pd.read_csv(tmp_path / "leaderboard.csv")
    assert board.model.nunique() == 50  # the CSV holds every model
    tests = pd.read_csv(tmp_path / "paired_tests.csv")
    assert set(tests.groupby("metric").size()) <= {49}  # adjacent: each model against the next, per metric
    md = (tmp_path / "leaderboard.md").read_text()
    shown = shown_models(md)
    order = list(board.drop_duplicates("model").model)
    # the table's own order: its first and last 10 rows, in that order
    assert shown[:10] == order[:10] and shown[-10:] == order[-10:]
    # every ranked column's best and worst model is in view (the first column's ends alone left some out), and
    # this data has a column whose end is not among the first column's ends, so the check bites
    ends = ends_of_each_ranking(board)
    assert len(ends) >= 2
    assert all(best in shown and worst in shown for best, worst in ends.values()), ends
    assert any(m not in order[:10] + order[-10:] for pair in ends.values() for m in pair)
    # the rows left out are counted where they are, and every model is either shown or counted
    counted = [(int(a), int(b or a), int(n)) for n, a, b in re.findall(
        r"… (\d+) more models? not shown \(rows? (\d+)(?: to (\d+))? of 50 in this order\): "
        r"\[leaderboard.csv\]\(leaderboard.csv\)", md)]
    assert counted and len(shown) + sum(n for _, _, n in counted) == 50
    for first, last, n in counted:
        assert last - first + 1 == n and order[first - 2] in shown and order[last] in shown
    # a shown cell carries its rank in its column (leaderboard.csv's rank)
    best = ends["fill_mask_pass_rate"][0]
    assert re.search(rf"^\| {best} \|.* #1 \|$", md, flags=re.M)
    html = (tmp_path / "report.html").read_text()
    assert html.count('<a href="leaderboard.csv">leaderboard.csv</a> lists every model') == len(counted)
    assert "more models not shown" in html and "<script" not in html
    assert 'href="paired_tests.csv">paired_tests.csv</a> lists every test' in html
    assert "more than 20 models" in html and "Holm&#x27;s correction runs over the" in html
    # the provenance's table of models, a row each, folded (at 1,000 models it was a page of rows)
    provenance = html[html.index('<h2 id="provenance">'):]
    assert "<details><summary>All 50 models</summary>" in provenance
    # the per-model sections: the models the leaderboard shows
    report = (tmp_path / "report.md").read_text()
    assert sorted(re.findall(r"^## crows_pairs / (model_\d\d)", report, flags=re.M)) == sorted(shown)
    assert "the ends of each setting's ranking in every column" in report
    # the summary line names 12 models and counts the rest (at 1,000 models the names were a page of their own)
    summary = next(line for line in report.splitlines() if "· models: " in line)
    assert "models: model_00, model_01, " in summary and "model_12" not in summary
    assert "model_11 and 38 more (50 models: leaderboard.csv lists each)" in summary


def write_golden() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, table in report_tables(*synthetic_run(3)).items():
        if isinstance(table, str):
            (GOLDEN / name).write_text(table)
        else:
            table.reset_index(drop=True).to_parquet(GOLDEN / f"{name}.parquet", index=False)


if __name__ == "__main__":
    write_golden()


def test_a_reference_the_plan_lacks_or_does_not_use_is_refused_when_planning():
    """``stats.paired_reference`` naming no model of the plan left the report without tests and said only that it had
    none: refused when planning, naming the models, with the reference design or beside the adjacent one (where it
    adds each model against the reference)."""
    from biasflow.errors import ConfigError
    from biasflow.plan import build_plan
    from biasflow.report.leaderboard import hidden_text

    overrides = ["model=bert_base_uncased,roberta_base", "metric=[crows_pairs]"]
    with pytest.raises(ConfigError, match=r"stats.paired_reference='nosuch' is not a model of this plan; its models: "
                                          r"bert_base_uncased, roberta_base"):
        build_plan([*overrides, "stats.paired=reference", "stats.paired_reference=nosuch"], multirun=True)
    with pytest.raises(ConfigError, match=r"stats.paired_reference='nosuch' is not a model of this plan"):
        build_plan([*overrides, "stats.paired_reference=nosuch"], multirun=True)
    with pytest.raises(ConfigError, match=r"is read only with stats.paired=reference, adjacent or auto"):
        build_plan([*overrides, "stats.paired=all_pairs", "stats.paired_reference=roberta_base"], multirun=True)
    assert len(build_plan([*overrides, "stats.paired_reference=roberta_base"], multirun=True).jobs) == 2
    plan = build_plan([*overrides, "stats.paired=reference", "stats.paired_reference=roberta_base"], multirun=True)
    assert len(plan.jobs) == 2
    assert hidden_text(1, 21) == "… 1 more model not shown (row 11 of 21 in this order)"
    assert hidden_text(5, 25) == "… 5 more models not shown (rows 11 to 15 of 25 in this order)"
