"""Answering ``Generation`` requests: one answerer for every generator, the responses-file backend, the failure rule.

``answer_generation`` is declared (``biasflow.kinds``) as the answerer of model kinds ``causal_lm`` (the
model's own ``generate``: ``HFGenerateBackend``) and ``generator`` (the backend its config names:
``models/generator.py``). The dispatcher caches its answers in the one answer cache, failed ones included (with
their redacted error), and asks the failed ones again on the next run.
"""
from __future__ import annotations

import hashlib
import re
import logging
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError, GenerationError
from biasflow.generation.backends import GenerationSettings, HFGenerateBackend, OpenAICompletionsBackend, _row
from biasflow.schema import GeneratorConfig, ModelOptions, model_options
from biasflow.interface.requests import Generation
from biasflow.secrets import redact_text

log = logging.getLogger(__name__)

ANSWER_COLUMNS = ["response", "status", "error", "latency_s"]


# ------------------------------------------------------------------------------------------- responses files
def check_text_columns(df: pd.DataFrame, where: str) -> None:
    """Prompts and responses are text (or missing: a failed generation); anything else is named by its row."""
    for column in ("prompt", "response"):
        bad = [i for i, v in enumerate(df[column]) if not (isinstance(v, str) or v is None
                                                            or (isinstance(v, float) and v != v))]
        if bad:
            value = df[column].iloc[bad[0]]
            value = value.item() if hasattr(value, "item") else value  # a numpy scalar as the plain value
            raise DataFormatError(f"{where}, row {bad[0] + 1}: {column} is not text but {type(value).__name__} "
                                  f"{value!r} ({len(bad)} such row(s))")


def read_responses_file(path: str | Path) -> pd.DataFrame:
    """A user's own responses: CSV, JSONL or Parquet with columns ``prompt`` and ``response``.

    Rows keep their order; prompts lose surrounding whitespace and ``sample_index`` numbers the responses of each
    prompt. Empty responses count as failed generations (status ``failed``), like a backend that returned nothing.
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
    if df.empty:
        raise DataFormatError(f"responses file {path} has no rows: nothing to score")
    check_text_columns(df, f"responses file {path}")
    df["prompt"] = df["prompt"].fillna("").astype(str).str.strip()
    empty = df["response"].isna() | (df["response"].astype(str).str.strip() == "")
    df["response"] = df["response"].where(~empty, None)
    df["sample_index"] = df.groupby("prompt", sort=False).cumcount()
    df["status"] = ["failed" if e else "ok" for e in empty]
    df["error"] = [("empty response in " + str(path)) if e else None for e in empty]
    return df


def check_responses_cover(model_cfg: Mapping[str, Any] | ModelOptions, requests: Sequence[Generation],
                          metric: str) -> None:
    """A responses file (the model config's ``path``, the ``responses_file`` generator kind's ``check_requests``) answers a
    metric's generation requests exactly: a prompt the file answers more often than the metric asks (a single-reply
    metric given two different replies to one prompt) would silently use the first; it is refused, naming the prompt
    and its rows. (Prompts the file lacks are failed requests, counted and named by ``check_failures``.)"""
    path = model_options(model_cfg, "generator").path
    table = read_responses_file(path)
    asked: dict[str, int] = {}
    for req in requests:
        asked[req.prompt] = max(asked.get(req.prompt, 0), req.sample_index + 1)
    rows = table.groupby("prompt", sort=False).groups
    surplus = [(p, list(rows[p])) for p, n in asked.items() if p in rows and len(rows[p]) > n]
    if surplus:
        prompt, where = surplus[0]
        wanted = asked[prompt]
        raise DataFormatError(
            f"responses file {path}: {len(surplus)} prompt(s) have more responses than metric {metric} asks for "
            f"({wanted} per prompt); the extra ones would be ignored. First: {_shown(prompt)} has {len(where)} "
            f"responses (file rows {', '.join(str(i + 1) for i in where)}, counting from the first data row). Keep "
            f"{wanted} per prompt" + (" (or ask for more samples)" if wanted > 1 else "") + ".")


def _shown(prompt: str, width: int = 80) -> str:
    one_line = " ".join(str(prompt).split())
    return repr(one_line if len(one_line) <= width else one_line[: width - 3] + "...")


class ResponsesFileBackend:
    """A user's responses file as a generator: the answer to (prompt, sample index) is that prompt's response of
    that rank in the file; the other settings of a request are not the file's to know. The fingerprint is the
    file's content, so an edited file is a new model."""

    kind = "responses_file"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        table = read_responses_file(self.path)
        self.answers = {(p, int(i)): (r if isinstance(r, str) else None, e if isinstance(e, str) else None)
                        for p, i, r, e in zip(table["prompt"], table["sample_index"], table["response"],
                                              table["error"])}
        self.model_id = self.path.name.split(".")[0]
        self.fingerprint = "file-" + hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]

    def generate(self, requests: Iterable[Generation], settings: GenerationSettings) -> Iterator[dict]:
        for req in requests:
            started = time.monotonic()
            found = self.answers.get((req.prompt, req.sample_index))
            if found is not None:
                yield _row(req, *found, started)
            else:
                yield _row(req, None, f"no response {req.sample_index + 1} to this prompt in {self.path}", started)


# ------------------------------------------------------------------------------------------------- answerer
def generation_backend(adapter: Any):
    """The backend that answers for ``adapter``: a ``generator`` model's own; a served causal LM's server's
    ``/completions`` with the model's key, retries, concurrency and rate limit (built once per model, here: the
    model adapter does not reach up to generation's backends); or ``generate`` on a causal LM (with the
    ``use_chat_template`` / ``generate_kwargs`` its config carries)."""
    backend = getattr(adapter, "backend", None)
    if backend is not None:
        return backend
    if getattr(adapter, "kind", None) == "served_causal_lm":
        if adapter.generation_backend is None:
            adapter.generation_backend = OpenAICompletionsBackend(
                adapter.base_url, adapter.served_name, api_key_env=adapter.opts.api_key_env,
                api_key_file=adapter.opts.api_key_file, timeout_s=adapter.timeout_s,
                max_retries=adapter.max_retries, backoff_s=adapter.backoff_s, max_backoff_s=adapter.max_backoff_s,
                concurrency=adapter.concurrency, requests_per_second=adapter.opts.requests_per_second,
                sleep=adapter._sleep)
            adapter.generation_backend.timeout_option = "model.timeout_s"
        return adapter.generation_backend
    opts = getattr(adapter, "opts", None) or model_options(getattr(adapter, "cfg", None) or {}, "causal_lm")
    # null: the generator config's default (schema.GeneratorConfig)
    use_chat_template = opts.use_chat_template
    if use_chat_template is None:
        use_chat_template = GeneratorConfig.model_fields["use_chat_template"].default
    # model.batch_size: prompts per generate call for greedy decoding (the same texts as one at a time)
    return HFGenerateBackend(adapter, use_chat_template=use_chat_template, generate_kwargs=opts.generate_kwargs,
                             batch_size=int(opts.batch_size or 8))


def answer_generation(adapter: Any, requests: Sequence[Generation], budget) -> pd.DataFrame:
    """Answerer of ``Generation``: requests of one setting go to the backend together; one row per request, in
    order. Errors are redacted again here (backends redact their own key; this catches anything secret-looking)."""
    backend = generation_backend(adapter)
    by_settings: dict[GenerationSettings, list[Generation]] = {}
    for req in requests:
        by_settings.setdefault(GenerationSettings.of(req), []).append(req)
    rows: dict[str, dict] = {}
    from biasflow.bars import progress_bar as tqdm

    with tqdm(total=len(requests), desc=f"generating ({backend.model_id})", disable=not budget.progress,
              mininterval=1.0) as bar:
        for settings, group in by_settings.items():
            for row in backend.generate(group, settings):
                rows[row["key"]] = row
                bar.update(1)
    out = pd.DataFrame([rows[r.key] for r in requests]).reindex(columns=ANSWER_COLUMNS)
    out["error"] = [redact_text(e) if isinstance(e, str) else None for e in out["error"]]
    failed = int((out["status"] != "ok").sum())
    if failed:
        log.warning("generation: %d of %d requests failed (%s)", failed, len(out), backend.model_id)
    return out


# ------------------------------------------------------------------------------------------------ failures
_FILE_FAILURE = r"^(?:no response \d+ to this prompt in |empty response in )"


def check_failures(answers: pd.DataFrame, max_failed_fraction: float, option: str = "generator",
                   source: str = "", ids: Mapping[str, Sequence[str]] | None = None) -> None:
    """GenerationError when more than ``max_failed_fraction`` of the generation answers failed.

    The score stage calls it (``MetricSpec.check_answers``) before writing its answers: raising fails the stage,
    so a plain re-run runs it again, the answered requests come from the cache and exactly the failed ones are sent
    again. Failures within the threshold are accepted and reported (LangFair's non-completion rate); a re-run does
    not retry those.
    """
    failed = answers["status"] != "ok"
    n_failed, n = int(failed.sum()), len(answers)
    if not n_failed:
        return
    errors = answers.loc[failed, "error"].dropna()
    first = f"; first error: {errors.iloc[0]}" if len(errors) else ""
    where = f" ({source})" if source else ""
    from_file = len(errors) == n_failed and errors.str.contains(_FILE_FAILURE).all()
    # a responses file fails a request by lacking its prompt's response, or by holding an empty one
    empty = answers["error"].fillna("").str.startswith("empty response in ") & failed
    kinds = [(failed & ~empty, "no response"), (empty, "an empty response")]
    if from_file and "prompt" in answers and ids:
        first = "; " + "; ".join(_missing_by_id(answers.loc[rows, "prompt"], ids, what)
                                 for rows, what in kinds if rows.any())
    elif from_file and "prompt" in answers:
        first += f" (prompt {_shown(answers.loc[failed, 'prompt'].iloc[0])})"
    if n_failed / n > max_failed_fraction and from_file:
        # a re-run reads the same file: only editing it (or accepting the failures) changes anything
        counts = " and ".join(f"{int(rows.sum())} of {n} requests have {what} in the responses file"
                              for rows, what in kinds if rows.any())
        fix = " and ".join(text for rows, text in ((failed & ~empty, "add the missing responses to the file"),
                                                   (empty, "fill in its empty responses")) if rows.any())
        msg = (f"generation{where}: {counts}, more than {option}.max_failed_fraction={max_failed_fraction:g}{first}. "
               f"{fix[0].upper() + fix[1:]} (an edited file is a new model: its answers are cached apart), or raise "
               f"{option}.max_failed_fraction to report them as non-completions.")
        log.error(msg)
        raise GenerationError(msg)
    if n_failed / n > max_failed_fraction:
        msg = (f"generation{where}: {n_failed} of {n} requests failed, more than {option}.max_failed_fraction="
               f"{max_failed_fraction:g}{first}. The {n - n_failed} answered requests are cached: re-run the same "
               f"command to retry exactly the {n_failed} failed ones (or raise {option}.max_failed_fraction to "
               f"accept failures, which are then reported as non-completions and not retried).")
        log.error(msg)
        raise GenerationError(msg)
    log.warning("generation%s: %d of %d requests failed, accepted (%s.max_failed_fraction=%g)%s", where, n_failed,
                n, option, max_failed_fraction, first)


def _missing_by_id(prompts: Iterable[str], ids: Mapping[str, Sequence[str]], what: str = "no response",
                   shown: int = 50) -> str:
    """"no response to the prompt of items X, Y, ...": every failed prompt named by the items that ask it (a
    prompt's text shares its template with every other, so its start names nothing); ``what`` it has."""
    named = sorted({i for p in prompts for i in ids.get(p, ())}, key=_natural)
    unnamed = sum(1 for p in prompts if p not in ids)
    listed = ", ".join(named[:shown]) + (f" and {len(named) - shown} more" if len(named) > shown else "")
    if len(named) > shown:
        log.error("every item whose prompt has %s: %s", what, ", ".join(named))
    extra = f" (and {unnamed} prompt(s) of no item)" if unnamed else ""
    return f"{what} to the prompt of {len(named)} item(s): {listed}{extra}"


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


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


def responses_file_backend(cfg: Mapping[str, Any] | ModelOptions) -> ResponsesFileBackend:
    """The backend of a generation job's model config of generator kind ``responses_file`` (``generator_kinds``)."""
    opts = model_options(cfg, "generator")
    if not opts.path:
        raise ConfigError("model.kind=generator with generator=responses_file needs model.path")
    return ResponsesFileBackend(opts.path)
