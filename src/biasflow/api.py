"""biasflow from Python (notebooks, scripts): the pipeline with the command line's overrides, and the generated-text
metrics on your own prompts and responses.

    import biasflow.api as bf

    jobs = bf.plan("metric=[crows_pairs]", "model=bert_base_uncased").jobs        # what would run
    res = bf.run("metric=[crows_pairs]", "benchmark.crows_pairs.limit=100")      # `biasflow run ...`
    res.aggregate, res.per_item, res.leaderboard, res.paired_tests, res.run_dir   # leaderboard: models x metrics
    scores = bf.evaluate("langfair_stereotype", responses)                       # a DataFrame: prompt, response

``run`` is ``biasflow run`` (the same plan, Snakemake DAG, cache, files and MLflow runs); ``evaluate`` runs one
generated-text metric's stages in this process (no Snakemake, no MLflow) on a responses table, through the same
plan, answer cache and metric code as ``biasflow run metric=[...] +generator=responses_file``: the same numbers.
Overrides are Hydra's, exactly as on the command line (``docs/python_api.md``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from biasflow.errors import BiasflowError, ConfigError, DataFormatError


def generated_text_metrics() -> list[str]:
    """The metrics that score generated text, and so accept a table of responses: those that take a ``generator``
    model (derived from the metrics' declarations, so a new one appears here by itself)."""
    from biasflow.registry import METRICS, load_all

    load_all()
    return sorted(name for name, spec in METRICS.items() if "generator" in spec.model_kinds)


def user_table_metrics() -> dict[str, str]:
    """The metrics that score a table of your own system's outputs (predictions, recommendation lists), asking no
    model, with the option that names the table (``MetricSpec.user_table``)."""
    from biasflow.registry import METRICS, load_all

    load_all()
    return {name: spec.user_table for name, spec in sorted(METRICS.items()) if spec.user_table}


class RunFailed(BiasflowError):
    """``run`` ended without finishing: ``results`` holds what finished (the run's partial report), ``unfinished``
    each job that did not (``progress.JobState``: metric, model, state, error, log), ``outcome`` the rest
    (``runner.RunOutcome``: exit code, signal, resume command)."""

    def __init__(self, message: str, results: "Results", unfinished: list | None = None, outcome=None):
        super().__init__(message)
        self.results = results
        self.unfinished = list(unfinished or [])
        self.outcome = outcome


def _read(path: Path) -> pd.DataFrame | None:
    if not path.exists():
        return None
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


@dataclass
class Results:
    """A run's tables as pandas DataFrames (None where the run has no such table, e.g. paired tests of one model)."""

    run_dir: Path | None
    jobs: list[Path] = field(default_factory=list)  # the metric folders the tables come from

    def _run_table(self, name: str) -> pd.DataFrame | None:
        return _read(self.run_dir / name) if self.run_dir is not None else None

    def _job_tables(self, name: str) -> pd.DataFrame | None:
        frames = [pd.read_parquet(d / name) for d in self.jobs if (d / name).exists()]
        return pd.concat(frames, ignore_index=True) if frames else None

    @property
    def aggregate(self) -> pd.DataFrame | None:
        """model, benchmark, metric, category, value, ci_low, ci_high, n, ... (one row per number)."""
        table = self._run_table("aggregate.parquet")
        return table if table is not None else self._job_tables("aggregate.parquet")

    @property
    def per_item(self) -> pd.DataFrame | None:
        table = self._run_table("per_item.parquet")
        return table if table is not None else self._job_tables("per_item.parquet")

    @property
    def leaderboard(self) -> pd.DataFrame | None:
        """Models x headline metrics: a row per (model, setting), a column per (family, metric, stat) where stat is
        value, ci_low or ci_high (``res.leaderboard["crows_pairs", "metric_score", "value"]``)."""
        long = self.leaderboard_long
        if long is None:
            return None
        from biasflow.report.leaderboard import wide_frame

        return wide_frame(long)

    @property
    def leaderboard_long(self) -> pd.DataFrame | None:
        """The leaderboard as ``leaderboard.csv`` holds it: a row per (job, headline metric) with its goal, distance,
        rank, best / worst marks and the paired test that decided them."""
        return self._run_table("leaderboard.csv")

    @property
    def paired_tests(self) -> pd.DataFrame | None:
        """Every pair of models on the same items (``paired_tests.csv``): with one model a table with the same
        columns and no rows; None only when the run wrote no tables."""
        return self._run_table("paired_tests.csv")

    @property
    def report(self) -> Path | None:
        """The HTML report (open it in a browser, or ``IPython.display.HTML(res.report.read_text())``)."""
        path = self.run_dir / "report.html" if self.run_dir is not None else None
        return path if path is not None and path.exists() else None

    def value(self, metric: str, category: str = "overall", model: str | None = None) -> float:
        """One number of the aggregate table (the only model's, or ``model``'s)."""
        agg = self.aggregate
        rows = agg[(agg["metric"] == metric) & (agg["category"] == category)]
        if model is not None:
            rows = rows[rows["model"] == model]
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} rows for metric={metric!r}, category={category!r}"
                           + (f", model={model!r}" if model else "") + "; give model= (models: "
                           f"{sorted(agg['model'].unique())})")
        return float(rows["value"].iloc[0])


def _overrides(overrides: Sequence[str]) -> list[str]:
    if len(overrides) == 1 and isinstance(overrides[0], (list, tuple)):
        overrides = list(overrides[0])  # run(["a=1", "b=2"]) as well as run("a=1", "b=2")
    bad = [o for o in overrides if not isinstance(o, str)]
    if bad:
        raise ConfigError(f"overrides are strings such as 'metric=[crows_pairs]', got {bad[0]!r}")
    return list(overrides)


def plan(*overrides: str, multirun: bool = False):
    """The plan ``biasflow plan`` shows: ``.jobs`` (metric, model, metric_dir, ...), ``.run_dir``."""
    from biasflow.plan import build_plan

    return build_plan(_overrides(overrides), multirun=multirun)


def run(*overrides: str, multirun: bool = False, cores: int | str = "all",
        snakemake_args: Sequence[str] = ()) -> Results:
    """``biasflow run [-m] overrides... --cores N -- snakemake_args``; its tables. Raises ``RunFailed`` (with the
    partial results and the unfinished jobs) when a job failed or the run was stopped, ``ConfigError`` for a bad
    override, before anything runs."""
    from biasflow.runner import execute, failure_text

    overrides = _overrides(overrides)
    the_plan = plan(*overrides, multirun=multirun)  # validates before Snakemake starts
    try:
        outcome = execute(the_plan, overrides, multirun=multirun, cores=cores, snakemake_args=list(snakemake_args))
    except BiasflowError as exc:  # no workflow to run (no Snakefile), an unwritable folder: nothing ran
        raise RunFailed(f"biasflow run did not start: {exc}", Results(run_dir=Path(the_plan.run_dir))) from None
    results = Results(run_dir=outcome.run_dir)
    if not outcome.ok:
        if not (outcome.run_dir / "plan.json").exists() and not outcome.unfinished:
            # nothing ran (a locked folder, a Snakefile that does not parse, ...): nothing to resume
            raise RunFailed(f"biasflow run did not start (exit code {outcome.exit_code}): "
                            f"{failure_text(outcome)}", results, outcome=outcome)
        causes = "".join(f"\n  {u.metric} / {u.model}: {u.state}" + (f" ({u.error})" if u.error else "")
                         for u in outcome.unfinished)
        raise RunFailed(f"biasflow run ended with exit code {outcome.exit_code}; {len(outcome.unfinished)} job(s) "
                        f"did not finish:{causes}\n{failure_text(outcome)}", results,
                        unfinished=outcome.unfinished, outcome=outcome)
    return results


def _table_file(table: pd.DataFrame | str | Path, folder: Path, option: str) -> Path:
    """Your outputs' table as a Parquet file named by its content (its columns are checked where the metric reads
    it, naming the file and row); a path is used as it is."""
    if isinstance(table, (str, Path)):
        return Path(table).resolve()
    if not isinstance(table, pd.DataFrame):
        raise DataFormatError(f"{option}: a pandas DataFrame or a file path; got {type(table).__name__}")
    table = table.reset_index(drop=True)
    blob = table.to_json(orient="split", force_ascii=False).encode()
    path = folder / f"{option.removesuffix('_file')}-{hashlib.sha256(blob).hexdigest()[:16]}.parquet"
    if not path.exists():
        from biasflow.io import write_parquet

        write_parquet(table, path)
    return path.resolve()


def _responses_file(responses: pd.DataFrame | str | Path, folder: Path) -> Path:
    """The responses as a Parquet file named by its content (the same table is the same file, so the cache and the
    job folders are shared with every call and with the command line on that file)."""
    if isinstance(responses, (str, Path)):
        return Path(responses).resolve()
    if not isinstance(responses, pd.DataFrame):
        raise DataFormatError(f"responses: a pandas DataFrame with columns prompt and response, or a file path; "
                              f"got {type(responses).__name__}")
    missing = [c for c in ("prompt", "response") if c not in responses.columns]
    if missing:
        raise DataFormatError(f"responses has no column {', '.join(map(repr, missing))} (columns: "
                              f"{list(responses.columns)})")
    table = responses.reset_index(drop=True)
    if table.empty:
        raise DataFormatError("responses is empty: no prompt and response to score")
    from biasflow.generation.answer import check_text_columns

    check_text_columns(table, "responses")
    blob = table.to_json(orient="split", force_ascii=False).encode()
    path = folder / f"responses-{hashlib.sha256(blob).hexdigest()[:16]}.parquet"
    if not path.exists():
        from biasflow.io import write_parquet

        write_parquet(table, path)
    return path.resolve()


def _quoted(value: str) -> str:
    """A string as one quoted value of a Hydra override: any character a name or path may hold (``<``, ``'``, ``,``,
    ``${``) is text, not override grammar, a sweep or an interpolation."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"  # no interpolation


def evaluate(metric: str, responses: pd.DataFrame | str | Path, *overrides: str,
             name: str = "responses") -> Results:
    """Compute a metric with its bootstrap CIs on your own system's outputs, in this process without Snakemake or
    MLflow. ``name`` names the system that wrote them (tables, folders).

    * A generated-text metric (``generated_text_metrics()``: ``langfair_stereotype``, ``counterfactual``, ...) on
      your responses: a DataFrame (or CSV / JSONL / Parquet file) with columns ``prompt`` and ``response`` (HONEST:
      k responses per template prompt). The same plan, cache and code as ``biasflow run metric=[<metric>]
      +generator=responses_file generator.path=<file> generator.name=<name>``.
    * A metric of a table of outputs (``user_table_metrics()``: ``classification_fairness`` on predictions with
      ``y_true``, ``y_pred``, ``group``; ``recommendation_fairness`` on recommendation lists): the table or its file,
      as ``biasflow run metric=[<metric>] metric.<metric>.<its file option>=<file> model.name=<name>``."""
    from biasflow import stages
    from biasflow.plan import build_plan, compose

    scoring_text, tables = generated_text_metrics(), user_table_metrics()
    if metric not in scoring_text and metric not in tables:
        raise ConfigError(f"evaluate: metric {metric!r} scores neither generated text nor a table of your outputs; "
                          f"one of {', '.join(scoring_text + list(tables))} (other metrics: run(...))")
    overrides = _overrides(overrides)
    results_dir = Path(compose([f"metric=[{metric}]", *overrides])["paths"]["results"])  # its own options too
    if metric in tables:
        path = _table_file(responses, results_dir / "api", tables[metric])
        # the metric asks the model nothing: its config only names the system (GloVe: packaged, nothing to fetch)
        the_plan = build_plan([f"metric=[{metric}]", f"metric.{metric}.{tables[metric]}={_quoted(str(path))}",
                               "model=glove_6b_50d", f"model.name={_quoted(name)}", *overrides])
    else:
        path = _responses_file(responses, results_dir / "api")
        # a metric that reads the responses alone takes their prompts as its items (plan.responses_as_items)
        the_plan = build_plan([f"metric=[{metric}]", "+generator=responses_file",
                               f"generator.path={_quoted(str(path))}", f"generator.name={_quoted(name)}", *overrides])
    resources, cache = the_plan.paths["resources"], the_plan.paths["cache"]
    return Results(run_dir=None, jobs=[stages.run_job(job, resources, cache).metric_dir for job in the_plan.jobs])


__all__ = ["plan", "run", "evaluate", "Results", "RunFailed", "generated_text_metrics", "user_table_metrics"]
