"""Comparisons between the models of a run: paired tests on the same items and threshold curves.

Paired tests: for every metric family, jobs with the same setting (all options equal but the model) are compared
on each headline metric, in pairs the design chooses (``stats.paired``, ``paired_design``): every pair up to
``stats.all_pairs_up_to`` models, above that each model against the next in the metric's ranking (linear in the
models: 999 tests of a metric at 1,000 models instead of 499,500), or each against a reference model, or both (adjacent
pairs and each model against the reference, each pair once). The difference gets a paired bootstrap CI (``stats.paired.paired_bootstrap``,
re-running the family's own ``aggregate`` on one item resample shared by both models, or, where the metric declares
``exact_replicates``, its ``bootstrap_statistic`` on every replicate at once: the same numbers, bit for bit). Where a metric is the rate of a
per-item binary outcome (``MetricSpec.binary_outcomes``), the exact McNemar test gives the p-value; otherwise the bootstrap
p-value does. Holm's correction runs over every comparison the run made. A metric that the swept options do not change
(CrowS-Pairs ``metric_score`` in a ``diff_threshold`` sweep) is compared once, not once per setting.

Curves: when a family's jobs vary a numeric option, each headline metric that changes with it is drawn against it,
one line per model (and per value of any other varied option), with the CI as a band.
"""
from __future__ import annotations

import math
from itertools import combinations
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from biasflow.io import atomic_path
from biasflow.report.explain import stats_of
from biasflow.report.leaderboard import (SHOWN_AT_EACH_END, distance, goal, goals, headline_metrics, hidden_middle,
                                         hidden_text, ranked_index)
from biasflow.report.sweep import job_table, short_option
from biasflow.schema import StatsConfig
from biasflow.stats.paired import holm, mcnemar_exact, paired_bootstrap

PAIRED_COLUMNS = ["family", "benchmark", "setting", "metric", "model_a", "model_b", "value_a", "value_b", "diff",
                  "ci_low", "ci_high", "n_items", "test", "discordant_a", "discordant_b", "p_value", "p_holm",
                  "significant"]


def _binary_outcomes(family: str) -> Mapping[str, Callable[[pd.DataFrame], pd.Series]]:
    from biasflow.registry import METRICS, load_all

    load_all()
    spec = METRICS.get(family)
    return spec.binary_outcomes if spec is not None else {}


def _compared_metrics(family: str, present: set[str]) -> list[str]:
    # metrics with no ranking goal (p-values, pass/fail flags) are not differenced
    return [m for m in headline_metrics(family, present) if goal(m) is not None or m not in goals()]


def paired_design(stats: StatsConfig, n_models: int) -> str:
    """The design of the paired tests between ``n_models`` models of one metric and setting: ``stats.paired``, where
    ``auto`` is every pair up to ``stats.all_pairs_up_to`` models and adjacent models in each ranking above; adjacent
    with a ``stats.paired_reference`` is ``adjacent+reference`` (both kinds of pair)."""
    design = stats.paired
    if design == "auto":
        design = "all_pairs" if n_models <= stats.all_pairs_up_to else "adjacent"
    return "adjacent+reference" if design == "adjacent" and stats.paired_reference else design


def _comparison_groups(plan: Mapping[str, Any]):
    """(family, setting_key, its jobs, design) of every metric family and setting with two or more models whose
    metric is bootstrapped: the groups the paired tests compare within."""
    from biasflow.registry import get_metric

    stats = stats_of(plan)
    for (family, key), group in job_table(plan).groupby(["family", "setting_key"], sort=True):
        n_models = group["model_key"].nunique()
        if n_models >= 2 and get_metric(family).bootstrap:
            yield family, key, group, paired_design(stats, n_models)


def ranking(rows: pd.DataFrame, metric: str) -> list[str]:
    """The ``config_hash`` of ``rows`` (overall aggregate rows) in the leaderboard's order for ``metric``: closest to
    its unbiased value first, ties by model name (``leaderboard.ranked_index``, as the leaderboard's rows and marks); a
    metric without a goal by value, highest first. Rows without a value are not ranked."""
    g = goal(metric)
    one = rows[rows["metric"] == metric].drop_duplicates("config_hash")
    one = one.assign(distance=[distance(v, g if g is not None else "max") for v in one["value"]])
    one = one[one["distance"].notna()]
    return list(one.loc[ranked_index(one), "config_hash"])


def _design_pairs(design: str, group: pd.DataFrame, overall: pd.DataFrame, metrics: list[str],
                  reference: str | None) -> list[tuple[str, str, str]] | None:
    """(model_a, model_b, metric) to test; None: every pair of models on every metric."""
    if design == "all_pairs":
        return None
    if design == "reference":
        return [(m, reference, metric) for metric in metrics for m in group["model"] if m != reference]
    label = dict(zip(group["config_hash"], group["model"]))
    rows = overall[overall["config_hash"].isin(group["config_hash"])]
    with_reference = design == "adjacent+reference" and reference in set(group["model"])
    pairs = []
    for metric in metrics:  # each model against the next one in this metric's ranking
        ranked = [label[h] for h in ranking(rows, metric)]
        adjacent = [(i, (a, b, metric)) for i, (a, b) in enumerate(zip(ranked, ranked[1:]))]
        if not with_reference:
            pairs += [pair for _, pair in adjacent]
            continue
        # and each against the reference, a pair the adjacent ones hold tested once; in the ranking's order (a pair
        # at its better-ranked model's place), so a long table's first and last tests are the ranking's two ends
        tested = {frozenset(pair[:2]) for _, pair in adjacent}
        to_reference = [(i, (m, reference, metric)) for i, m in enumerate(ranked)
                        if m != reference and frozenset((m, reference)) not in tested]
        pairs += [pair for _, _, pair in sorted([(i, 0, p) for i, p in adjacent] + [(i, 1, p) for i, p in to_reference],
                                                key=lambda x: x[:2])]
    return pairs


def _mcnemar(a: pd.Series, b: pd.Series) -> dict[str, float]:
    """McNemar's test of two models' per-item outcomes on the items both have."""
    if not a.index.equals(b.index):
        both = a.index.intersection(b.index)
        a, b = a.loc[both], b.loc[both]
    return mcnemar_exact(a.to_numpy(), b.to_numpy())


def _pairs_on_shared_items(tables: Mapping[str, pd.DataFrame], aggregates: Mapping[str, Any],
                           statistics: Mapping[str, Any], metrics: list[str],
                           pairs: list[tuple[str, str, str]] | None, bootstrap: Mapping[str, Any]) -> pd.DataFrame:
    """``paired_bootstrap`` of ``pairs`` (None: every pair), each pair on the items its two models both have: a model
    lacking items changes only its own pairs (as McNemar's counts, ``_mcnemar``). Models with the same items share
    one call (their draws and replicates computed once, as when every model has every item, the usual case)."""
    models = list(tables)
    if pairs is None:
        pairs = [(a, b, metric) for a, b in combinations(models, 2) for metric in metrics]
    item_sets: dict[frozenset, int] = {}  # each distinct set of items once (compared by hash, not item by item)
    items = {m: item_sets.setdefault(frozenset(tables[m]["item_id"]), len(item_sets)) for m in models}
    groups: dict[Any, list[tuple[str, str, str]]] = {}
    for pair in pairs:
        a, b = pair[0], pair[1]
        groups.setdefault(items[a] if items[a] == items[b] else (a, b), []).append(pair)
    if len(groups) <= 1:
        return paired_bootstrap(tables, aggregates, metrics, statistic=statistics, pairs=pairs, **bootstrap)
    frames = []
    for key, group_pairs in groups.items():
        members = [m for m in models if items[m] == key] if isinstance(key, int) else list(key)
        frames.append(paired_bootstrap({m: tables[m] for m in members}, aggregates, metrics, pairs=group_pairs,
                                       statistic={m: statistics[m] for m in members}, **bootstrap))
    out = pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)
    order = {pair: i for i, pair in enumerate(pairs)}  # the design's order, as one call gives it
    return out.iloc[np.argsort([order[t] for t in zip(out["model_a"], out["model_b"], out["metric"])],
                             kind="stable")].reset_index(drop=True)


def job_rows(table: pd.DataFrame) -> dict[str, slice | np.ndarray]:
    """Each job's rows of a run table (by ``config_hash``): a slice where they are contiguous, as the aggregate
    stage concatenates the jobs' files. Why: a text column of that table is one Arrow chunk per job, and a selection
    by positions walks every chunk (once per model, the square of the models), where a slice takes one."""
    if table.empty:
        return {}
    return {h: slice(at[0], at[-1] + 1) if at[-1] - at[0] + 1 == len(at) else at
            for h, at in table.groupby("config_hash", sort=False).indices.items()}


def paired_tests(plan: Mapping[str, Any], agg: pd.DataFrame, per_item: pd.DataFrame) -> pd.DataFrame:
    from biasflow.registry import get_metric, metric_options_from

    stats = stats_of(plan)
    n_boot, seed, level = stats.n_boot, stats.seed, stats.level
    overall = agg[agg["category"] == "overall"]
    rows_of = None  # found once, where two models are compared (a run of one model may have no per-item rows)
    frames = []
    for family, _, group, design in _comparison_groups(plan):
        spec = get_metric(family)
        metrics = _compared_metrics(family, set(overall.loc[overall.config_hash.isin(group.config_hash), "metric"]))
        if not metrics:
            continue
        if design == "reference" and stats.paired_reference not in set(group["model"]):
            continue  # the reference model is not among this setting's models (design_notes says so)
        rows_of = job_rows(per_item) if rows_of is None else rows_of
        tables, aggregates, statistics = {}, {}, {}
        fast = spec.bootstrap_statistic if spec.exact_replicates else None
        for job in group.itertuples(index=False):
            tables[job.model] = per_item.iloc[rows_of.get(job.config_hash, [])]
            # built once per job as the metric stage builds them, in the job's run.mode (a mode changes what some
            # options default to: WinoBias' pass-rate denominator)
            options = metric_options_from(family, job.cfg, mode=job.mode or None)
            aggregates[job.model] = lambda df, agg=spec.aggregate, cfg=options: agg(df, cfg)
            # every replicate at once where the metric's array path is exact: the same numbers, in seconds
            statistics[job.model] = (lambda df, r, st=fast, cfg=options: st(df, cfg, r)) if fast else None
        pairs = _design_pairs(design, group, overall, metrics, stats.paired_reference)
        res = _pairs_on_shared_items(tables, aggregates, statistics, metrics, pairs,
                                     dict(n_boot=n_boot, seed=seed, level=level))
        if res.empty:  # no item in common
            continue
        res.insert(0, "family", family)
        res.insert(1, "benchmark", group["benchmark"].iloc[0])
        res.insert(2, "setting", group["setting"].iloc[0])
        tests, outcomes = [], {}
        for r in res.itertuples(index=False):
            outcome = _binary_outcomes(family).get(r.metric)
            if outcome is None:
                tests.append({"test": "paired bootstrap", "discordant_a": np.nan, "discordant_b": np.nan,
                              "p_value": r.p_boot})
                continue
            for m in (r.model_a, r.model_b):  # each model's outcomes once, however many tests it is in
                if (m, r.metric) not in outcomes:
                    outcomes[(m, r.metric)] = outcome(tables[m])
            mc = _mcnemar(outcomes[(r.model_a, r.metric)], outcomes[(r.model_b, r.metric)])
            tests.append({"test": "McNemar exact", "discordant_a": mc["b"], "discordant_b": mc["c"],
                          "p_value": mc["p_value"]})
        frames.append(pd.concat([res.reset_index(drop=True), pd.DataFrame(tests)], axis=1))
    if not frames:
        return pd.DataFrame(columns=PAIRED_COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    # a metric the sweep does not change is the same comparison in every setting: keep it once
    key = out[["family", "model_a", "model_b", "metric", "value_a", "value_b"]].round(12).astype(str).apply(
        tuple, axis=1)
    settings = out.groupby("family")["setting"].transform("nunique")
    times = key.map(key.value_counts())
    out.loc[(times > 1) & (times == settings), "setting"] = "(every setting)"
    out.loc[(times > 1) & (times < settings), "setting"] += " (and others)"
    out = out[~key.duplicated(keep="first")]
    # a metric one of the two models has no value for (an undefined score) is no comparison: not a "no"
    out = out[out["diff"].notna()].reset_index(drop=True)
    if out.empty:
        return pd.DataFrame(columns=PAIRED_COLUMNS)
    out["p_holm"] = holm(out["p_value"].to_numpy())
    out["significant"] = out["p_holm"] < (1.0 - level)
    return out[PAIRED_COLUMNS]


def design_notes(plan: Mapping[str, Any], tests: pd.DataFrame) -> list[str]:
    """What the report says of the paired design where it is not every pair (nothing otherwise, so a run of a few
    models reads as it always did): which metrics and settings, how many models, the tests run instead of every pair,
    how to choose another design."""
    stats = stats_of(plan)
    notes = []
    for family, _, group, design in _comparison_groups(plan):
        if design == "all_pairs":
            continue
        n = group["model_key"].nunique()
        setting = group["setting"].iloc[0]
        where = f"{family}" + (f" ({setting})" if setting else "") + f", {n:,} models"
        if design == "reference":
            if stats.paired_reference not in set(group["model"]):
                notes.append(f"{where}: not tested (stats.paired=reference, and stats.paired_reference="
                             f"{stats.paired_reference} is not one of these models).")
                continue
            how = f"each model against the reference {stats.paired_reference} (stats.paired=reference)"
        elif design == "adjacent+reference":
            why = (f"stats.paired=auto: more than {stats.all_pairs_up_to} models" if stats.paired == "auto"
                   else "stats.paired=adjacent")
            there = stats.paired_reference in set(group["model"])
            how = ("each model against the next in the ranking of each headline metric, which holds the "
                   "leaderboard's best vs runner-up and worst vs the one above, "
                   + (f"and against the reference {stats.paired_reference}, each pair once" if there else
                      f"not against the reference {stats.paired_reference}, which is not one of these models")
                   + f" ({why}; stats.paired_reference={stats.paired_reference})")
            notes.append(f"{where}: {how}; at most {max(2 * n - 3, n - 1) if there else n - 1:,} tests per metric "
                         f"instead of {n * (n - 1) // 2:,} pairs.")
            continue
        else:
            why = (f"stats.paired=auto: more than {stats.all_pairs_up_to} models" if stats.paired == "auto"
                   else "stats.paired=adjacent")
            how = (f"each model against the next in the ranking of each headline metric ({why}), which holds the "
                   "leaderboard's best vs runner-up and worst vs the one above")
        notes.append(f"{where}: {how}; at most {n - 1:,} tests per metric instead of {n * (n - 1) // 2:,} pairs.")
    if notes:
        notes.append(f"Holm's correction runs over the {len(tests):,} tests run. Every pair: "
                     "stats.paired=all_pairs; each model against one: stats.paired=reference "
                     "stats.paired_reference=<model>; the adjacent pairs and each model against one: "
                     "stats.paired_reference=<model> alone.")
    return notes


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(v)
    return f"{v:.{digits}f}"


def p_text(p: float) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return ""
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def paired_rows(tests: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the paired-test table (Markdown and HTML share them)."""
    with_setting = bool((tests["setting"] != "").any())
    head = ["family"] + (["setting"] if with_setting else []) + ["metric", "A", "B", "A - B [95% CI]", "n",
                                                                 "test", "b / c", "p", "p (Holm)", "significant"]
    rows = []
    for r in tests.itertuples(index=False):
        diff = f"{_fmt(r.diff)} [{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]" if _fmt(r.ci_low) else _fmt(r.diff)
        bc = f"{int(r.discordant_a)} / {int(r.discordant_b)}" if not pd.isna(r.discordant_a) else "–"
        rows.append([r.family] + ([r.setting] if with_setting else []) + [
            r.metric, f"{r.model_a} ({_fmt(r.value_a)})", f"{r.model_b} ({_fmt(r.value_b)})", diff,
            str(r.n_items), r.test, bc, p_text(r.p_value), p_text(r.p_holm),
            "" if pd.isna(r.p_holm) else "yes" if r.significant else "no"])
    return head, rows


PAIRED_LEGEND = ("A - B: difference of the metric with a paired bootstrap CI (items resampled once for both "
                 "models). b / c: items where only A / only B has the outcome (McNemar's discordant pairs; – where "
                 "the test is the bootstrap's, which has none). "
                 "p: exact McNemar test where the metric is a rate of a per-item binary outcome, otherwise the "
                 "two-sided bootstrap p-value; Holm's correction over every comparison of the run.")


def shown_tests(tests: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str]]:
    """The tests the report's tables show: of each family, setting and metric that compares more than
    2 x SHOWN_AT_EACH_END models, the first and last SHOWN_AT_EACH_END tests (under the adjacent design, the two
    ends of the ranking), and the line standing for the others, by the position it takes among the shown rows."""
    blocks = list(tests.groupby(["family", "setting", "metric"], sort=False).indices.values())
    models = lambda at: len(set(tests["model_a"].iloc[at]) | set(tests["model_b"].iloc[at]))  # noqa: E731
    cut = [hidden_middle(len(at)) if models(at) > 2 * SHOWN_AT_EACH_END else range(0) for at in blocks]
    if not any(cut):
        return tests, {}
    keep: list[int] = []
    gaps: dict[int, str] = {}
    for at, gap in zip(blocks, cut):
        if gap:
            keep += list(at[:gap.start])
            gaps[len(keep) + len(gaps)] = hidden_text(len(gap), len(at), "tests of this metric")
            keep += list(at[gap.stop:])
        else:
            keep += list(at)
    return tests.iloc[keep], gaps


def with_gaps(items: list, fillers: Mapping[int, Any]) -> list:
    """``items`` with each filler at its position (``shown_tests``' gaps: where a table's left-out rows are
    counted)."""
    out = list(items)
    for position in sorted(fillers):
        out.insert(position, fillers[position])
    return out


def paired_markdown(tests: pd.DataFrame, design: Sequence[str] = ()) -> str:
    """The paired-test table (its longest blocks cut to their ends, ``shown_tests``), after the ``design`` notes."""
    if tests.empty:
        return ""
    shown, gaps = shown_tests(tests)
    head, rows = paired_rows(shown)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += with_gaps(["| " + " | ".join(r) + " |" for r in rows], {
        i: f"| {text}: [paired_tests.csv](paired_tests.csv) lists every test |" + " |" * (len(head) - 1)
        for i, text in gaps.items()})
    return "".join(n + "\n\n" for n in design) + PAIRED_LEGEND + "\n\n" + "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- threshold curves
CURVE_COLUMNS = ["family", "option", "x", "line", "model", "metric", "value", "ci_low", "ci_high", "n", "config_hash"]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _swept_numbers(plan: Mapping[str, Any], agg: pd.DataFrame):
    """(family, option, its values, points of every headline metric against it) for each numeric option a family's
    jobs vary."""
    jobs = job_table(plan)
    overall = agg[agg["category"] == "overall"]
    rows_of = overall.groupby("config_hash", sort=False).indices
    for family, fjobs in jobs.groupby("family", sort=True):
        varied = sorted({k for o in fjobs["options"] for k in o})
        for option in varied:
            values = [o.get(option) for o in fjobs["options"]]
            if not all(_is_number(v) for v in values) or len(set(values)) < 2:
                continue
            others = [k for k in varied if k != option]
            pts = []
            for job in fjobs.itertuples(index=False):
                extra = ", ".join(f"{short_option(k, varied)}={job.options.get(k)}" for k in others)
                line = job.model + (f" ({extra})" if extra else "")
                rows = overall.iloc[rows_of.get(job.config_hash, [])]
                pts.append(rows.assign(family=family, option=short_option(option, varied),
                                       x=float(job.options[option]), line=line, model=job.model))
            df = pd.concat(pts, ignore_index=True)
            yield family, short_option(option, varied), sorted(set(values)), \
                df[df["metric"].isin(headline_metrics(family, set(df["metric"])))]


def _moving(df: pd.DataFrame) -> list[str]:
    """The metrics of ``df`` whose value changes along the option for at least one line."""
    moving = df.groupby(["metric", "line"])["value"].nunique(dropna=True).groupby("metric").max()
    return list(moving[moving > 1].index)


def threshold_curves(plan: Mapping[str, Any], agg: pd.DataFrame) -> pd.DataFrame:
    """Points of every curve: a headline metric (overall) against a numeric option the run sweeps."""
    frames = []
    for _, _, _, df in _swept_numbers(plan, agg):
        df = df[df["metric"].isin(_moving(df))]  # only metrics the option changes for at least one line
        frames.append(df.sort_values(["metric", "line", "x"]))
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    return out[CURVE_COLUMNS]


def unchanged_sweeps(plan: Mapping[str, Any], agg: pd.DataFrame) -> list[str]:
    """A note per numeric option a family sweeps that changed none of its headline numbers (so it has no curve,
    and curves.csv may be empty): the option, its values and the metrics it left alone."""
    notes = []
    for family, option, values, df in _swept_numbers(plan, agg):
        if _moving(df):
            continue
        metrics = list(pd.unique(df["metric"]))
        notes.append(f"{family}: {option} was swept ({', '.join(f'{v:g}' for v in values)}) but changed none of "
                     f"its headline numbers ({', '.join(metrics) or 'none computed'}) for any model: no curve.")
    return notes


def curve_plot(points: pd.DataFrame, path, title: str, reference: float | None = None) -> None:
    """One metric against one option: a line per model with its CI as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for line, df in points.groupby("line", sort=True):
        df = df.sort_values("x")
        (drawn,) = ax.plot(df["x"], df["value"], marker="o", label=line)
        if df["ci_low"].notna().any():
            ax.fill_between(df["x"], df["ci_low"], df["ci_high"], color=drawn.get_color(), alpha=0.18, lw=0)
    xs = np.sort(points["x"].unique())
    if len(xs) > 2 and xs[0] > 0 and xs[-1] / xs[0] >= 10:  # thresholds spread over orders of magnitude
        ax.set_xscale("log")
    if reference is not None:
        ax.axhline(reference, color="red", lw=1, ls="--", label=f"unbiased = {reference:g}")
    option, metric = points["option"].iloc[0], points["metric"].iloc[0]
    ax.set_xlabel(option)
    ax.set_ylabel(f"{metric} (95% bootstrap CI)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_curve_plots(curves: pd.DataFrame, plots_dir) -> list[tuple[str, str]]:
    """A PNG per (family, option, metric); returns [(title, file name)]."""
    from pathlib import Path

    written = []
    for (family, option, metric), df in curves.groupby(["family", "option", "metric"], sort=True):
        name = f"curve__{family}__{option}__{metric}.png".replace("/", "_")
        g = goal(metric)
        title = f"{family}: {metric} vs {option}"
        curve_plot(df, Path(plots_dir) / name, title, reference=g if isinstance(g, float) else None)
        written.append((title, name))
    return written
