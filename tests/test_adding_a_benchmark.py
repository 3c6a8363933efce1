"""docs/adding_a_benchmark.md, run: its code blocks become a loader, a metric and two configs in a scratch project,
and its documented command plans and runs through every stage on tiny models with the numbers checked by hand."""
from __future__ import annotations

import hashlib
import re
import shlex
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, project_copy, run_job_stages

DOC = ROOT / "docs" / "adding_a_benchmark.md"
BLOCK = re.compile(r'```(?P<lang>\w+)(?: title="(?P<title>[^"]+)")?\n(?P<body>.*?)```', re.S)
CSV = """id,category,sent_a,sent_b
1,nurse,He is a nurse.,She is a nurse.
2,nurse,He works as a nurse.,She works as a nurse.
3,engineer,He is an engineer.,She is an engineer.
4,engineer,He became an engineer.,She became an engineer.
5,engineer,He trained as an engineer.,She trained as an engineer.
"""


def blocks() -> list[dict]:
    return [m.groupdict() for m in BLOCK.finditer(DOC.read_text())]


def titled(title: str) -> str:
    found = [b["body"] for b in blocks() if b["title"] == title]
    assert len(found) == 1, f"{DOC.name} has no single block titled {title}"
    return found[0]


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The page's files in a scratch project; the loader and metric registered (and unregistered after)."""
    from biasflow import registry

    registry.load_all()
    project = project_copy(tmp_path)
    data = tmp_path / "pronoun_pairs.csv"
    data.write_text(CSV)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    for name in ("conf/benchmark/pronoun_pairs.yaml", "conf/metric/pronoun_pairs.yaml"):
        text = titled(name).replace("file:///path/to/pronoun_pairs.csv", data.as_uri())
        (project / name).write_text(text.replace("SHA256_OF_THE_FILE", digest))
    for module, title in (("biasflow.data.pronoun_pairs", "src/biasflow/data/pronoun_pairs.py"),
                          ("biasflow.metrics.pronoun_pairs", "src/biasflow/metrics/pronoun_pairs.py")):
        mod = types.ModuleType(module)
        mod.__file__ = str(tmp_path / Path(title).name)
        monkeypatch.setitem(sys.modules, module, mod)
        exec(compile(titled(title), mod.__file__, "exec"), mod.__dict__)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    monkeypatch.chdir(project)
    yield project, data
    registry.LOADERS.pop("pronoun_pairs", None)
    registry.METRICS.pop("pronoun_pairs", None)


def documented_overrides() -> list[str]:
    commands = [line for b in blocks() if b["lang"] == "bash" for line in b["body"].splitlines()
                if line.startswith("biasflow run")]
    assert len(commands) == 1
    return shlex.split(commands[0])[2:]


@pytest.mark.parametrize("kind", ["masked_lm", "causal_lm"])
def test_the_worked_example_runs_end_to_end(example, kind, tiny_bert_dir, tiny_gpt2):
    from biasflow.plan import build_plan
    from biasflow.scoring.causal import causal_token_logprobs, encode as causal_encode
    from biasflow.scoring.masked import encode, pseudo_log_likelihoods

    project, data = example
    overrides = [o for o in documented_overrides() if not o.startswith("model=")]
    if kind == "masked_lm":
        model = ["model=local_masked_lm", f"model.path={tiny_bert_dir}", "model.lowercase=true", "model.device=cpu"]
    else:
        model = ["model=gpt2", f"+model.path={tiny_gpt2.source}", "model.device=cpu"]
    plan = build_plan(overrides + model + ["stats.n_boot=50"])
    (job,) = plan.jobs
    agg = pd.read_parquet(run_job_stages(job, project) / "aggregate.parquet").set_index(["metric", "category"])
    # by hand: each sentence's total log-likelihood straight from the scorer, then the share preferring sent_a
    items = pd.read_csv(data)
    from biasflow.models import load_model

    adapter = load_model(job.model)
    texts = [adapter.normalise(t) for t in items.sent_a.tolist() + items.sent_b.tolist()]
    if kind == "masked_lm":
        totals = [np.nansum(x) for x in pseudo_log_likelihoods(adapter, encode(adapter, texts), progress=False)]
    else:
        totals = [np.nansum(x) for x in causal_token_logprobs(adapter, causal_encode(adapter, texts), progress=False)]
    prefers = np.array(totals[:len(items)]) > np.array(totals[len(items):])
    assert agg.value["prefers_a_pct", "overall"] == pytest.approx(100 * prefers.mean())
    for category, group in items.assign(prefers=prefers).groupby("category"):
        assert agg.value["prefers_a_pct", category] == pytest.approx(100 * group.prefers.mean())
        assert agg.n["prefers_a_pct", category] == len(group)
    assert agg[["ci_low", "ci_high"]].notna().all().all()


def test_the_worked_example_rejects_bad_input(example, tmp_path):
    from biasflow.errors import ConfigError, DataFormatError
    from biasflow.plan import build_plan
    from biasflow.registry import get_loader

    broken = tmp_path / "broken.csv"
    broken.write_text("id,category,sent_a\n1,nurse,He is a nurse.\n")
    with pytest.raises(DataFormatError, match=r"broken.csv: missing column\(s\) \['sent_b'\]"):
        get_loader("pronoun_pairs")({"csv": broken}, {})
    broken.write_text("id,category,sent_a,sent_b\n1,nurse,He is a nurse.,\n")
    with pytest.raises(DataFormatError, match="broken.csv, line 2: empty sentence"):
        get_loader("pronoun_pairs")({"csv": broken}, {})
    # the metric's options model is checked at plan time like a built-in metric's
    with pytest.raises(ConfigError, match="metric.pronoun_pairs.first_token"):
        build_plan(documented_overrides() + ["metric.pronoun_pairs.first_token=separate"])


def test_the_worked_example_touches_only_its_own_files_and_its_two_configs():
    """A new benchmark is its loader module, its metric module and its two config files: the page writes nothing
    else (no registry, schema, report or plan file to edit), and the fixture above runs the page with exactly those."""
    assert {b["title"] for b in blocks() if b["title"]} == {
        "conf/benchmark/pronoun_pairs.yaml", "src/biasflow/data/pronoun_pairs.py",
        "src/biasflow/metrics/pronoun_pairs.py", "conf/metric/pronoun_pairs.yaml"}
