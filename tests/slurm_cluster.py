"""A real single-node SLURM cluster on this machine, for the tests: munged, slurmctld and slurmd on localhost.

Everything lives in one temporary folder (munge key and socket, slurm.conf, state, spool, logs); the daemons run in
the foreground as children of the test process, on free ports, so two test runs on one machine do not meet and
nothing of the machine's own configuration (/etc/slurm, /etc/munge) is read or changed. Clients find the cluster
through ``SLURM_CONF`` (``LocalSlurm.env``); jobs inherit it (sbatch --export=ALL).

No accounting database: ``sacct`` answers "accounting storage is disabled", so jobs are followed with ``squeue``,
which keeps finished jobs for ``MinJobAge`` seconds (set long enough for a test to read them back).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

# Debian packages: slurm-wlm (slurmctld, slurmd, slurm-client) and munge
PROGRAMS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scontrol", "scancel", "srun")
INSTALL_HINT = "apt-get install slurm-wlm munge"
PARTITION = "biasflow"
NODE = "localhost"
MIN_JOB_AGE_S = 3600
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p, path=SEARCH_PATH) is None]


def skip_reason() -> str | None:
    """Why a local SLURM cluster cannot be started here (None: it can)."""
    missing = missing_programs()
    if missing:
        return f"SLURM/munge programs not installed ({', '.join(missing)}): as root, {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "the local SLURM cluster runs its daemons as root (SlurmUser=root): run the test as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_memory_mb(margin: float = 0.1) -> int:
    """The node's RealMemory: MemTotal less a margin (slurmd drains a node that reports less than configured)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * (1 - margin))
    raise RuntimeError("no MemTotal in /proc/meminfo")


def node_cpus() -> int:
    return len(os.sched_getaffinity(0))


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.logs = self.root / "log"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.cpus = node_cpus()
        self.memory_mb = node_memory_mb()

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, Snakemake's SLURM executor) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf), "PATH": os.pathsep.join([str(self.root / "bin"), SEARCH_PATH])}

    def client_env(self) -> dict[str, str]:
        return dict(os.environ, **self.env)

    # ------------------------------------------------------------------------------------------ start / stop
    def start(self, timeout_s: float = 60) -> "LocalSlurm":
        for d in ("munge", "state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o755)  # munged refuses a socket directory others may write to
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)  # munged refuses a key others may read
        self.socket = munge / "munge.socket"
        self._spawn("munged", [shutil.which("munged", path=SEARCH_PATH), "--foreground", "--force",
                               f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.logs / 'munged.log'}",
                               f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: self.socket.exists(), timeout_s, "munged did not create its socket")
        self.conf.write_text(self.slurm_conf())
        self._srun_keeping_conf()
        self._spawn("slurmctld", [shutil.which("slurmctld", path=SEARCH_PATH), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [shutil.which("slurmd", path=SEARCH_PATH), "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self.node_idle, timeout_s, "the node did not become idle")
        return self

    def slurm_conf(self) -> str:
        r = self.root
        return "\n".join([
            "ClusterName=biasflowtest",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",  # no cgroups needed (containers, CI)
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",  # jobs are placed by their CPUs and memory, as on a cluster
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            f"MinJobAge={MIN_JOB_AGE_S}",  # finished jobs stay visible to squeue (no accounting database here)
            "KillWait=5",  # a job past its time limit is killed 5 s after its SIGTERM (the failure tests' TIMEOUT)
            # a step that ends while the controller is down (the failure test's outage) cannot report its end; after
            # the default 60 s slurmd calls it unkillable and drains the node ("Kill task failed"), and every later
            # job pends for good. Real clusters set this well above their controller's restart time too
            "UnkillableStepTimeout=300",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
            # two jobs per CPU: a job spends part of its life waiting (submission, status checks), not computing
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2",
            "",
        ])

    def _srun_keeping_conf(self) -> None:
        """An ``srun`` first on PATH that finds this cluster. Inside a job, snakemake-executor-plugin-slurm-jobstep
        (0.6.1) starts the rule with ``srun`` after removing every SLURM_* variable but the job's identity, SLURM_CONF
        included: a real cluster's srun then reads /etc/slurm/slurm.conf, this one's config is in a temporary
        folder."""
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        srun = bin_dir / "srun"
        srun.write_text(f"#!/bin/sh\nSLURM_CONF='{self.conf}' exec '{shutil.which('srun', path=SEARCH_PATH)}' "
                        f'"$@"\n')
        srun.chmod(0o755)

    def stop(self) -> None:
        if any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
            subprocess.run(["scancel", "--full", "--partition", PARTITION], env=self.client_env(),
                           capture_output=True, timeout=30)
        for name, proc in reversed(self.procs):  # slurmd, slurmctld, munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._kill_leftover_steps()
        self.procs.clear()

    def stop_controller(self) -> None:
        """Stop slurmctld as an outage does (its state is saved; the jobs on the node keep running)."""
        for i, (name, proc) in enumerate(self.procs):
            if name == "slurmctld" and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)

    def start_controller(self, timeout_s: float = 60) -> None:
        """Start slurmctld again; it recovers its jobs from the saved state."""
        self.procs = [(n, p) for n, p in self.procs if not (n == "slurmctld" and p.poll() is not None)]
        self._spawn("slurmctld", [shutil.which("slurmctld", path=SEARCH_PATH), "-D", "-i", "-f", str(self.conf)])
        self._wait(self.controller_answers, timeout_s, "slurmctld did not answer after its restart")

    def drained(self) -> str:
        """``sinfo -R``: the nodes SLURM took out of service and why (empty when none)."""
        proc = subprocess.run(["sinfo", "-R", "--noheader"], env=self.client_env(), capture_output=True, text=True,
                              timeout=30)
        return proc.stdout.strip()

    def controller_answers(self) -> bool:
        proc = subprocess.run(["squeue", "--noheader"], env=self.client_env(), capture_output=True, timeout=30)
        return proc.returncode == 0

    def job_processes(self, jobid: str) -> list[tuple[int, str]]:
        """(pid, command line) of the processes of a SLURM job (its batch script, Snakemake, the rule's script):
        those whose environment has SLURM_JOB_ID=<jobid>, slurmstepd excluded."""
        want = f"SLURM_JOB_ID={jobid}".encode()
        found = []
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                environ = (pid_dir / "environ").read_bytes().split(b"\0")
                cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if want in environ and not cmdline.startswith("slurmstepd"):
                found.append((int(pid_dir.name), cmdline))
        return found

    def _kill_leftover_steps(self) -> None:
        """slurmstepd processes of this cluster that outlived slurmd (they name our spool dir in their cmdline)."""
        spool = str(self.root / "spool")
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().decode(errors="replace")
                environ = (pid_dir / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if cmdline.startswith("slurmstepd") and (spool in cmdline or str(self.conf) in environ):
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except OSError:
                    pass

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.logs / f"{name}.stdout", "w")
        env = dict(os.environ, **self.env)
        self.procs.append((name, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                  start_new_session=True)))

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [(n, p.returncode) for n, p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{what}: {dead[0][0]} exited with {dead[0][1]}\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"{what} within {timeout_s:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for f in sorted(self.logs.glob("*")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(out)

    # ------------------------------------------------------------------------------------------ queries
    def node_idle(self) -> bool:
        proc = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%T"], env=self.client_env(),
                              capture_output=True, text=True, timeout=30)
        return proc.returncode == 0 and proc.stdout.split() == ["idle"]

    def jobs(self) -> list[dict[str, str]]:
        """Every job the controller knows, finished ones included: id, name, state, partition, CPUs, memory,
        time limit, comment (the Snakemake plugin writes the rule and wildcards there)."""
        fields = {"id": "%i", "name": "%j", "state": "%T", "partition": "%P", "cpus": "%C", "memory": "%m",
                  "time_limit": "%l", "comment": "%k"}
        proc = subprocess.run(["squeue", "--noheader", "--states=all", "--format=" + "|".join(fields.values())],
                              env=self.client_env(), capture_output=True, text=True, timeout=30, check=True)
        return [dict(zip(fields, line.split("|"))) for line in proc.stdout.splitlines() if line.strip()]


__all__ = ["LocalSlurm", "skip_reason", "INSTALL_HINT", "PARTITION"]
