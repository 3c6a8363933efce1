"""Which GPU a score job uses: on a box with several GPUs, one scoring job per GPU.

``snakemake --resources gpu=N`` (``workflow/profiles/gpu``) lets N score jobs that ask for a GPU run at once, but
without this module every one of them would use ``cuda:0``. A score job whose model asks for GPUs
(``scheduling.score_resources(model)["gpus"]`` >= 1: ``model.device=cuda``, or ``model.resources.gpus``) claims
them before torch is imported (``claim``, called by ``stages.score``):

* **locked**: it takes an exclusive ``fcntl.flock`` on ``<workdir>/.snakemake/biasflow/gpus/<host>/<id>.lock`` of
  the first free GPU(s) among the visible ones and sets ``CUDA_VISIBLE_DEVICES`` to them, so torch sees only them
  (the model's ``cuda`` is that GPU). The lock is held for the job's life and the kernel drops it when the process
  ends, killed with -9 included: no stale lock to clean up. The host is in the path because a workdir on a shared
  filesystem may be seen from several nodes, whose GPU 0s are different GPUs. The GPUs to choose from: the entries
  of ``CUDA_VISIBLE_DEVICES`` if it is set (a run restricted to some GPUs stays on them), else every GPU of the
  machine, counted without importing torch (``nvidia-smi -L``, then ``/proc/driver/nvidia/gpus/``, then torch in a
  child process, which leaves this process's CUDA uninitialised) and numbered in PCI bus order
  (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, as nvidia-smi numbers them, so the recorded name is the GPU's).
* **given**: a scheduler gave the job its own GPUs (SLURM sets ``CUDA_VISIBLE_DEVICES`` to the job's GPUs, or
  ``SLURM_JOB_GPUS``/``SLURM_STEP_GPUS``): when no more GPUs are visible than the job asks for, or SLURM named the
  job's GPUs and ``CUDA_VISIBLE_DEVICES`` is unset, there is nothing to choose and nothing is locked.
* **explicit**: ``model.device=cuda:K`` is the user's choice: no selection, no lock.
* **none found**: no GPU visible (a CPU machine): nothing is set; loading a model on ``cuda`` then fails as it would.
* **in process**: CUDA is already initialised in this process (``biasflow.api`` scoring in a session that used the
  GPU before): ``CUDA_VISIBLE_DEVICES`` can no longer change what torch sees, so nothing is chosen.

When every GPU is taken, the job **waits** for one (polling, with a log line every minute naming the holders' pids),
and gives up with ``GpuBusyError`` after ``BIASFLOW_GPU_WAIT_S`` seconds if that is set. Waiting is right because
Snakemake's ``gpu`` resource already caps how many GPU jobs run at once: all GPUs taken means either a job that is
still ending (its Snakemake was killed and ``stages.watch_workflow`` is stopping it; a retry starting as the failed
attempt exits) or a ``--resources gpu=N`` larger than the machine's GPU count; in both cases the job can run as soon
as a GPU frees, and two jobs on one GPU would only fight over its memory (each sizes its batches from the free
memory: ``scoring.answer.device_budget``). Failing at once would turn a moment's overlap into a failed job (and
its retry would ask for more memory, which it does not need).

A model that asks for no GPU (the default on a CPU, ``model.device=cpu`` or ``auto``, or a kind that never uses
one: vector tables, n-gram models, HTTP clients) is not touched: nothing is locked, set or recorded.

For tests only, ``BIASFLOW_FAKE_GPU_COUNT=N`` takes the machine to have N GPUs (no nvidia-smi is asked).
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, MutableMapping

from biasflow.errors import BiasflowError
from biasflow.scheduling import score_resources

log = logging.getLogger(__name__)

LOCK_DIR = Path(".snakemake") / "biasflow" / "gpus"  # under the workdir (where Snakemake runs the job)
FAKE_COUNT_ENV = "BIASFLOW_FAKE_GPU_COUNT"  # tests only: the number of GPUs this machine is taken to have
WAIT_ENV = "BIASFLOW_GPU_WAIT_S"  # give up after this many seconds when every GPU is taken (unset: wait)
POLL_S = 0.2
REPORT_EVERY_S = 60.0
SLURM_GPU_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")


class GpuBusyError(BiasflowError):
    """Every GPU this job may use stayed locked by other jobs for longer than ``BIASFLOW_GPU_WAIT_S``."""


@dataclass
class Claim:
    """What a score job asked for and got. ``how``: locked, given, explicit, none_found or in_process (see the
    module's docstring). ``devices``: the GPUs as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs)."""

    how: str
    asked: int
    devices: list[str] = field(default_factory=list)
    visible: str | None = None  # CUDA_VISIBLE_DEVICES the job runs with (None: unset)
    locks: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # device -> nvidia-smi's name and UUID, where known
    waited_s: float = 0.0
    counted_by: str = ""  # how the GPUs were counted (locked and none_found only)
    host: str = field(default_factory=socket.gethostname)
    note: str = ""
    _handles: list[Any] = field(default_factory=list, repr=False)
    _restore: dict[str, str | None] = field(default_factory=dict, repr=False)
    _env: MutableMapping[str, str] | None = field(default=None, repr=False)

    def record(self) -> dict[str, Any]:
        """For the score job's ``.meta.json``."""
        out: dict[str, Any] = {"how": self.how, "asked": self.asked, "devices": self.devices,
                               "CUDA_VISIBLE_DEVICES": self.visible, "host": self.host}
        if self.names:
            out["names"] = self.names
        if self.locks:
            out["locks"] = self.locks
            out["waited_s"] = round(self.waited_s, 3)
        if self.counted_by:
            out["counted_by"] = self.counted_by
        if self.note:
            out["note"] = self.note
        return out

    def describe(self) -> str:
        """One line for the provenance (``gpu``: the report's model table and MLflow's tags): which GPU, where."""
        gpus = ", ".join(f"GPU {d}" + (f" ({self.names[d]})" if d in self.names else "") for d in self.devices)
        if self.how == "locked":
            return f"{gpus} on {self.host}, locked by this job (CUDA_VISIBLE_DEVICES={self.visible})"
        if self.how == "given":
            where = f"{gpus or 'the GPUs'} on {self.host}"
            return f"{where}, given by the scheduler (CUDA_VISIBLE_DEVICES={self.visible}); none locked"
        return f"{self.how}: {self.note}"

    def log_line(self) -> str:
        """``describe()``, and for a locked GPU this process and how long it waited (for the job's log)."""
        if self.how != "locked":
            return self.describe()
        return f"{self.describe()}; pid {os.getpid()}, after waiting {self.waited_s:.1f}s"

    def release(self) -> None:
        """Drop the locks and put back the environment (for a caller that goes on, e.g. ``biasflow.api``; a
        Snakemake job just exits, and the kernel drops its locks)."""
        for fh in self._handles:
            try:
                fcntl.flock(fh, fcntl.LOCK_UN)
            finally:
                fh.close()
        self._handles.clear()
        env = os.environ if self._env is None else self._env
        for name, value in self._restore.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        self._restore.clear()

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def gpus_asked(model_cfg: Mapping[str, Any]) -> int:
    """How many GPUs a score job of ``model_cfg`` asks the scheduler for (Snakemake's ``gpu`` resource)."""
    return int(score_resources(model_cfg)["gpus"])


def _visible_entries(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def nvidia_smi_gpus() -> dict[str, str] | None:
    """``{index: "NVIDIA H100 80GB HBM3 (UUID: GPU-...)"}`` from ``nvidia-smi -L`` (indices in PCI bus order);
    None where nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi -L failed (%s): counting GPUs another way", exc)
        return None
    if proc.returncode != 0:
        log.warning("nvidia-smi -L exited %d (%s): counting GPUs another way", proc.returncode,
                    (proc.stderr or proc.stdout).strip()[:200])
        return None
    # MIG devices are listed indented under their GPU ("  MIG 1g.10gb Device 0: ..."): GPUs only
    found = (re.match(r"GPU (\d+): (.*)", line) for line in proc.stdout.splitlines())
    return {m.group(1): m.group(2).strip() for m in found if m}


def gpu_count(env: Mapping[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """(number of GPUs on this machine, how it was counted, names by index where nvidia-smi gave them), without
    importing torch in this process."""
    env = os.environ if env is None else env
    fake = env.get(FAKE_COUNT_ENV)
    if fake is not None:
        if not re.fullmatch(r"\d+", fake.strip()):
            raise ValueError(f"{FAKE_COUNT_ENV}={fake!r}: must be a whole number of GPUs (tests only)")
        return int(fake), FAKE_COUNT_ENV, {}
    names = nvidia_smi_gpus()
    if names is not None:
        return len(names), "nvidia-smi -L", names
    proc_dir = Path("/proc/driver/nvidia/gpus")
    if proc_dir.is_dir():
        n = sum(1 for _ in proc_dir.iterdir())
        if n:
            return n, str(proc_dir), {}
    # torch in a child process: cudaGetDeviceCount here would fix this process's devices before we choose
    child_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True, timeout=300, env=child_env)
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            return int(proc.stdout.strip()), "torch.cuda.device_count() (child process)", {}
    except (OSError, subprocess.TimeoutExpired):
        pass
    return 0, "nvidia-smi, /proc/driver/nvidia/gpus and torch found none", {}


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA support
        return False


def _lock_name(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", device) + ".lock"


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def _try_lock(path: Path):
    """The open, exclusively locked file ``path``, or None if another process holds it."""
    fh = open(path, "a+")  # never truncated before the lock is ours: the holder's line stays readable
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    except BaseException:
        fh.close()
        raise
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    fh.flush()
    return fh


def _lock_some(candidates: list[str], n: int, folder: Path, wait_s: float | None, what: str):
    """Lock ``n`` of ``candidates`` (the first free ones), waiting while fewer are free. Returns (devices, files,
    handles, seconds waited). All or none: a job never holds some GPUs while waiting for more."""
    folder.mkdir(parents=True, exist_ok=True)
    start = next_report = time.monotonic()
    while True:
        got: list[tuple[str, Path, Any]] = []
        for device in candidates:
            path = folder / _lock_name(device)
            fh = _try_lock(path)
            if fh is not None:
                got.append((device, path, fh))
                if len(got) == n:
                    return ([d for d, _, _ in got], [str(p) for _, p, _ in got], [h for _, _, h in got],
                            time.monotonic() - start)
        for _, _, fh in got:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()
        waited = time.monotonic() - start
        held = "; ".join(f"GPU {d}: {_holder(folder / _lock_name(d))}" for d in candidates)
        if wait_s is not None and waited >= wait_s:
            raise GpuBusyError(
                f"{what}: waited {waited:.0f}s ({WAIT_ENV}={wait_s:g}) for {n} free GPU(s) of {len(candidates)} "
                f"({', '.join(candidates)}), each locked by another score job under {folder}: {held}. "
                f"Run fewer GPU jobs at once (snakemake --resources gpu=N, N at most the GPUs this machine has) or "
                f"wait for those jobs to end.")
        if time.monotonic() >= next_report:
            log.info("%s: waiting for %d free GPU(s) of %d (%s)", what, n, len(candidates), held)
            next_report = time.monotonic() + REPORT_EVERY_S
        time.sleep(POLL_S)


def claim(model_cfg: Mapping[str, Any], workdir: str | Path | None = None,
          env: MutableMapping[str, str] | None = None, wait_s: float | None = None) -> Claim | None:
    """The GPU(s) for a score job of ``model_cfg``, chosen and locked before torch initialises CUDA (see the
    module's docstring); None when the model asks for no GPU (nothing is touched). ``env``: the environment to read
    and set (``os.environ``); ``wait_s``: how long to wait for a free GPU (default ``BIASFLOW_GPU_WAIT_S``, unset:
    for ever). The claim holds its locks until ``release()`` or the end of the process."""
    n = gpus_asked(model_cfg)
    if n < 1:
        return None
    env = os.environ if env is None else env
    what = f"model {model_cfg.get('name')!r}"
    device = str(model_cfg.get("device") or "")
    visible_now = env.get("CUDA_VISIBLE_DEVICES")
    if re.fullmatch(r"cuda:\d+", device):
        return Claim("explicit", n, devices=[device], visible=visible_now,
                     note=f"model.device={device} set by the user: no GPU chosen or locked")
    if _cuda_initialised():
        return Claim("in_process", n, visible=visible_now,
                     note="CUDA was initialised in this process before the job: its devices are used as they are")
    if wait_s is None and env.get(WAIT_ENV):
        try:
            wait_s = float(env[WAIT_ENV])
        except ValueError:
            raise ValueError(f"{WAIT_ENV}={env[WAIT_ENV]!r}: must be a number of seconds") from None
    counted_by, names = "", {}
    if visible_now is not None:
        candidates = _visible_entries(visible_now)
        if not candidates or candidates[0] in ("-1", "NoDevFiles"):
            return Claim("none_found", n, visible=visible_now,
                         note=f"CUDA_VISIBLE_DEVICES={visible_now!r} hides every GPU: none chosen")
        if len(candidates) <= n:
            if len(candidates) < n:
                log.warning("%s asks for %d GPUs but CUDA_VISIBLE_DEVICES=%s shows %d", what, n, visible_now,
                            len(candidates))
            return Claim("given", n, devices=candidates, visible=visible_now)
        counted_by = "CUDA_VISIBLE_DEVICES"
    elif any(env.get(v) for v in SLURM_GPU_VARS):
        given = next(env[v] for v in SLURM_GPU_VARS if env.get(v))
        return Claim("given", n, devices=_visible_entries(given), visible=None,
                     note="SLURM gave the job its GPUs (" + ", ".join(f"{v}={env[v]}" for v in SLURM_GPU_VARS
                                                                       if env.get(v)) + ")")
    else:
        count, counted_by, names = gpu_count(env)
        if count < 1:
            return Claim("none_found", n, counted_by=counted_by,
                         note=f"no GPU found ({counted_by}): none chosen; a model on cuda fails to load")
        candidates = [str(i) for i in range(count)]
        if env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID":
            names = {}  # the user's order numbers the GPUs as CUDA does, not as nvidia-smi does: no names
        if count < n:
            log.warning("%s asks for %d GPUs; this machine has %d (%s): using them all", what, n, count, counted_by)
            n = count
    folder = Path(workdir or ".").resolve() / LOCK_DIR / re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
    devices, locks, handles, waited = _lock_some(candidates, n, folder, wait_s, what)
    out = Claim("locked", gpus_asked(model_cfg), devices=devices, visible=",".join(devices), locks=locks,
                names={d: names[d] for d in devices if d in names}, waited_s=waited, counted_by=counted_by,
                _handles=handles, _env=env)
    settings = {"CUDA_VISIBLE_DEVICES": out.visible}
    if visible_now is None and "CUDA_DEVICE_ORDER" not in env:
        settings["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # index K is nvidia-smi's GPU K (CUDA's default: fastest first)
    for name, value in settings.items():
        out._restore[name] = env.get(name)
        env[name] = value
    return out


__all__ = ["claim", "Claim", "GpuBusyError", "gpu_count", "gpus_asked", "nvidia_smi_gpus", "LOCK_DIR",
           "FAKE_COUNT_ENV", "WAIT_ENV"]
