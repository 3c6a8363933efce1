"""The run's leaderboard: models x headline metrics per metric family, each cell value [CI], with the unbiased value.

Rows are sorted by the family's first rankable headline metric, closest to its unbiased value first; in every column
with two or more values the best (closest) and the worst (farthest) are marked, but only where the run's paired test
(``report.compare.paired_tests``, Holm-corrected) finds the best different from the runner-up (the worst from the one
before it): a mark on a difference the test cannot tell from noise would be read as a finding. Each column says which
(``marks``: the p-values, "no significant difference", or "not tested"). ``goals()`` (each metric's
``MetricSpec.goals``) says what "unbiased" (or "better", for quality metrics) means for each headline metric: a
number to be close to, ``max`` or ``min``, or None (shown but not ranked, e.g. p-values).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from biasflow.io import atomic_path
from biasflow.report.sweep import job_table

def goals() -> dict[str, float | str | None]:
    """What "unbiased" (or "better") is for each metric name, from the metrics' declarations
    (``MetricSpec.goals``); a name two families declare must have one goal (tests/test_metric_contract.py)."""
    from biasflow.registry import METRICS, load_all

    load_all()
    key = tuple((name, id(spec)) for name, spec in METRICS.items())
    if _GOALS.get("key") != key:
        merged: dict[str, float | str | None] = {}
        for spec in METRICS.values():
            merged.update(spec.goals)
        _GOALS.update(key=key, goals=merged)
    return _GOALS["goals"]


_GOALS: dict[str, Any] = {}  # the merged goals and the registry they were merged from


COLUMNS = ["family", "definition", "benchmark", "model", "model_key", "setting", "config_hash", "metric", "goal",
           "value", "ci_low", "ci_high", "n", "note", "distance", "rank", "best", "worst", "marks"]


def goal(metric: str) -> float | str | None:
    """The goal of ``metric`` (exact names first, then patterns, matched with fnmatch); None: not ranked."""
    from biasflow.report.explain import by_metric_name

    return by_metric_name(goals(), metric)


def distance(value: float, g: float | str | None) -> float:
    """How far from the goal (smaller is better); NaN when the metric is not ranked or the value is missing."""
    if g is None or value is None or (isinstance(value, float) and math.isnan(value)):
        return float("nan")
    if g == "max":
        return -float(value)
    if g == "min":
        return float(value)
    return abs(float(value) - float(g))


def tie_key(distances: pd.Series) -> pd.Series:
    """``distances`` to 12 significant digits, what rankings sort by: two values the same distance from the goal in
    exact arithmetic (0.69444444444444 above and below it) tie, as on paper, instead of ranking by a float sum's
    last bits (which would choose the pairs an adjacent design tests)."""
    return distances.map(lambda d: float(f"{d:.12g}") if pd.notna(d) else np.nan).astype(float)


def ranked_index(rows: pd.DataFrame) -> pd.Index:
    """The index of ``rows`` (one metric's rows of one setting, ``distance`` not NaN, a ``model`` column) best first:
    by ``tie_key`` of the distance, ties by model name (the leaderboard's row order, its marks and the adjacent
    design's pairs all follow it)."""
    return rows.assign(_tie=tie_key(rows["distance"])).sort_values(["_tie", "model"], kind="stable").index


def goal_text(g: float | str | None) -> str:
    if g is None:
        return ""
    if g == "max":
        return "higher"
    if g == "min":
        return "lower"
    return f"{g:g}"


def headline_metrics(family: str, present: set[str]) -> list[str]:
    from biasflow.registry import get_metric

    return [m for m in get_metric(family).headline if m in present]


def _option_order(options: Mapping[str, Any]) -> tuple:
    """Sort key of a setting: its option values, numbers numerically."""
    return tuple((0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, str(v))
                 for _, v in sorted(options.items()))


def _paired_p(tests: pd.DataFrame | None, family: str, metric: str, a: pd.Series, b: pd.Series) -> float | None:
    """Holm-adjusted p-value of the paired test between the rows ``a`` and ``b`` (same family, metric and setting);
    None when the run has no such test. A test kept once for every setting is found by its values."""
    if tests is None or tests.empty:
        return None
    t = tests[(tests["family"] == family) & (tests["metric"] == metric)]
    for x, y in ((a, b), (b, a)):
        hit = t[(t["model_a"] == x["model"]) & (t["model_b"] == y["model"])
                & np.isclose(t["value_a"].astype(float), float(x["value"]), rtol=0, atol=1e-9)
                & np.isclose(t["value_b"].astype(float), float(y["value"]), rtol=0, atol=1e-9)]
        if len(hit):
            return float(hit["p_holm"].iloc[0])
    return None


def _significance_marks(df: pd.DataFrame, family: str, tests: pd.DataFrame | None, alpha: float) -> pd.DataFrame:
    """``best`` / ``worst`` only where the paired test separates them from their neighbour; ``marks`` says why."""
    df = df.assign(best=False, worst=False, marks="")
    for _, g in df.groupby(["setting_key", "metric"], sort=False):
        ranked = g[g["distance"].notna()]
        ranked = ranked.loc[ranked_index(ranked)]
        ends = tie_key(ranked["distance"]).iloc[[0, -1]] if len(ranked) else None
        if len(ranked) < 2 or ends.iloc[0] == ends.iloc[1]:
            continue
        metric = ranked["metric"].iloc[0]
        p_best = _paired_p(tests, family, metric, ranked.iloc[0], ranked.iloc[1])
        p_worst = _paired_p(tests, family, metric, ranked.iloc[-1], ranked.iloc[-2])
        if p_best is None and p_worst is None:
            tested = tests is not None and bool(((tests["family"] == family) & (tests["metric"] == metric)).any())
            note = ("not tested (the run's paired design has no test between these models)" if tested
                    else "not tested (no paired test of this metric)")
        else:
            best_ok = p_best is not None and p_best < alpha
            worst_ok = p_worst is not None and p_worst < alpha
            df.loc[ranked.index[:1], "best"] = best_ok
            df.loc[ranked.index[-1:], "worst"] = worst_ok
            if len(ranked) == 2:
                note = (f"significant ({_p_phrase(p_best)})" if best_ok
                        else f"no significant difference ({_p_phrase(p_best)})")
            elif not best_ok and not worst_ok:
                note = (f"no significant difference at either end (best vs next: {_p_phrase(p_best)}; worst vs "
                        f"previous: {_p_phrase(p_worst)})")
            else:
                note = (f"best vs next: {'significant' if best_ok else 'not significant'} ("
                        f"{_p_phrase(p_best)}); worst vs previous: {'significant' if worst_ok else 'not significant'} "
                        f"({_p_phrase(p_worst)})")
        df.loc[g.index, "marks"] = note
    return df


def _p_phrase(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "not tested"
    return f"p Holm = {p:.2g}" if p >= 1e-4 else f"p Holm = {p:.1e}"


def leaderboard(plan: Mapping[str, Any], agg: pd.DataFrame, tests: pd.DataFrame | None = None,
                level: float = 0.95) -> pd.DataFrame:
    """Tidy leaderboard: one row per (job, headline metric) of the ``overall`` category (see ``COLUMNS``).

    Models are ranked against each other within a setting (jobs whose options are equal but the model): in a
    threshold sweep every threshold has its own ranking, the settings in the order of their values. ``tests``: the
    run's paired tests, which decide the best / worst marks (without them nothing is marked)."""
    from biasflow.registry import get_metric
    from biasflow.report.explain import cell_reason, ci_expected, heading_note, stats_of

    jobs = job_table(plan)
    stats = stats_of(plan)
    overall = agg[agg["category"] == "overall"]
    frames = []
    for family, fjobs in jobs.groupby("family", sort=True):
        rows = overall[overall["config_hash"].isin(fjobs["config_hash"])]
        metrics = headline_metrics(family, set(rows["metric"]))
        if not metrics:
            continue
        spec = get_metric(family)
        with_ci = ci_expected(spec, stats)
        order = {k: i for i, k in enumerate(sorted(
            fjobs["setting_key"].unique(), key=lambda k: _option_order(fjobs.loc[fjobs.setting_key == k,
                                                                                 "options"].iloc[0])))}
        df = rows[rows["metric"].isin(metrics)].merge(
            fjobs[["config_hash", "model", "setting", "setting_key"]].rename(columns={"model": "label"}),
            on="config_hash")
        df = df.assign(model=df.pop("label"), family=family, goal=df["metric"].map(goal),
                       definition=heading_note(spec, list(fjobs["cfg"]), list(fjobs["mode"])))
        # a CI is expected of the ranked metrics (not of p-values and flags) where the run bootstraps
        cfg_of = dict(zip(fjobs["config_hash"], fjobs["cfg"]))
        job_rows = {h: rows.iloc[i] for h, i in rows.groupby("config_hash", sort=False).indices.items()}
        df["note"] = [cell_reason(spec, m, v, lo, hi, n, with_ci and goal(m) is not None, job_rows[h],
                                  cfg_of.get(h))
                      for v, lo, hi, n, m, h in zip(df["value"], df["ci_low"], df["ci_high"], df["n"], df["metric"],
                                                    df["config_hash"])]
        df["distance"] = [distance(v, g) for v, g in zip(df["value"], df["goal"])]
        df["rank"] = df.assign(_tie=tie_key(df["distance"])).groupby(["setting_key", "metric"])["_tie"].rank(
            method="min")
        df = _significance_marks(df, family, tests, 1.0 - level)
        # within a setting, rows in the order of the first ranked headline metric (best first), then by model
        ranked = [m for m in metrics if goal(m) is not None and df.loc[df.metric == m, "distance"].notna().any()]
        key = tie_key(df[df.metric == ranked[0]].set_index("config_hash")["distance"]) if ranked else pd.Series(
            dtype=float)
        df["_set"] = df["setting_key"].map(order)
        df["_row"] = df["config_hash"].map(key).fillna(np.inf)
        df["_col"] = df["metric"].map({m: i for i, m in enumerate(metrics)})
        df = df.sort_values(["_set", "_row", "model", "_col"], kind="stable").drop(columns=["_set", "_row", "_col",
                                                                                         "setting_key"])
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    return out[[c for c in COLUMNS if c in out]]


def _num(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def cell_text(value: float, lo: float, hi: float, note: str = "", text: str | None = None) -> str:
    """``value [ci_low, ci_high]``; a blank value or CI with its reason (``note``) in parentheses. ``text``: the
    value as written, where it is not 2 decimals (a p-value)."""
    text = _num(value) if text is None else text
    if text and _num(lo) and _num(hi):
        text += f" [{_num(lo)}, {_num(hi)}]"
    note = note if isinstance(note, str) else ""
    return (f"{text} ({note})" if note else text) if text else (f"– ({note})" if note else "–")


def _mark_notes(df: pd.DataFrame) -> list[str]:
    """What the paired tests said of each column's best / worst: the columns with a mark, each with its test; the
    columns without one in a sentence."""
    if "marks" not in df:
        return []
    df = df.assign(setting=df["setting"].fillna(""), marks=df["marks"].fillna(""))
    tested = df[df["marks"] != ""].drop_duplicates(["metric", "setting"])
    marked = df[df["best"] | df["worst"]][["metric", "setting"]].drop_duplicates()
    keys = set(zip(marked["metric"], marked["setting"]))
    name = lambda m, s: m + (f" ({s})" if s else "")  # noqa: E731
    notes = [f"{name(r.metric, r.setting)}: {r.marks}" for r in tested.itertuples(index=False)
             if (r.metric, r.setting) in keys]
    untested = tested[tested["marks"].str.startswith("not tested")]
    plain = tested[~tested["marks"].str.startswith("not tested")
                   & ~pd.Series(list(zip(tested["metric"], tested["setting"])), index=tested.index).isin(keys)]
    if len(plain):
        cols = list(dict.fromkeys(plain["metric"]))
        notes.append(f"{'every other column' if notes else 'every column'} ({', '.join(cols)}): no significant "
                     "difference between the best and the next model or between the worst and the one before")
    for why, rows in untested.groupby(untested["marks"].str.extract(r"\((.*)\)$", expand=False), sort=False):
        notes.append(f"not tested ({', '.join(dict.fromkeys(rows['metric']))}): {why}")
    return notes


# a table of more rows than twice this (a setting's models, a metric's paired tests) shows the first and last this
# many and says how many it leaves out: the full tables (leaderboard.csv, paired_tests.csv) hold every row
SHOWN_AT_EACH_END = 10
# and a cut leaderboard also shows the best and worst this many of every other ranked column (its rows are in the
# order of the first one), so no column's best or worst model is left out of view; few, so the view stays short
OTHER_ENDS_SHOWN = 3


def hidden_middle(n: int) -> range:
    """Positions of the rows a table of ``n`` ranked rows leaves out: none up to 2 x SHOWN_AT_EACH_END."""
    return range(SHOWN_AT_EACH_END, n - SHOWN_AT_EACH_END) if n > 2 * SHOWN_AT_EACH_END else range(0)


def hidden_text(hidden: int, total: int, what: str = "models", start: int = SHOWN_AT_EACH_END) -> str:
    """The line standing for the rows a table leaves out (the file that holds them is named beside it); ``start``:
    the position (from 0) of the first of them."""
    hidden, total, start = int(hidden), int(total), int(start)  # counts (a table's column of them is float)
    if hidden == 1:
        return f"… 1 more {what.removesuffix('s')} not shown (row {start + 1:,} of {total:,} in this order)"
    return (f"… {hidden:,} more {what} not shown (rows {start + 1:,} to {start + hidden:,} "
            f"of {total:,} in this order)")


def rows_in_view(df: pd.DataFrame) -> dict[str, bool]:
    """Which jobs (``config_hash``) of one family's leaderboard rows (in the board's order) a table shows: every job
    of a setting of up to 2 x SHOWN_AT_EACH_END models; above that the first and last SHOWN_AT_EACH_END in the
    table's order (the first ranked column's) and the best and worst OTHER_ENDS_SHOWN of every ranked column."""
    order = df.drop_duplicates("config_hash")
    settings = order["setting"].fillna("").tolist()
    hashes = order["config_hash"].tolist()
    shown: dict[str, bool] = {}
    for setting in dict.fromkeys(settings):
        members = [h for h, s in zip(hashes, settings) if s == setting]
        gap = hidden_middle(len(members))
        keep = set(members) - {members[i] for i in gap}
        if gap:
            rows = df[df["config_hash"].isin(members) & df["distance"].notna()]
            for _, one in rows.groupby("metric", sort=False):
                ranked = one.loc[ranked_index(one), "config_hash"].tolist()
                keep |= set(ranked[:OTHER_ENDS_SHOWN]) | set(ranked[-OTHER_ENDS_SHOWN:])
        shown.update({h: h in keep for h in members})
    return shown


def _cut(rows: list[dict], shown: Mapping[str, bool]) -> list[dict]:
    """Each setting's rows (consecutive, best first) as the table shows them: the rows ``shown`` keeps, and for each
    run of rows between them one row that counts them (``hidden``, ``total``, ``start``: its position)."""
    out: list[dict] = []
    for setting, members in itertools.groupby(rows, key=lambda r: r["setting"]):
        members = list(members)
        for keep, run in itertools.groupby(enumerate(members), key=lambda ir: shown.get(ir[1]["config_hash"], True)):
            run = list(run)
            out += [r for _, r in run] if keep else [
                {"model": "", "setting": setting, "cells": {}, "hidden": len(run), "total": len(members),
                 "start": run[0][0], "config_hash": ""}]
    return out


@dataclass
class FamilyTable:
    """One family's leaderboard as the report shows it."""
    family: str
    title: str  # the family, the definition its numbers follow and the mode (``bbq · Parrish et al. 2022 ...``)
    table: pd.DataFrame  # a row per job: model, setting, cells {metric: {text, best, worst}}, hidden (0); above
    # 2 x SHOWN_AT_EACH_END jobs in a setting, the rows ``rows_in_view`` keeps, and for each run of rows between them
    # one whose ``hidden`` counts them (of ``total``, from position ``start``)
    goals: dict[str, str]  # metric -> the unbiased value as text
    notes: list[str]  # per column (and setting): whether the best / worst marks passed the paired test
    meanings: list[str]  # per metric: what it measures, which way is fair
    ci_note: str  # why the table has no CIs ('' when it has them)
    full: pd.DataFrame | None = None  # where ``table`` leaves rows out: every row (the HTML's collapsed full table)
    view_note: str = ""  # where ``table`` leaves rows out: which rows it shows


# what a cut leaderboard shows (``rows_in_view``), said under it
VIEW_NOTE = (f"Above {2 * SHOWN_AT_EACH_END} models in a setting, the table shows its first and last "
             f"{SHOWN_AT_EACH_END} rows in this order and the best and worst {OTHER_ENDS_SHOWN} of every other ranked "
             "column, so every column's best and worst model is in view; #k after a value is its rank in its column "
             "(leaderboard.csv's rank).")


def wide_tables(board: pd.DataFrame, stats: Any = None) -> list[FamilyTable]:
    """Per family: the table with one row per job and a cell per headline metric, with what explains it. ``stats``
    (the run's ``StatsConfig``): to say when a family has no CIs at all."""
    from biasflow.registry import get_metric
    from biasflow.report.explain import ci_note, meaning_lines

    out = []
    for family in pd.unique(board["family"]):
        df = board[board["family"] == family]
        metrics = list(pd.unique(df["metric"]))
        shown = rows_in_view(df)
        # a cut setting's ranked cells carry their rank in their column (#k, as leaderboard.csv's rank): it says why
        # a row off the ends of the table's order is shown (near an end of another column)
        cut = set(df.loc[~df["config_hash"].map(shown), "setting"].fillna(""))
        rows = []
        for ch, at in df.groupby("config_hash", sort=False).indices.items():
            r = df.iloc[at].set_index("metric")
            first = r.iloc[0]
            ranked = (first["setting"] if isinstance(first["setting"], str) else "") in cut
            cells = {m: ({"text": cell_text(r.at[m, "value"], r.at[m, "ci_low"], r.at[m, "ci_high"],
                                             r.at[m, "note"] if "note" in r else "")
                          + (f" #{int(r.at[m, 'rank'])}" if ranked and pd.notna(r.at[m, "rank"]) else ""),
                          "best": bool(r.at[m, "best"]), "worst": bool(r.at[m, "worst"])} if m in r.index
                         else {"text": "– (not computed for this job)", "best": False, "worst": False})
                     for m in metrics}
            rows.append({"model": first["model"], "setting": first["setting"], "cells": cells, "hidden": 0,
                         "config_hash": ch})
        full = pd.DataFrame(rows) if cut else None
        rows = _cut(rows, shown)
        goals = {m: goal_text(goal(m)) for m in metrics}
        notes = _mark_notes(df)
        definition = str(df["definition"].iloc[0]) if "definition" in df and isinstance(
            df["definition"].iloc[0], str) else ""
        try:
            spec = get_metric(str(family))
        except KeyError:
            spec = None
        out.append(FamilyTable(
            family=str(family), title=f"{family} · {definition}" if definition else str(family),
            table=pd.DataFrame(rows), goals=goals, notes=notes,
            meanings=meaning_lines(spec, metrics) if spec is not None else [],
            ci_note=ci_note(spec, stats) if spec is not None and stats is not None else "", full=full,
            view_note=VIEW_NOTE if full is not None else ""))
    return out


def wide_frame(board: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard as one DataFrame: a row per (model, setting), a column per (family, metric, stat) with stat
    ``value``, ``ci_low``, ``ci_high``, in the order the leaderboard lists them (``api.Results.leaderboard``)."""
    if board.empty:
        return pd.DataFrame(index=pd.MultiIndex.from_arrays([[], []], names=["model", "setting"]),
                            columns=pd.MultiIndex.from_arrays([[], [], []], names=["family", "metric", "stat"]))
    board = board.assign(setting=board["setting"].fillna(""))
    long = board.melt(id_vars=["family", "metric", "model", "setting"], value_vars=["value", "ci_low", "ci_high"],
                      var_name="stat", value_name="number")
    wide = long.pivot_table(index=["model", "setting"], columns=["family", "metric", "stat"], values="number",
                            aggfunc="first", dropna=False, sort=False)
    columns = list(dict.fromkeys((f, m, st) for f, m in zip(board["family"], board["metric"])
                                 for st in ("value", "ci_low", "ci_high")))
    rows = list(dict.fromkeys(zip(board["model"], board["setting"])))
    return wide.reindex(index=pd.MultiIndex.from_tuples(rows, names=["model", "setting"]),
                        columns=pd.MultiIndex.from_tuples(columns, names=["family", "metric", "stat"]))


LEGEND = ("Each cell: value [95% bootstrap CI] of the overall category (a blank value or CI says why in "
          "parentheses). Rows sorted by the first ranked metric, "
          "closest to the unbiased value first (within each setting of a sweep); **bold** = best, _italic_ = worst "
          "in its column (closest to / farthest from the unbiased value; 'higher'/'lower' for quality metrics), "
          "marked only where the paired test between it and the next model (Holm-corrected over the run) is "
          "significant; the notes under each table give the test of every column.")
ONE_MODEL_LEGEND = ("Each cell: value [95% bootstrap CI] of the overall category (a blank value or CI says why in "
                    "parentheses); the unbiased value ('higher'/'lower' for quality metrics) heads each column. With "
                    "one model per table (and setting) nothing is ranked or marked: run two or more models to compare "
                    "them.")


def legend(tables: Sequence["FamilyTable"], stats: Any = None) -> str:
    """The leaderboard's legend: the marks and their tests where a table compares models (two or more within a
    setting), else what a cell is; the run's CI level, or no CI without a bootstrap."""
    from biasflow.report.explain import ci_label

    compares = any(not t.table.empty and (t.table.groupby("setting")["model"].nunique() > 1).any() for t in tables)
    label = ci_label(stats)
    cell = f"value [{label}]" if label else "value (no CI: stats.n_boot=0)"
    return (LEGEND if compares else ONE_MODEL_LEGEND).replace("value [95% bootstrap CI]", cell, 1)


def leaderboard_markdown(board: pd.DataFrame, stats: Any = None) -> str:
    if board.empty:
        return ""
    tables = wide_tables(board, stats)
    parts = [legend(tables, stats) + "\n"]
    for t in tables:
        metrics = list(t.goals)
        with_setting = bool((t.table["setting"] != "").any())
        head = ["model"] + (["setting"] if with_setting else []) + metrics
        lines = [f"\n### {t.title}\n"]
        lines += [f"- {line}" for line in t.meanings] + ([""] if t.meanings else [])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                  "| *unbiased value* |" + (" |" if with_setting else "")
                  + "".join(f" {t.goals[m] or '(not ranked)'} |" for m in metrics)]
        for r in t.table.itertuples(index=False):
            if r.hidden:
                lines.append(f"| {hidden_text(r.hidden, r.total, start=r.start)}: [leaderboard.csv](leaderboard.csv) lists every "
                             "model |" + " |" * (len(head) - 1))
                continue
            cells = []
            for m in metrics:
                c = r.cells[m]
                cells.append(f"**{c['text']}**" if c["best"] else f"_{c['text']}_" if c["worst"] else c["text"])
            lines.append("| " + " | ".join([r.model] + ([r.setting] if with_setting else []) + cells) + " |")
        if t.view_note:
            lines.append("\n" + t.view_note)
        if t.ci_note:
            lines.append("\n" + t.ci_note)
        if t.notes:
            lines.append("\nMarks (paired tests): " + "; ".join(t.notes) + ".")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: object) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def booktabs(header: list[str], rows: list[list[str]], align: str, caption: str, label: str,
             extra_header: list[str] | None = None) -> str:
    """A booktabs table; cells are LaTeX already (escape text with ``latex_escape``)."""
    lines = [r"\begin{table}[ht]", r"\centering", r"\small", rf"\begin{{tabular}}{{{align}}}", r"\toprule"]
    if extra_header:
        lines += extra_header
    lines += [" & ".join(header) + r" \\", r"\midrule"]
    lines += [" & ".join(r) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{caption}}}", rf"\label{{{label}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def leaderboard_latex(board: pd.DataFrame, run: str = "") -> str:
    if board.empty:
        return ""
    out = ["% biasflow leaderboard" + (f" of run {run}" if run else "") + "; needs \\usepackage{booktabs}\n"]
    for t in wide_tables(board):
        family, table, goals, notes = t.title, t.table, t.goals, t.notes
        metrics = list(goals)
        with_setting = bool((table["setting"] != "").any())
        head = ["Model"] + (["Setting"] if with_setting else []) + [latex_escape(m) for m in metrics]
        goal_row = [r"\textit{unbiased}"] + ([""] if with_setting else []) + [latex_escape(goals[m]) for m in metrics]
        rows = [goal_row]
        for r in table.itertuples(index=False):
            if r.hidden:
                text = latex_escape(hidden_text(r.hidden, r.total, start=r.start) + ": leaderboard.csv lists every model")
                rows.append([rf"\multicolumn{{{len(head)}}}{{l}}{{\textit{{{text}}}}}"])
                continue
            cells = []
            for m in metrics:
                c = r.cells[m]
                text = latex_escape(c["text"]).replace("–", "--")
                cells.append(rf"\textbf{{{text}}}" if c["best"] else rf"\textit{{{text}}}" if c["worst"] else text)
            rows.append([latex_escape(r.model)] + ([latex_escape(r.setting)] if with_setting else []) + cells)
        align = "l" + ("l" if with_setting else "") + "r" * len(metrics)
        caption = (f"{latex_escape(family)}: value [95\\% bootstrap CI]; bold = closest to the unbiased value, "
                   "italic = farthest, each only where the paired test against the next model is significant (Holm)."
                   + (" " + latex_escape("; ".join(notes)) + "." if notes else ""))
        out.append(booktabs(head, rows, align, caption, f"tab:leaderboard-{t.family}".replace("_", "-")))
    return "\n".join(out)


def model_plot(board: pd.DataFrame, family: str, path: Path, ci: str = "95% bootstrap CI") -> bool:
    """The models side by side: one panel per ranked headline metric of ``family``, a point per model (and
    setting) with its CI as a bar and the unbiased value as a line; a model without a value says "no data".
    Returns whether a plot was written (two or more rows to compare)."""
    df = board[(board["family"] == family) & board["goal"].notna()]
    if df.empty:
        return False
    # a panel whose every model lacks a value would be an empty frame: the table says why instead
    metrics = [m for m in pd.unique(df["metric"]) if df.loc[df["metric"] == m, "value"].notna().any()]
    labels = list(dict.fromkeys((m + (f" ({s})" if isinstance(s, str) and s else "")) for m, s in zip(
        df["model"], df["setting"])))
    if len(labels) < 2 or not metrics:
        return False
    # the rows the table shows (``rows_in_view``: each setting's ends, and the ends of every ranked column)
    left_out = 0
    if len(labels) > 2 * SHOWN_AT_EACH_END:  # a setting of fewer models shows them all
        shown = rows_in_view(board[board["family"] == family])
        in_view = df.drop_duplicates("config_hash")["config_hash"].map(shown).tolist()
        left_out = in_view.count(False)
        labels = [label for label, keep in zip(labels, in_view) if keep]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics) + 1.6, 0.42 * len(labels) + 1.4),
                             sharey=True, squeeze=False)
    y = np.arange(len(labels))
    for ax, metric in zip(axes[0], metrics):
        rows = df[df["metric"] == metric].assign(
            label=lambda d: [m + (f" ({s})" if isinstance(s, str) and s else "") for m, s in zip(d["model"],
                                                                                             d["setting"])])
        rows = rows.set_index("label").reindex(labels)
        values = rows["value"].astype(float).to_numpy()
        lo = (values - rows["ci_low"].astype(float).to_numpy())
        hi = (rows["ci_high"].astype(float).to_numpy() - values)
        err = np.vstack([np.nan_to_num(np.clip(lo, 0, None)), np.nan_to_num(np.clip(hi, 0, None))])
        ax.errorbar(values, y, xerr=err, fmt="o", color="#1f77b4", ecolor="#7f9fbf", capsize=3)
        g = goal(metric)
        if isinstance(g, (int, float)):
            ax.axvline(float(g), color="red", lw=1, ls="--")
        finite = values[np.isfinite(values)]
        x_text = float(np.nanmin(finite)) if finite.size else 0.0
        for yi, v in zip(y, values):
            if not np.isfinite(v):
                ax.text(x_text, yi, "no data", va="center", ha="left", fontsize=8, color="#888", style="italic")
        ax.set_title(metric + (f"\n(unbiased {g:g})" if isinstance(g, (int, float)) else f"\n({g} is better)"
                               if g in ("max", "min") else ""), fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    axes[0][0].set_yticks(y, labels, fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"{family}: models side by side" + (f" ({ci})" if ci else "")
                 + (f"\nthe models the leaderboard shows (each ranking's ends); {left_out:,} more in leaderboard.csv"
                    if left_out else ""), fontsize=10)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return True
