"""Run-level tables and plots: the aggregate table (Parquet + CSV + Markdown), per-item table, bar plots."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.io import atomic_path, write_parquet, write_text
from biasflow.report.published import compare, job_splits

log = logging.getLogger(__name__)

COLUMNS = ["model", "benchmark", "metric", "category", "value", "ci_low", "ci_high", "n", "config_hash"]


def markdown_table(agg: pd.DataFrame, columns: list[str] | None = None) -> str:
    df = agg[[c for c in (columns or COLUMNS) if c in agg]].copy()
    for c in ("value", "ci_low", "ci_high"):
        df[c] = df[c].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    header = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in df.itertuples(index=False))


def comparison_markdown(df: pd.DataFrame) -> str:
    cols = ["experiment", "model", "split", "metric", "category", "published", "ours", "delta", "ci_low", "ci_high",
            "published_in_ci"]
    view = df[cols].copy()
    for c in ("published", "ours", "delta", "ci_low", "ci_high"):
        view[c] = view[c].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    header = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in r) + " |\n" for r in view.itertuples(index=False))


def bar_plot(agg: pd.DataFrame, metric: str, title: str, path: Path, reference: float | None = 50.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = agg[(agg.metric == metric)].copy()
    if df.empty:
        return
    df["order"] = (df.category != "overall").astype(int)
    df = df.sort_values(["order", "category"])
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(df) + 1.2))
    err = [(df.value - df.ci_low).clip(lower=0).fillna(0), (df.ci_high - df.value).clip(lower=0).fillna(0)]
    ax.barh(df.category, df.value, xerr=err, color=["#444" if c == "overall" else "#4c72b0" for c in df.category],
            capsize=3)
    if reference is not None:
        ax.axvline(reference, color="red", lw=1, ls="--", label=f"no bias = {reference:g}")
        ax.legend(loc="lower right", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{metric} (95% bootstrap CI)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_run_report(plan: Mapping[str, Any], agg: pd.DataFrame, per_item: pd.DataFrame, out: Path) -> None:
    from biasflow.registry import get_metric

    out.mkdir(parents=True, exist_ok=True)
    agg = agg[[c for c in COLUMNS if c in agg] + [c for c in agg if c not in COLUMNS]]
    write_parquet(agg, out / "aggregate.parquet")
    with atomic_path(out / "aggregate.csv", suffix=".csv") as tmp:
        agg.to_csv(tmp, index=False)
    write_parquet(per_item, out / "per_item.parquet")
    lines = [f"# biasflow run {plan['plan_hash']}\n"]
    if any(j["model"].get("demo") for j in plan["jobs"]):
        lines.append("> **Demo model.** At least one model here was built by the pipeline for an offline "
                     "demonstration; its numbers are not those of any published model.\n")
    for msg in plan.get("skipped", []):
        lines.append(f"- skipped: {msg}")
    experiments = [s["config"]["experiment"] for s in plan.get("sweep", []) if s.get("config", {}).get("experiment")]
    comparison = compare(agg, experiments, splits=job_splits(plan["jobs"]))
    if not comparison.empty:
        with atomic_path(out / "comparison.csv", suffix=".csv") as tmp:
            comparison.to_csv(tmp, index=False)
        shown = comparison.dropna(subset=["ours"])
        lines.append("\n## Published numbers beside ours\n")
        lines.append(f"{len(shown)} of {len(comparison)} published values have a counterpart in this run "
                     "(comparison.csv has all of them).\n")
        if not shown.empty:
            lines.append(comparison_markdown(shown))
    for (model, family), df in agg.groupby(["model", "metric_family"], sort=True):
        spec = get_metric(family)
        lines.append(f"\n## {family} / {model}\n")
        head = df[df.category == "overall"]
        lines.append(markdown_table(head))
        if spec.plot_metric:
            by_cat = df[(df.metric == spec.plot_metric) & (df.category != "overall")]
            if not by_cat.empty:
                lines.append(f"\n{spec.plot_metric} by category:\n")
                lines.append(markdown_table(by_cat.sort_values("category"),
                                            ["category", "value", "ci_low", "ci_high", "n"]))
            png = out / "plots" / f"{model}__{family}__{spec.plot_metric}.png"
            bar_plot(df, spec.plot_metric, f"{family}: {spec.plot_metric} by category ({model})", png,
                     reference=spec.plot_reference)
            if png.exists():
                lines.append(f"\n![{family} {model}](plots/{png.name})\n")
    from biasflow.report.timing import write_stage_times

    lines += write_stage_times(plan, out)
    write_text("\n".join(lines) + "\n", out / "report.md")
