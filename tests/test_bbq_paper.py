"""The BBQ paper preset (conf/experiment/bbq_parrish2022.yaml): its published numbers are keyed as our metric stage
reports them (every category and context condition of the paper's Figures 3 and 5), and a run on a predictions file
standing in for a published model fills that model's row of the paper table with our values, CIs and deltas.

Where a checkout of nyu-mll/BBQ is at hand (``BIASFLOW_BBQ_REPO``), the authors' own UnifiedQA predictions are
scored and compared with the preset's numbers (the check the preset's header records)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasflow.data.bbq import load
from biasflow.metrics.bbq import METRICS_OUT, SPEC, parse_choice
from biasflow.plan import compose
from biasflow.report.published import published_rows
from conftest import mirrored_files

PRESET = "bbq_parrish2022"
RACE = "unifiedqa-t5-11b-race"


@pytest.fixture(scope="module")
def bbq_files() -> dict[str, Path]:
    return mirrored_files("bbq", "bbq")


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return published_rows(compose([f"+experiment={PRESET}"])["experiment"])


def test_the_preset_publishes_both_figures_for_every_model_category_and_context(published, bbq_files):
    # six models x (bias, accuracy) x 11 reported categories x (ambiguous, disambiguated)
    assert len(published) == 6 * 2 * 11 * 2
    assert set(published.metric) == {"bbq_bias_ambig", "bbq_bias_disambig", "bbq_accuracy_ambig",
                                     "bbq_accuracy_disambig"} <= set(METRICS_OUT)
    assert published.groupby("model").size().eq(44).all() and published.model.nunique() == 6
    # every published category is one that metric bbq (parity) reports: the 9 non-intersectional categories and
    # the name-proxy examples of Gender_identity and Race_ethnicity apart
    items = load(bbq_files, {"categories": None, "limit": None, "split": "all"})
    reported = {f"{c} (names)" if t == "name" else c for c, t in zip(items.category, items.label_type)}
    assert set(published.category) <= reported
    assert set(published.category) == reported - {"Race_x_SES", "Race_x_gender", "Race_x_SES (names)",
                                                   "Race_x_gender (names)"}
    assert published.published.between(-100, 100).all()
    # accuracy in percent, bias in percent (points): a few cells as printed (Figure 3 Age row, Figure 5 Age row)
    cell = published.set_index(["model", "metric", "category"]).published
    assert cell[("roberta-base-race", "bbq_bias_ambig", "Age")] == 6.3
    assert cell[(RACE, "bbq_bias_ambig", "Physical_appearance")] == 40.9
    assert cell[(RACE, "bbq_accuracy_disambig", "Age")] == 93.5


def run_job(overrides: list[str], tmp_path: Path, raw: dict) -> Path:
    """prepare, score, metric of the plan's one job, then the run's report; returns the run folder."""
    from biasflow import stages
    from biasflow.plan import build_plan

    plan = build_plan(overrides)
    (job,) = plan.jobs
    items = Path(job.items_path)
    stages.prepare(job.benchmark, job.benchmark_cfg, {k: str(v) for k, v in raw.items()}, str(items))
    scores = job.scores_path()
    stages.score(job.score_params(), str(items), scores, str(tmp_path / "cache"))
    stages.metric(job.params(), str(items), scores, job.metric_dir)
    plan_path = plan.write(str(tmp_path / "plan.json"))
    out = tmp_path / "run"
    stages.aggregate_run(plan_path, str(out))
    return out


def test_a_predictions_file_fills_its_models_row_of_the_paper_table(published, bbq_files, tmp_path):
    """The published model's answers, made elsewhere, under the model name of its published entry: the paper table
    shows our value [CI] and ours - paper beside each of its numbers, and '–' for the models not in the run."""
    items = load(bbq_files, {"categories": None, "limit": 330, "split": "all"})
    rng = np.random.default_rng(3)
    preds = pd.DataFrame({"example_id": items.example_id, "category": items.category,
                          "answer": rng.integers(0, 3, len(items))})
    path = tmp_path / "unifiedqa_race.csv"
    preds.to_csv(path, index=False)
    out = run_job([f"+experiment={PRESET}", f"model.name={RACE}", f"metric.bbq.predictions_file={path}",
                   "benchmark.bbq.limit=330", "stats.n_boot=40", f"paths.results={tmp_path / 'results'}",
                   "tracking.enabled=false"], tmp_path, bbq_files)
    agg = pd.read_parquet(out / "aggregate.parquet")
    assert set(agg.model) == {RACE}
    ours = agg.set_index(["metric", "category"])
    comparison = pd.read_csv(out / "comparison.csv")
    md = (out / "paper_tables.md").read_text()
    assert f"### {PRESET}" in md
    # the first 30 examples of each category hold no name-proxy examples: those published numbers stay unmatched
    race_rows = published[(published.model == RACE) & published.category.isin(set(agg.category))]
    assert len(race_rows) == 44 - 8
    assert f"{len(race_rows)} of {len(published)} published numbers have a counterpart" in md
    lines = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): line
             for line in md.splitlines() if line.startswith("| ")}
    hub = race_rows.hub_id.iloc[0]
    for r in race_rows.itertuples(index=False):
        group, column = r.metric.rsplit("_", 1)
        line = lines[(hub, group, r.category)]
        value = ours.loc[(r.metric, r.category)]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        at = 3 + 3 * ["ambig", "disambig"].index(column)
        assert cells[at] == f"{r.published:.2f}"
        assert cells[at + 1] == f"{value.value:.2f} [{value.ci_low:.2f}, {value.ci_high:.2f}]"
        assert cells[at + 2].split()[0] == f"{value.value - r.published:+.2f}"
    other = published[published.model != RACE].iloc[0]
    cells = [c.strip() for c in lines[(other.hub_id, "bbq_bias", other.category)].strip().strip("|").split("|")]
    assert cells[4] == "–" and cells[5] == "–"
    assert comparison.ours.notna().sum() == len(race_rows) and len(comparison) == len(published)
    assert set(comparison.loc[comparison.ours.isna() & (comparison.model == RACE), "category"]) == {
        "Gender_identity (names)", "Race_ethnicity (names)"}


AUTHORS_CATEGORIES = ("Age", "Disability_status", "Nationality", "Religion", "Sexual_orientation")


@pytest.mark.skipif(not os.environ.get("BIASFLOW_BBQ_REPO"),
                    reason="set BIASFLOW_BBQ_REPO to a checkout of nyu-mll/BBQ (results/UnifiedQA/preds_*.jsonl)")
@pytest.mark.parametrize("fmt", ["race", "arc"])
def test_the_authors_unifiedqa_predictions_give_the_published_numbers(fmt, published, bbq_files, tmp_path):
    """The authors' UnifiedQA 11B predictions (results/UnifiedQA, outside Git LFS for these categories), matched to
    the answers by parse_choice's text rule, scored by metric bbq (parity): every Figure 3 / Figure 5 number of the
    five categories whose data has not changed since, to the printed decimal."""
    repo = Path(os.environ["BIASFLOW_BBQ_REPO"])
    rows = []
    for category in AUTHORS_CATEGORIES:
        with open(repo / "results" / "UnifiedQA" / f"preds_{category}.jsonl", encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                choice = parse_choice(r[f"unifiedqa-t5-11b_pred_{fmt}"], [r["ans0"], r["ans1"], r["ans2"]])
                rows.append({"example_id": r["example_id"], "category": r["category"],
                             "answer": -1 if choice is None else choice})
    path = tmp_path / "preds.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    items = load(bbq_files, {"categories": list(AUTHORS_CATEGORIES), "limit": None, "split": "all"})
    cfg = {"definition": "parity", "predictions_file": str(path)}
    agg = SPEC.aggregate(SPEC.compute(items, pd.DataFrame(columns=["key"]), cfg), cfg)
    ours = agg.set_index(["metric", "category"]).value
    mine = published[(published.model == f"unifiedqa-t5-11b-{fmt}") & published.category.isin(AUTHORS_CATEGORIES)]
    assert len(mine) == 20
    for r in mine.itertuples(index=False):
        assert round(ours[(r.metric, r.category)], 1) == pytest.approx(r.published, abs=1e-9), (r.metric, r.category)
