"""The work of each Snakemake stage, as plain functions of paths and configs (scripts/ only unpack arguments)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import yaml

from biasflow.errors import DataFormatError
from biasflow.io import write_json, write_parquet, write_text
from biasflow.registry import ScoreContext, get_loader, get_metric
from biasflow.stats.bootstrap import bootstrap_ci

log = logging.getLogger(__name__)


def setup_logging(log_file: str | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(max(1, int(n)))


def download_file(sources, dest: str, wheel_dir: str) -> dict:
    from biasflow.data.download import fetch_verified

    return fetch_verified(sources, dest, wheel_dir=wheel_dir)


def build_demo_model(model_cfg: Mapping[str, Any], text_files, out_dir: str, threads: int = 1) -> dict:
    from biasflow.data.bold import documents
    from biasflow.models.demo import build_demo_mlm

    set_threads(threads)
    return build_demo_mlm(documents(text_files), out_dir, model_cfg.get("train", {}))


def prepare(benchmark: str, benchmark_cfg: Mapping[str, Any], raw_files: Mapping[str, str], out: str) -> pd.DataFrame:
    loader = get_loader(benchmark_cfg.get("loader", benchmark))
    items = loader({k: Path(v) for k, v in raw_files.items()}, benchmark_cfg)
    if "item_id" not in items or items["item_id"].duplicated().any():
        raise DataFormatError(f"loader {benchmark}: items need unique item_id values")
    limit = benchmark_cfg.get("limit")
    if limit:
        items = items.head(int(limit))
    write_parquet(items, out)
    log.info("prepared %d %s items -> %s", len(items), benchmark, out)
    return items


def score(params: Mapping[str, Any], items_path: str | None, out: str, cache_dir: str) -> pd.DataFrame:
    spec = get_metric(params["metric"])
    items = pd.read_parquet(items_path) if items_path else pd.DataFrame()
    # run.mode reaches the metric as cfg["_mode"] (options that follow it: biasflow.metrics._mode)
    ctx = ScoreContext(items=items, metric_cfg=dict(params["metric_cfg"], _mode=params.get("mode", "parity")),
                       model_cfg=params["model"], cache_dir=Path(cache_dir))
    start = time.perf_counter()
    scores = spec.score(ctx)
    write_parquet(scores, out)
    provenance = ctx.model.provenance() if ctx._model is not None and hasattr(ctx.model, "provenance") else {}
    write_json({"provenance": provenance, "rows": len(scores), "seconds": time.perf_counter() - start},
               f"{out}.meta.json")
    log.info("scored %d rows in %.1fs -> %s", len(scores), time.perf_counter() - start, out)
    return scores


def metric(params: Mapping[str, Any], items_path: str | None, scores_path: str, out_dir: str) -> pd.DataFrame:
    spec = get_metric(params["metric"])
    items = pd.read_parquet(items_path) if items_path else pd.DataFrame()
    scores = pd.read_parquet(scores_path)
    cfg = dict(params["metric_cfg"], _model=params["model"], _mode=params.get("mode", "parity"))
    per_item = spec.compute(items, scores, cfg)
    for path in (spec.export(items, scores, cfg) if spec.export else []):
        log.info("exported %s", path)
    stats = params.get("stats", {})
    agg = bootstrap_ci(per_item, lambda df: spec.aggregate(df, cfg), n_boot=int(stats.get("n_boot", 1000)),
                       seed=int(stats.get("seed", 0)), level=float(stats.get("level", 0.95)))
    labels = {"model": params["model"]["name"], "model_key": params["model_key"],
              "benchmark": params.get("benchmark") or params["metric"], "metric_family": params["metric"],
              "config_hash": params["cfg_hash"]}
    for k, v in reversed(list(labels.items())):
        agg.insert(0, k, v)
        per_item.insert(0, k, v)
    out = Path(out_dir)
    write_parquet(per_item, out / "per_item.parquet")
    write_parquet(agg, out / "aggregate.parquet")
    write_text(yaml.safe_dump(json.loads(json.dumps(dict(params), default=str)), sort_keys=False),
               out / "config.yaml")
    meta_path = Path(f"{scores_path}.meta.json")
    if meta_path.exists():
        write_json(json.loads(meta_path.read_text()), out / "score_meta.json")
    return agg


def aggregate_run(plan_path: str, out_dir: str) -> pd.DataFrame:
    from biasflow.report.tables import write_run_report

    plan = json.loads(Path(plan_path).read_text())
    aggs, items = [], []
    for job in plan["jobs"]:
        aggs.append(pd.read_parquet(Path(job["metric_dir"]) / "aggregate.parquet"))
        items.append(pd.read_parquet(Path(job["metric_dir"]) / "per_item.parquet"))
    agg = pd.concat(aggs, ignore_index=True)
    per_item = pd.concat(items, ignore_index=True)
    write_run_report(plan, agg, per_item, Path(out_dir))
    return agg


def log_mlflow(plan_path: str, run_dir: str, out: str) -> dict:
    from biasflow.tracking.mlflow_log import log_plan

    record = log_plan(json.loads(Path(plan_path).read_text()), Path(run_dir))
    write_json(record, out)
    return record
