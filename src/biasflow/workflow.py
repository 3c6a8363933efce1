"""Lookups the Snakemake rules use: wildcard values -> inputs and params, all derived from the plan."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from biasflow.errors import ConfigError
from biasflow.plan import Job, Plan, build_plan
from biasflow.report import METRIC_FILES, RUN_FILES, raw_file_paths
from biasflow.scheduling import score_resources
from biasflow.schema import TrackingConfig

# Snakemake priority of building a model and of downloading what it is built from: every job on that model waits
# for it, so it goes before cheaper jobs that are ready (WEAT, SEAT) take the cores
BUILD_PRIORITY = 10


def _overrides(config: Mapping[str, Any]) -> list[str]:
    raw = config.get("overrides", [])
    if isinstance(raw, str):
        return raw.split()
    return [str(x) for x in raw]


def load_plan(config: Mapping[str, Any], remote: bool = False) -> tuple["Plan | PlanHead", "Lookups"]:
    """The plan of this Snakemake invocation: the staged plan named by ``--config plan=PATH`` (what ``biasflow run``
    passes, and what every cluster job's re-parse reads), else composed from ``overrides`` once and staged for later
    parses while nothing it was made from has changed. Parsing writes nothing under ``results/``: the run folder's
    ``plan.json`` is the output of the ``plan`` rule, copied from the staged file.

    ``remote``: this parse runs one cluster job (Snakemake's remote mode, ``workflow.remote_exec``). It reads the
    staged plan's job store (``JobStore``: the summary and the files of the jobs it looks up), not the whole plan, so
    a job's cost does not grow with the sweep; without a store (a plan staged by an older biasflow) the whole plan."""
    if config.get("plan"):
        given = Path(str(config["plan"]))
        store = JobStore.beside(given) if remote else None
        if store is not None:
            return PlanHead.of(store.summary), Lookups(None, str(given), store)
        plan = Plan.read(given)
        # a run folder's plan.json is the plan rule's output, never also its input: stage a copy
        staged = stage_plan(plan) if given.resolve() == Path(plan.path).resolve() else str(given)
        return plan, Lookups(plan, staged)
    multirun = str(config.get("multirun", False)).lower() in ("1", "true", "yes")
    plan, staged = cached_plan(_overrides(config), multirun)
    return plan, Lookups(plan, staged)


STAGE_DIR = Path(".snakemake") / "biasflow" / "plans"


def stage_plan(plan: Plan, workdir: str | os.PathLike = ".") -> str:
    """Write ``plan`` where Snakemake's parses read it (``.snakemake/biasflow/plans/<plan hash>.json`` under the
    working directory, rewritten only when it changed) with its job store beside it; return the absolute path."""
    path = (Path(workdir) / STAGE_DIR / f"{plan.plan_hash}.json").resolve()
    plan.write(str(path))
    JobStore.write(plan, path)
    return str(path)


JOB_STORE_FORMAT = "biasflow-job-store/1"


def _sha256(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class JobStore:
    """A staged plan split for cluster jobs: ``<plan>.jobs/summary.json`` (what the rules' definitions read of the
    whole plan: paths, dataset descriptions, built models, metrics with extra files, exports) and one file per job,
    named by the hash of the path it is looked up by (its metric folder, its scores file, its items table). A cluster
    job's parse reads the summary and the few jobs its target needs: at 1,000 models the whole plan took seconds to
    read and check, per job."""

    def __init__(self, folder: Path, summary: dict[str, Any]):
        self.folder = folder
        self.summary = summary
        self._jobs: dict[str, Job] = {}

    @staticmethod
    def folder_of(staged_plan: str | os.PathLike) -> Path:
        return Path(staged_plan).with_suffix(".jobs")

    @staticmethod
    def _name(path: str) -> str:
        from biasflow.io import stable_hash

        return f"{stable_hash(path, 20)}.json"

    @classmethod
    def beside(cls, staged_plan: str | os.PathLike) -> "JobStore | None":
        """The store of ``staged_plan`` if it was written for this plan file as it is now, else None: the plan file's
        size and modification time as recorded, or (a copy that did not keep the times: ``cp -r``, ``rsync -r``) its
        size and sha256, which costs a read of the file, not a parse of the plan."""
        folder = cls.folder_of(staged_plan)
        try:
            summary = json.loads((folder / "summary.json").read_text())
            plan_stat = os.stat(staged_plan)
        except (OSError, ValueError):
            return None
        recorded = summary.get("plan_file") if isinstance(summary, dict) else None
        if summary.get("format") != JOB_STORE_FORMAT or not isinstance(recorded, list) or not recorded \
                or recorded[0] != plan_stat.st_size:
            return None  # another format, or the plan file was rewritten after the store
        if recorded[1:] != [plan_stat.st_mtime_ns] and summary.get("plan_sha256") != _sha256(staged_plan):
            return None
        return cls(folder, summary)

    @classmethod
    def write(cls, plan: Plan, staged_plan: str | os.PathLike) -> None:
        """Write the store of ``plan`` (staged at ``staged_plan``) unless it is there for this plan file already;
        written into a new folder and renamed into place, so a reader sees the old store or the new one."""
        import shutil
        import tempfile

        if cls.beside(staged_plan) is not None:
            return
        folder = cls.folder_of(staged_plan)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # as a folder made by mkdir: a group's shared project reads it (mkdtemp: 0700)
        written: set[str] = set()
        for job in plan.jobs:
            doc = json.dumps(job.to_doc(), sort_keys=True, default=str)
            for key in (job.metric_dir, job.scores_path(), job.items_path):
                if key and key not in written:  # the first job with that scores file / items table, as Lookups
                    written.add(key)
                    (tmp / cls._name(key)).write_text(doc)
        stat = os.stat(staged_plan)
        summary = dict(plan_summary(plan), format=JOB_STORE_FORMAT, plan_file=[stat.st_size, stat.st_mtime_ns],
                       plan_sha256=_sha256(staged_plan))
        (tmp / "summary.json").write_text(json.dumps(summary, sort_keys=True, default=str))
        old = folder.with_name(tmp.name + ".old")
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)

    def job(self, path: str) -> Job:
        """The job looked up by ``path`` (a metric folder, scores file or items table); KeyError if the plan has
        none. A damaged or misplaced file is an error naming it and the way out."""
        if path not in self._jobs:
            file = self.folder / self._name(path)
            try:
                doc = json.loads(file.read_text())
                job = Job.from_doc(doc, file)
            except FileNotFoundError:
                raise KeyError(path) from None
            except (ValueError, KeyError, TypeError, ConfigError) as exc:
                raise ConfigError(f"{file}: a damaged file of the plan's job store ({exc}); delete {self.folder} and "
                                  f"run again (biasflow run writes it anew)") from None
            if path not in (job.metric_dir, job.scores_path(), job.items_path):
                raise ConfigError(f"{file}: the job store's file for {path} holds another job ({job.metric_dir}); "
                                  f"delete {self.folder} and run again (biasflow run writes it anew)")
            self._jobs[path] = job
        return self._jobs[path]


def plan_summary(plan: Plan) -> dict[str, Any]:
    """What the workflow's rule definitions read of the whole plan, small whatever the sweep's size."""
    job_benchmarks = dict(plan.benchmarks)
    built: dict[str, dict[str, Any]] = {}
    for job in plan.jobs:
        if job.benchmark:
            job_benchmarks[job.benchmark] = job.benchmark_cfg  # a job's own (possibly overridden) description wins
        if job.model.get("build"):  # one recipe per folder (check_built_models): the first job's
            built.setdefault(os.path.normpath(str(job.model["path"])), job.model)
    return {"plan_hash": plan.plan_hash, "run_dir": plan.run_dir, "plan_path": plan.path, "paths": plan.paths,
            "tracking": plan.tracking, "benchmarks": plan.benchmarks, "job_benchmarks": job_benchmarks,
            "built_models": list(built.values()),
            "families_with_extras": {j.metric: list(j.extra_outputs) for j in plan.jobs if j.extra_outputs},
            "exports": [[job.metric_dir, option, path] for job in plan.jobs
                        for option, path in sorted(job.exports.items())]}


class PlanHead:
    """The plan as a cluster job's parse sees it (``load_plan(remote=True)``): its hash, folders and tracking."""

    def __init__(self, plan_hash: str, run_dir: str, path: str, paths: dict[str, Any], tracking: dict[str, Any]):
        self.plan_hash, self.run_dir, self.path, self.paths, self.tracking = plan_hash, run_dir, path, paths, tracking

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> "PlanHead":
        return cls(summary["plan_hash"], summary["run_dir"], summary["plan_path"], summary["paths"],
                   summary["tracking"])


def _inputs_state(paths) -> list:
    out = []
    for p in sorted(paths):
        try:
            st = os.stat(p)
            out.append([p, st.st_mtime_ns, st.st_size])
        except OSError:
            out.append([p, None, None])
    return out


def plan_cache_key(overrides: list[str], multirun: bool) -> str:
    """What a plan is made from: the overrides, every config file, the package's code and the environment
    variables configs may read. Any change makes a new plan."""
    from biasflow.io import stable_hash
    from biasflow.plan import conf_dir
    from biasflow.plan.composition import env_names_read
    from biasflow.secrets import environ_snapshot

    code = Path(__file__).resolve().parent
    files = [*conf_dir().rglob("*.yaml"), *code.rglob("*.py")]
    # the variables biasflow reads, and every one a config file reads (${oc.env:NAME})
    read = set(env_names_read("\n".join(Path(f).read_text(errors="replace") for f in sorted(map(str, files))
                                        if f.endswith(".yaml"))))
    env = {k: v for k, v in environ_snapshot().items() if k.startswith(("BIASFLOW_", "MLFLOW_")) or k in read}
    return stable_hash({"overrides": overrides, "multirun": multirun, "files": _inputs_state(map(str, files)),
                        "env": env}, 16)


def cached_plan(overrides: list[str], multirun: bool) -> tuple[Plan, str]:
    """``build_plan`` once per distinct input, staged (``stage_plan``); re-parses (Snakemake parses the Snakefile
    again for every cluster job and for every `snakemake` command) read the staged plan. User files (predictions,
    local models) are checked by mtime and size: a changed one plans again, since their digests are part of the job
    paths. Returns the plan and its staged path."""
    import json

    key = plan_cache_key(overrides, multirun)
    cache = STAGE_DIR / f"composed-{key}.json"
    if cache.exists():
        try:
            saved = json.loads(cache.read_text())
            if _inputs_state(saved["user_files"]) == saved["user_files_state"]:
                return Plan.read(saved["plan"]), saved["plan"]
        except Exception:  # a stale or damaged cache entry only costs a new plan
            pass
    plan = build_plan(overrides, multirun=multirun)
    path = stage_plan(plan)
    files = sorted({f["path"] for j in plan.jobs for f in j.user_files.values()})
    from biasflow.io import write_json

    write_json({"plan": path, "user_files": files, "user_files_state": _inputs_state(files)}, cache)
    return plan, path


def check_built_models(jobs) -> None:
    """Every folder a plan builds a model into holds one recipe (``model.build`` and ``model.train``). Each training
    setting is its own model (its own key: ``train`` is in the fingerprint), but the build rule makes one model per
    folder: a second setting's jobs would score the first one's weights under their own key. Refused, naming both."""
    recipes: dict[str, dict[str, Any]] = {}
    for job in jobs:
        model = job.model
        if model.get("build"):
            recipe = json.dumps({"build": model["build"], "train": model.get("train") or {}}, sort_keys=True)
            recipes.setdefault(os.path.normpath(str(model["path"])), {}).setdefault(recipe, model)
    for path, found in recipes.items():
        if len(found) > 1:
            settings = "; ".join(f"{m['name']}: {recipe}" for recipe, m in found.items())
            raise ConfigError(f"model.path={path}: this plan builds {len(found)} different models into this one "
                              f"folder ({settings}); give each training setting its own run and folder: "
                              f"model.train.<option>=<value> model.path={path}_<setting>")


class Lookups:
    """Wildcards -> jobs, inputs and params, for the rules. From the whole plan (``plan``), or on a cluster job
    from its job store (``store``, plan None): then the run-level lists (``every_output``, ``run_inputs``,
    ``mlflow_inputs``) hold only the plan file, as those rules run in the main process, never on a cluster node."""

    def __init__(self, plan: Plan | None, staged_plan: str, store: JobStore | None = None):
        self.plan = plan
        self.store = store
        self.summary = store.summary if store is not None else plan_summary(plan)
        if plan is not None:
            check_built_models(plan.jobs)  # when the workflow is parsed, before any job
        self.staged_plan = staged_plan  # what the plan rule copies into the run folder
        self.plan_path = self.summary["plan_path"]  # the run folder's plan.json: the plan rule's output
        self.results = self.summary["paths"]["results"]
        self.resources = self.summary["paths"]["resources"]
        self.run_dir = self.summary["run_dir"]
        # metric folder, scores file, items table -> the job (the first of a shared scores file / items table)
        self.by_path: dict[str, Job] = {}
        for job in plan.jobs if plan is not None else ():
            self.by_path[job.metric_dir] = job
            self.by_path.setdefault(job.scores_path(), job)
            if job.items_path:
                self.by_path.setdefault(job.items_path, job)

    def _job(self, path: str) -> Job:
        try:
            if path in self.by_path or self.store is None:
                return self.by_path[path]
            return self.store.job(path)
        except KeyError:
            where = (f"; or its file in the job store {self.store.folder} is gone: delete that folder and run again"
                     if self.store is not None else "")
            raise ConfigError(f"{path}: no job of the plan {self.staged_plan} writes it (a target of another plan"
                              f"{where})") from None

    # ---- targets
    def final_target(self) -> str:
        name = "mlflow.json" if TrackingConfig.model_validate(self.summary["tracking"] or {}).enabled \
            else "aggregate.parquet"
        return f"{self.run_dir}/{name}"

    # ---- data
    def file_spec(self, benchmark: str, filename: str) -> dict[str, Any]:
        bcfg = self.summary["job_benchmarks"].get(benchmark)
        if not bcfg:
            raise ValueError(f"no benchmark config {benchmark!r}")
        for key, spec in bcfg["files"].items():
            if spec["filename"] == filename:
                return {"key": key, "sources": spec["sources"]}
        raise ValueError(f"benchmark {benchmark!r} has no file {filename!r}")

    def local_sources(self, benchmark: str, filename: str) -> list[str]:
        """The sources of a dataset file that are files on this machine (``file://`` URLs): the download's inputs."""
        from urllib.parse import unquote, urlparse

        urls = [s.get("url", "") for s in self.file_spec(benchmark, filename)["sources"]]
        return [unquote(urlparse(u).path) for u in urls if u.startswith("file://")
                and os.path.isfile(unquote(urlparse(u).path))]

    def raw_files(self, benchmark: str, bcfg: Mapping[str, Any]) -> dict[str, str]:
        return raw_file_paths(self.resources, benchmark, bcfg)

    def items_job(self, benchmark: str, bhash: str) -> Job:
        return self._job(f"{self.results}/items/{benchmark}-{bhash}.parquet")

    # ---- models
    def model_inputs(self, model: Mapping[str, Any]) -> list[str]:
        """Models the workflow builds itself (the demo model) are inputs of the stages that use them."""
        return [model["path"]] if model.get("build") else []

    def built_model(self, path: str) -> Mapping[str, Any]:
        for model in self.built_models():  # one recipe per folder (check_built_models, when parsed)
            if os.path.normpath(model["path"]) == os.path.normpath(path):
                return model
        raise ValueError(f"no model of this plan is built at {path}")

    def build_params(self, path: str) -> dict[str, Any]:
        """The build rule's params: only what the build reads (the recipe and its training settings), so changing
        how the model is scored (dtype, batch_tokens, device, name) never rebuilds or overwrites it."""
        model = self.built_model(path)
        return {"build": model["build"], "train": dict(model.get("train") or {})}

    def build_threads(self, path: str, workflow) -> int:
        """The build rule's threads. On a cluster, the training's own thread count (``model.train.threads``). On one
        machine one: the model is the longest wait of a run, and a job claiming two cores waits until two are free
        at the same moment, which on a busy 2-core machine is only after every cheaper job that is ready (WEAT,
        SEAT, downloads) has run; with one it starts at once and trains on its threads beside them."""
        from biasflow.models.demo import demo_threads

        if workflow.local_exec and not workflow.remote_exec:
            return 1
        return demo_threads(self.built_model(path).get("train") or {})

    def download_priority(self, benchmark: str, filename: str) -> int:
        """Snakemake priority of a download: ``BUILD_PRIORITY`` for the files a model is built from."""
        wanted = {os.path.normpath(p) for p in self.demo_training_texts()} if self.built_models() else set()
        return BUILD_PRIORITY if os.path.normpath(f"{self.resources}/datasets/{benchmark}/{filename}") in wanted else 0

    def built_models(self) -> list[Mapping[str, Any]]:
        return self.summary["built_models"]

    def demo_training_texts(self) -> list[str]:
        from biasflow.models.demo import TRAINING_BENCHMARK

        return list(self.raw_files(TRAINING_BENCHMARK, self.summary["benchmarks"][TRAINING_BENCHMARK]).values())

    # ---- scores and metrics
    def score_job(self, model_key: str, metric: str, shash: str) -> Job:
        return self._job(f"{self.results}/scores/{model_key}/{metric}-{shash}.parquet")

    def metric_job(self, model_key: str, metric: str, chash: str) -> Job:
        return self._job(f"{self.results}/metrics/{model_key}/{metric}/{chash}")

    def score_resources(self, wildcards) -> dict[str, int]:
        """The score rule's threads and resources, from its model's config (biasflow.scheduling)."""
        return score_resources(self.score_job(wildcards.model_key, wildcards.metric, wildcards.shash).model)

    def score_threads(self, wildcards, workflow) -> int:
        """The score rule's threads: the model config's CPUs on a cluster; on one machine at most half its cores,
        so two scoring jobs share it (one small model's job rarely keeps more than one core busy, and a job that
        claims every core leaves the others idle)."""
        cpus = self.score_resources(wildcards)["cpus"]
        if workflow.local_exec and not workflow.remote_exec:
            return max(1, min(cpus, int(workflow.cores) // 2))
        return cpus

    def score_inputs(self, job: Job) -> dict[str, Any]:
        inputs: dict[str, Any] = {"model": self.model_inputs(job.model), "user_files": self.user_file_inputs(job),
                                  "user_folders": self.user_folder_inputs(job)}
        if job.items_path:
            inputs["items_file"] = job.items_path
        return inputs

    def metric_inputs(self, job: Job) -> dict[str, Any]:
        inputs: dict[str, Any] = {"scores": job.scores_path(), "score_meta": f"{job.scores_path()}.meta.json",
                                  "user_files": self.user_file_inputs(job)}
        if job.items_path:
            inputs["items_file"] = job.items_path
        return inputs

    @staticmethod
    def metric_files(job: Job) -> list[str]:
        """Every file a metric job writes into its folder (the metric rule's outputs)."""
        return [f"{job.metric_dir}/{name}" for name in (*METRIC_FILES, *job.extra_outputs)]

    def export_inputs(self, job: Job) -> dict[str, Any]:
        return {k: v for k, v in self.metric_inputs(job).items() if k != "score_meta"}

    def exports(self) -> list[tuple[Job, str, str]]:
        """(job, option, path) of every file a job exports where the user asked (one rule each)."""
        return [(self._job(metric_dir), option, path) for metric_dir, option, path in self.summary["exports"]]

    def families_with_extras(self) -> dict[str, tuple[str, ...]]:
        """Metric -> the files it writes beside its tables, for the metrics of this plan that write any."""
        return {metric: tuple(extras) for metric, extras in self.summary["families_with_extras"].items()}

    def every_output(self) -> list[str]:
        """Every file of the plan's DAG except downloads: rule all's targets. Snakemake re-creates a missing file
        only when something asks for it, and a user who deletes a report or metadata file whose downstream files are
        up to date expects it back. (A download's record ``<file>.source.json`` is not asked for: a dataset file
        placed by hand has none, and re-running its download would replace the file.)"""
        if self.plan is None:
            return []
        jobs = self.plan.jobs
        return sorted({self.plan_path, *self.run_files().values(), f"{self.run_dir}/plots",
                       *(f for j in jobs for f in self.metric_files(j)),
                       *(f"{j.scores_path()}.meta.json" for j in jobs),
                       *(f"{j.items_path}.meta.json" for j in jobs if j.items_path),
                       *(path for _, _, path in self.exports())})

    # ---- run level
    def run_files(self) -> dict[str, str]:
        """The run folder's tables and report (the aggregate rule's outputs), by name."""
        return {name.replace(".", "_"): f"{self.run_dir}/{name}" for name in RUN_FILES}

    def run_inputs(self) -> dict[str, Any]:
        """What the run report reads: the plan, every job's tables and score provenance, the items' descriptions."""
        if self.plan is None:
            return {"plan": self.plan_path}
        jobs = self.plan.jobs
        return {"plan": self.plan_path,
                "aggregates": [f"{j.metric_dir}/aggregate.parquet" for j in jobs],
                "per_items": [f"{j.metric_dir}/per_item.parquet" for j in jobs],
                "score_metas": [f"{j.metric_dir}/score_meta.json" for j in jobs],
                # the retried-jobs section reads each score job's time; the category labels read the items
                "score_job_metas": sorted({f"{j.scores_path()}.meta.json" for j in jobs}),
                "item_tables": sorted({j.items_path for j in jobs if j.items_path}),
                "items_metas": sorted({f"{j.items_path}.meta.json" for j in jobs if j.items_path})}

    def mlflow_inputs(self) -> dict[str, Any]:
        """What logging a run reads: the plan, the run folder's report files and every job's folder."""
        if self.plan is None:
            return {"plan": self.plan_path}
        return {"plan": self.plan_path, **self.run_files(), "plots": f"{self.run_dir}/plots",
                "metric_files": [f for j in self.plan.jobs for f in self.metric_files(j)],
                "items_metas": self.run_inputs()["items_metas"]}

    def user_folder_inputs(self, job: Job) -> list[str]:
        """User folders feeding the job (a local checkpoint), not built by this workflow (those are model inputs)."""
        built = {os.path.normpath(p) for p in self.model_inputs(job.model)}
        return sorted({f["path"] for f in job.user_files.values()
                       if os.path.isdir(f["path"]) and os.path.normpath(f["path"]) not in built})

    @staticmethod
    def user_file_inputs(job: Job) -> list[str]:
        """User files (not folders) feeding the job; their content digest is already in the output paths."""
        return sorted({f["path"] for f in job.user_files.values() if os.path.isfile(f["path"])})


__all__ = ["load_plan", "Lookups", "JobStore", "PlanHead", "plan_summary", "stage_plan"]
