"""One scoring job per GPU on a box with several (biasflow.gpus): each score job whose model asks for a GPU locks a
free one and sees only it (CUDA_VISIBLE_DEVICES, set before torch is imported), records it in its .meta.json, waits
while every GPU is taken, and gets its GPU back from the kernel when it is killed with -9. A GPU a scheduler gave the
job, and model.device=cuda:K, are used as they are; a model that asks for no GPU is never touched.

No GPU here: the machine's GPU count is faked with BIASFLOW_FAKE_GPU_COUNT (or a fake nvidia-smi on PATH), and the
"jobs" are separate processes, as Snakemake's are. The test marked ``gpu`` checks on a real GPU that torch sees
exactly the GPU chosen (skipped without one).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT

from biasflow import gpus

GPU_MODEL = {"name": "m", "kind": "masked_lm", "device": "cuda"}

# a "score job": claims its GPU, says what it got, then holds it until its stdin closes (or it is killed)
JOB = textwrap.dedent("""
    import json, logging, os, sys
    from biasflow.gpus import claim
    logging.basicConfig(level=logging.INFO)  # as stages.start_stage sets it up
    got = claim(json.loads(sys.argv[1]))
    print(json.dumps({"how": got.how, "devices": got.devices, "env": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "order": os.environ.get("CUDA_DEVICE_ORDER"), "torch": "torch" in sys.modules}), flush=True)
    sys.stdin.read()
""")


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", gpus.WAIT_ENV, *gpus.SLURM_GPU_VARS)}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def start_job(workdir: Path, log: Path, model: dict = GPU_MODEL, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOB, json.dumps(model)], cwd=workdir, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=job_env(**env))


def first_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, f"the job ended without claiming a GPU (exit {proc.wait()})"
    return json.loads(line)


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def wait_for(predicate, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_concurrent_jobs_get_their_own_gpu_a_third_waits_and_kill_9_frees_one(tmp_path):
    logs = [tmp_path / f"job{i}.log" for i in range(4)]
    a = start_job(tmp_path, logs[0], BIASFLOW_FAKE_GPU_COUNT="2")
    b = start_job(tmp_path, logs[1], BIASFLOW_FAKE_GPU_COUNT="2")
    c = None
    try:
        got_a, got_b = first_line(a), first_line(b)
        # each job locked a GPU of its own and sees only it, set before torch was imported
        assert {got_a["how"], got_b["how"]} == {"locked"}
        assert sorted(got_a["devices"] + got_b["devices"]) == ["0", "1"]
        assert got_a["env"] == got_a["devices"][0] and got_b["env"] == got_b["devices"][0]
        assert got_a["order"] == "PCI_BUS_ID" and not got_a["torch"]
        # a third job waits (Snakemake's gpu resource caps GPU jobs, so a taken GPU frees soon), naming the holders
        c = start_job(tmp_path, logs[2], BIASFLOW_FAKE_GPU_COUNT="2")
        assert wait_for(lambda: "waiting for 1 free GPU(s) of 2" in logs[2].read_text())
        text = logs[2].read_text()
        assert f"pid {a.pid}" in text and f"pid {b.pid}" in text
        assert c.poll() is None
        # ... and with a wait limit, gives up with an error naming the lock folder and the holders
        d = subprocess.run([sys.executable, "-c", JOB, json.dumps(GPU_MODEL)], cwd=tmp_path, capture_output=True,
                           text=True, env=job_env(BIASFLOW_FAKE_GPU_COUNT="2", BIASFLOW_GPU_WAIT_S="0.3"),
                           timeout=60)
        assert d.returncode != 0 and "GpuBusyError" in d.stderr
        assert "BIASFLOW_GPU_WAIT_S=0.3" in d.stderr and ".snakemake/biasflow/gpus" in d.stderr
        assert f"pid {a.pid}" in d.stderr and "--resources gpu=N" in d.stderr
        # kill -9 the first: the kernel drops its lock and the waiting job gets its GPU
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        got_c = first_line(c)
        assert got_c["how"] == "locked" and got_c["devices"] == got_a["devices"]
    finally:
        stop(a, b, *([c] if c else []))


def test_a_gpu_the_scheduler_gave_is_used_as_given_and_nothing_is_locked(tmp_path):
    for env in ({"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"},
                {"SLURM_JOB_GPUS": "2"}, {"SLURM_STEP_GPUS": "5"}):
        before = dict(env)
        got = gpus.claim(GPU_MODEL, workdir=tmp_path, env=env)
        assert got.how == "given", env
        assert env == before  # CUDA_VISIBLE_DEVICES as the scheduler set it (or unset)
        assert got.devices == [list(before.values())[0]]
        got.release()
    assert not (tmp_path / ".snakemake").exists()
    # a job asking for two GPUs on a node that gave it two
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpus.claim({**GPU_MODEL, "resources": {"gpus": 2}}, workdir=tmp_path, env=env).how == "given"
    assert not (tmp_path / ".snakemake").exists()


def test_a_run_restricted_to_some_gpus_chooses_among_them(tmp_path):
    """CUDA_VISIBLE_DEVICES listing more GPUs than a job asks for (a run limited to GPUs 2 and 5, or a SLURM
    allocation running the local profile): each job takes one of those, never another."""
    env1, env2 = {"CUDA_VISIBLE_DEVICES": "2,5"}, {"CUDA_VISIBLE_DEVICES": "2,5"}
    first = gpus.claim(GPU_MODEL, workdir=tmp_path, env=env1)
    second = gpus.claim(GPU_MODEL, workdir=tmp_path, env=env2)
    try:
        assert (first.how, first.devices, env1) == ("locked", ["2"], {"CUDA_VISIBLE_DEVICES": "2"})
        assert (second.how, second.devices, env2) == ("locked", ["5"], {"CUDA_VISIBLE_DEVICES": "5"})
        with pytest.raises(gpus.GpuBusyError, match=r"1 free GPU\(s\) of 2 \(2, 5\)"):
            gpus.claim(GPU_MODEL, workdir=tmp_path, env={"CUDA_VISIBLE_DEVICES": "2,5"}, wait_s=0)
    finally:
        first.release()
        second.release()
    assert env1 == env2 == {"CUDA_VISIBLE_DEVICES": "2,5"}  # put back on release
    # a job asking for two GPUs takes two at once
    env = {"BIASFLOW_FAKE_GPU_COUNT": "4"}
    with gpus.claim({**GPU_MODEL, "resources": {"gpus": 2}}, workdir=tmp_path, env=env) as both:
        assert both.devices == ["0", "1"] and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_DEVICE_ORDER" not in env


def test_explicit_device_and_models_without_a_gpu_are_left_alone(tmp_path):
    env = {"BIASFLOW_FAKE_GPU_COUNT": "2"}
    got = gpus.claim({**GPU_MODEL, "device": "cuda:1"}, workdir=tmp_path, env=env)
    assert got.how == "explicit" and got.devices == ["cuda:1"] and "model.device=cuda:1" in got.describe()
    for model in ({**GPU_MODEL, "device": "cpu"}, {**GPU_MODEL, "device": "auto"}, {**GPU_MODEL, "device": None},
                  {"name": "glove", "kind": "word_vectors", "device": "cuda"},  # kinds that never use a GPU
                  {"name": "ng", "kind": "ngram", "device": "cuda"},
                  {"name": "srv", "kind": "served_causal_lm", "device": "cuda"},
                  {**GPU_MODEL, "resources": {"gpus": 0}}):
        assert gpus.claim(model, workdir=tmp_path, env=env) is None, model
    assert env == {"BIASFLOW_FAKE_GPU_COUNT": "2"}
    assert not (tmp_path / ".snakemake").exists()


def test_gpus_are_counted_by_nvidia_smi_and_named(tmp_path):
    """nvidia-smi -L: GPUs only (a MIG device's indented line is not a GPU), numbered as CUDA numbers them once
    CUDA_DEVICE_ORDER=PCI_BUS_ID; the chosen GPU's name and UUID are recorded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)'\n"
                   "echo '  MIG 3g.40gb     Device  0: (UUID: MIG-bbbb)'\n"
                   "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)'\n")
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    old_path = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    try:
        assert gpus.gpu_count({})[:2] == (2, "nvidia-smi -L")
        held = gpus.claim(GPU_MODEL, workdir=tmp_path, env={})
        got = gpus.claim(GPU_MODEL, workdir=tmp_path, env=env)
        # a user's own device order is kept, and nvidia-smi's names (in PCI bus order) are then not recorded
        own = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
        with gpus.claim(GPU_MODEL, workdir=tmp_path / "other", env=own) as fastest:
            assert fastest.devices == ["0"] and fastest.names == {} and own["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    finally:
        os.environ["PATH"] = old_path
    try:
        assert got.devices == ["1"] and got.names == {"1": "NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)"}
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        record = got.record()
        assert record["how"] == "locked" and record["counted_by"] == "nvidia-smi -L"
        assert "GPU 1 (NVIDIA H100 80GB HBM3 (UUID: GPU-cccc))" in got.describe()
    finally:
        got.release()
        held.release()
    with pytest.raises(ValueError, match="BIASFLOW_FAKE_GPU_COUNT='two'"):
        gpus.gpu_count({"BIASFLOW_FAKE_GPU_COUNT": "two"})


# the score stage in a process of its own, as Snakemake runs it: records what CUDA_VISIBLE_DEVICES was when torch
# was first imported
STAGE = textwrap.dedent("""
    import json, os, sys
    seen = {}
    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" and "torch" not in seen:
                seen["torch"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    sys.meta_path.insert(0, Watch())
    from biasflow import stages
    stages.setup_logging(sys.argv[2])
    stages.score(json.loads(sys.argv[1]), "items.parquet", "s.parquet", "cache")
    print(json.dumps({**seen, "after": os.environ.get("CUDA_VISIBLE_DEVICES")}))
""")


@pytest.fixture()
def score_dir(tmp_path: Path) -> Path:
    """Three CrowS-Pairs items in a workdir."""
    from biasflow.registry import get_loader, load_all

    load_all()
    lines = [line for line in (ROOT / "tests" / "fixtures" / "crows_sample.csv").open() if not line.startswith("#")]
    (tmp_path / "crows.csv").write_text("".join(lines))
    get_loader("crows_pairs")({"csv": tmp_path / "crows.csv"}, {}).head(3).to_parquet(tmp_path / "items.parquet")
    return tmp_path


def test_the_score_stage_uses_and_records_its_gpu_and_cpu_jobs_are_unchanged(score_dir, tiny_bert_dir):
    model = {"name": "tiny", "kind": "masked_lm", "path": str(tiny_bert_dir), "lowercase": True, "device": "cpu"}
    params = {"metric": "crows_pairs", "metric_cfg": {}, "model": model, "mode": "parity"}
    env = job_env(BIASFLOW_FAKE_GPU_COUNT="2")

    def run_stage(p: dict) -> tuple[dict, dict, str]:
        proc = subprocess.run([sys.executable, "-c", STAGE, json.dumps(p), "score.log"], cwd=score_dir,
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return (json.loads(proc.stdout.strip().splitlines()[-1]), json.loads((score_dir / "s.parquet.meta.json")
                .read_text()), (score_dir / "score.log").read_text())

    # a CPU model: nothing locked, set or recorded
    seen, meta, log = run_stage(params)
    assert seen == {"torch": None, "after": None}
    assert "gpu" not in meta and "gpu" not in meta["provenance"] and "GPU" not in log
    assert not (score_dir / ".snakemake").exists()
    cpu_scores = (score_dir / "s.parquet").read_bytes()
    # a model asking for a GPU (model.resources.gpus; it loads on the CPU here, so torch is imported) with GPU 0 taken
    # by another job: it gets GPU 1, set before torch was imported, and says so in its log and provenance
    held = gpus.claim(GPU_MODEL, workdir=score_dir, env={"BIASFLOW_FAKE_GPU_COUNT": "2"})
    try:
        (score_dir / "cache").rename(score_dir / "cache-cpu")  # answered again, loading the model
        seen, meta, log = run_stage({**params, "model": {**model, "resources": {"gpus": 1}}})
    finally:
        held.release()
    assert seen == {"torch": "1", "after": None}
    assert meta["gpu"]["how"] == "locked" and meta["gpu"]["devices"] == ["1"]
    assert meta["gpu"]["CUDA_VISIBLE_DEVICES"] == "1" and meta["gpu"]["locks"][0].endswith("/1.lock")
    host = socket.gethostname()
    assert meta["provenance"]["gpu"] == f"GPU 1 on {host}, locked by this job (CUDA_VISIBLE_DEVICES=1)"
    assert meta["gpu"]["host"] == host
    assert f"GPU: GPU 1 on {host}, locked by this job (CUDA_VISIBLE_DEVICES=1); pid " in log
    assert (score_dir / "s.parquet").read_bytes() == cpu_scores  # the same numbers


GPU_JOB = textwrap.dedent("""
    import json, subprocess, sys
    from biasflow.gpus import claim
    got = claim({"name": "m", "kind": "masked_lm", "device": "cuda"})
    import torch
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    print(json.dumps({"how": got.how, "devices": got.devices, "names": got.names,
                      "count": torch.cuda.device_count(), "uuid": uuid}))
""")


def nvidia_smi_blocks() -> dict[str, str]:
    """nvidia-smi -L's text per GPU index: its line and the indented lines of its MIG devices."""
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    blocks: dict[str, str] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("GPU "):
            current = line.split(":", 1)[0].split()[1]
            blocks[current] = line
        elif current is not None:
            blocks[current] += "\n" + line
    return blocks


@pytest.mark.gpu
def test_on_a_gpu_the_job_sees_only_the_gpu_it_locked(tmp_path):
    """On a real GPU box: with the first GPU taken (when there are two or more), the job gets the next one, and
    torch sees that GPU alone, the one nvidia-smi names (UUID). A CUDA_VISIBLE_DEVICES the machine sets is kept:
    one GPU there is the scheduler's (used as given), several are chosen among."""
    names = gpus.nvidia_smi_gpus()
    if not names:
        pytest.skip("needs an NVIDIA GPU and nvidia-smi (nvidia-smi -L found none)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    candidates = list(names) if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
    env = {k: v for k, v in job_env().items()}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    held_env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    held = gpus.claim(GPU_MODEL, workdir=tmp_path, env=held_env) if len(candidates) > 1 else None
    try:
        proc = subprocess.run([sys.executable, "-c", GPU_JOB], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=300)
    finally:
        if held:
            held.release()
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = candidates[1] if len(candidates) > 1 else candidates[0]
    assert got["how"] == ("given" if len(candidates) == 1 and visible is not None else "locked"), got
    assert got["devices"] == [expected] and got["count"] == 1, got
    if visible is None:  # indices are nvidia-smi's (CUDA_DEVICE_ORDER=PCI_BUS_ID): the UUID must be that GPU's
        uuid = got["uuid"].removeprefix("GPU-").removeprefix("MIG-")
        assert uuid in nvidia_smi_blocks()[expected], (got, names)


@pytest.mark.slow
def test_the_gpu_profile_gives_each_score_job_a_gpu(tmp_path, tiny_bert_dir, crows_csv):
    """Through Snakemake with workflow/profiles/gpu and --resources gpu=2 on a box of two (faked) GPUs, with GPU 0
    held by another job all along: both score jobs (two models that ask for a GPU) run on GPU 1, one after the
    other, each recording it; the locks live in the run's workdir."""
    from conftest import project_copy

    project = project_copy(tmp_path / "p", {"crows_pairs/crows_pairs_anonymized.csv": crows_csv})
    for name in ("tiny_a", "tiny_b"):
        (project / "conf" / "model" / f"{name}.yaml").write_text(
            f"name: {name}\nkind: masked_lm\npath: {tiny_bert_dir}\nlowercase: true\ndevice: cpu\n"
            f"resources:\n  gpus: 1\n")
    overrides = ["model=tiny_a,tiny_b", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=4", "stats.n_boot=0",
                 "tracking.enabled=false"]
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(project),
           "--profile", str(ROOT / "workflow" / "profiles" / "gpu"), "--cores", "2", "--resources", "gpu=2",
           "--config", f"overrides={json.dumps(overrides)}", "multirun=true"]
    env = job_env(BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1", BIASFLOW_FAKE_GPU_COUNT="2")
    held = gpus.claim(GPU_MODEL, workdir=project, env={"BIASFLOW_FAKE_GPU_COUNT": "2"})
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        held.release()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    metas = sorted((project / "results" / "scores").glob("*/*.parquet.meta.json"))
    assert [m.parent.name.rsplit("-", 1)[0] for m in metas] == ["tiny_a", "tiny_b"]
    for meta in metas:
        gpu = json.loads(meta.read_text())["gpu"]
        assert (gpu["how"], gpu["devices"], gpu["CUDA_VISIBLE_DEVICES"]) == ("locked", ["1"], "1")
        assert Path(gpu["locks"][0]).parent.parent == project.resolve() / ".snakemake" / "biasflow" / "gpus"
    logs = sorted((project / "results" / "logs" / "score").glob("*/*.log"))
    assert len(logs) == 2 and all(f"GPU: GPU 1 on {socket.gethostname()}, locked by this job" in p.read_text()
                                  for p in logs)
