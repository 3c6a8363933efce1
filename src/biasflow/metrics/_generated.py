"""What the generated-text metrics (LangFair, HELM, HONEST) share: their ``Generation`` requests and the failure rule.

The text comes from the job's model: the generator chosen with ``+generator=...`` (the plan makes its model config
the job's: ``generator_config.job_model``) or, without one, the job's causal LM with the metric's ``generation``
settings. A metric asks for ``Generation`` requests and reads the answers by request key; it never builds a backend.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.generation.answer import check_failures, max_failed_fraction, read_responses_file
from biasflow.generation.backends import GenerationSettings
from biasflow.generator_config import check_generator_config
from biasflow.schema import Generating
from biasflow.scoring.answer import lookup
from biasflow.interface.requests import Generation


def generator_settings(metric_cfg: Generating, metric: str) -> tuple[dict[str, Any], str]:
    """The generator config of a generated-text metric and the option it lives under (for messages).

    The chosen generator's settings (``+generator=...``) win over the metric's ``generation`` defaults; without a
    generator, the job's causal LM generates (``hf_generate``) with the ``generation`` settings."""
    generator = metric_cfg.generator
    written = generator.model_dump(mode="json", exclude_unset=True) if generator else {"kind": "hf_generate"}
    gen_cfg = {**metric_cfg.generation.model_dump(), **written}
    gen_cfg = {k: v for k, v in gen_cfg.items() if v is not None or k in ("system_prompt", "seed")}
    option = "generator" if generator else f"metric.{metric}.generation"
    check_generator_config(gen_cfg, option)
    return gen_cfg, option


def one_reply_request(prompt: str, settings) -> Generation:
    """The one reply of a multiple-choice prompt, asked with the metric's ``generation`` settings (``bbq``'s
    ``OneChoiceGeneration``: the generator supplies the endpoint; the plan refuses its sampling settings)."""
    return Generation(prompt, sample_index=0, system_prompt=settings.system_prompt,
                      temperature=float(settings.temperature), max_tokens=int(settings.max_tokens),
                      seed=None if settings.seed is None else int(settings.seed))


def responses_path(gen_cfg: Mapping[str, Any], option: str) -> str | None:
    """The responses file of a ``responses_file`` generator (None for the other generators)."""
    if gen_cfg["kind"] != "responses_file":
        return None
    if not gen_cfg.get("path"):
        raise ConfigError(f"{option}.kind=responses_file needs {option}.path")
    return str(gen_cfg["path"])


def generation_grid(items: pd.DataFrame, cfg: Generating, metric: str,
                    count: int | None = None) -> tuple[pd.DataFrame, list[Generation]]:
    """One row per ``Generation`` request, and the requests in the same order.

    The rows are ``count`` (default: the settings' ``count``) samples of every row of ``items`` (its columns kept,
    ``sample_index`` added); with a responses file and no ``count``, the file's own rows (every response in it, as
    LangFair and HELM read a file).
    """
    gen_cfg, option = generator_settings(cfg, metric)
    max_failed_fraction(gen_cfg, option)  # a bad threshold fails before anything is generated
    settings = GenerationSettings.from_cfg({**gen_cfg, **({"count": count} if count is not None else {})})
    path = responses_path(gen_cfg, option)
    if path is not None and count is None:
        grid = read_responses_file(path).drop(columns=["response", "status", "error"])
    else:
        if "prompt" not in items:
            raise DataFormatError(f"metric {metric}: the prompts table has no 'prompt' column "
                                  f"(columns: {list(items.columns)})")
        frame = items.reset_index(drop=True)
        grid = frame.loc[frame.index.repeat(settings.count)].copy()
        grid["sample_index"] = grid.groupby(level=0).cumcount()
        grid = grid.reset_index(drop=True)
    requests = [settings.request(p, i) for p, i in zip(grid["prompt"], grid["sample_index"])]
    return grid, requests


def with_responses(grid: pd.DataFrame, requests: list[Generation], answers: pd.DataFrame) -> pd.DataFrame:
    """``grid`` with each request's ``response``, ``status`` and ``error`` (looked up by request key)."""
    out = grid.copy()
    for column in ("response", "status", "error"):
        out[column] = lookup(answers, requests, column) if requests else []
    return out


MISSING_FROM_FILE = r"no response \d+ to this prompt in "  # the responses file backend's words for a lacking prompt


def check_generations(metric: str) -> Callable[[pd.DataFrame, Mapping[str, Any]], None]:
    """``MetricSpec.check_answers`` of a generated-text metric: more failed generations than
    ``max_failed_fraction`` fail the score stage (GenerationError naming the count and the first error). A
    responses file's empty responses are its non-completions, never an error; a prompt the file has no response to
    at all is a failure (before: counterfactual on a file without LangFair's prompts gave a non-completion rate of
    1.0 and no other number, without a word)."""

    def check(answers: pd.DataFrame, cfg: Generating) -> None:
        gen_cfg, option = generator_settings(cfg, metric)
        if "kind" not in answers:
            return
        rows = answers[answers["kind"] == Generation.kind]
        if not len(rows):
            return
        if responses_path(gen_cfg, option) is not None:
            missing = rows["error"].fillna("").astype(str).str.match(MISSING_FROM_FILE)
            rows = rows.assign(status=rows["status"].where(missing, "ok"))  # only what the file lacks counts
            source = f"responses file {responses_path(gen_cfg, option)}"
        else:
            source = f"{gen_cfg['kind']} {gen_cfg.get('model') or 'the job model'}"
        check_failures(rows, max_failed_fraction(gen_cfg, option), option, source)

    return check


def check_choice_replies(metric: str, prompts: Callable[[pd.DataFrame, Mapping[str, Any]], Iterable[tuple[str, str]]]
                         ) -> Callable[..., None]:
    """``MetricSpec.check_answers`` of a multiple-choice metric answered by generation (``bbq``, ``stereoset_mc``,
    ``winobias_mc``: one rule for all): more failed requests than ``metric.<metric>.generation.max_failed_fraction``
    fail the score stage (the answered ones are cached; a re-run asks only the failed ones), and prompts a responses
    file lacks are named by the ids of the items that ask them. ``prompts(items, cfg)`` gives (item id, prompt)."""

    def check(answers: pd.DataFrame, cfg: Generating, items: pd.DataFrame | None = None) -> None:
        if answers is None or not len(answers) or "status" not in answers:
            return
        rows = answers[answers["kind"] == Generation.kind] if "kind" in answers else answers
        if not len(rows):
            return
        source = (cfg.generator.model if cfg.generator else None) or "the job model"
        ids: dict[str, list[str]] = {}
        if items is not None and (rows["status"] != "ok").any():
            for item_id, prompt in prompts(items, cfg):
                ids.setdefault(prompt, []).append(str(item_id))
        check_failures(rows, float(cfg.generation.max_failed_fraction), f"metric.{metric}.generation", source,
                       ids=ids)

    return check
