"""Run a backend over prompts with the cache in front: only requests never answered (or failed before) are sent."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError, GenerationError
from biasflow.generation.backends import (GenerationRequest, GenerationSettings, HFGenerateBackend,
                                          OpenAIChatBackend)
from biasflow.generation.cache import GenerationCache, empty_cache_frame, generation_key
from biasflow.generation.config import check_generator_config
from biasflow.secrets import redact_text

log = logging.getLogger(__name__)

RESPONSE_COLUMNS = ["prompt", "sample_index", "response", "status", "error"]


def _prompts_frame(prompts: Sequence[str] | pd.DataFrame) -> pd.DataFrame:
    if isinstance(prompts, pd.DataFrame):
        if "prompt" not in prompts:
            raise DataFormatError(f"prompts table has no 'prompt' column (columns: {list(prompts.columns)})")
        return prompts.reset_index(drop=True)
    return pd.DataFrame({"prompt": list(prompts)})


def generate_responses(prompts: Sequence[str] | pd.DataFrame, backend, settings: GenerationSettings,
                       cache: GenerationCache | None = None, flush_every: int = 32,
                       show_progress: bool = False) -> pd.DataFrame:
    """``settings.count`` responses per prompt, one row per (prompt row, sample index).

    Other columns of a prompts DataFrame (item_id, category, ...) are carried over. Rows answered before come from
    the cache (``from_cache`` True); results are flushed to the cache every ``flush_every`` rows, so a crash loses
    at most that many answers. Failed requests are returned with status ``failed`` and their error.
    """
    frame = _prompts_frame(prompts)
    base = {"fingerprint": backend.fingerprint, "model": backend.model_id,
            "system_prompt": settings.system_prompt, "temperature": settings.temperature,
            "max_tokens": settings.max_tokens, "seed": settings.seed}
    grid = frame.loc[frame.index.repeat(settings.count)].copy()
    grid["sample_index"] = grid.groupby(level=0).cumcount()
    grid = grid.reset_index(drop=True)
    grid["key"] = [generation_key({**base, "prompt": p, "sample_index": int(i)})
                   for p, i in zip(grid["prompt"], grid["sample_index"])]

    cached = cache.get(grid["key"]) if cache is not None else empty_cache_frame()
    done = cached[cached["status"] == "ok"].set_index("key")
    todo_keys = [k for k in dict.fromkeys(grid["key"]) if k not in done.index]
    first = grid.drop_duplicates("key").set_index("key")
    todo = [GenerationRequest(k, first.at[k, "prompt"], int(first.at[k, "sample_index"])) for k in todo_keys]
    log.info("generation: %d requests, %d cached, %d to send (%s)", len(grid), len(done), len(todo),
             backend.model_id)

    fresh: list[dict] = []
    pending: list[dict] = []

    def flush():
        if cache is not None and pending:
            cache.put(pending)
        pending.clear()

    results = backend.generate(todo, settings)
    if show_progress and todo:
        from tqdm import tqdm

        results = tqdm(results, total=len(todo), desc=f"generating ({backend.model_id})")
    try:
        for row in results:
            row = {**base, **row}
            if row.get("error"):  # backends redact their own key; this catches anything secret-looking left
                row["error"] = redact_text(row["error"])
            fresh.append(row)
            pending.append(row)
            if len(pending) >= flush_every:
                flush()
    finally:
        flush()

    answers = pd.concat([done.reset_index()[["key", "response", "status", "error"]].assign(from_cache=True),
                         pd.DataFrame(fresh, columns=["key", "response", "status", "error"]).assign(from_cache=False)],
                        ignore_index=True).drop_duplicates("key")
    out = grid.merge(answers, on="key", how="left")
    failed = int((out["status"] != "ok").sum())
    if failed:
        log.warning("generation: %d of %d requests failed (see the 'error' column)", failed, len(out))
    return out


# ------------------------------------------------------------------------------------------- responses files
def read_responses_file(path: str | Path) -> pd.DataFrame:
    """A user's own responses: CSV, JSONL or Parquet with columns ``prompt`` and ``response``.

    Rows keep their order; ``sample_index`` numbers the responses of each prompt. Empty responses count as failed
    generations (status ``failed``), like a backend that returned nothing.
    """
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"responses file {path} does not exist")
    suffix = "".join(path.suffixes[-2:]).lower() if path.suffix == ".gz" else path.suffix.lower()
    try:
        if suffix in (".csv", ".csv.gz"):
            df = pd.read_csv(path, dtype={"prompt": str, "response": str}, keep_default_na=False)
        elif suffix in (".jsonl", ".jsonl.gz", ".ndjson"):
            df = pd.read_json(path, lines=True, dtype={"prompt": str, "response": str})
        elif suffix == ".parquet":
            df = pd.read_parquet(path)
        else:
            raise DataFormatError(f"responses file {path}: unknown format {suffix!r} (use .csv, .jsonl or .parquet)")
    except DataFormatError:
        raise
    except Exception as exc:
        raise DataFormatError(f"responses file {path} could not be read: {exc}") from exc
    missing = [c for c in ("prompt", "response") if c not in df.columns]
    if missing:
        raise DataFormatError(f"responses file {path} has no column {', '.join(map(repr, missing))} "
                              f"(columns: {list(df.columns)})")
    df = df.reset_index(drop=True)
    df["prompt"] = df["prompt"].fillna("").astype(str)
    empty = df["response"].isna() | (df["response"].astype(str).str.strip() == "")
    df["response"] = df["response"].where(~empty, None)
    df["sample_index"] = df.groupby("prompt", sort=False).cumcount()
    df["status"] = ["failed" if e else "ok" for e in empty]
    df["error"] = [("empty response in " + str(path)) if e else None for e in empty]
    df["from_cache"] = False
    return df


# ------------------------------------------------------------------------------------------------- from config
def build_backend(cfg: Mapping[str, Any], model: Any = None):
    """A backend from a ``generator`` config (``kind``: hf_generate | openai_compatible).

    For ``hf_generate`` the model comes from ``cfg.model`` (hub id or path) or, if unset, the ``model`` argument
    (the job's causal LM adapter).
    """
    kind = cfg.get("kind")
    if kind == "hf_generate":
        source = cfg.get("model") or model
        if source is None:
            raise ConfigError("generator.kind=hf_generate needs generator.model (hub id or path) or a causal LM model")
        return HFGenerateBackend(source, device=cfg.get("device"),
                                 use_chat_template=cfg.get("use_chat_template", "auto"),
                                 generate_kwargs=cfg.get("generate_kwargs"))
    if kind == "openai_compatible":
        return OpenAIChatBackend(
            cfg.get("base_url"), cfg.get("model"), api_key_env=cfg.get("api_key_env", "OPENAI_API_KEY"),
            api_key_file=cfg.get("api_key_file"),
            timeout_s=cfg.get("timeout_s", 60), max_retries=cfg.get("max_retries", 5),
            backoff_s=cfg.get("backoff_s", 1.0), max_backoff_s=cfg.get("max_backoff_s", 60),
            concurrency=cfg.get("concurrency", 4), requests_per_second=cfg.get("requests_per_second"),
            extra_body=cfg.get("extra_body"))
    raise ConfigError(f"generator.kind={kind!r} is not a generation backend; known: hf_generate, "
                      "openai_compatible, responses_file")


def check_failures(out: pd.DataFrame, max_failed_fraction: float, option: str = "generator",
                   source: str = "") -> None:
    """GenerationError when more than ``max_failed_fraction`` of the requests failed.

    Raising fails the stage, so its output is not written and a plain re-run runs it again: the answered requests
    come from the cache and exactly the failed ones are sent again. Failures within the threshold are accepted
    and reported (LangFair's non-completion rate); a re-run does not retry those.
    """
    failed = out["status"] != "ok"
    n_failed, n = int(failed.sum()), len(out)
    if not n_failed:
        return
    errors = out.loc[failed, "error"].dropna()
    first = f"; first error: {errors.iloc[0]}" if len(errors) else ""
    where = f" ({source})" if source else ""
    if n_failed / n > max_failed_fraction:
        msg = (f"generation{where}: {n_failed} of {n} requests failed, more than {option}.max_failed_fraction="
               f"{max_failed_fraction:g}{first}. The {n - n_failed} answered requests are cached: re-run the same "
               f"command to retry exactly the {n_failed} failed ones (or raise {option}.max_failed_fraction to "
               f"accept failures, which are then reported as non-completions and not retried).")
        log.error(msg)
        raise GenerationError(msg)
    log.warning("generation%s: %d of %d requests failed, accepted (%s.max_failed_fraction=%g)%s", where, n_failed,
                n, option, max_failed_fraction, first)


def max_failed_fraction(gen_cfg: Mapping[str, Any], option: str = "generator") -> float:
    value = gen_cfg.get("max_failed_fraction")
    try:
        value = 0.0 if value is None else float(value)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # also catches NaN
        raise ConfigError(f"{option}.max_failed_fraction must be a number in [0, 1], got "
                          f"{gen_cfg.get('max_failed_fraction')!r}")
    return value


def responses_for_items(items: pd.DataFrame, gen_cfg: Mapping[str, Any], cache_dir: str | Path | None,
                        model: Any = None, count: int | None = None, option: str = "generator") -> pd.DataFrame:
    """Responses for a prompts table from a ``generator`` config; what the metric stages call.

    ``count`` overrides the config's responses per prompt (HONEST asks for k); ``option`` is where the config
    lives, for messages. Fails (GenerationError) when more requests failed than ``max_failed_fraction`` allows.
    """
    check_generator_config(gen_cfg, option)
    if gen_cfg.get("kind") == "responses_file":
        path = gen_cfg.get("path")
        if not path:
            raise ConfigError(f"{option}.kind=responses_file needs {option}.path")
        return read_responses_file(path)
    threshold = max_failed_fraction(gen_cfg, option)
    backend = build_backend(gen_cfg, model)
    cache = GenerationCache(Path(cache_dir)) if cache_dir else None
    settings = GenerationSettings.from_cfg({**gen_cfg, **({"count": count} if count is not None else {})})
    out = generate_responses(items, backend, settings, cache, flush_every=int(gen_cfg.get("flush_every", 32)),
                             show_progress=bool(gen_cfg.get("progress", False)))
    check_failures(out, threshold, option, f"{backend.kind} {backend.model_id}")
    return out
