"""docs/adding_a_model_kind.md, run: its code blocks become an adapter module, a declaration and a model config in a
scratch project, and its documented command plans and runs CrowS-Pairs through the real stages with the unigram
model, the numbers checked by hand."""
from __future__ import annotations

import math
import re
import shlex
import sys
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, project_copy, run_job_stages

DOC = ROOT / "docs" / "adding_a_model_kind.md"
BLOCK = re.compile(r'```(?P<lang>\w+)(?: title="(?P<title>[^"]+)")?\n(?P<body>.*?)```', re.S)
WORD = re.compile(r"\w+|[^\w\s]")
LIMIT = 40


def blocks() -> list[dict]:
    return [m.groupdict() for m in BLOCK.finditer(DOC.read_text())]


def titled(title: str) -> str:
    found = [b["body"] for b in blocks() if b["title"] == title]
    assert len(found) == 1, f"{DOC.name} has no single block titled {title}"
    return found[0]


def documented_overrides(table: Path) -> list[str]:
    commands = [line for b in blocks() if b["lang"] == "bash" for line in b["body"].splitlines()
                if line.startswith("biasflow run")]
    assert len(commands) == 1
    return [o.replace("/path/to/unigram_counts.tsv", str(table)) for o in shlex.split(commands[0])[2:]]


@pytest.fixture
def example(tmp_path, monkeypatch, crows_csv, restore_registries):
    """The page's files in a scratch project with the CrowS-Pairs file in place; the declaration module imported as
    biasflow.kinds.unigram (the registry finds it there) and its kind gone after the test; a counts table from the
    first pairs' less stereotyped sentences."""
    project = project_copy(tmp_path / "project", datasets={f"crows_pairs/{crows_csv.name}": crows_csv})
    (project / "conf" / "model" / "unigram.yaml").write_text(titled("conf/model/unigram.yaml"))
    module = types.ModuleType("biasflow.models.unigram")
    module.__file__ = str(tmp_path / "unigram.py")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(titled("src/biasflow/models/unigram.py"), module.__file__, "exec"), module.__dict__)
    declaration = types.ModuleType("biasflow.kinds.unigram")
    declaration.__file__ = str(tmp_path / "kinds_unigram.py")
    monkeypatch.setitem(sys.modules, declaration.__name__, declaration)
    exec(compile(titled("src/biasflow/kinds/unigram.py"), declaration.__file__, "exec"), declaration.__dict__)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    monkeypatch.chdir(project)
    source = pd.read_csv(crows_csv).head(LIMIT)
    counts = Counter(w for text in source.sent_less for w in WORD.findall(text.lower()))
    table = tmp_path / "unigram_counts.tsv"
    table.write_text("".join(f"{word}\t{n}\n" for word, n in sorted(counts.items())))
    return project, table, counts


def test_the_worked_example_runs_crows_pairs_end_to_end(example):
    from biasflow.plan import build_plan
    from biasflow.scheduling import score_resources

    project, table, counts = example
    plan = build_plan(documented_overrides(table) + [f"benchmark.crows_pairs.limit={LIMIT}", "stats.n_boot=50"])
    (job,) = plan.jobs
    assert (job.metric, job.model["kind"]) == ("crows_pairs_causal", "unigram")
    # the declared scheduling defaults: no GPU even on a CUDA device
    assert score_resources(dict(job.model, device="cuda")) == {"mem_mb": 1000, "gpus": 0, "cpus": 1,
                                                               "runtime_min": 30}
    out = run_job_stages(job, project)
    items = pd.read_parquet(job.items_path)
    assert len(items) == LIMIT

    # by hand: add-one smoothed unigram log-probabilities of the lowercased words, summed per sentence
    total, vocabulary = sum(counts.values()), len(counts)

    def loglik(text: str) -> float:
        return sum(math.log((counts[w] + 1) / (total + vocabulary + 1)) for w in WORD.findall(text.lower()))

    more = np.array([loglik(t) for t in items.sent_more])
    less = np.array([loglik(t) for t in items.sent_less])
    per_item = pd.read_parquet(out / "per_item.parquet").set_index("item_id").loc[items.item_id]
    np.testing.assert_allclose(per_item.score_more, more, rtol=1e-12)
    np.testing.assert_allclose(per_item.score_less, less, rtol=1e-12)
    agg = pd.read_parquet(out / "aggregate.parquet").set_index(["metric", "category"])
    stereo = more > less  # a tie counts in N as neither
    assert agg.value["metric_score", "overall"] == pytest.approx(100 * stereo.mean())
    assert agg.n["metric_score", "overall"] == LIMIT
    for category, group in items.assign(stereo=stereo).groupby("category"):
        assert agg.value["metric_score", category] == pytest.approx(100 * group.stereo.mean())
        assert agg.n["metric_score", category] == len(group)
    assert agg.loc["metric_score", ["ci_low", "ci_high"]].notna().all().all()
    # the answers are cached under the unigram model's fingerprint, which follows the table's content
    from biasflow.models import load_model

    fingerprint = load_model(job.model).fingerprint
    cached = project / "results" / "cache" / "scores" / fingerprint / "token_logprobs"
    assert cached.is_dir() and any(cached.glob("part-*.parquet"))
    table.write_text(table.read_text() + "nurse\t5\n")
    assert load_model(job.model).fingerprint != fingerprint


def test_the_worked_example_tells_what_is_wrong(example, tmp_path):
    from biasflow.errors import ConfigError, ModelLoadError
    from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind
    from biasflow.models import load_model
    from biasflow.plan import build_plan

    project, table, _ = example
    broken = tmp_path / "broken.tsv"
    broken.write_text("nurse\t3\nengineer 4\n")
    with pytest.raises(ModelLoadError, match=r"broken.tsv, line 2: expected word<TAB>count, got 'engineer 4'"):
        load_model({"name": "unigram", "kind": "unigram", "path": str(broken)})
    # like causal_lm: a metric written for masked LMs skips it, saying why
    with pytest.raises(ConfigError, match=r"metric crows_pairs skipped for model unigram: it needs a model of kind "
                                          r"\['masked_lm'\], got 'unigram'"):
        build_plan(["model=unigram", f"model.path={table}", "metric=[crows_pairs]"])
    # a second declaration of the name from another module
    with pytest.raises(ValueError, match="model kind 'unigram' is registered twice: by biasflow.kinds.unigram and by "
                                         "my_project.kinds"):
        register_model_kind(ModelKindSpec(name="unigram", factory="my_project.kinds:Unigram", answers={},
                                          resources=Resources(mem_mb=1, cpus=1, runtime_min=1, gpu_capable=False)),
                            module="my_project.kinds")


def test_the_worked_example_touches_only_its_own_files_and_its_model_config():
    """A new model kind is its adapter module, its declaration module and its model config: the page writes nothing
    else (no registry, schema, fingerprint or scheduler file to edit), and the fixture above runs it with exactly
    those."""
    assert {b["title"] for b in blocks() if b["title"]} == {
        "src/biasflow/models/unigram.py", "src/biasflow/kinds/unigram.py", "conf/model/unigram.yaml"}
