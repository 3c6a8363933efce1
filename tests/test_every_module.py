"""Every module of src/biasflow imports (the fast tier's floor: ``pytest -m fast`` touches each of them at least
here), ``python -m biasflow.lmchallenge`` answers ``--help``, and the fast tier's file list names real files."""
from __future__ import annotations

import importlib
import pkgutil
import runpy
import sys
from pathlib import Path

import pytest

import biasflow
from conftest import FAST_FILES, TESTS

SRC = Path(biasflow.__file__).resolve().parent


def module_names() -> list[str]:
    """Every module under src/biasflow as pkgutil finds it, but the ``__main__`` modules (importing runs them)."""
    return sorted(m.name for m in pkgutil.walk_packages(biasflow.__path__, "biasflow.")
                  if not m.name.endswith(".__main__"))


def test_the_walk_finds_every_python_file():
    """A .py file pkgutil cannot reach (a folder without __init__.py) would escape the import test below."""
    files = {".".join(("biasflow",) + p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
             for p in SRC.rglob("*.py")}
    assert files - {"biasflow"} - {f for f in files if f.endswith(".__main__")} == set(module_names())


@pytest.mark.parametrize("name", module_names())
def test_module_imports(name):
    importlib.import_module(name)


def test_lmchallenge_main_answers_help(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m biasflow.lmchallenge", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("biasflow.lmchallenge", run_name="__main__", alter_sys=False)
    assert done.value.code == 0 and "ngram" in capsys.readouterr().out


def test_the_fast_tier_lists_existing_test_files():
    """A renamed or removed file would silently leave the fast tier (conftest.FAST_FILES)."""
    assert "test_every_module.py" in FAST_FILES
    assert sorted(f for f in FAST_FILES if not (TESTS / f).is_file() or not f.endswith(".py")) == []
