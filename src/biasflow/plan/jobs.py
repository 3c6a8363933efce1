"""The plan's model: ``Job`` (one metric x model x benchmark configuration, with the path of every stage it writes) and
``Plan`` (every job of a run or sweep, written to and read from JSON)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


from biasflow.errors import ConfigError
from biasflow.io import stable_hash, write_text_if_changed
from biasflow.models.fingerprint import config_fingerprint


def model_key(model_cfg: dict[str, Any]) -> str:
    return f"{model_cfg['name']}-{config_fingerprint(model_cfg)[:8]}"


@dataclass
class Job:
    metric: str
    model: dict[str, Any]
    metric_cfg: dict[str, Any]
    benchmark: str | None
    benchmark_cfg: dict[str, Any] | None
    stats: dict[str, Any]
    mode: str
    results: str
    sweep_overrides: list[list[str]] = field(default_factory=list)  # every sweep job that asked for this job
    user_files: dict[str, dict[str, str]] = field(default_factory=dict)  # option -> {path, digest}: see user_files()
    score_keys: tuple[str, ...] = ()  # the metric options that change model outputs (MetricSpec.score_keys)
    # files the metric stage writes beside its tables (MetricSpec.extra_outputs): Snakemake outputs, in no hash
    extra_outputs: tuple[str, ...] = ()
    # option -> the user's path of a file the metric exports (MetricSpec.export_options): each its own rule
    exports: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        # one key order whichever way the job was made (composed, or read from a saved plan): Snakemake compares
        # rule params by their text, and a reordered dict would re-run the stage
        for name in ("model", "metric_cfg", "benchmark_cfg", "stats", "user_files"):
            setattr(self, name, canonical(getattr(self, name)))

    def __setattr__(self, name: str, value: Any) -> None:
        # the hashes below are kept until a field is set again (build_plan sets user_files after making the job);
        # the workflow's lookups read each job's paths many times, at 1,000 models seconds of hashing per parse
        super().__setattr__(name, value)
        super().__setattr__("_hashes", {})

    def _hash(self, name: str, compute) -> str:
        if name not in self._hashes:
            self._hashes[name] = compute()
        return self._hashes[name]

    @property
    def model_key(self) -> str:
        return self._hash("model_key", lambda: model_key(self.model))

    @property
    def bench_hash(self) -> str:
        return self._hash("bench_hash", lambda: stable_hash(self.benchmark_cfg, 8))

    def score_hash(self, score_keys: Sequence[str] | None = None) -> str:
        score_keys = tuple(self.score_keys if score_keys is None else score_keys)

        def compute() -> str:
            key = {"model": config_fingerprint(self.model), "benchmark": self.benchmark_cfg,
                   "mode": self.mode, "score": {k: self.metric_cfg.get(k) for k in score_keys}}
            if self.user_files:  # the content of every user file that feeds the job, not only its path
                key["files"] = {k: v["digest"] for k, v in self.user_files.items()}
            return stable_hash(key, 12)

        return self._hash(("score_hash", score_keys), compute)

    @property
    def cfg_hash(self) -> str:
        def compute() -> str:
            key = {"model": config_fingerprint(self.model), "model_name": self.model["name"],
                   "benchmark": self.benchmark_cfg, "metric": self.metric_cfg, "stats": self.stats,
                   "mode": self.mode}
            if self.user_files:
                key["files"] = {k: v["digest"] for k, v in self.user_files.items()}
            return stable_hash(key, 12)

        return self._hash("cfg_hash", compute)

    @property
    def items_path(self) -> str | None:
        return f"{self.results}/items/{self.benchmark}-{self.bench_hash}.parquet" if self.benchmark else None

    def scores_path(self, score_keys: Sequence[str] | None = None) -> str:
        return f"{self.results}/scores/{self.model_key}/{self.metric}-{self.score_hash(score_keys)}.parquet"

    @property
    def metric_dir(self) -> str:
        return f"{self.results}/metrics/{self.model_key}/{self.metric}/{self.cfg_hash}"

    def score_params(self, score_keys: Sequence[str] | None = None) -> dict[str, Any]:
        """Params of the score stage: only what can change model outputs, so a threshold sweep shares it."""
        score_keys = self.score_keys if score_keys is None else score_keys
        p = self.params()
        p["metric_cfg"] = {k: self.metric_cfg.get(k) for k in score_keys if k in self.metric_cfg}
        p.pop("stats")
        p.pop("cfg_hash")
        p["score_hash"] = self.score_hash(score_keys)
        return p

    def params(self) -> dict[str, Any]:
        """What the stage scripts get: everything that determines the job's numbers, nothing else."""
        return {"metric": self.metric, "model": self.model, "metric_cfg": self.metric_cfg,
                "benchmark": self.benchmark, "benchmark_cfg": self.benchmark_cfg, "stats": self.stats,
                "mode": self.mode, "model_key": self.model_key, "cfg_hash": self.cfg_hash,
                "user_files": self.user_files}

    def to_doc(self) -> dict[str, Any]:
        """The job as the plan file stores it: its params and the paths they give (checked when read back)."""
        return dict(self.params(), metric_dir=self.metric_dir, items_path=self.items_path,
                    scores_path=self.scores_path(), score_keys=list(self.score_keys), results=self.results,
                    sweep_overrides=self.sweep_overrides, extra_outputs=list(self.extra_outputs), exports=self.exports)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], where: str | os.PathLike) -> "Job":
        """A job written by ``to_doc``; its paths are recomputed and must equal the saved ones, or the file ``where``
        is not this code's."""
        job = cls(metric=doc["metric"], model=doc["model"], metric_cfg=doc["metric_cfg"], benchmark=doc["benchmark"],
                  benchmark_cfg=doc["benchmark_cfg"], stats=doc["stats"], mode=doc["mode"], results=doc["results"],
                  sweep_overrides=doc["sweep_overrides"], user_files=doc.get("user_files") or {},
                  score_keys=tuple(doc["score_keys"]), extra_outputs=tuple(doc.get("extra_outputs") or ()),
                  exports=dict(doc.get("exports") or {}))
        if job.metric_dir != doc["metric_dir"] or job.scores_path() != doc["scores_path"]:
            raise ConfigError(f"{where}: job {doc['metric_dir']} does not match this biasflow version; plan again")
        return job


PLAN_FORMAT = "biasflow-plan/1"


def canonical(obj: Any) -> Any:
    """``obj`` with every dict's keys sorted (recursively); lists keep their order."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [canonical(v) for v in obj]
    return obj


@dataclass
class Plan:
    jobs: list[Job]
    sweep: list[dict[str, Any]]  # per sweep job: overrides + resolved config
    tracking: dict[str, Any]
    paths: dict[str, Any]
    skipped: list[str]
    benchmarks: dict[str, Any] = field(default_factory=dict)  # every dataset description (for downloads)

    @property
    def plan_hash(self) -> str:
        return stable_hash({"jobs": sorted(j.metric_dir for j in self.jobs), "tracking": self.tracking}, 12)

    @property
    def run_dir(self) -> str:
        return f"{self.paths['results']}/runs/{self.plan_hash}"

    @property
    def path(self) -> str:
        return f"{self.run_dir}/plan.json"

    def to_json(self) -> str:
        doc = {"format": PLAN_FORMAT, "plan_hash": self.plan_hash, "tracking": self.tracking, "paths": self.paths,
               "sweep": self.sweep, "skipped": self.skipped, "benchmarks": self.benchmarks,
               "jobs": [j.to_doc() for j in self.jobs]}
        return json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"

    def write(self, path: str | None = None) -> str:
        """Write the plan (read by every stage and by Snakemake re-parses) only if it changed; return its path."""
        path = path or self.path
        write_text_if_changed(self.to_json(), path)
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Plan":
        """The plan saved by ``write``: no Hydra, no composition (a cluster job parses the workflow in well under a
        second). Every job's paths are recomputed and must equal the saved ones, or the file is not this code's."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not text (UnicodeDecodeError)
            raise ConfigError(f"cannot read the plan {path}: {exc}") from exc
        if doc.get("format") != PLAN_FORMAT:
            raise ConfigError(f"{path} is not a plan of this biasflow version (format {doc.get('format')!r}); "
                              f"plan again with biasflow run / biasflow plan")
        jobs = [Job.from_doc(j, path) for j in doc["jobs"]]
        plan = cls(jobs=jobs, sweep=doc["sweep"], tracking=doc["tracking"], paths=doc["paths"],
                   skipped=doc["skipped"], benchmarks=canonical(doc.get("benchmarks") or {}))
        if plan.plan_hash != doc["plan_hash"]:
            raise ConfigError(f"{path}: plan hash mismatch; plan again")
        return plan


# Options naming files or folders the user provides: their content is part of the job's identity (a file replaced
# in place gives new results, never the old file's), and files are rule inputs. Paths are relative to the cwd.
