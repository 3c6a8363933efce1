"""Run-level outputs: the aggregate and per-item tables, leaderboard, paired tests, curves, paper tables, plots,
report.md and the self-contained report.html."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from biasflow.io import atomic_path, markdown_safe, write_parquet, write_text
from biasflow.report.categories import category_labels, label, natural_sorted, sort_by_category
from biasflow.report.explain import (cell_reason, ci_expected, ci_label, ci_note, heading_note, is_p_value,
                                     meaning_lines, missing_headline, missing_note, no_ci_note, stats_of, value_text)
from biasflow.report.published import compare, job_splits
from biasflow.report.sweep import alike_models, job_table, model_labels, summary_line
from biasflow.report.unfinished import UNFINISHED_HEAD, unfinished_rows

log = logging.getLogger(__name__)

COLUMNS = ["model", "benchmark", "metric", "category", "value", "ci_low", "ci_high", "n", "config_hash"]


def markdown_table(agg: pd.DataFrame, columns: list[str] | None = None) -> str:
    df = agg[[c for c in (columns or COLUMNS) if c in agg]].copy()
    for c in ("value", "ci_low", "ci_high"):
        df[c] = [value_text(m, v) for m, v in zip(agg["metric"], agg[c])]
    header = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in df.itertuples(index=False))


def provenance_markdown(prov: Mapping[str, Any]) -> list[str]:
    """report.md's Provenance section: the run, each model (source, revision, the machine that scored it) and each
    data file (sha256, the items it gave), as report.html's."""
    lines = ["\n## Provenance\n",
             f"plan {prov['plan']}, written {prov['created']}, git commit {prov['git commit'] or 'unknown'}, mode "
             f"{prov['mode'] or 'n/a'}, bootstrap {prov['bootstrap']}\n"]
    if prov["models"]:  # the report's lines are joined with newlines: a table's rows carry none of their own
        lines += ["| model key | model | kind | source | revision | scored on |", "|---|---|---|---|---|---|"]
        for key, m in prov["models"].items():
            machine = m.get("gpu") or m.get("cpu") or ""
            lines.append(f"| {key} | {m['model']} | {m['kind']} | {m['source']} | {m['revision']} | {machine} |")
    if prov["datasets"]:
        lines += ["", "| data file | sha256 | items | source |", "|---|---|---|---|"]
        for name, d in prov["datasets"].items():
            lines.append(f"| {name} | {d['sha256'][:16]} | {d['items']} | {d['source']} |")
    return lines


def comparison_markdown(df: pd.DataFrame) -> str:
    cols = ["experiment", "model", "split", "metric", "category", "published", "ours", "delta", "ci_low", "ci_high",
            "published_in_ci"]
    view = df[cols].copy()
    for c in ("published", "ours", "delta", "ci_low", "ci_high"):
        view[c] = view[c].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    header = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in r) + " |\n" for r in view.itertuples(index=False))


def bar_plot(agg: pd.DataFrame, metric: str, title: str, path: Path, reference: float | None = 50.0,
             labels: dict[str, str] | None = None, ci: str = "95% bootstrap CI") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = sort_by_category(agg[(agg.metric == metric)])
    if df.empty or df["value"].isna().all():  # no frame that only says "no data": the tables say why
        return
    names = [wrap(label(c, labels or {}), 60) for c in df.category]
    fig, ax = plt.subplots(figsize=(7, 0.45 * sum(n.count("\n") + 1 for n in names) + 1.2))
    err = [(df.value - df.ci_low).clip(lower=0).fillna(0), (df.ci_high - df.value).clip(lower=0).fillna(0)]
    ax.barh(range(len(df)), df.value.fillna(0), xerr=err,
            color=["#444" if c == "overall" else "#4c72b0" for c in df.category], capsize=3)
    # every bar says its value, so a 0 is a 0 and a missing value says "no data" (both draw no bar)
    span = float(np.nanmax(np.abs(np.r_[df.value.to_numpy(float), df.ci_high.to_numpy(float), 1e-12])))
    for i, (v, hi) in enumerate(zip(df.value.astype(float), df.ci_high.astype(float))):
        if np.isnan(v):
            ax.text(0, i, " no data", va="center", ha="left", fontsize=7, color="#a00", style="italic")
        else:
            end = max(v, hi) if not np.isnan(hi) else v
            ax.text(end + 0.01 * span if end >= 0 else end - 0.01 * span, i, f"{v:.2f}", va="center",
                    ha="left" if end >= 0 else "right", fontsize=7, color="#222")
    left, right = ax.get_xlim()
    ax.set_xlim(left, right + 0.1 * (right - left))  # room for the value labels
    ax.set_yticks(range(len(df)), names, fontsize=8)
    if reference is not None:
        ax.axvline(reference, color="red", lw=1, ls="--", label=f"no bias = {reference:g}")
        ax.legend(loc="lower right", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{metric} ({ci})" if ci else metric)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def unfinished_section(unfinished) -> list[str]:
    """The report's list of jobs that did not finish (failed with their SLURM state and cause, interrupted, or never
    ran), what each attempt asked for, and how to redo them."""
    failed = [u for u in unfinished if u.state == "failed"]
    blocked = [u for u in unfinished if u.state == "blocked"]
    interrupted = [u for u in unfinished if u.state == "interrupted"]
    lines = [f"\n## PARTIAL RESULTS: {len(unfinished)} job(s) did not finish\n",
             f"{len(failed)} failed; {len(blocked)} blocked by a failed download, prepare or build (which one, its "
             f"cause and log: the table); {len(interrupted)} interrupted (the run was stopped); "
             f"{len(unfinished) - len(failed) - len(blocked) - len(interrupted)} did not run. Their "
             "numbers are missing below. Fix the cause and run the same command again: finished jobs are kept and "
             "only these run.\n",
             "| " + " | ".join(UNFINISHED_HEAD) + " |", "|" + "---|" * len(UNFINISHED_HEAD)]
    for row in unfinished_rows(unfinished):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return lines


def retried_section(plan: Mapping[str, Any]) -> list[str]:
    """Finished jobs that needed more than one cluster attempt: what each attempt asked for and how it ended."""
    from biasflow.progress import job_states

    try:
        retried = [s for s in job_states(plan) if s.state == "done"
                   and any((a.get("attempt") or 1) > 1 for a in s.attempts or [])]
    except Exception:  # noqa: BLE001 - the attempts are a note; a report is never lost for them
        return []
    if not retried:
        return []
    lines = ["\n## Retried jobs\n", "Finished after more than one cluster attempt (each retry asks for more memory "
             "and time):\n", "| model | metric | attempts (memory, time limit, end) | causes |", "|---|---|---|---|"]
    for s in retried:
        causes = "; ".join(f"#{a['attempt']} {a['cause']}" for a in s.attempts if a.get("cause"))
        lines.append(f"| {s.model} | {s.metric} | {s.attempts_text()} | {causes.replace('|', '/')} |")
    return lines


def wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def _text_rows(df: pd.DataFrame, columns: list[str]) -> tuple[list[str], list[list[str]]]:
    view = df[[c for c in columns if c in df]]
    numeric = ("value", "ci_low", "ci_high")
    return list(view.columns), [[value_text(metric, v) if c in numeric else str(v) for c, v in zip(view.columns, row)]
                                for metric, row in zip(df["metric"], view.itertuples(index=False))]


def family_labels(plan: Mapping[str, Any], family: str, per_item: pd.DataFrame) -> dict[str, str]:
    """Category labels of a metric family, from its items (where the templates and word-set names are) and its
    per-item rows."""
    labels: dict[str, str] = {}
    if "metric_family" in per_item:
        labels.update(category_labels(per_item[per_item["metric_family"] == family]))
    for path in sorted({j["items_path"] for j in plan["jobs"] if j["metric"] == family and j.get("items_path")}):
        if Path(path).exists():
            found = category_labels(pd.read_parquet(path))
            labels.update({c: v for c, v in found.items() if v != c})
    return labels


def setting_order(options: Mapping[str, Any]) -> tuple:
    """Sort key of a sweep setting: its options by name, numbers by value (0.05 before 0.1, 9 before 10)."""
    return tuple((k, 0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                 else (k, 1, 0.0, str(v)) for k, v in sorted(options.items()))


def section_title(family: str, model: str, note: str = "") -> str:
    """The heading of a metric family's results for one model, with the definition its numbers follow and the run
    mode (``crows_pairs / tinyA · Nangia et al. 2020 (the authors' metric.py) · run.mode=parity``)."""
    return f"{family} / {model} · {note}" if note else f"{family} / {model}"


def category_tables(one: pd.DataFrame, metrics: list[str], labels: dict[str, str], with_ci: bool, spec: Any = None,
                    cfg: Mapping[str, Any] | None = None, ci: str = "95% CI"
                    ) -> list[tuple[str, list[str], list[list[str]]]]:
    """Categories x metrics of one job: each cell value [CI] (a blank one with its reason), n of the first metric.
    Metrics computed on different categories (SEAT's effect size per test, its average per bias type) get a table
    each, so no cell is blank for want of a category. Empty when no metric of ``metrics`` has categories besides
    overall."""
    from biasflow.report.leaderboard import cell_text, goal

    cats = one[(one["category"] != "overall") & one["metric"].isin(metrics)]
    groups: dict[frozenset, list[str]] = {}
    for m in metrics:
        found = frozenset(cats.loc[cats["metric"] == m, "category"])
        if found:
            groups.setdefault(found, []).append(m)
    tables = []
    for categories, present in groups.items():
        head = ["category", *present, f"n ({present[0]})"]
        rows = []
        for category in natural_sorted(categories):
            r = cats[cats["category"] == category].drop_duplicates("metric").set_index("metric")
            cells = []
            for m in present:
                v, lo, hi, n = (r.at[m, c] for c in ("value", "ci_low", "ci_high", "n"))
                why = cell_reason(spec, m, v, lo, hi, n, with_ci and goal(m) is not None,
                                  one[one["category"] == category], cfg)
                cells.append(cell_text(v, lo, hi, why, text=value_text(m, v)))
            n0 = r.at[present[0], "n"]
            rows.append([label(category, labels), *cells, "" if pd.isna(n0) else f"{int(n0):,}"])
        tables.append((f"By category: {', '.join(present)} " + (f"(value [{ci}])" if ci else "(value; no CIs in this "
                                                                 "run)"), head, rows))
    return tables


def setting_title(family: str, model: str, setting: str) -> str:
    """The heading of one setting of a sweep within a model's section (``crows_pairs — tinyA (diff_threshold=0.05)``):
    it names the metric, the model and the setting, so no two headings of a report are alike."""
    return f"{family} — {model} ({setting})"


def plain_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of text cells (``|`` escaped)."""
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    return ("| " + " | ".join(map(cell, head)) + " |\n|" + "---|" * len(head) + "\n"
            + "".join("| " + " | ".join(map(cell, r)) + " |\n" for r in rows))


def write_table(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path, suffix=path.suffix) as tmp:
        df.to_csv(tmp, index=False)


def write_run_report(plan: Mapping[str, Any], agg: pd.DataFrame, per_item: pd.DataFrame, out: Path,
                     unfinished=(), started: tuple[float, float] | None = None) -> None:
    """The run's tables (aggregate, per-item, leaderboard, paired tests, curves, paper tables), plots, report.md and
    the self-contained report.html. ``started``: (wall, CPU) clock when the aggregate job began (its stage time)."""
    from biasflow.registry import get_metric
    from biasflow.report import compare as cmp
    from biasflow.report import html, leaderboard as lb, paper

    out.mkdir(parents=True, exist_ok=True)
    if agg.empty:  # no job finished (a partial run): the same columns, no rows
        agg = agg.reindex(columns=list(dict.fromkeys([*COLUMNS, "model_key", "metric_family", *agg.columns])))
    if per_item.empty:
        per_item = per_item.reindex(columns=list(dict.fromkeys(["item_id", "category", "model", "model_key",
                                                                 "benchmark", "metric_family", "config_hash",
                                                                 *per_item.columns])))
    agg = agg[[c for c in COLUMNS if c in agg] + [c for c in agg if c not in COLUMNS]]
    write_parquet(agg, out / "aggregate.parquet")
    write_table(agg, out / "aggregate.csv")
    write_parquet(per_item, out / "per_item.parquet")
    written: list[str] = ["aggregate.csv", "aggregate.parquet", "per_item.parquet"]
    report = html.HtmlReport(plan=plan)
    lines = [f"# biasflow run {plan['plan_hash']}\n"]
    report.summary = summary_line(plan)
    lines.append(report.summary + "\n")
    report.alike = alike_models(plan["jobs"])
    if report.alike[1]:
        lines += [html.ALIKE_NOTE + "\n", plain_table(*report.alike)]
    if any(j["model"].get("demo") for j in plan["jobs"]):
        lines.append(f"> **{html.DEMO_WARNING.split('. ', 1)[0]}.** {html.DEMO_WARNING.split('. ', 1)[1]}\n")
    if unfinished:
        lines += unfinished_section(unfinished)
        report.unfinished = list(unfinished)
    lines += retried_section(plan)
    for msg in plan.get("skipped", []):
        lines.append(f"- skipped: {msg}")

    stats = stats_of(plan)
    tests = cmp.paired_tests(plan, agg, per_item)
    board = lb.leaderboard(plan, agg, tests, level=stats.level)
    if not board.empty:
        write_table(board, out / "leaderboard.csv")
        write_text(lb.leaderboard_markdown(board, stats), out / "leaderboard.md")
        write_text(lb.leaderboard_latex(board, plan["plan_hash"]), out / "leaderboard.tex")
        written += ["leaderboard.md", "leaderboard.csv", "leaderboard.tex"]
        lines.append("\n## Leaderboard\n")
        lines.append(lb.leaderboard_markdown(board, stats))
        report.leaderboard = lb.wide_tables(board, stats)
        report.leaderboard_legend = lb.legend(report.leaderboard, stats).replace("**", "").replace("_italic_",
                                                                                                    "italic")
        ci = ci_label(stats)
        for family in pd.unique(board["family"]):  # the models side by side, with their CIs
            png = out / "plots" / f"models__{family}.png"
            if lb.model_plot(board, family, png, ci):
                title = f"{family}: models side by side" + (f" ({ci})" if ci else "")
                lines.append(f"\n![{title}](plots/{png.name})\n")
                report.model_plots[str(family)] = html.Figure(title, png, wide=True)

    if not tests.empty:
        design = cmp.design_notes(plan, tests)
        write_table(tests, out / "paired_tests.csv")
        write_text(cmp.paired_markdown(tests, design), out / "paired_tests.md")
        written += ["paired_tests.csv", "paired_tests.md"]
        lines.append("\n## Paired tests between models\n")
        lines.append(cmp.paired_markdown(tests, design))
        shown, gaps = cmp.shown_tests(tests)  # a long table's ends, and where the rest are counted
        head, rows = cmp.paired_rows(shown)
        report.paired = head, cmp.with_gaps(rows, {i: [] for i in gaps})
        report.paired_significant = cmp.with_gaps(shown["significant"].tolist(), {i: False for i in gaps})
        report.paired_gaps, report.paired_design, report.paired_legend = gaps, design, cmp.PAIRED_LEGEND

    curves = cmp.threshold_curves(plan, agg)
    report.curve_notes = cmp.unchanged_sweeps(plan, agg)
    if not curves.empty or report.curve_notes:
        lines.append("\n## Threshold curves\n")
        lines += [note + "\n" for note in report.curve_notes]
    if not curves.empty:
        write_table(curves, out / "curves.csv")
        written.append("curves.csv")
        for title, name in cmp.write_curve_plots(curves, out / "plots"):
            lines.append(f"![{title}](plots/{name})\n")
            report.curves.append(html.Figure(title, out / "plots" / name))

    experiments = [s["config"]["experiment"] for s in plan.get("sweep", []) if s.get("config", {}).get("experiment")]
    comparison = compare(agg, experiments, splits=job_splits(plan["jobs"]))
    tables = paper.paper_tables(experiments, comparison)
    if tables:
        write_text(paper.paper_markdown(tables), out / "paper_tables.md")
        write_text(paper.paper_latex(tables), out / "paper_tables.tex")
        written += ["paper_tables.md", "paper_tables.tex"]
        report.paper = tables
    if not comparison.empty:
        write_table(comparison, out / "comparison.csv")
        written.append("comparison.csv")
        shown = comparison.dropna(subset=["ours"])
        note = (f"{len(shown)} of {len(comparison)} published values have a counterpart in this run "
                "(comparison.csv has all of them).")
        report.published_note = note + " Each published column: the paper's number, ours [95% CI], and ours - " \
            "paper (✓: the paper's number lies inside our CI)."
        lines.append("\n## Published numbers beside ours\n")
        lines.append(note + "\n")
        if not shown.empty:
            lines.append(comparison_markdown(shown))
        if tables:
            lines.append("\nAs the papers lay them out (paper_tables.md, paper_tables.tex for LaTeX):\n")
            lines.append(paper.paper_markdown(tables))

    jobs = job_table(plan).set_index("config_hash")
    names = model_labels(plan["jobs"])
    if "model_key" not in agg:
        agg = agg.assign(model_key=agg["model"])
    agg = agg.assign(_label=[names.get(k, m) for k, m in zip(agg["model_key"], agg["model"])])
    # where a leaderboard table leaves models out, so do the sections: the models it shows (aggregate.csv has all)
    cut = {t.family: set(t.table.loc[t.table["hidden"] == 0, "model"]) for t in report.leaderboard
           if t.table["hidden"].any()}
    if cut:
        report.sections_note = (f"Per metric and model, for {', '.join(cut)}: the models the leaderboard shows (the "
                                "ends of each setting's ranking in every column); aggregate.csv has every model's "
                                "numbers, by category too.")
        lines.append(f"\n{report.sections_note}\n")
        agg = agg[[f not in cut or m in cut[f] for f, m in zip(agg["metric_family"], agg["_label"])]]
    groups = sorted(agg.groupby(["metric_family", "_label"], sort=False), key=lambda g: (g[0][0], g[0][1]))
    labels_of: dict[str, dict[str, str]] = {}
    for (family, model), df in groups:
        spec = get_metric(family)
        if family not in labels_of:
            labels_of[family] = family_labels(plan, family, per_item)
        labels = labels_of[family]
        hashes = list(pd.unique(df["config_hash"]))
        known = [h for h in hashes if h in jobs.index]
        group = section_title(family, model, heading_note(spec, [jobs.at[h, "cfg"] for h in known],
                                                          [jobs.at[h, "mode"] for h in known]))
        lines.append(f"\n## {group}\n")
        settings = {h: (jobs.at[h, "setting"] if h in jobs.index else "") for h in hashes}
        if len(hashes) > 1:  # settings in the order the sweep's options sort
            hashes.sort(key=lambda h: (setting_order(jobs.at[h, "options"]) if h in jobs.index else (), h))
        with_ci = ci_expected(spec, stats)
        head = df[df.category == "overall"].assign(model=model)
        overall_rows = df[df.category == "overall"]
        head = head.assign(note=[
            cell_reason(spec, m, v, lo, hi, n, with_ci and lb.goal(m) is not None,
                        overall_rows[overall_rows["config_hash"] == h], jobs.at[h, "cfg"] if h in jobs.index else None)
            for v, lo, hi, n, m, h in zip(head["value"], head["ci_low"], head["ci_high"], head["n"], head["metric"],
                                          head["config_hash"])])
        # a p-value or a pass/fail verdict has no CI by nature: said in its row, not left blank without a word
        head["note"] = [note or ("no CI: the outcome of a test, not an estimate" if with_ci and pd.notna(v)
                                 and pd.isna(lo) and (is_p_value(m) or lb.goal(m) is None) else "")
                        for note, v, lo, m in zip(head["note"], head["value"], head["ci_low"], head["metric"])]
        if len(hashes) > 1:
            head = head.assign(setting=head["config_hash"].map(settings))
            head = head.set_index("config_hash").loc[hashes].reset_index()
        has_note = bool((head["note"] != "").any())
        shown = set(df["metric"])  # every row of the table, and every metric of the tables by category and plot
        meanings = meaning_lines(spec, list(dict.fromkeys([*head["metric"], *(
            m for m in (*spec.headline, spec.plot_metric) if m and m in shown)])))
        lines += [f"- {m}" for m in meanings] + ([""] if meanings else [])
        cols = COLUMNS[:2] + (["setting"] if len(hashes) > 1 else []) + COLUMNS[2:] + (["note"] if has_note else [])
        lines.append(markdown_table(head, cols))
        notes = [n for n in [ci_note(spec, stats)] if n]
        for h in hashes:
            overall_metrics = set(head.loc[head["config_hash"] == h, "metric"])
            job_metrics = set(df.loc[df["config_hash"] == h, "metric"])
            where = f"{settings[h]}: " if len(hashes) > 1 else ""
            missing = missing_headline(spec, job_metrics)
            if missing:
                notes.append(where + missing_note(missing))
            per_category = [m for m in missing_headline(spec, overall_metrics) if m in job_metrics]
            if per_category:  # SEAT's effect size and p-value exist per test only
                notes.append(f"{where}{', '.join(per_category)}: computed per category only (no overall value), in "
                             "the tables by category below.")
        lines += [n + "\n" for n in notes]
        section = html.Section(group, _text_rows(head, (["setting"] if len(hashes) > 1 else [])
                                                 + ["metric", "value", "ci_low", "ci_high", "n"]
                                                 + (["note"] if has_note else [])),
                               meanings=meanings, notes=notes)
        report.sections.append(section)
        by_category_metrics = [m for m in (*spec.headline, spec.plot_metric) if m]
        by_category_metrics = list(dict.fromkeys(by_category_metrics))
        for h in hashes:
            setting = settings[h]
            part = html.Part(setting_title(family, model, setting) if len(hashes) > 1 else "")
            if part.title:
                lines.append(f"\n### {part.title}\n")
                section.parts.append(part)
            one = df[df.config_hash == h]
            cat_ci = f"{100 * stats.level:g}% CI" if with_ci else ""
            for title, cat_head, cat_rows in category_tables(one, by_category_metrics, labels, with_ci, spec,
                                                             jobs.at[h, "cfg"] if h in jobs.index else None, cat_ci):
                lines.append(f"\n{title}:\n")
                lines.append(plain_table(cat_head, cat_rows))
                part.by_category.append((title, cat_head, cat_rows))
            if spec.plot_metric:
                suffix = f"__{h}" if len(hashes) > 1 else ""
                png = out / "plots" / f"{model}__{family}__{spec.plot_metric}{suffix}.png"
                caption = (f"{family}: {spec.plot_metric} by category ({model}" + (f", {setting}" if setting else "")
                           + ")")
                bar_plot(one, spec.plot_metric, caption, png, reference=spec.plot_reference, labels=labels,
                         ci=ci_label(stats) if with_ci else "")
                if png.exists():
                    lines.append(f"\n![{caption}](plots/{png.name})\n")
                    part.figure = html.Figure(caption, png)
            by_cat_rows = one[one["category"] != "overall"]
            untested = [m for m in by_category_metrics if (is_p_value(m) or lb.goal(m) is None)
                        and m in set(by_cat_rows["metric"])
                        and by_cat_rows.loc[by_cat_rows["metric"] == m, "ci_low"].isna().all()]
            if with_ci and untested:
                part.notes.append(no_ci_note(untested))
                lines.append(no_ci_note(untested) + "\n")
            if not part.title and (part.by_category or part.figure):
                section.parts.append(part)
    from biasflow.report.timing import STAGE_TIMES_HEAD, STAGE_TIMES_LEGEND, write_stage_times

    report.stage_times = write_stage_times(plan, out, aggregate_started=started)
    if report.stage_times:
        lines += ["\n## Stage times\n", STAGE_TIMES_LEGEND + "\n", plain_table(STAGE_TIMES_HEAD, report.stage_times)]
    lines += provenance_markdown(html.provenance(plan))
    write_text(markdown_safe("\n".join(lines) + "\n"), out / "report.md")  # names a user chose stay text
    report.files = written + ["report.md", "plots/"]
    write_text(html.render(report), out / "report.html")
