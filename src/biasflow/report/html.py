"""The run's report as one self-contained HTML file: opens offline, in a browser or in MLflow's artifact viewer.

Everything is inline (CSS, plots as PNG data URIs); there is no script and no external reference. Text is escaped,
and provenance passes through ``biasflow.secrets.redact_text`` so no key reaches the file.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Mapping, Sequence


from biasflow.provenance import configured_revision, model_source
from biasflow.report.leaderboard import SHOWN_AT_EACH_END, hidden_text
from biasflow.report.sweep import model_labels, summary_line
from biasflow.secrets import redact_text

ALIKE_NOTE = ("Models named alike (folders or hub ids of one name, or one model.name given to different models): "
              "what tells them apart.")

DEMO_WARNING = ("Demo model. At least one model here was built by the pipeline for an offline demonstration; its "
                "numbers are not those of any published model.")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0 auto;max-width:1200px;
padding:1.2em 2em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3{margin-bottom:.3em}code{background:#f3f3f3;padding:0 .25em;border-radius:3px}
.meta{color:#555}.legend{color:#444;font-size:.92em;max-width:70em}
.warning{border:2px solid #d97706;background:#fff7e6;padding:.8em 1em;border-radius:6px;margin:1em 0;font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.9em;display:block;max-width:100%;overflow-x:auto}
th,td{border:1px solid #d0d0d0;padding:.3em .55em;text-align:left;vertical-align:top;overflow-wrap:break-word;
max-width:32em}
ul.meanings{margin:.2em 0 .4em;padding-left:1.2em;font-size:.9em;color:#333}
th{background:#f2f4f7;overflow-wrap:normal;word-break:normal;hyphens:manual}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.goal td{background:#fafafa;color:#555;font-style:italic}
td.best{background:#dcf5e3;font-weight:bold}td.worst{background:#fbe1e3;font-style:italic}
td.sig{font-weight:bold}
figure{display:inline-block;margin:.5em 1em 1em 0;vertical-align:top;max-width:100%}
figure img{max-width:min(100%,560px);border:1px solid #eee}figure.wide img{max-width:100%}
figcaption{font-size:.85em;color:#555}
nav a{margin-right:1em}
details{margin:.4em 0}summary{cursor:pointer;font-weight:600}
"""


@dataclass
class Figure:
    title: str
    path: Path
    wide: bool = False  # drawn at the page's width (several panels), not as a thumbnail-sized plot


@dataclass
class Part:
    """One setting of a sweep within a section (``title`` names family, model and setting; '' when the family's
    jobs have one setting): per-category table, bar plot."""
    title: str
    by_category: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # (title, head, rows)
    notes: list[str] = field(default_factory=list)  # what the tables leave out (no CI for p-values)
    figure: Figure | None = None


@dataclass
class Section:
    """A per (family, model) block: the headline table (a row per setting and metric), then each setting's part."""
    title: str
    head: tuple[list[str], list[list[str]]]
    parts: list[Part] = field(default_factory=list)
    meanings: list[str] = field(default_factory=list)  # what each headline metric measures, which way is fair
    notes: list[str] = field(default_factory=list)  # why cells are blank, what this data does not hold


@dataclass
class HtmlReport:
    plan: Mapping[str, Any]
    leaderboard: list[Any] = field(default_factory=list)  # report.leaderboard.FamilyTable
    model_plots: dict[str, Figure] = field(default_factory=dict)  # family -> the models side by side
    leaderboard_legend: str = ""
    paired: tuple[list[str], list[list[str]]] | None = None
    paired_significant: list[bool] = field(default_factory=list)
    paired_gaps: dict[int, str] = field(default_factory=dict)  # row position -> the tests left out there (text)
    paired_legend: str = ""
    paired_design: list[str] = field(default_factory=list)  # the paired design, where not every pair
    curves: list[Figure] = field(default_factory=list)
    curve_notes: list[str] = field(default_factory=list)  # swept options that changed no headline number
    paper: list[Any] = field(default_factory=list)  # report.paper.PaperTable
    published_note: str = ""
    sections: list[Section] = field(default_factory=list)
    sections_note: str = ""  # which models the sections leave out, where the leaderboard leaves models out
    summary: str = ""  # jobs, every model by its name in this report, metrics
    alike: tuple[list[str], list[list[str]]] = ([], [])  # what tells apart the models named alike
    files: list[str] = field(default_factory=list)
    unfinished: list[Any] = field(default_factory=list)  # progress.JobState of jobs that did not finish
    stage_times: list[list[str]] = field(default_factory=list)  # per rule (report.timing.STAGE_TIMES_HEAD)


def _breakable(text: str) -> str:
    return re.sub(r"([._/])(?=\w)", r"\1<wbr>", text)


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _is_num(text: str) -> bool:
    t = text.replace("[", "").replace("]", "").replace(",", "").replace("–", "").replace("✓", "").strip()
    return bool(t) and all(part.lstrip("+-").replace(".", "", 1).replace("e-", "", 1).isdigit() for part in t.split())


def table(head: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] | None = None,
          cell_classes: Sequence[Sequence[str]] | None = None, spans: Mapping[int, str] | None = None,
          row_ids: Sequence[str] | None = None) -> str:
    """``spans``: rows (by position) drawn as one cell across the table holding that HTML (the rows a long table
    leaves out, with a link to the file that has them). ``row_ids``: each row's id (an address to link to)."""
    # headers break only after "." or "_" ("model.<wbr>device"), never inside a word ("mod el.de vice")
    out = ["<table><thead><tr>" + "".join(f"<th>{_breakable(escape(str(h)))}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        if spans and i in spans:
            out.append(f'<tr class="hidden-rows"><td colspan="{len(head)}" style="font-style:italic;'
                       f'text-align:center">{spans[i]}</td></tr>')
            continue
        rc = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        rc += f' id="{escape(row_ids[i])}"' if row_ids and row_ids[i] else ""
        cells = []
        for j, v in enumerate(row):
            cls = ["num"] if _is_num(str(v)) else []
            if cell_classes and cell_classes[i][j]:
                cls.append(cell_classes[i][j])
            attr = f' class="{" ".join(cls)}"' if cls else ""
            cells.append(f"<td{attr}>{escape(str(v))}</td>")
        out.append(f"<tr{rc}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


IMAGE_SLOT = "@@biasflow-image-{}@@"


def figure(fig: Figure, images: list[Path]) -> str:
    """The figure with a slot for its image (filled after the text is redacted: base64 is not text to redact)."""
    if not Path(fig.path).exists():
        return ""
    images.append(Path(fig.path))
    wide = ' class="wide"' if fig.wide else ""
    return (f'<figure{wide}><img alt="{escape(fig.title)}" src="{IMAGE_SLOT.format(len(images) - 1)}">'
            f"<figcaption>{escape(fig.title)}</figcaption></figure>")


def model_anchor(family: str, model: str, setting: str = "") -> str:
    """The id of a model's row in its family's full leaderboard (``report.html#crows_pairs--tinyA``): a link to a
    model at any size."""
    return re.sub(r"\s+", "_", f"{family}--{model}" + (f"--{setting}" if setting else ""))


def _leaderboard_table(t: Any, rows_of: Any, with_setting: bool, ids: bool = False) -> str:
    metrics = list(t.goals)
    head = ["model"] + (["setting"] if with_setting else []) + metrics
    rows = [["unbiased value"] + ([""] if with_setting else []) + [t.goals[m] or "(not ranked)" for m in metrics]]
    classes = [[""] * len(head)]
    spans, row_ids = {}, [""]
    for r in rows_of.itertuples(index=False):
        if r.hidden:
            spans[len(rows)] = hidden_html(hidden_text(r.hidden, r.total, start=r.start), "leaderboard.csv", "model",
                                           f"every-{t.family}")
            rows.append([])
            classes.append([])
            row_ids.append("")
            continue
        rows.append([r.model] + ([r.setting] if with_setting else []) + [r.cells[m]["text"] for m in metrics])
        classes.append([""] * (len(head) - len(metrics)) + [
            "best" if r.cells[m]["best"] else "worst" if r.cells[m]["worst"] else "" for m in metrics])
        row_ids.append(model_anchor(t.family, r.model, r.setting if with_setting else "") if ids else "")
    return table(head, rows, ["goal"] + [""] * (len(rows) - 1), classes, spans, row_ids if ids else None)


def _leaderboard_html(report: HtmlReport, images: list[Path]) -> str:
    parts = [f'<p class="legend">{escape(report.leaderboard_legend)}</p>']
    for t in report.leaderboard:
        with_setting = bool((t.table["setting"] != "").any())
        every = ""
        if t.full is not None:
            # every row, collapsed: the browser's find searches it (and opens it), and each row has an address;
            # no script or form: MLflow's viewer (a sandboxed iframe) submits no form, and other viewers run no script
            every = (f'<p class="legend">{escape(t.view_note)}</p>'
                     f'<details id="every-{escape(t.family)}"><summary>Every model of {escape(t.family)}: '
                     f"{len(t.full):,} rows in this order (the browser's find searches them; a model's row is at "
                     f"report.html#{escape(model_anchor(t.family, '<model>'))})</summary>"
                     + _leaderboard_table(t, t.full, with_setting, ids=True) + "</details>")
        parts.append(f"<h3>{escape(t.title)}</h3>" + _meanings_html(t.meanings)
                     + _leaderboard_table(t, t.table, with_setting) + every
                     + (f'<p class="legend">{escape(t.ci_note)}</p>' if t.ci_note else "")
                     + (f'<p class="legend">Marks (paired tests): {escape("; ".join(t.notes))}.</p>' if t.notes
                        else ""))
        fig = report.model_plots.get(t.family)
        if fig is not None:
            parts.append(figure(fig, images))
    return "\n".join(parts)


def hidden_html(text: str, csv: str, what: str, every: str = "") -> str:
    """The cell standing for the rows a table leaves out, linking the file beside the report that holds them all
    (and ``every``: the id of the page's own collapsed table of them)."""
    return (f'{escape(text)}: <a href="{escape(csv)}">{escape(csv)}</a> lists every {escape(what)}'
            + (f', as does <a href="#{escape(every)}">every {escape(what)} below</a>' if every else ""))


def _meanings_html(lines: Sequence[str]) -> str:
    if not lines:
        return ""
    items = []
    for line in lines:
        metric, _, text = line.partition(": ")
        items.append(f"<li><code>{escape(metric)}</code>: {escape(text)}</li>")
    return f'<ul class="meanings">{"".join(items)}</ul>'


def _paper_html(report: HtmlReport) -> str:
    from biasflow.report.paper import _delta, _ours, table_heading

    parts = [f'<p class="legend">{escape(report.published_note)}</p>']
    for t in report.paper:
        head = t.row_header + [h for c in t.columns for h in (f"{c} paper", f"{c} ours [CI]", f"{c} Δ")]
        rows = [[str(x) for x in labels] + [v for c in t.columns for v in (
            (cells.get(c) or {}).get("paper", ""), _ours(cells.get(c)), _delta(cells.get(c)))]
            for labels, cells in t.rows]
        source = f' Source: <code>{escape(t.source)}</code>' if t.source else ""
        parts.append(f"<h3>{escape(t.experiment)}</h3><p>{escape(table_heading(t))}{source}</p>" + table(head, rows))
    return "\n".join(parts)


def provenance(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What produced these numbers: code, packages, commands, models and datasets (redacted)."""
    from biasflow.provenance import git_commit, package_versions

    models: dict[str, dict[str, str]] = {}
    datasets: dict[str, dict[str, str]] = {}
    names = model_labels(list(plan["jobs"]))
    for job in plan["jobs"]:
        m = job["model"]
        entry = models.setdefault(job["model_key"], {
            "model": names[job["model_key"]], "kind": str(m.get("kind", "")),
            "source": model_source(m),
            # a blank says why: a model read from files has no revision; a hub id without one is not pinned
            "revision": configured_revision(m) or ("none (local files)" if m.get("path") or m.get("package")
                                                   else "not pinned"),
            "demo": "yes" if m.get("demo") else "no"})
        meta = Path(job["metric_dir"]) / "score_meta.json"
        if meta.exists():
            prov = json.loads(meta.read_text()).get("provenance") or {}
            for k, v in prov.items():
                entry.setdefault(k, str(v))
        items_meta = Path(f"{job['items_path']}.meta.json") if job.get("items_path") else None
        if items_meta is not None and items_meta.exists():
            info = json.loads(items_meta.read_text())
            for key, f in (info.get("files") or {}).items():  # the files the items came from, and their rows
                entry = datasets.setdefault(f"{info.get('benchmark', job.get('benchmark'))}/{key}", {
                    "sha256": str(f.get("sha256", "")), "source": str(f.get("source", "")), "items": ""})
                rows = f"{f['rows']:,}" if isinstance(f.get("rows"), int) else ""  # None: read beside the rows
                if rows and rows not in entry["items"].split(" / "):  # a sweep preparing it twice (limit)
                    entry["items"] = f"{entry['items']} / {rows}" if entry["items"] else rows
    first = plan["jobs"][0] if plan["jobs"] else {}
    return {"plan": plan["plan_hash"], "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "git commit": git_commit(), "mode": str(first.get("mode", "")),
            "bootstrap": json.dumps(first.get("stats") or {}),
            "commands": [" ".join(s.get("overrides") or []) or "(defaults)" for s in plan.get("sweep", [])],
            "skipped": list(plan.get("skipped") or []), "packages": package_versions(),
            "models": models, "datasets": datasets}


def _folded_above_a_page(html: str, n: int, what: str) -> str:
    """``html`` as it is up to 2 x SHOWN_AT_EACH_END rows; above that folded (a list of 1,000 models would push the
    rest of the section a page of rows down; the browser's find still searches it)."""
    if n <= 2 * SHOWN_AT_EACH_END:
        return html
    return f"<details><summary>All {n:,} {what}</summary>{html}</details>"


def _provenance_html(prov: Mapping[str, Any], files: Sequence[str]) -> str:
    kv = [["plan", prov["plan"]], ["created", prov["created"]], ["git commit", prov["git commit"]],
          ["mode", prov["mode"]], ["bootstrap", prov["bootstrap"]]]
    parts = [table(["what", "value"], kv)]
    parts.append("<h3>Overrides of each sweep job</h3>" + _folded_above_a_page(
        "<ul>" + "".join(f"<li><code>{escape(c)}</code></li>" for c in prov["commands"]) + "</ul>",
        len(prov["commands"]), "sweep jobs"))
    if prov["models"]:
        cols = sorted({k for m in prov["models"].values() for k in m}
                      - {"model", "kind", "source", "revision", "demo", "gpu", "cpu"})
        head = ["model key", "model", "kind", "source", "revision", "demo", "scored on"] + cols
        # scored on: the GPU, else the CPU (with any restriction of its kernels), as report.md says it
        rows = [[k, m["model"], m["kind"], m["source"], m["revision"], m["demo"], m.get("gpu") or m.get("cpu") or ""]
                + [m.get(c, "–") for c in cols] for k, m in prov["models"].items()]
        parts.append("<h3>Models</h3>" + ('<p class="legend">–: the setting does not apply to the model\'s kind.</p>'
                                          if any(c not in m for c in cols for m in prov["models"].values()) else "")
                     + _folded_above_a_page(table(head, rows), len(rows), "models"))
    if prov["datasets"]:
        rows = [[k, d["items"], d["sha256"], d["source"]] for k, d in sorted(prov["datasets"].items())]
        parts.append("<h3>Datasets (verified files)</h3><p>The files the items were read from, each with the "
                     "items it gave (after <code>limit</code>; blank: a file read beside them, such as metadata or "
                     "templates, that gives none of its own). A configured file the run did not read (another "
                     "split, a category not chosen) is not listed.</p>"
                     + table(["file", "items", "sha256", "source"], rows))
    if prov["skipped"]:
        parts.append("<h3>Skipped</h3><ul>" + "".join(f"<li>{escape(s)}</li>" for s in prov["skipped"]) + "</ul>")
    parts.append("<details><summary>Package versions</summary>"
                 + table(["package", "version"], [[k.removeprefix("version."), v]
                                                  for k, v in sorted(prov["packages"].items())]) + "</details>")
    if files:
        parts.append("<p>Files of this run (beside this report): "
                     + ", ".join(f"<code>{escape(f)}</code>" for f in files) + "</p>")
    return "\n".join(parts)


def render(report: HtmlReport) -> str:
    plan = report.plan
    images: list[Path] = []
    demo = any(j["model"].get("demo") for j in plan["jobs"])
    nav = [("leaderboard", "Leaderboard", bool(report.leaderboard)), ("paired", "Paired tests", bool(report.paired)),
           ("curves", "Threshold curves", bool(report.curves or report.curve_notes)), ("paper", "Published tables", bool(report.paper)),
           ("details", "Per metric", bool(report.sections)), ("stage-times", "Stage times", bool(report.stage_times)),
           ("provenance", "Provenance", True)]
    body = [f"<h1>biasflow run <code>{escape(plan['plan_hash'])}</code></h1>",
            f'<p class="meta">{escape(report.summary or summary_line(plan))}</p>']
    if report.alike[1]:
        body.append(f'<p class="legend">{escape(ALIKE_NOTE)}</p>' + table(*report.alike))
    if demo:
        body.append(f'<div class="warning" role="alert"><strong>⚠ {escape(DEMO_WARNING.split(". ", 1)[0])}.'
                    f"</strong> {escape(DEMO_WARNING.split('. ', 1)[1])}</div>")
    if report.unfinished:
        from biasflow.report.unfinished import UNFINISHED_HEAD, unfinished_rows

        rows = unfinished_rows(report.unfinished)
        body.append(f'<div class="warning" role="alert"><strong>⚠ Partial results: {len(rows)} job(s) did not '
                    "finish.</strong> Their numbers are missing below. Fix the cause and run the same command again: "
                    "finished jobs are kept and only these run.</div>"
                    + table(UNFINISHED_HEAD, rows))
    body.append("<nav>" + "".join(f'<a href="#{a}">{escape(t)}</a>' for a, t, shown in nav if shown) + "</nav>")
    if report.leaderboard:
        body.append('<h2 id="leaderboard">Leaderboard</h2>' + _leaderboard_html(report, images))
    if report.paired:
        head, rows = report.paired
        classes = [[""] * (len(head) - 1) + ["sig" if s else ""] for s in report.paired_significant]
        body.append('<h2 id="paired">Paired tests between models</h2>'
                    + "".join(f'<p class="legend">{escape(n)}</p>' for n in report.paired_design)
                    + f'<p class="legend">{escape(report.paired_legend)}</p>'
                    + table(head, rows, cell_classes=classes,
                            spans={i: hidden_html(text, "paired_tests.csv", "test")
                                   for i, text in report.paired_gaps.items()}))
    if report.curves or report.curve_notes:
        body.append('<h2 id="curves">Threshold curves</h2>'
                    + "".join(f'<p class="legend">{escape(n)}</p>' for n in report.curve_notes)
                    + "".join(figure(f, images) for f in report.curves))
    if report.paper:
        body.append('<h2 id="paper">Published tables beside ours</h2>' + _paper_html(report))
    if report.sections:
        body.append('<h2 id="details">Per metric and model</h2>'
                    + (f'<p class="legend">{escape(report.sections_note)}</p>' if report.sections_note else ""))
        for s in report.sections:
            block = [f"<h3>{escape(s.title)}</h3>", _meanings_html(s.meanings), table(*s.head)]
            block += [f'<p class="legend">{escape(n)}</p>' for n in s.notes]
            for part in s.parts:
                if part.title:
                    block.append(f"<h4>{escape(part.title)}</h4>")
                for title, head, rows in part.by_category:
                    block.append(f'<p class="legend">{escape(title)}</p>' + table(head, rows))
                block += [f'<p class="legend">{escape(n)}</p>' for n in part.notes]
                if part.figure:
                    block.append(figure(part.figure, images))
            body.append("\n".join(block))
    if report.stage_times:
        from biasflow.report.timing import STAGE_TIMES_HEAD, STAGE_TIMES_LEGEND

        body.append('<h2 id="stage-times">Stage times</h2>'
                    f'<p class="legend">{escape(STAGE_TIMES_LEGEND)}</p>' + table(STAGE_TIMES_HEAD, report.stage_times))
    body.append('<h2 id="provenance">Provenance</h2>' + _provenance_html(provenance(plan), report.files))
    title = f"biasflow run {plan['plan_hash']}"
    doc = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
           f'<meta name="viewport" content="width=device-width, initial-scale=1">'
           f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n" + "\n".join(body)
           + "\n</body></html>\n")
    doc = redact_text(doc)
    for i, path in enumerate(images):
        doc = doc.replace(IMAGE_SLOT.format(i), data_uri(path), 1)
    return doc
