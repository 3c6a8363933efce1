"""The locked environment: requirements.lock satisfies pyproject.toml, pins every package with hashes, is what the
README's commands and CI install, and the floors pyproject.toml declares are installable and pass a fast subset."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from conftest import ROOT

LOCK = ROOT / "requirements.lock"
EXTRAS = ("test", "offline-models", "server", "cluster")  # what scripts/bootstrap.sh and scripts/lock.sh install


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of requirements.lock."""
    out, name = {}, None
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", line)
        if m:
            name = canonicalize_name(m.group(1))
            out[name] = (m.group(2), [])
        elif name and (h := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            out[name][1].append(h.group(1))
    return out


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def declared() -> list[Requirement]:
    project = pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in EXTRAS:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def torch_spec() -> str:
    m = re.search(r'TORCH_SPEC="\$\{TORCH_SPEC:-([^}]+)\}"', (ROOT / "scripts" / "bootstrap.sh").read_text())
    assert m, "scripts/bootstrap.sh sets no default TORCH_SPEC"
    return m.group(1)


def test_the_lock_satisfies_pyproject():
    """Every dependency of biasflow and of the extras the README's commands install is in the lock at a version
    pyproject.toml allows (re-resolve with `bash scripts/lock.sh` when this fails); torch, installed from TORCH_SPEC,
    at a version pyproject.toml allows too."""
    lock = locked()
    problems = []
    for req in declared():
        name = canonicalize_name(req.name)
        if name == "torch":
            pinned = Requirement(torch_spec())
            (spec,) = pinned.specifier
            if not req.specifier.contains(Version(spec.version)):
                problems.append(f"TORCH_SPEC {pinned} is outside pyproject's {req}")
            assert name not in lock, "torch comes from TORCH_SPEC (its build depends on the hardware), not the lock"
            continue
        if name not in lock:
            problems.append(f"{req} is not in requirements.lock")
        elif not req.specifier.contains(Version(lock[name][0]), prereleases=True):
            problems.append(f"requirements.lock has {name}=={lock[name][0]}, pyproject asks {req}")
    assert not problems, "requirements.lock no longer satisfies pyproject.toml (bash scripts/lock.sh):\n" + \
        "\n".join(problems)


def test_every_locked_package_is_pinned_with_hashes():
    lock = locked()
    assert len(lock) > 100
    lines = [ln for ln in LOCK.read_text().splitlines() if re.match(r"^[A-Za-z0-9]", ln)]
    assert len(lines) == len(lock) and all("==" in ln for ln in lines)  # nothing unpinned
    assert all(hashes for _, hashes in lock.values()), [n for n, (_, h) in lock.items() if not h]


def test_the_readme_commands_and_ci_install_the_lock():
    boot = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "--require-hashes --no-deps -r requirements.lock" in boot
    assert "pip_install --no-deps -e ." in boot and "pip check" in boot
    assert "bash scripts/bootstrap.sh test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/lock.sh" in readme  # the one command that re-resolves it
    env = (ROOT / "environment.yml").read_text()
    assert "python=3.11" in env and "scripts/bootstrap.sh" in env  # conda: the same locked install


@pytest.mark.skipif(not (os.environ.get("CI") and Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()),
                    reason="checks the bootstrap .venv in CI (CI=true bash .ci/run)")
def test_the_environment_under_test_is_the_lock():
    """What CI tests is exactly what a fresh machine installs."""
    wrong = []
    for name, (pinned, _) in locked().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            wrong.append(f"{name}=={pinned} is not installed")
            continue
        if Version(installed) != Version(pinned):
            wrong.append(f"{name}: installed {installed}, locked {pinned}")
    torch_pin = Requirement(torch_spec())
    assert torch_pin.specifier.contains(Version(version("torch")).base_version), version("torch")
    assert not wrong, wrong


def floor_gaps(pins: dict[str, str]) -> list[str]:
    """Direct dependencies (core, test, offline-models) that the lowest-direct resolution could not take at their
    declared floor: the floor pyproject.toml states is then not the one tested."""
    project = pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("test", "offline-models"):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    gaps = []
    for req in reqs:
        name = canonicalize_name(req.name)
        floor = next((s.version for s in req.specifier if s.operator in (">=", "==")), None)
        if name == "torch" or floor is None or "*" in floor:
            continue
        if Version(pins[name]) != Version(floor):
            gaps.append(f"{req}: resolved {pins[name]}")
    return gaps


FLOOR_TESTS = ["tests/test_choice_parser.py", "tests/test_plan.py", "tests/test_crows_metric.py",
               "tests/test_scoring.py", "tests/test_config_validation.py", "tests/test_stereoset_metric.py",
               "tests/test_crows_aul.py", "tests/test_weat.py", "tests/test_bbq.py::test_prepare_on_all_58492_examples",
               "tests/test_workflow.py"]  # the pipeline end to end: Snakemake, the stages, MLflow logging


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CI"), reason="installs the lowest allowed versions into a scratch venv (about "
                    "5 minutes); runs in CI (CI=true bash .ci/run), or: CI=true pytest tests/test_lock.py")
def test_the_declared_floors_install_and_pass_a_fast_subset(tmp_path):
    """pyproject.toml's floors are real: the lowest version of every direct dependency it allows (uv's
    lowest-direct resolution of the core and the test / offline-models extras; torch at TORCH_SPEC, the cluster extra
    left out since the SLURM plugin itself needs numpy>=2.4 and pandas>=2.3) installs and passes a fast subset."""
    env = {**os.environ, "VIRTUAL_ENV": "", "PYTHONNOUSERSITE": "1"}
    floors = tmp_path / "floors.txt"
    constraint = tmp_path / "torch.txt"
    constraint.write_text(torch_spec() + "\n")
    uv = [sys.executable, "-m", "uv"]
    if subprocess.run(uv + ["--version"], capture_output=True).returncode != 0:
        pytest.fail("uv is not installed in the test environment (the test extra pins it)")
    compiled = subprocess.run(
        uv + ["pip", "compile", str(ROOT / "pyproject.toml"), "--extra", "test", "--extra", "offline-models",
              "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}", "--resolution", "lowest-direct",
              "--constraint", str(constraint), "--no-header", "--no-annotate", "-o", str(floors)]
        + (["--find-links", os.environ["PIP_FIND_LINKS"]] if os.environ.get("PIP_FIND_LINKS") else []),
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    pins = {canonicalize_name(k): v for k, v in
            re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", floors.read_text(), re.M)}
    assert not floor_gaps(pins), "declared floors that cannot be installed together (raise them in pyproject.toml):" \
        f" {floor_gaps(pins)}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    for args in (["--no-deps", "-r", str(floors)], ["--no-deps", "-e", str(ROOT)]):
        done = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                              capture_output=True, text=True, env=env, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout
    run = subprocess.run([py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *FLOOR_TESTS],
                         capture_output=True, text=True, cwd=ROOT, env={**env, "TOKENIZERS_PARALLELISM": "false"},
                         timeout=1200)
    assert run.returncode == 0, "on the floors " + shlex.join(FLOOR_TESTS) + ":\n" + run.stdout[-4000:]
