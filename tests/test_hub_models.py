"""Hub models for real: `biasflow run` with a hub id, against a local server that speaks the hub's file API.

`tests/hub_server.py` serves tiny BERTs (three commits of different weights) under `org/tiny-bert`; the runs go
through `HF_ENDPOINT` and a scratch `HF_HOME`, in a subprocess as a user runs them. Checked: the download and the
commit it resolved to (in provenance, the report and the answer cache's key); a second run with `HF_HUB_OFFLINE=1`
and the hub down; a branch moved to another commit (and moving again mid-load) never serving or mixing answers of
two commits; and one-line errors for an unknown id, an unknown revision, a gated model (never writing the token),
a connection dropped mid-file (the partial file never used) and an unreadable weights file.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, build_tiny_bert, project_copy
from hub_server import HubServer, folder_files

pytestmark = pytest.mark.slow

REPO = "org/tiny-bert"
SLICE = ["metric=[crows_pairs]", "benchmark.crows_pairs.limit={limit}", "stats.n_boot=20", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def commits(tmp_path_factory) -> list[dict[str, bytes]]:
    """The files of three commits of the same tiny BERT: same tokenizer, different weights."""
    root = tmp_path_factory.mktemp("hub-models")
    return [folder_files(build_tiny_bert(root / f"seed{seed}", seed=seed)) for seed in range(3)]


@pytest.fixture(scope="module")
def hub(commits):
    with HubServer() as server:
        server.shas = [server.add_commit(REPO, files, move=(i == 0)) for i, files in enumerate(commits)]
        yield server


@pytest.fixture(scope="module")
def project(tmp_path_factory, crows_csv):
    work = project_copy(tmp_path_factory.mktemp("project"), {"crows_pairs/crows_pairs_anonymized.csv": crows_csv})
    (work / "conf" / "model" / "tiny_hub.yaml").write_text(
        f"name: tiny_hub\nkind: masked_lm\nhub_id: {REPO}\nrevision: main\nlowercase: true\ndtype: float32\n"
        f"device: cpu\nbatch_tokens: 2048\n")
    return work


def hub_env(project: Path, hub: HubServer, offline: bool = False, token: str | None = None) -> dict[str, str]:
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT), HF_ENDPOINT=hub.url,
               HF_HOME=str(project / "hf-home"), HF_HUB_OFFLINE="1" if offline else "0",
               TRANSFORMERS_OFFLINE="1" if offline else "0", HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_CACHE", None)
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    return env


def biasflow_run(project: Path, hub: HubServer, overrides: list[str], multirun=False, offline=False, token=None,
                 ok=True, targets=()) -> subprocess.CompletedProcess:
    """``biasflow run`` as a user runs it (``targets``: only the files named, e.g. score tables, for speed)."""
    cmd = [sys.executable, "-m", "biasflow.cli", "run", *(["-m"] if multirun else []), *overrides, "--cores", "2",
           "--", "--directory", str(project), *targets]
    proc = subprocess.run(cmd, cwd=ROOT, env=hub_env(project, hub, offline, token), capture_output=True, text=True,
                          timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def plan_jobs(project: Path, overrides: list[str], multirun=False):
    old = os.environ.get("BIASFLOW_CONF")
    os.environ["BIASFLOW_CONF"] = str(project / "conf")
    try:
        from biasflow.plan import build_plan

        return build_plan(overrides, multirun=multirun)
    finally:
        if old is None:
            os.environ.pop("BIASFLOW_CONF")
        else:
            os.environ["BIASFLOW_CONF"] = old


def slice_(limit: int) -> list[str]:
    return [o.format(limit=limit) for o in SLICE]


def scored(project: Path, job) -> tuple[dict[str, str], dict[str, float]]:
    """The provenance a job's score stage recorded and its answers (sentence -> PLL total)."""
    path = project / job.scores_path()
    meta = json.loads(Path(f"{path}.meta.json").read_text())
    table = pd.read_parquet(path)
    table = table[table["kind"] == "pll"]
    return meta["provenance"], dict(zip(table["text"], table["total"]))


def cache_folders(project: Path) -> set[str]:
    """The model fingerprints the answer cache holds answers of (its folders with a request kind's answers)."""
    return {p.parent.name for p in (project / "results" / "cache").glob("*/pll") if p.is_dir()}


@pytest.fixture(scope="module")
def first_run(project, hub):
    hub.clear_log()
    overrides = ["model=tiny_hub", *slice_(20)]
    proc = biasflow_run(project, hub, overrides)
    return proc, plan_jobs(project, overrides)


def test_a_hub_model_is_downloaded_and_its_commit_recorded(project, hub, first_run):
    _, plan = first_run
    commit = hub.shas[0]
    provenance, answers = scored(project, plan.jobs[0])
    assert provenance["model.source"] == REPO and provenance["model.revision"] == commit  # not "main"
    assert len(answers) == 40
    # every file came from that one commit, asked for by its sha
    files = hub.file_requests(REPO)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f for _, _, f in files}
    assert {revision for _, revision, _ in files} == {commit}
    # the answers are cached under the fingerprint the provenance names, and the report shows the commit
    assert cache_folders(project) == {provenance["model.fingerprint"]}
    assert commit in (project / plan.run_dir / "report.html").read_text()


def test_a_second_run_works_offline_from_the_cache(project, hub, first_run):
    """HF_HUB_OFFLINE=1 and the hub down: the branch resolves from the Hugging Face cache, a pinned commit too."""
    commit = hub.shas[0]
    _, first = first_run
    _, first_answers = scored(project, first.jobs[0])
    overrides = ["model=tiny_hub", f"model.revision=main,{commit}", *slice_(10)]
    jobs = {job.model["revision"]: job for job in plan_jobs(project, overrides, multirun=True).jobs}
    hub.clear_log()
    hub.refuse = True
    try:
        biasflow_run(project, hub, overrides, multirun=True, offline=True,
                     targets=[job.scores_path() for job in jobs.values()])
    finally:
        hub.refuse = False
    assert hub.requests == []  # nothing asked of the hub
    for revision in ("main", commit):
        provenance, answers = scored(project, jobs[revision])
        assert provenance["model.revision"] == commit
        assert len(answers) == 20 and all(answers[t] == first_answers[t] for t in answers)  # the same weights
    # the pinned run has a cache key of its own, named by the config and the commit
    pinned, _ = scored(project, jobs[commit])
    assert pinned["model.fingerprint"] in cache_folders(project)


@pytest.fixture(scope="module")
def moved_run(project, hub, commits):
    """main moved from commit 0 to commit 1 (and to commit 2 as soon as a run resolves it), beside a gated model
    asked with a token that has no access to it: one sweep over the two hub ids."""
    token = "hf_" + secrets.token_hex(16)
    hub.add_commit("org/gated", commits[0])
    hub.repos["org/gated"].token = "hf_" + secrets.token_hex(16)  # not the token given
    repo = hub.repos[REPO]
    repo.refs["main"] = hub.shas[1]
    repo.move_after_resolve = ("main", hub.shas[2])  # a push landing right after the run resolves main
    overrides = ["model=tiny_hub", f"model.hub_id={REPO},org/gated", *slice_(25)]
    jobs = {job.model["hub_id"]: job for job in plan_jobs(project, overrides, multirun=True).jobs}
    hub.clear_log()
    try:
        proc = biasflow_run(project, hub, overrides, multirun=True, token=token, ok=False,  # no second try
                            targets=["--retries", "0", *(job.scores_path() for job in jobs.values())])
    finally:
        repo.refs["main"], repo.move_after_resolve = hub.shas[0], None
    return proc, jobs, token


def test_a_moved_branch_never_serves_or_mixes_answers_of_another_commit(project, hub, first_run, moved_run):
    """The run uses commit 1 alone: for every file, for its cache key and for every answer (none of commit 0's
    cached answers, none of commit 2's files)."""
    _, first = first_run
    first_prov, first_answers = scored(project, first.jobs[0])
    _, jobs, _ = moved_run
    provenance, answers = scored(project, jobs[REPO])
    assert provenance["model.revision"] == hub.shas[1]
    assert {revision for _, revision, _ in hub.file_requests(REPO)} == {hub.shas[1]}
    assert provenance["model.fingerprint"] != first_prov["model.fingerprint"]
    assert provenance["model.fingerprint"] in cache_folders(project)
    shared = [t for t in answers if t in first_answers]
    assert len(shared) == 40 and all(answers[t] != first_answers[t] for t in shared)  # commit 1's weights


def test_a_gated_model_in_a_run_fails_in_one_line_and_the_token_is_written_nowhere(project, hub, moved_run):
    proc, jobs, token = moved_run
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not Path(jobs["org/gated"].scores_path()).exists()
    line = next(ln for ln in out.splitlines() if "is gated or private" in ln)
    assert "model 'tiny_hub': hub id 'org/gated'" in line and "has no access" in line and "HF_TOKEN" in line
    assert token not in out
    for folder in (project, Path(hub_env(project, hub)["HF_HOME"])):
        for path in folder.rglob("*"):
            if path.is_file() and path.stat().st_size < 50 << 20:
                assert token.encode() not in path.read_bytes(), path


ERRORS_SCRIPT = r"""
import json, os, sys, urllib.request
from huggingface_hub import try_to_load_from_cache
from biasflow.errors import ModelLoadError
from biasflow.models import load_model

endpoint, cases = sys.argv[1], json.loads(sys.argv[2])
out = {}
for case, hub_id, revision, token in cases:
    if case == "resumed":
        urllib.request.urlopen(f"{endpoint}/_test/heal/{hub_id}").read()
    os.environ.pop("HF_TOKEN", None)
    if token:
        os.environ["HF_TOKEN"] = token
    try:
        model = load_model({"name": case, "kind": "masked_lm", "hub_id": hub_id, "revision": revision,
                            "device": "cpu"})
        out[case] = {"revision": model.provenance()["model.revision"]}
    except ModelLoadError as exc:
        out[case] = {"error": str(exc)}
    out[case]["cached weights"] = isinstance(try_to_load_from_cache(hub_id, "model.safetensors"), str)
print("RESULT " + json.dumps(out))
"""


def test_hub_errors_are_one_line_and_say_what_to_do(project, hub, commits):
    token = "hf_" + secrets.token_hex(16)
    hub.add_commit("org/gated-too", commits[0])
    hub.repos["org/gated-too"].token = token
    hub.add_commit("org/flaky", commits[0])
    hub.repos["org/flaky"].drop = {"model.safetensors": len(commits[0]["model.safetensors"]) // 2}
    broken = dict(commits[0], **{"model.safetensors": commits[0]["model.safetensors"][:4096]})
    hub.add_commit("org/broken", broken)
    cases = [("unknown_id", "org/no-such-model", "main", None), ("unknown_revision", REPO, "no-such-branch", None),
             ("gated", "org/gated-too", "main", None),
             ("gated_wrong_token", "org/gated-too", "main", "hf_" + "0" * 32),
             ("gated_token", "org/gated-too", "main", token), ("dropped", "org/flaky", "main", None),
             ("resumed", "org/flaky", "main", None), ("broken", "org/broken", "main", None)]
    env = hub_env(project, hub)
    env["HF_HOME"] = str(project / "hf-home-errors")
    proc = subprocess.run([sys.executable, "-c", ERRORS_SCRIPT, hub.url, json.dumps(cases)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    errors = {case: result.get("error", "") for case, result in out.items()}
    for case in ("unknown_id", "unknown_revision", "gated", "gated_wrong_token", "dropped", "broken"):
        assert errors[case] and "\n" not in errors[case] and f"model '{case}'" in errors[case], (case, out[case])
        assert hub.url in errors[case] or case == "broken"
    assert "'org/no-such-model' does not exist" in errors["unknown_id"] and "model.hub_id" in errors["unknown_id"]
    assert "no revision 'no-such-branch'" in errors["unknown_revision"] and "model.revision" in errors[
        "unknown_revision"]
    for case in ("gated", "gated_wrong_token"):
        assert "gated" in errors[case] and "HTTP 401" in errors[case] and "HF_TOKEN" in errors[case]
    assert "no token was given" in errors["gated"] and "has no access" in errors["gated_wrong_token"]
    assert out["gated_token"].get("revision") == hub.shas[0]  # the right token in HF_TOKEN loads it
    assert token not in proc.stdout + proc.stderr
    # a connection dropped mid-file: named, resumable, and the partial file never used
    assert "model.safetensors" in errors["dropped"] and "interrupted" in errors["dropped"]
    assert "run the same command again" in errors["dropped"]
    assert out["dropped"]["cached weights"] is False
    assert out["resumed"].get("revision") == hub.shas[0] and out["resumed"]["cached weights"] is True
    # an unreadable weights file in the cache names the model, its hub id and the file, and how to get it again
    assert "'org/broken'" in errors["broken"] and "model.safetensors" in errors["broken"]
    assert "delete" in errors["broken"]


def test_an_unreadable_local_weights_file_names_the_model_and_the_file(tmp_path, tiny_bert_dir):
    from biasflow.errors import ModelLoadError
    from biasflow.models import load_model

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])  # a truncated copy
    with pytest.raises(ModelLoadError) as err:
        load_model({"name": "my_bert", "kind": "masked_lm", "path": str(folder), "device": "cpu"})
    message = str(err.value)
    assert "\n" not in message and "model 'my_bert'" in message and str(folder) in message
    assert str(weights) in message and "save_pretrained" in message


def test_offline_and_never_downloaded_says_to_run_once_online(monkeypatch):
    from huggingface_hub import constants

    from biasflow.errors import ModelLoadError
    from biasflow.models import load_model

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as err:
        load_model({"name": "offline_bert", "kind": "masked_lm", "hub_id": "org/never-downloaded", "device": "cpu"})
    message = str(err.value)
    assert "\n" not in message and "model 'offline_bert': hub id 'org/never-downloaded'" in message
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE=1" in message
    assert "run once with hub access" in message
