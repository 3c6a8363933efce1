"""Shared loading code for Hugging Face models: hub id or local path, pinned revision, device, dtype."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from biasflow.errors import ModelLoadError
from biasflow.io import stable_hash
# planning needs these without torch; they live in models.fingerprint and stay importable from here
from biasflow.models.fingerprint import (PROCESS_KEYS, SCORING_KEYS, config_fingerprint,  # noqa: F401
                                         local_weights_digest, numeric_library_versions)
from biasflow.schema import ModelOptions, model_options

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def source_of(opts: ModelOptions) -> str:
    src = opts.path or opts.hub_id
    if not src:
        raise ModelLoadError(f"model {opts.name!r}: set model.hub_id (a hub id) or model.path (a local folder)")
    return str(src)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def check_model_folder(folder: Path, name: str) -> None:
    """A local model folder must be what ``save_pretrained`` writes; otherwise say what is missing (transformers'
    own message for an empty or wrong folder talks about sentencepiece and tiktoken)."""
    if not folder.is_dir():
        raise ModelLoadError(f"model {name!r}: {folder} is a file, not a model folder (save_pretrained output)")
    missing = []
    if not (folder / "config.json").exists():
        missing.append("config.json")
    if not any((folder / f).exists() for f in WEIGHT_FILES):
        missing.append("weights (" + " or ".join(WEIGHT_FILES[::2]) + ")")
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        missing.append("tokenizer files (" + ", ".join(TOKENIZER_FILES[:3]) + ", ...)")
    if missing:
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise ModelLoadError(f"model {name!r}: {folder} is not a model folder: no {'; no '.join(missing)} "
                             f"(found {found or 'nothing'}). Point model.path at the output of save_pretrained.")


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


@dataclass
class Loaded:
    """What ``load_pretrained`` gives: the model (eval mode, on its device), its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    source: str
    device: torch.device
    dtype: torch.dtype
    resolved_revision: str

    def fingerprint(self, opts: ModelOptions) -> str:
        """Changes whenever the model's outputs could: the scoring options (of the config as written: a cache
        key), the resolved revision, the class."""
        return stable_hash({"config": config_fingerprint(opts.written()), "revision": self.resolved_revision,
                            "cls": type(self.model).__name__, "libraries": numeric_library_versions()}, 24)


def load_pretrained(cfg: Mapping[str, Any] | ModelOptions, auto_class: Any, *, tokenizer: bool = True) -> Loaded:
    """THE way biasflow loads a Hugging Face model: ``model.path`` (a local ``save_pretrained`` folder, checked) or
    ``model.hub_id`` at ``model.revision``, in ``model.dtype`` on ``model.device`` (auto: cuda, mps, cpu), with
    ``model.attn_implementation`` if set. A hub revision (a branch or tag) is resolved to its commit once
    (``hub_commit``) and tokenizer and weights are both loaded at that commit, which is the model's
    ``resolved_revision`` (its fingerprint and provenance). Errors are one line naming the model and where it was
    looked for (``hub_errors``)."""
    from transformers import AutoTokenizer

    opts = model_options(cfg, "causal_lm")  # a plain dict naming no kind (a backend's): a local model's options
    name = opts.name or source_of(opts)
    source = source_of(opts)
    revision = opts.revision or None
    device = resolve_device(opts.device)
    dtype_name = str(opts.dtype)
    if dtype_name not in DTYPES:
        raise ModelLoadError(f"model.dtype={dtype_name!r} is not one of {sorted(DTYPES)}")
    local = Path(source).expanduser()
    is_local = local.exists()
    if opts.path and not is_local:
        raise ModelLoadError(f"model.path={source!r} does not exist")
    if is_local:
        check_model_folder(local, name)
    kwargs: dict[str, Any] = {}
    commit = None
    if not is_local:
        commit = kwargs["revision"] = hub_commit(name, source, revision)
    where_from = str(local) if is_local else source
    where = f"local folder {local}" if is_local else f"hub id {source!r} (revision {revision}, commit {commit})"
    with hub_errors(name, source, revision, commit):
        try:
            tok = AutoTokenizer.from_pretrained(where_from, **kwargs) if tokenizer else None
            model_kwargs = dict(kwargs, dtype=DTYPES[dtype_name])
            attn = getattr(opts, "attn_implementation", None)  # None: a kind without the option (sentence_encoder)
            if attn:
                model_kwargs["attn_implementation"] = attn
            model = auto_class.from_pretrained(where_from, **model_kwargs)
        except Exception as exc:  # noqa: BLE001 - sorted below; anything else is raised as it is
            if _hub_cause(exc) is not None:
                raise  # hub_errors names it
            weights = _unreadable_weights(name, local if is_local else None, source, commit, exc)
            if weights is not None:
                raise weights from exc
            if isinstance(exc, (OSError, ValueError, ImportError)):
                raise ModelLoadError(f"could not load model {name!r} from {where}: {_one_line(exc)}") from exc
            raise
    model.to(device).eval()
    resolved = "local:" + local_weights_digest(local) if is_local else str(commit)
    return Loaded(model=model, tokenizer=tok, source=source, device=device, dtype=DTYPES[dtype_name],
                  resolved_revision=resolved)


# --- the hub: a revision resolved once per process, and its errors in one line --------------------------------------

_COMMITS: dict[tuple[str, str, str], str] = {}  # (endpoint, hub id, revision) -> the commit this process loads


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def hub_commit(name: str, hub_id: str, revision: str | None) -> str:
    """The commit ``revision`` of ``hub_id`` names: asked of the hub (``HF_ENDPOINT``) once per process, or read
    from the Hugging Face cache where the hub cannot be asked (``HF_HUB_OFFLINE=1``, no network). Every file of the
    model is then downloaded at that commit, so a branch that moves while a model loads (or between the heads one
    job loads) never gives a model of two commits, and the commit names the model's cached answers."""
    key = (hub_endpoint(), hub_id, revision or "")  # "": the repo's default branch
    if key not in _COMMITS:
        from huggingface_hub import HfApi, constants

        with hub_errors(name, hub_id, revision, None):  # offline: straight from the cache's refs/, no warning
            _COMMITS[key] = str(HfApi().resolve_revision(hub_id, revision=revision,
                                                         local_files_only=constants.HF_HUB_OFFLINE).resolved)
    return _COMMITS[key]


def _hub_cause(exc: BaseException | None) -> BaseException | None:
    """The huggingface_hub or network error behind ``exc`` (itself, or what transformers wrapped in it with
    ``raise ... from``), else None."""
    from huggingface_hub import errors

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (errors.HfHubHTTPError, errors.RevisionResolutionError, errors.OfflineModeIsEnabled)) \
                or _is_transport_error(exc):
            return exc
        exc, seen = exc.__cause__, seen + 1
    return None


def _is_transport_error(exc: BaseException) -> bool:
    """A network error of the HTTP client huggingface_hub uses (httpx or its successor): connection refused, reset,
    closed mid-body, timed out."""
    return any(cls.__name__ == "TransportError" and cls.__module__.split(".")[0].startswith("httpx")
               for cls in type(exc).__mro__)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _requested_file(exc: BaseException) -> str | None:
    """The file of a failed download, from the request's URL (``.../resolve/<revision>/<file>``)."""
    try:
        url = str(exc.request.url)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None
    return url.split("/resolve/", 1)[1].split("?")[0].split("/", 1)[-1] if "/resolve/" in url else None


class hub_errors:
    """Turn what huggingface_hub raises for a hub model into a one-line ``ModelLoadError`` that says what to do.

    Never includes a token: huggingface_hub's messages carry URLs and request ids, and ours only the endpoint."""

    def __init__(self, name: str, hub_id: str, revision: str | None, commit: str | None):
        self.name, self.hub_id, self.revision, self.commit = name, hub_id, revision or "main", commit

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        cause = None if isinstance(exc, ModelLoadError) else _hub_cause(exc)
        if cause is None:
            return False
        raise self.error(cause) from exc

    def error(self, exc: BaseException) -> ModelLoadError:
        from huggingface_hub import constants, errors

        model = f"model {self.name!r}: hub id {self.hub_id!r}"
        endpoint = hub_endpoint()
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, errors.GatedRepoError) or (isinstance(exc, errors.HfHubHTTPError) and status == 403):
            token = "the token in HF_TOKEN (or saved by `hf auth login`) has no access to it" \
                if _has_token() else "no token was given"
            return ModelLoadError(
                f"{model} is gated or private on {endpoint} (HTTP {status}) and {token}: accept its terms on its "
                f"model page, then set HF_TOKEN to a read token of that account or run `hf auth login` "
                f"(biasflow reads the token from there and never writes it to its files, logs or MLflow)")
        if isinstance(exc, errors.RepositoryNotFoundError):
            return ModelLoadError(
                f"{model} does not exist on {endpoint} (HTTP {status}): check model.hub_id (org/name, as on its "
                f"model page); a private model also needs HF_TOKEN set or `hf auth login`")
        if isinstance(exc, errors.RevisionNotFoundError):
            return ModelLoadError(
                f"{model} has no revision {self.revision!r} on {endpoint} (HTTP {status}): set model.revision to one "
                f"of its branches, tags or full commit hashes (or main)")
        if isinstance(exc, errors.RevisionResolutionError) or isinstance(exc, errors.OfflineModeIsEnabled):
            why = ("HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE
                   else f"{endpoint} could not be reached ({_one_line(exc.__cause__ or exc)[:200]})")
            return ModelLoadError(
                f"{model} at revision {self.revision!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                f"and {why}: run once with hub access to download it (or check HF_ENDPOINT, HF_HOME)")
        if self.commit is not None and _is_transport_error(exc):
            filename = _requested_file(exc) or "a file"
            return ModelLoadError(
                f"{model}: the download of {filename} (commit {self.commit}) from {endpoint} was interrupted "
                f"({type(exc).__name__}: {_one_line(exc)[:120]}); run the same command again to go on with it (the "
                f"files already downloaded are kept in {constants.HF_HUB_CACHE}; a partial file is never loaded)")
        if _is_transport_error(exc):
            return ModelLoadError(f"{model}: could not reach {endpoint} ({type(exc).__name__}: "
                                  f"{_one_line(exc)[:200]}): check the network, or HF_ENDPOINT")
        return ModelLoadError(f"{model} (revision {self.revision!r}): the hub at {endpoint} answered "
                              f"{_one_line(exc)[:300]}")


def _has_token() -> bool:
    try:
        from huggingface_hub import get_token

        return bool(get_token())
    except Exception:  # noqa: BLE001 - only a hint in a message
        return False


def _unreadable_weights(name: str, folder: Path | None, hub_id: str, commit: str | None,
                        exc: BaseException) -> ModelLoadError | None:
    """A weights file that is there but cannot be read (truncated, not safetensors, not a torch file): an error
    naming the model (config name, hub id or folder) and the file; None when the failure is something else."""
    text = f"{type(exc).__name__} {exc}".lower()
    if not any(w in text for w in ("safetensor", "deserializ", "unpickl", "pytorchstreamreader", "invalid load key",
                                   "zip archive", "incomplete metadata", "header too large")):
        return None
    if folder is None and commit is not None:
        from huggingface_hub import snapshot_download

        try:  # the model's files in the Hugging Face cache, at the commit that was loaded
            folder = Path(snapshot_download(hub_id, revision=commit, local_files_only=True))
        except Exception:  # noqa: BLE001 - only to name the file
            folder = None
    files = [folder / f for f in WEIGHT_FILES if folder is not None and (folder / f).exists()]
    shown = ", ".join(map(str, files)) or "its weights file"
    if commit is None:
        return ModelLoadError(f"model {name!r}: local folder {folder}: cannot read {shown} ({_one_line(exc)[:200]}): "
                              f"save the model again (save_pretrained) or point model.path at a good copy")
    blobs = ", ".join(str(f.resolve()) for f in files if f.is_symlink())
    return ModelLoadError(f"model {name!r}: hub id {hub_id!r} (commit {commit}): cannot read the cached {shown} "
                          f"({_one_line(exc)[:200]}): delete {blobs or 'it'} and run again to download it again")


class HFAdapter:
    """Base adapter: loads tokenizer + model once (``load_pretrained``), records provenance, runs in eval mode."""

    auto_class: Any = None
    kind = "hf"

    def __init__(self, cfg: Mapping[str, Any] | ModelOptions):
        opts = self.opts = model_options(cfg, self.kind)
        self.cfg = opts.written()  # as written: what the fingerprint hashes
        self.name = opts.name or source_of(opts)
        self.lowercase = opts.lowercase
        loaded = load_pretrained(opts, self.auto_class)
        self.source, self.revision = loaded.source, opts.revision or None
        self.device, self.dtype = loaded.device, loaded.dtype
        self.tokenizer, self.model = loaded.tokenizer, loaded.model
        self.resolved_revision = loaded.resolved_revision
        self.fingerprint = loaded.fingerprint(opts)

    def normalise(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def provenance(self) -> dict[str, str]:
        return {"model.source": self.source, "model.revision": str(self.resolved_revision),
                "model.class": type(self.model).__name__, "model.dtype": str(self.dtype).replace("torch.", ""),
                "model.device": str(self.device), "model.fingerprint": self.fingerprint}
