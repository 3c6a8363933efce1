"""Paper tables side by side: each experiment's published table laid out as published, ours beside every number.

The layout follows the shape of the experiment's ``published`` values (``report/published.py``):
  {category: number}            rows = categories (e.g. WEAT 1-10), a column per published model
  {metric: {category: number}}  rows = models, a column per metric/category (e.g. CrowS-Pairs by bias type)
  {group: {category: [...]}}    rows = model, group, category; columns = ``value_columns`` (StereoSet LMS/SS/ICAT)
Every published column becomes three: the paper's number, ours [95% CI], and the delta (ours - paper) with a check
mark when the paper's number lies inside our CI. Rows and columns keep the published order; a published number
this run has no counterpart for keeps its row with "–" beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pandas as pd

from biasflow.report.leaderboard import booktabs, latex_escape
from biasflow.report.published import VALUE_KEY, published_rows

CHECK = "✓"


@dataclass
class PaperTable:
    experiment: str
    paper: str
    source: str
    split: str
    row_header: list[str]
    columns: list[str]
    rows: list[tuple[list[str], dict[str, dict[str, Any]]]] = field(default_factory=list)
    matched: int = 0
    total: int = 0


def _shape(experiment: Mapping[str, Any]) -> str:
    if experiment.get("value_columns"):
        return "lists"
    entries = experiment.get("published") or []
    if experiment.get("metric") and all(isinstance(v, (int, float)) for e in entries
                                        for v in (e.get("values") or {}).values()):
        return "by_category"
    return "by_metric"


def _layout(pub: pd.DataFrame, experiment: Mapping[str, Any]) -> tuple[list[str], pd.DataFrame]:
    """Row labels and column label of every published value (in published order)."""
    shape = _shape(experiment)
    pub = pub.copy()
    if shape == "by_category":
        pub["row"] = [(c,) for c in pub["category"]]
        pub["column"] = pub["hub_id"]
        return ["category"], pub
    cols = [str(c) for c in experiment.get("value_columns") or []]
    suffix = [next((c for c in cols if m.endswith(f"_{c}")), None) for m in pub["metric"]]
    if shape == "lists" and None not in suffix:  # (values of mixed shapes fall back to models x metrics)
        pub["column"] = suffix
        groups = [m[: -len(c) - 1] for m, c in zip(pub["metric"], pub["column"])]
        pub["row"] = [(h, g, c) for h, g, c in zip(pub["hub_id"], groups, pub["category"])]
        return ["model", "task", "category"], pub
    metrics, categories = pub["metric"].unique(), pub["category"].unique()
    if len(metrics) == 1:
        pub["column"] = pub["category"]
    elif len(categories) == 1:
        pub["column"] = pub["metric"]
    else:
        pub["column"] = pub["metric"] + " / " + pub["category"]
    pub["row"] = [(h,) for h in pub["hub_id"]]
    return ["model"], pub


def _num(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def paper_tables(experiments: Iterable[Mapping[str, Any]], comparison: pd.DataFrame) -> list[PaperTable]:
    """One table per experiment of the run (experiments without published numbers are left out)."""
    tables, seen = [], set()
    for exp in experiments:
        name = exp.get("name", "?")
        if name in seen:
            continue
        seen.add(name)
        pub = published_rows(exp)
        if pub.empty:
            continue
        ours = (comparison[comparison["experiment"] == name].drop_duplicates(VALUE_KEY)
                if not comparison.empty else pd.DataFrame(columns=VALUE_KEY))
        row_header, laid = _layout(pub, exp)
        keep = [c for c in ("ours", "ci_low", "ci_high", "delta", "published_in_ci") if c in ours]
        laid = laid.merge(ours[VALUE_KEY + keep], on=VALUE_KEY, how="left") if keep else laid
        columns = list(pd.unique(laid["column"]))
        table = PaperTable(name, str(exp.get("paper", "")), str(exp.get("source", "")),
                           str(exp.get("split", "")), row_header, columns, total=len(laid))
        for row in pd.unique(laid["row"]):
            cells = {}
            for r in laid[laid["row"] == row].itertuples(index=False):
                ours_v = getattr(r, "ours", float("nan"))
                has = not (ours_v is None or (isinstance(ours_v, float) and math.isnan(ours_v)))
                table.matched += has
                cells[r.column] = {"paper": _num(r.published), "ours": _num(ours_v) if has else "",
                                   "ci": (f"[{_num(r.ci_low)}, {_num(r.ci_high)}]"
                                          if has and _num(r.ci_low) else ""),
                                   "delta": f"{r.delta:+.2f}" if has else "",
                                   "in_ci": bool(has and r.published_in_ci == True)}  # noqa: E712 (NaN = no)
            table.rows.append((list(row), cells))
        tables.append(table)
    return tables


def _ours(cell: Mapping[str, Any] | None) -> str:
    if not cell or not cell["ours"]:
        return "–"
    return f"{cell['ours']} {cell['ci']}".strip()


def _delta(cell: Mapping[str, Any] | None) -> str:
    if not cell or not cell["delta"]:
        return "–"
    return cell["delta"] + (f" {CHECK}" if cell["in_ci"] else "")


def table_heading(t: PaperTable) -> str:
    return (f"{t.paper} ({t.experiment}, split {t.split}): {t.matched} of {t.total} published numbers have a "
            "counterpart in this run.")


def paper_markdown(tables: list[PaperTable]) -> str:
    if not tables:
        return ""
    parts = [f"Each published column: the paper's number, ours [95% CI], and ours - paper ({CHECK}: the paper's "
             "number lies inside our CI).\n"]
    for t in tables:
        head = t.row_header + [h for c in t.columns for h in (f"{c} paper", f"{c} ours", f"{c} Δ")]
        lines = [f"\n### {t.experiment}\n", table_heading(t) + (f" Source: {t.source}" if t.source else "") + "\n",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for labels, cells in t.rows:
            vals = [v for c in t.columns for v in ((cells.get(c) or {}).get("paper", "") or "",
                                                   _ours(cells.get(c)), _delta(cells.get(c)))]
            lines.append("| " + " | ".join([str(x) for x in labels] + vals) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def paper_latex(tables: list[PaperTable]) -> str:
    if not tables:
        return ""
    out = ["% biasflow: published tables beside ours; needs \\usepackage{booktabs,amssymb}\n"]
    for t in tables:
        k = len(t.row_header)
        group = (" & " * (k - 1)) + " & " + " & ".join(rf"\multicolumn{{3}}{{c}}{{{latex_escape(c)}}}"
                                                       for c in t.columns) + r" \\"
        rules = " ".join(rf"\cmidrule(lr){{{k + 1 + 3 * i}-{k + 3 + 3 * i}}}" for i in range(len(t.columns)))
        head = [latex_escape(h) for h in t.row_header] + ["paper", "ours", r"$\Delta$"] * len(t.columns)
        rows = []
        for labels, cells in t.rows:
            vals = []
            for c in t.columns:
                cell = cells.get(c)
                vals += [(cell or {}).get("paper", "") or "",
                         latex_escape(_ours(cell)).replace("–", "--"),
                         latex_escape(_delta(cell).replace(f" {CHECK}", "")).replace("–", "--")
                         + (r" $\checkmark$" if cell and cell["in_ci"] else "")]
            rows.append([latex_escape(x) for x in labels] + vals)
        caption = latex_escape(table_heading(t)) + r" Ours: value [95\% CI]; $\checkmark$: the published value " \
            r"lies inside our CI."
        out.append(booktabs(head, rows, "l" * k + "r" * (3 * len(t.columns)), caption,
                            f"tab:{t.experiment}".replace("_", "-"), extra_header=[group, rules]))
    return "\n".join(out)
