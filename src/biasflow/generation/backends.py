"""Generation backends: a local causal LM (HF ``generate``) and an OpenAI-compatible chat-completions endpoint.

A backend turns ``Generation`` requests of one setting (``GenerationSettings``) into result rows (``key``,
``response``, ``status``, ``error``, ...); ``biasflow.generation.answer.answer_generation`` is the answerer that
runs them behind the one answer cache. Every backend has a ``fingerprint`` (what produced the text: the weights,
or the endpoint) and a ``model_id``.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from biasflow.errors import ConfigError
from biasflow.io import stable_hash
from biasflow.openai_http import OpenAIHTTPClient, RateLimiter  # noqa: F401 (RateLimiter re-exported)
from biasflow.interface.requests import Generation
from biasflow.secrets import read_secret, redact_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationSettings:
    """What to ask for: ``count`` responses per prompt under one system prompt and sampling setup (the
    ``Generation`` requests they make: ``requests``)."""

    count: int = 1
    system_prompt: str | None = None
    temperature: float = 1.0
    max_tokens: int = 256
    seed: int | None = 0

    def __post_init__(self):
        if self.count < 1:
            raise ConfigError(f"generator.count must be >= 1, got {self.count}")
        if self.temperature < 0:
            raise ConfigError(f"generator.temperature must be >= 0, got {self.temperature}")
        if self.max_tokens < 1:
            raise ConfigError(f"generator.max_tokens must be >= 1, got {self.max_tokens}")

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> "GenerationSettings":
        """The settings of a generator config whose defaults are filled in (``metrics._generated.generator_settings``:
        the metric's filled ``generation`` options under the generator's own)."""
        seed = cfg["seed"]
        return cls(count=int(cfg["count"]), system_prompt=cfg["system_prompt"] or None,
                   temperature=float(cfg["temperature"]), max_tokens=int(cfg["max_tokens"]),
                   seed=None if seed is None else int(seed))

    @classmethod
    def of(cls, request: Generation) -> "GenerationSettings":
        """The settings a request was made with (one response: ``count`` 1)."""
        return cls(count=1, system_prompt=request.system_prompt, temperature=request.temperature,
                   max_tokens=request.max_tokens, seed=request.seed)

    def request(self, prompt: str, sample_index: int) -> Generation:
        return Generation(prompt=str(prompt), sample_index=int(sample_index), system_prompt=self.system_prompt,
                          temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed)

    def requests(self, prompts: Sequence[str]) -> list[Generation]:
        """``count`` requests per prompt (sample indices 0 .. count-1), prompts in order."""
        return [self.request(p, i) for p in prompts for i in range(self.count)]


def sample_seed(seed: int | None, prompt: str, sample_index: int) -> int:
    """A per-sample seed: a sample's text does not depend on which other samples run in the same call."""
    blob = f"{seed}|{sample_index}|{prompt}".encode()
    return int(hashlib.sha256(blob).hexdigest()[:8], 16)


def _row(req: Generation, response: str | None, error: str | None, started: float) -> dict:
    return {"key": req.key, "prompt": req.prompt, "sample_index": req.sample_index, "response": response,
            "status": "ok" if error is None else "failed", "error": error,
            "latency_s": time.monotonic() - started, "created_at": time.time()}


# --------------------------------------------------------------------------------------------- local causal LM
class HFGenerateBackend:
    """Sampling from a local causal LM with ``model.generate``.

    ``model`` is a hub id or local path (loaded by ``models.hf.load_pretrained`` as AutoModelForCausalLM), a
    biasflow causal LM adapter (anything with ``.model`` and ``.tokenizer``), or a model object with ``tokenizer``
    passed beside it. Each sample is seeded from (seed, prompt, sample index), so a resumed run produces the same
    text as an uninterrupted one. ``temperature`` 0 means greedy decoding; sampling is pure temperature sampling
    (top_k 0, top_p 1) unless ``generate_kwargs`` says otherwise (they enter the fingerprint). With
    ``use_chat_template`` true (or "auto" and the tokenizer has a chat template) the prompt and system prompt are
    formatted as chat messages; otherwise the raw prompt is continued and the system prompt is ignored.
    """

    kind = "hf_generate"

    def __init__(self, model: Any, tokenizer: Any = None, *, name: str | None = None, device: str | None = None,
                 use_chat_template: bool | str = "auto", batch_size: int = 8, fingerprint: str | None = None,
                 generate_kwargs: Mapping[str, Any] | None = None):
        import torch

        adapter_fp = None
        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM

            from biasflow.models.hf import load_pretrained
            from biasflow.schema import model_options

            source = str(model)
            # validated as a causal LM's options (its kind is not written: the fingerprint hashes the config as
            # written); no name (a hub id or path is no model name: messages name the source)
            opts = model_options({"path" if Path(source).expanduser().exists() else "hub_id": source,
                                  "device": device or "auto"}, "causal_lm")
            loaded = load_pretrained(opts, AutoModelForCausalLM)
            tokenizer = tokenizer or loaded.tokenizer
            model = loaded.model
            name = name or source
            adapter_fp = loaded.fingerprint(opts)
        elif hasattr(model, "model") and hasattr(model, "tokenizer"):  # a biasflow adapter
            adapter_fp = getattr(model, "fingerprint", None)
            name = name or getattr(model, "name", None)
            tokenizer = tokenizer or model.tokenizer
            model = model.model
        if tokenizer is None:
            raise ConfigError("HFGenerateBackend: pass the tokenizer with a model object")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.model.to(self.device)
        self.model_name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.use_chat_template = use_chat_template
        self.batch_size = batch_size
        # Pure temperature sampling unless asked otherwise (a model's generation_config may default to top_k=50).
        self.generate_kwargs = {"top_k": 0, "top_p": 1.0, **dict(generate_kwargs or {})}
        base_fp = fingerprint or adapter_fp or self._weights_fingerprint()
        self.fingerprint = base_fp if not generate_kwargs else stable_hash([base_fp, dict(generate_kwargs)], 16)

    @property
    def model_id(self) -> str:
        return self.model_name

    def _weights_fingerprint(self) -> str:
        """Digest of the weights for small models; name + commit hash for large ones (hashing them is slow)."""
        import torch

        n = sum(p.numel() for p in self.model.parameters())
        if n > 50_000_000:
            commit = getattr(self.model.config, "_commit_hash", None) or "unpinned"
            return stable_hash({"hf": self.model_name, "commit": commit, "n": n}, 16)
        h = hashlib.sha256()
        with torch.no_grad():
            for pname, p in self.model.state_dict().items():
                h.update(pname.encode())
                h.update(p.detach().cpu().float().numpy().tobytes())
        return "w" + h.hexdigest()[:15]

    def _encode(self, prompt: str, system_prompt: str | None):
        chat = self.use_chat_template
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if chat is True or (chat == "auto" and has_template):
            messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
                       [{"role": "user", "content": prompt}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return self.tokenizer(prompt, return_tensors="pt")

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.tokenizer.eos_token_id if pad is None else pad

    def _kwargs(self, settings: GenerationSettings) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_new_tokens": settings.max_tokens, "pad_token_id": self._pad_id()}
        if settings.temperature > 0:
            kwargs.update(do_sample=True, temperature=settings.temperature, **self.generate_kwargs)
        else:
            kwargs.update(do_sample=False)
        return kwargs

    def _generate_one(self, req: Generation, settings: GenerationSettings) -> dict:
        import torch

        started = time.monotonic()
        try:
            enc = self._encode(req.prompt, settings.system_prompt).to(self.device)
            torch.manual_seed(sample_seed(settings.seed, req.prompt, req.sample_index))
            with torch.no_grad():
                out = self.model.generate(**enc, **self._kwargs(settings))
            new_tokens = out[0, enc["input_ids"].shape[1]:]
            text = self.tokenizer.decode(new_tokens, skip_special_tokens=True)
            return _row(req, text, None, started)
        except Exception as exc:  # recorded as a failure; the run goes on
            error = redact_text(f"{type(exc).__name__}: {exc}")
            log.warning("generation failed for sample %d of %r: %s", req.sample_index, req.prompt[:60], error)
            return _row(req, None, error, started)

    def _generate_batch(self, batch: list[Generation], settings: GenerationSettings) -> list[dict]:
        """Greedy decoding of several prompts in one ``generate`` call, left-padded (the new tokens of every row
        start at the same column; the attention mask hides the padding and gives each row its own positions)."""
        import torch

        started = time.monotonic()
        encs = [self._encode(r.prompt, settings.system_prompt) for r in batch]
        width = max(e["input_ids"].shape[1] for e in encs)
        padded = {}
        for name in encs[0].keys():
            fill = self._pad_id() if name == "input_ids" else 0
            rows = [torch.nn.functional.pad(e[name][0], (width - e[name].shape[1], 0), value=fill) for e in encs]
            padded[name] = torch.stack(rows).to(self.device)
        with torch.no_grad():
            out = self.model.generate(**padded, **self._kwargs(settings))
        texts = self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        return [_row(r, t, None, started) for r, t in zip(batch, texts)]

    def generate(self, requests: Iterable[Generation], settings: GenerationSettings) -> Iterator[dict]:
        """Rows as they are generated. Greedy decoding (temperature 0) runs ``batch_size`` prompts per ``generate``
        call; sampling runs one at a time, each under its own seed, so a sample's text never depends on which other
        samples shared its batch (a resumed run reproduces it). A batch that fails is retried one prompt at a time,
        so an error is recorded against the prompt that caused it."""
        size = max(1, int(self.batch_size)) if settings.temperature == 0 else 1
        pending = iter(requests)
        while batch := list(islice(pending, size)):
            if len(batch) > 1:
                try:
                    yield from self._generate_batch(batch, settings)
                    continue
                except Exception as exc:  # noqa: BLE001 - e.g. out of memory: fall back to one at a time
                    log.warning("batched generation of %d prompts failed (%s); generating them one at a time",
                                len(batch), redact_text(f"{type(exc).__name__}: {exc}"))
            for req in batch:
                yield self._generate_one(req, settings)


# ------------------------------------------------------------------------------------ OpenAI-compatible endpoint
class OpenAIChatBackend(OpenAIHTTPClient):
    """``POST {base_url}/chat/completions``, one request per sample, spoken by vLLM, Ollama, llama.cpp and hosts.

    The API key is read from the file named by ``api_key_file`` or else the environment variable named by
    ``api_key_env`` (never from the config itself); no key means no Authorization header (local servers). 429,
    5xx, timeouts and connection errors are retried with exponential back-off (``backoff_s * 2**attempt``, capped,
    or the server's numeric Retry-After); other errors and exhausted retries give a failed row with the error, and
    the run goes on. Error texts are redacted (the key itself and anything secret-looking) before they are stored
    or logged: servers quote the key they rejected.
    """

    kind = "openai_compatible"
    endpoint = "/chat/completions"
    timeout_option = "generator.timeout_s"

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY",
                 api_key_file: str | None = None, timeout_s: float | None = None, max_retries: int | None = None,
                 backoff_s: float | None = None, max_backoff_s: float | None = None,
                 concurrency: int | None = None, requests_per_second: float | None = None,
                 extra_body: Mapping[str, Any] | None = None, sleep: Callable[[float], None] = time.sleep):
        # an option not given: the generator config's default (schema.GeneratorConfig, the one place it is written)
        from biasflow.schema import GeneratorConfig

        defaults = GeneratorConfig.model_construct()  # every option at its declared default, unvalidated
        given = {"timeout_s": timeout_s, "max_retries": max_retries, "backoff_s": backoff_s,
                 "max_backoff_s": max_backoff_s, "concurrency": concurrency}
        timeout_s, max_retries, backoff_s, max_backoff_s, concurrency = (
            getattr(defaults, key) if value is None else value for key, value in given.items())
        if not base_url or not model:
            raise ConfigError("generator: openai_compatible needs base_url and model")
        if concurrency < 1:
            raise ConfigError(f"generator.concurrency must be >= 1, got {concurrency}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + self.endpoint
        self.model_id = model
        self.api_key_env = api_key_env
        self._api_key = read_secret(env=api_key_env, file=api_key_file, what="generator.api_key_file")
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.concurrency = int(concurrency)
        self.limiter = RateLimiter(requests_per_second)
        self.extra_body = dict(extra_body or {})
        self._sleep = sleep
        self.fingerprint = stable_hash({"backend": self.kind, "base_url": self.base_url,
                                        "extra_body": self.extra_body}, 16)
        self._local = threading.local()
        self.requests_sent = 0  # HTTP attempts, retries included (tests and timings read it)
        self._count_lock = threading.Lock()

    def _body(self, req: Generation, settings: GenerationSettings) -> dict:
        messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []) + \
                   [{"role": "user", "content": req.prompt}]
        body = {"model": self.model_id, "messages": messages, "temperature": settings.temperature,
                "max_tokens": settings.max_tokens, "n": 1}
        if settings.seed is not None:  # distinct samples need distinct seeds on servers that honour them
            body["seed"] = settings.seed + req.sample_index
        body.update(self.extra_body)
        return body

    @staticmethod
    def _content(reply: dict) -> str | None:
        return reply["choices"][0]["message"]["content"]

    def _one(self, req: Generation, settings: GenerationSettings) -> dict:
        started = time.monotonic()
        resp, error = self.post(self._body(req, settings))
        if resp is None:
            return _row(req, None, error, started)
        try:
            content = self._content(resp.json())
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            body_text = self._redact(resp.text)[:200]
            return _row(req, None, self._redact(f"malformed response: {exc!r}: {body_text}"), started)
        return _row(req, content if content is not None else "", None, started)

    def generate(self, requests: Iterable[Generation], settings: GenerationSettings) -> Iterator[dict]:
        requests = list(requests)
        if self.concurrency == 1:
            for req in requests:
                yield self._one(req, settings)
            return
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self._one, req, settings) for req in requests]
            for fut in as_completed(futures):
                yield fut.result()


class OpenAICompletionsBackend(OpenAIChatBackend):
    """``POST {base_url}/completions``: the raw prompt continued, no chat template and no system prompt (as
    ``hf_generate`` does for a model without one); how a served causal LM (``served_causal_lm``) generates.
    Retries, rate limit, concurrency and redaction as ``OpenAIChatBackend``."""

    kind = "openai_completions"
    endpoint = "/completions"

    def _body(self, req: Generation, settings: GenerationSettings) -> dict:
        body = {"model": self.model_id, "prompt": req.prompt, "temperature": settings.temperature,
                "max_tokens": settings.max_tokens, "n": 1}
        if settings.seed is not None:
            body["seed"] = settings.seed + req.sample_index
        body.update(self.extra_body)
        return body

    @staticmethod
    def _content(reply: dict) -> str | None:
        return reply["choices"][0]["text"]


def openai_chat_backend(cfg: Mapping[str, Any] | ModelOptions) -> OpenAIChatBackend:
    """The backend of a generation job's model config of generator kind ``openai_compatible`` (``generator_kinds``):
    the HTTP options its config sets (the others: the backend's defaults, the generator config's)."""
    from biasflow.model_kinds import HTTP_CLIENT_OPTIONS
    from biasflow.schema import model_options

    opts = model_options(cfg, "generator")
    options = {k: getattr(opts, k) for k in HTTP_CLIENT_OPTIONS if k in opts.model_fields_set}
    return OpenAIChatBackend(opts.base_url, opts.model_id, extra_body=opts.extra_body, **options)
