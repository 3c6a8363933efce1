"""The docs are true to the code: every name they give exists and every command they show runs (in dry form).

Docs: README.md, docs/*.md, benchmarks/README.md.

* **Names** (inline code and code blocks): ``biasflow.x.y`` imports and its attributes resolve; module-relative
  names (``stages.score``, ``lmchallenge.pipeline``) resolve under ``biasflow``; ``Class.attr`` of a biasflow class
  exists; config keys (``metric.stereoset.split``, ``+model.threads=N``) exist in the config groups of ``conf/``;
  repository paths (``src/...``, ``conf/...``, ``scripts/...``, ``workflow/...``, ``scoring/masked.py``,
  ``resources/cbs/...``) exist; the Python example blocks import and call with keywords the code accepts.
* **Commands** (``bash``/``sh`` blocks, plus inline ``biasflow run``/``snakemake`` commands): ``biasflow run ...``
  is planned in-process (``biasflow plan``: Hydra composition and validation) and dry-run through Snakemake
  (``biasflow run -n``, with Snakemake called in-process instead of in a subprocess, so it costs well under a
  second); ``snakemake ...`` gets ``-n``; ``python -m biasflow...`` commands run for real on tiny inputs in a
  temporary folder. Everything runs in a scratch project (symlinks to the Snakefile, rules, scripts and conf) so
  nothing is written into the checkout. Placeholders are substituted (SUBSTITUTIONS); commands that cannot be
  run by nature are listed with the reason (NOT_RUNNABLE); commands known to fail are strict xfails
  (KNOWN_FAILING) so the fix has to remove them.

A section of a doc that describes a design not built yet sits between ``<!-- planned -->`` and
``<!-- /planned -->`` under a heading that says "Planned"; names and commands inside it are not checked.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import itertools
import json
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from unittest import mock

import pytest

from conftest import ROOT

NAME_DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
             "benchmarks/README.md"]
COMMAND_DOCS = NAME_DOCS
SHELL_LANGS = {"bash", "sh", "shell", "console"}
PLANNED_START, PLANNED_END = "<!-- planned -->", "<!-- /planned -->"
COMMAND_PREFIXES = ("biasflow ", "snakemake", "python -m biasflow")

# Placeholders in documented commands -> what the test runs instead ({tmp} = the scratch project).
SUBSTITUTIONS = {
    "<commit-sha>": "0123456789abcdef0123456789abcdef01234567",  # planning never resolves a revision
    "model.path=/models/my-bert": "model.path={tmp}/my-bert",  # an empty folder: planning does not load it
    "generator.path=responses.csv": "generator.path={tmp}/responses.csv",
    # BBQ's predictions file is checked when planning (a list of records); StereoSet's is read by its metric job
    "bbq.predictions_file=/path/predictions.json": "bbq.predictions_file={tmp}/bbq_predictions.json",
    "predictions_file=/path/predictions.json": "predictions_file={tmp}/predictions.json",
    "model=<a sentence_encoder config>": "model=all_minilm_l6_v2",
    # a file shipped in the checkout, named relative to its root (the scratch project has no src/)
    "generator.path=src/biasflow/resources/examples/": f"generator.path={ROOT}/src/biasflow/resources/examples/",
}

# Commands in the docs that the test does not run, and why.
NOT_RUNNABLE = {
    "biasflow run metric=[pronoun_pairs] benchmark=[pronoun_pairs] model=bert_base_uncased":
        "the worked example's benchmark exists once the reader has added it; tests/test_adding_a_benchmark.py adds "
        "it in a scratch project and plans and runs this command there",
    "biasflow run model=unigram model.path=/path/to/unigram_counts.tsv metric=[crows_pairs_causal]":
        "the worked example's model kind exists once the reader has added it; tests/test_adding_a_model_kind.py adds "
        "it in a scratch project and plans and runs this command there",
    "biasflow run metric=[counterfactual] metric.counterfactual.benchmark=prompts_file +generator=responses_file "
    "generator.path=responses.csv": "needs the reader's own prompts file named in their conf/benchmark/"
    "prompts_file.yaml (the block above it); without it the plan refuses, saying so (tests/test_counterfactual.py), "
    "and tests/test_counterfactual.py runs the benchmark with a file through the stages",
    "biasflow status": "needs a run made in the folder; tests/test_concurrent_runs.py runs it after one",
    "bash scripts/bootstrap.sh run": "installs a virtual environment and runs the whole default pipeline (minutes)",
    "bash scripts/bootstrap.sh test": "installs a virtual environment and runs the whole test suite, this file too",
    "bash scripts/lock.sh": "re-resolves requirements.lock from the package index (its output changes with every "
                            "release upstream); tests/test_lock.py checks the lock it made",
    ".venv/bin/mlflow ui --backend-store-uri sqlite:///results/mlflow.db": "starts a web server that runs until "
                                                                             "stopped",
    ". .venv/bin/activate": "changes the state of the user's shell",
    "pytest -q": "the test suite itself",
    'pytest -q -m "not slow"': "the test suite itself",
    "pytest -q -m fast": "the test suite itself (its fast tier)",
    "python benchmarks/scoring_speed.py --quick": "a benchmark (minutes), not a test",
    "python benchmarks/planning.py --models 10 100 1000": "a benchmark (3 to 15 minutes at 1,000 models, by the load), not a test",
    "python benchmarks/mlflow_scale.py --children 10000 --impl after --keep-store benchmarks/out/mlflow_store":
        "a benchmark (logs 10,000 child runs twice: about an hour on 2 busy cores), not a test",
    "python benchmarks/mlflow_ui_scale.py --store benchmarks/out/mlflow_store/after-10000": "a benchmark (starts "
    "an MLflow server and Chromium on the 10,000-run store the command above keeps; minutes), not a test; "
    "tests/test_mlflow_ui.py checks the same pages at a sweep's size",
    "HF_HUB_OFFLINE=1 python benchmarks/scoring_speed.py --quick": "a benchmark (minutes), not a test",
    "HF_HUB_OFFLINE=1 python benchmarks/scoring_speed.py": "a benchmark (15 minutes), not a test",
    "HF_HUB_OFFLINE=1 python benchmarks/scoring_speed.py --sections base --base-sentences 80 --dtypes "
    "float32,bfloat16": "a benchmark (minutes), not a test",
    "HF_HUB_OFFLINE=1 python benchmarks/weat_seat.py": "a benchmark (minutes), not a test",
    "python benchmarks/pipeline_stages.py --quick": "runs a slice of the pipeline twice (minutes), not a test",
    "python benchmarks/summary.py --quick": "runs the pipeline slice, the bootstrap and the causal benchmarks "
                                            "(minutes), not a test",
    "python benchmarks/summary.py --quick --before f4c7661": "also runs an older commit's pipeline (minutes)",
    "python benchmarks/pipeline_stages.py": "runs the default pipeline twice (20 minutes), not a test",
    "python benchmarks/pipeline_stages.py --quick --project /work/main": "a benchmark of another checkout (minutes)",
    "python benchmarks/bootstrap_speed.py": "a benchmark (minutes), not a test",
    "python benchmarks/paired_tests.py": "a benchmark (minutes), not a test; tests/test_bootstrap.py checks the "
                                         "paired fast path it times",
    "python benchmarks/paired_tests.py --models 3 --quick": "a benchmark (about a minute), not a test",
    "python benchmarks/context_pass.py --sections speed --repeats 2": "a benchmark (minutes), not a test; "
    "tests/test_scoring.py checks that both context passes give the same log-probabilities",
    "python benchmarks/context_pass.py --sections parity": "a benchmark (over an hour on 2 cores), not a test; "
    "tests/test_bbq.py and tests/test_winogender.py check both passes against lm-evaluation-harness",
    "python benchmarks/context_pass.py --limit 60 --speed-examples 10 --lm-eval-examples 4": "a benchmark's smoke "
    "run (half a minute), not a test",
    "python benchmarks/cpu_isa.py scoring -- --quick --sections tiny,base,gpt2": "a benchmark (minutes), not a test",
    "python benchmarks/cpu_isa.py pipeline": "a benchmark (two pipeline runs, ~20 min), not a test",
    "python benchmarks/bootstrap_speed.py --old-reps 1000": "a benchmark (minutes), not a test",
    "python benchmarks/job_overhead.py --before /work/main": "a benchmark of two checkouts (minutes), not a test",
    "vllm serve meta-llama/Llama-3.1-8B --served-model-name llama-3.1-8b --port 8000 --no-enable-prefix-caching":
        "starts a vLLM server (needs vLLM, a GPU and the model's weights); tests/test_served.py starts a local "
        "server that answers as vLLM does",
    "python benchmarks/generation_batch.py": "a benchmark, not a test",
    "python benchmarks/generation_batch.py --shape small --prompts 32 --batch-sizes 1,8,32": "a benchmark, not a test",
    "python benchmarks/served_throughput.py": "a benchmark (starts a server), not a test",
    "python benchmarks/served_throughput.py --server-delay-ms 50 --sentences 200": "a benchmark (starts a server), "
                                                                                  "not a test",
    "python3 -m venv /tmp/mcvenv": "sets up a scratch environment for the optional minicons comparison",
    '/tmp/mcvenv/bin/pip install "transformers<5" wonderwords': "installs packages (pip install)",
    "/tmp/mcvenv/bin/pip install --no-deps minicons": "installs packages (pip install)",
    "echo /work/main/.venv/lib/python3.11/site-packages > \"$(/tmp/mcvenv/bin/python -c 'import site; "
    "print(site.getsitepackages()[0])')/zz_main_venv.pth\"": "changes the scratch environment of the minicons "
                                                             "comparison",
}

# Inline spans that show a command's syntax rather than a command.
SYNOPSES = {
    "biasflow run [-m] [overrides...] [-- snakemake args]",
    "snakemake --config overrides='[...]' multirun=true",
}

# Documented `biasflow run` commands whose Snakemake dry run fails today (each a strict xfail: remove the entry
# with the fix, as the benchmark-list failure of issue 10 item 1 was removed).
KNOWN_FAILURE_OUTPUT: dict[str, str] = {}  # reason -> what the output shows when it fails for that reason
KNOWN_FAILING: dict[str, str] = {}

# Snakemake options that need software the test environment does not have.
NEEDS_PLUGIN = {"workflow/profiles/slurm": "snakemake_executor_plugin_slurm"}

# What a `python -m biasflow...` command reads on stdin when it serves a protocol (as the doc says to type).
STDIN = {"python -m biasflow.lmchallenge ngram --order 3 --train train.txt": "predict\tThe \n"}

# Pipes into programs that are not part of biasflow: only the part before the pipe runs.
EXTERNAL_PIPES = {"snakemake --cores 1 --dag | dot -Tsvg > dag.svg": "Graphviz's dot renders the DAG "
                                                                     "(not a dependency)"}

# Dotted words in the docs that look like config keys but name something else.
NOT_CONFIG_KEYS = {"model.generate": "transformers' generate() method of a causal LM",
                   "metric.pronoun_pairs.first_token=none": "docs/adding_a_benchmark.md's worked example: an option "
                                                            "of a metric the reader adds"}


# ---------------------------------------------------------------------------------------------- markdown parsing
@dataclass(frozen=True)
class Snippet:
    doc: str
    line: int
    text: str
    lang: str | None  # None: inline code; "" an unlabelled block
    block: int = 0  # first line of the code block it belongs to (0: inline)


def _read(doc: str) -> list[str]:
    return (ROOT / doc).read_text(encoding="utf-8").splitlines()


def planned_lines(doc: str) -> set[int]:
    """1-based line numbers inside planned sections (markers included)."""
    inside, out, start = False, set(), 0
    for n, line in enumerate(_read(doc), 1):
        if line.strip() == PLANNED_START:
            assert not inside, f"{doc}:{n}: nested {PLANNED_START}"
            inside, start = True, n
        if inside:
            out.add(n)
        if line.strip() == PLANNED_END:
            assert inside, f"{doc}:{n}: {PLANNED_END} without {PLANNED_START}"
            inside = False
    assert not inside, f"{doc}:{start}: {PLANNED_START} is never closed"
    return out


def snippets(doc: str) -> list[Snippet]:
    """Every code block line and inline code span of a doc, outside planned sections."""
    lines = _read(doc)
    skip = planned_lines(doc)
    out: list[Snippet] = []
    prose = list(lines)
    lang, block = None, 0
    for n, line in enumerate(lines, 1):
        fence = re.match(r'^\s*```(\w*)(?:\s+title="[^"]*")?\s*$', line)  # a block may name its file (title=)
        if fence and lang is None:
            lang, block = fence.group(1), n
            prose[n - 1] = ""
            continue
        if lang is not None:
            if line.strip() == "```":
                lang = None
            elif n not in skip:
                out.append(Snippet(doc, n, line, lang, block))
            prose[n - 1] = ""
    text = "\n".join(prose)
    starts = [0, *itertools.accumulate(len(x) + 1 for x in prose)]
    for m in re.finditer(r"``?([^`]+?)``?", text):
        if "\n\n" in m.group(1):
            continue
        n = next(i for i, s in enumerate(starts) if s > m.start())  # 1-based line of the span
        if n not in skip:
            out.append(Snippet(doc, n, re.sub(r"\s*\n\s*", " ", m.group(1)).strip(), None))
    return out


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    text: str  # as documented, comment removed, continuations joined

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _strip_comment(line: str) -> str:
    return re.sub(r"(^|\s+)#(\s.*)?$", "", line).strip()


def documented_commands() -> list[DocCommand]:
    cmds: list[DocCommand] = []
    for doc in COMMAND_DOCS:
        pending, first = "", 0
        for s in snippets(doc):
            if s.lang is None:
                if s.text.startswith(("biasflow run ", "biasflow plan ", "snakemake ", "python -m biasflow")):
                    cmds.append(DocCommand(doc, s.line, s.text))
                continue
            if s.lang not in SHELL_LANGS:
                continue
            line = s.text.strip()
            alt = re.match(r"#\s*or:\s*(.+)$", line)  # "# or: snakemake ..." shows an equivalent command
            if alt:
                line = alt.group(1)
            elif line.startswith("#"):
                continue
            if not pending:
                first = s.line
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            text = _strip_comment(pending + line)
            pending = ""
            if text:
                cmds.append(DocCommand(doc, first, re.sub(r"\s+", " ", text)))
    return cmds


COMMANDS = documented_commands()


def _kind(cmd: DocCommand) -> str:
    if cmd.text in NOT_RUNNABLE or cmd.text in SYNOPSES:
        return "skip"
    if cmd.text.startswith("biasflow run "):
        return "run"
    if cmd.text.startswith("biasflow plan "):
        return "plan"
    if cmd.text.startswith("snakemake"):
        return "snakemake"
    if cmd.text.startswith("python -m biasflow"):
        return "python"
    return "unknown"


def _commands(*kinds: str) -> list[DocCommand]:
    return [c for c in COMMANDS if _kind(c) in kinds]


def _params(cmds: list[DocCommand], xfail: dict[str, str] | None = None):
    out = []
    for c in cmds:
        marks = ([pytest.mark.xfail(strict=True, raises=AssertionError, reason=xfail[c.text])]
                 if xfail and c.text in xfail else [])
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


# ----------------------------------------------------------------------------------------- the scratch project
@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder that shares the checkout's workflow and conf but writes its own results/ and .snakemake/."""
    tmp = tmp_path_factory.mktemp("docs_project")
    for name in ("Snakefile", "workflow", "scripts", "conf"):
        (tmp / name).symlink_to(ROOT / name)
    (tmp / "my-bert").mkdir()
    (tmp / "responses.csv").write_text("prompt,response\nWrite a letter.,Dear reader.\n")
    (tmp / "predictions.json").write_text(json.dumps({"intrasentence": [], "intersentence": []}))
    (tmp / "bbq_predictions.json").write_text(json.dumps([{"example_id": 0, "category": "Age", "answer": 2}]))
    return tmp


@pytest.fixture
def in_project(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.setenv("BIASFLOW_ROOT", str(project))
    monkeypatch.delenv("BIASFLOW_CONF", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return project


def substituted(text: str, tmp: Path) -> list[str]:
    for placeholder, value in SUBSTITUTIONS.items():
        text = text.replace(placeholder, value.format(tmp=tmp))
    return shlex.split(text)


def snakemake_in_process(args: list[str]) -> tuple[int, str]:
    """``python -m snakemake ARGS`` without a new interpreter (imports are the expensive part of a dry run)."""
    from snakemake.cli import main as snakemake_main

    out = io.StringIO()
    code = 0
    # the Snakefile sets OMP_WAIT_POLICY for its stage scripts: keep it out of this process's environment
    with mock.patch.dict(os.environ), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            snakemake_main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue()


def _missing_plugin(argv: list[str]) -> str | None:
    for needle, module in NEEDS_PLUGIN.items():
        if needle in argv and importlib.util.find_spec(module) is None:
            return module
    return None


# -------------------------------------------------------------------------------------------- command tests
def test_every_documented_command_is_tested_or_listed():
    unknown = [f"{c.id}: {c.text}" for c in COMMANDS if _kind(c) == "unknown"]
    assert not unknown, ("commands in the docs that this test neither runs nor lists in NOT_RUNNABLE (with the "
                         "reason):\n" + "\n".join(unknown))
    texts = {c.text for c in COMMANDS}
    all_text = "\n".join((ROOT / d).read_text(encoding="utf-8") for d in COMMAND_DOCS)
    stale = [k for k in [*NOT_RUNNABLE, *SYNOPSES, *KNOWN_FAILING, *STDIN, *EXTERNAL_PIPES] if k not in texts]
    stale += [k for k in SUBSTITUTIONS if k not in all_text]
    assert not stale, f"entries for commands or placeholders no doc has any more: {stale}"
    assert len(_commands("run", "plan")) >= 20 and _commands("snakemake") and _commands("python")


def test_command_blocks_are_labelled():
    """A command in an unlabelled block would escape this test: shell blocks say bash or sh."""
    hidden = [f"{s.doc}:{s.line}: {s.text}" for d in COMMAND_DOCS for s in snippets(d)
              if s.lang == "" and s.text.lstrip("# ").startswith(COMMAND_PREFIXES)]
    assert not hidden, "label these code blocks ```bash:\n" + "\n".join(hidden)


@pytest.mark.parametrize("cmd", _params(_commands("run", "plan")))
def test_biasflow_command_plans(cmd, in_project, capsys):
    from biasflow.cli import main

    args = substituted(cmd.text, in_project)[2:]  # after `biasflow run|plan`
    if "--" in args:
        args = args[:args.index("--")]  # Snakemake's own options
    rc = main(["plan", *[a for a in args if a not in ("-n", "--dry-run")]])
    captured = capsys.readouterr()
    assert rc == 0, f"{cmd.id}: `{cmd.text}` does not plan:\n{captured.err}{captured.out[-2000:]}"
    assert "metric job(s)" in captured.out


def dry_run_subset() -> list[DocCommand]:
    """The `biasflow run` commands that also get a Snakemake dry run (all of them plan): the first of every code
    block and every inline one, plus each that gives its own benchmark=[...] list (the class of the known bug)."""
    firsts, seen = [], set()
    for c in _commands("run"):
        block = next((s.block for s in snippets(c.doc) if s.line == c.line and s.lang is not None), -c.line)
        if (c.doc, block) not in seen or re.search(r"(^| )benchmark=", c.text):
            firsts.append(c)
        seen.add((c.doc, block))
    return firsts


@pytest.mark.parametrize("cmd", _params(dry_run_subset(), KNOWN_FAILING))
def test_biasflow_run_dry_runs_in_snakemake(cmd, in_project, monkeypatch, capsys):
    import biasflow.cli
    import biasflow.runner

    args = substituted(cmd.text, in_project)[2:]  # after `biasflow run`
    plugin = _missing_plugin(args)
    if plugin:
        pytest.skip(f"needs the Snakemake plugin {plugin}")
    outputs = []

    def call(command, cwd=None, env=None):
        assert command[1:3] == ["-m", "snakemake"] and Path(cwd) == in_project
        code, out = snakemake_in_process(command[3:])
        outputs.append(out)
        return code, False

    monkeypatch.setattr(biasflow.runner, "run_snakemake", call)
    rc = biasflow.cli.main(["run", "-n", "--cores", "1", *args])
    captured = capsys.readouterr()
    known = KNOWN_FAILURE_OUTPUT.get(KNOWN_FAILING.get(cmd.text, ""))
    if rc != 0 and known and known not in "".join(outputs):  # an xfail must fail for its stated reason
        pytest.fail(f"{cmd.id}: fails, but not with {known}:\n{''.join(outputs)[-3000:]}")
    assert rc == 0, f"{cmd.id}: `{cmd.text}` fails its dry run:\n{captured.err}\n{''.join(outputs)[-3000:]}"
    assert outputs and "This was a dry-run" in outputs[-1]


@pytest.mark.parametrize("cmd", _params(_commands("snakemake")))
def test_snakemake_command_dry_runs(cmd, in_project):
    text = cmd.text.split(" | ")[0] if cmd.text in EXTERNAL_PIPES else cmd.text
    argv = substituted(text, in_project)[1:]
    if "--dag" not in argv:
        argv.append("--dry-run")
    code, out = snakemake_in_process(argv)
    assert code == 0, f"{cmd.id}: `{cmd.text}` fails its dry run:\n{out[-3000:]}"
    assert ("digraph" in out) if "--dag" in argv else ("This was a dry-run" in out or "Nothing to be done" in out)


def _write_lmchallenge_inputs(folder: Path) -> None:
    lines = ["The cat sat on the mat.", "The dog sat on the log.", "A cat and a dog met on the mat.",
             "The mat was red and the log was brown.", "She said: the cat likes the dog."]
    (folder / "train.txt").write_text("\n".join(lines * 4) + "\n")
    (folder / "test.txt").write_text("The cat sat on the log.\nA dog and a cat sat.\n")
    words = sorted({w.strip(".:,").lower() for ln in lines for w in ln.split()} | {"The", "A", "She"})
    (folder / "words.txt").write_text("\n".join(words) + "\n")


def _write_stereoset_inputs(folder: Path) -> None:
    def example(ex_id, context, sentences):
        return {"id": ex_id, "target": "chess player", "bias_type": "profession", "context": context,
                "sentences": [{"id": f"{ex_id}-{lab}", "sentence": s, "gold_label": lab, "labels": []}
                              for lab, s in sentences]}

    intra = example("a1", "The chess player was BLANK.",
                    [("stereotype", "The chess player was asian."), ("anti-stereotype", "The chess player was "
                     "hispanic."), ("unrelated", "The chess player was fox.")])
    inter = example("b1", "The chess player sat down.",
                    [("stereotype", "He was nerdy."), ("anti-stereotype", "He was a jock."),
                     ("unrelated", "Cats purr.")])
    (folder / "dev.json").write_text(json.dumps({"version": "1.0", "data": {"intrasentence": [intra],
                                                                               "intersentence": [inter]}}))
    scores = {"a1-stereotype": 0.5, "a1-anti-stereotype": 0.2, "a1-unrelated": 0.1,
              "b1-stereotype": 0.3, "b1-anti-stereotype": 0.4, "b1-unrelated": 0.01}
    (folder / "predictions.json").write_text(json.dumps({
        task: [{"id": k, "score": v} for k, v in scores.items() if k.startswith(prefix)]
        for task, prefix in (("intrasentence", "a1"), ("intersentence", "b1"))}))


# Tiny inputs for the `python -m biasflow...` commands of each doc (the file names the doc uses).
PYTHON_INPUTS = {"docs/lmchallenge.md": _write_lmchallenge_inputs, "docs/stereoset.md": _write_stereoset_inputs}


@pytest.mark.parametrize("doc", sorted({c.doc for c in _commands("python")}))
def test_python_module_commands_run(doc, tmp_path):
    """Each doc's `python -m biasflow...` commands, in the doc's order, on tiny inputs (later ones read the logs
    earlier ones write), through a shell as a user would type them."""
    assert doc in PYTHON_INPUTS, f"{doc}: add tiny inputs for its python -m commands to PYTHON_INPUTS"
    PYTHON_INPUTS[doc](tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1")
    for cmd in [c for c in _commands("python") if c.doc == doc]:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd.text], cwd=tmp_path, env=env, text=True,
                              input=STDIN.get(cmd.text, ""), capture_output=True, timeout=120)
        assert proc.returncode == 0, f"{cmd.id}: `{cmd.text}` failed:\n{proc.stderr[-3000:]}"
        assert (proc.stdout + proc.stderr).strip() or re.search(r"(-o|--output|--html) \S+", cmd.text), \
            f"{cmd.id}: `{cmd.text}` printed nothing"


# ------------------------------------------------------------------------------------------------- name tests
def _biasflow_modules() -> dict[str, object]:
    import biasflow

    mods = {"biasflow": biasflow}
    for info in pkgutil.walk_packages(biasflow.__path__, "biasflow."):
        if info.name.endswith("__main__"):
            continue
        mods[info.name] = importlib.import_module(info.name)
    return mods


def resolve_python(dotted: str) -> bool:
    """``biasflow.a.b.c``: the longest importable module prefix, then attributes (dataclass fields count)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif is_dataclass(obj) and attr in {f.name for f in fields(obj)}:
                obj = None
            else:
                return False
        return True
    return False


def _deep_union(a: dict, b: dict) -> dict:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _deep_union(a[k], v)
        else:
            a.setdefault(k, v)
    return a


@pytest.fixture(scope="module")
def config_tree():
    """Every key a config can have: all metrics and benchmarks composed, plus every file of the other groups."""
    import yaml

    from biasflow.plan import compose

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASFLOW_CONF", str(ROOT / "conf"))
        metrics = sorted(p.stem for p in (ROOT / "conf" / "metric").glob("*.yaml"))
        tree = compose([f"metric=[{','.join(metrics)}]"])
    for group in ("model", "generator", "tracking"):
        for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
            tree[group] = _deep_union(tree.get(group) or {}, yaml.safe_load(path.read_text()) or {})
    from biasflow.model_kinds import KINDS

    for spec in KINDS.values():  # a model kind's options need no + (composition validates them by the kind's model)
        if spec.config is not None:
            tree["model"] = _deep_union(tree.get("model") or {}, {name: None for name in spec.config.model_fields})
    tree.setdefault("generator", {})
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        _deep_union(tree, {"experiment": (yaml.safe_load(path.read_text()) or {}).get("experiment", {})})
    return tree


def has_key(tree, parts: list[str]) -> bool:
    if not parts:
        return True
    if not isinstance(tree, dict):
        return False
    head, rest = parts[0], parts[1:]
    if head.startswith("<") and head.endswith(">"):  # a placeholder: any key, or one of <a|b>
        options = head[1:-1].split("|")
        keys = [k for k in tree if k in options] if len(options) > 1 else list(tree)
        return bool(keys) and all(has_key(tree[k], rest) for k in keys)
    return head in tree and has_key(tree[head], rest)


CONFIG_ROOTS = ("model", "benchmark", "metric", "tracking", "generator", "experiment", "run", "paths", "stats")
PACKAGE_DIRS = ("data", "models", "scoring", "metrics", "stats", "report", "tracking", "lmchallenge", "generation")
ROOT_DIRS = ("src", "conf", "scripts", "workflow", "tests", "benchmarks", "docs", ".ci")
RUNTIME_PATHS = ("results/", "benchmarks/out/", ".venv/", "resources/datasets", "resources/models",
                 "resources/wheels", "resources/lmchallenge")


def _expand_braces(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in _expand_braces(path[:m.start()] + alt + path[m.end():])]


def _exists(base: Path, path: str) -> bool:
    pattern = re.sub(r"<[^>]*>", "*", path).rstrip("/")
    if any(ch in pattern for ch in "*?["):
        return any(base.glob(pattern))
    return (base / pattern).exists()


def check_path(token: str) -> str | None:
    """An error for a repository path that does not exist, else None (also for paths this check does not own)."""
    if token.startswith(RUNTIME_PATHS) or "://" in token or token.startswith(("/", "~", "..", "$", "<")):
        return None
    if "::" in token:  # a pytest node id: the file, and the name defined in it
        path, name = token.split("::", 1)
        error = check_path(path)
        source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else ""
        if error or re.search(rf"^\s*(class|def) {re.escape(name.split('::')[-1])}\b", source, re.M):
            return error
        return f"{path} defines no {name}"
    first = token.split("/", 1)[0]
    if first in ROOT_DIRS or token in ("Snakefile", "environment.yml", "pyproject.toml"):
        bases = [ROOT]
    elif first in PACKAGE_DIRS and (token.endswith((".py", "/")) or "." not in token.rsplit("/", 1)[-1]):
        bases = [ROOT / "src" / "biasflow"]  # package-relative (`scoring/masked.py`); other repos' data files differ
    elif first == "resources" and token.split("/")[1:2] and (ROOT / "src/biasflow/resources" /
                                                             token.split("/")[1]).is_dir():
        bases = [ROOT / "src" / "biasflow"]
    else:
        return None
    missing = [p for p in _expand_braces(token) if not any(_exists(b, p) for b in bases)]
    return f"path {', '.join(missing)} does not exist" if missing else None


def _biasflow_classes() -> dict[str, type]:
    classes: dict[str, type] = {}
    for mod in _biasflow_modules().values():
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and getattr(obj, "__module__", "").startswith("biasflow"):
                classes.setdefault(name, obj)
    return classes


def check_token(token: str, tree: dict, classes: dict[str, type], top: set[str]) -> str | None:
    token = token.strip(".,;:'\"()").removesuffix("()")
    token = re.sub(r"\(.*\)$", "", token)  # `fetch_verified(sources, ...)` -> the name
    if not token or token in NOT_CONFIG_KEYS:
        return None
    if re.fullmatch(r"biasflow(\.\w+)+", token):
        return None if resolve_python(token) else f"{token} does not import or resolve"
    m = re.fullmatch(r"(\+?)([a-z_]+(?:\.(?:[\w-]+|<[^>]+>))+)(=.*)?", token)
    if m and not re.search(r"\.(py|yaml|yml|md|json|jsonl|txt|csv|tsv|parquet|db|png|log|html|svg|sh)$",
                           m.group(2)):
        plus, key, value = m.groups()
        first = key.split(".")[0]
        python_name = not value and not plus and "<" not in key and first in top
        if python_name and resolve_python(f"biasflow.{key}"):
            return None
        if first in CONFIG_ROOTS:
            parts = key.split(".")
            if has_key(tree, parts[:-1] if plus else parts):
                return None
            return (f"neither biasflow.{key} nor config key {key} exists" if python_name else
                    f"config key {key} does not exist" + ("" if plus else " (a key no config file has needs +)"))
        return f"biasflow.{key} does not import or resolve" if python_name else None
    m = re.fullmatch(r"([A-Z]\w*)\.(\w+)", token)
    if m and m.group(1) in classes:
        return None if resolve_python(f"{classes[m.group(1)].__module__}.{token}") else f"{token} does not exist"
    if "/" in token:
        return check_path(token)
    return None


def check_python_block(code: str) -> list[str]:
    """Imports of biasflow names resolve and calls of them bind (keywords included)."""
    errors, names = [], {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("biasflow"):
            for alias in node.names:
                if not resolve_python(f"{node.module}.{alias.name}"):
                    errors.append(f"{node.module}.{alias.name} does not exist")
                else:
                    names[alias.asname or alias.name] = getattr(importlib.import_module(node.module), alias.name)
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            try:
                signature = inspect.signature(names[node.func.id])
            except ValueError:  # a builtin's subclass without one (an exception class): nothing to bind
                continue
            try:
                signature.bind(*node.args, **{k.arg: None for k in node.keywords})
            except TypeError as exc:
                errors.append(f"{node.func.id}(...) does not match its signature: {exc}")
    return errors


def test_names_in_the_docs_exist(config_tree):
    classes = _biasflow_classes()
    top = {info.name for info in pkgutil.iter_modules(importlib.import_module("biasflow").__path__)}
    errors = []
    for doc in NAME_DOCS:
        found = snippets(doc)
        for block in sorted({s.block for s in found if s.lang == "python"}):
            code = "\n".join(s.text for s in found if s.block == block)
            errors += [f"{doc}:{block}: {e}" for e in check_python_block(code)]
        for s in found:
            if s.lang == "python":
                continue
            text = _strip_comment(s.text) if s.lang in SHELL_LANGS else s.text
            for token in re.findall(r"(?:\{[^}\s]*\}|[^\s,])+", text):
                err = check_token(token, config_tree, classes, top)
                if err:
                    errors.append(f"{doc}:{s.line}: {err}  (in `{s.text.strip()[:100]}`)")
    assert not errors, "the docs name things that do not exist:\n" + "\n".join(dict.fromkeys(errors))


def test_planned_sections_are_marked_as_planned():
    for doc in NAME_DOCS:
        lines = _read(doc)
        for n in sorted(planned_lines(doc)):
            if lines[n - 1].strip() == PLANNED_START:
                heading = next((ln for ln in lines[n:] if ln.strip()), "")
                assert heading.startswith("#") and "planned" in heading.lower(), \
                    f"{doc}:{n}: a planned section starts with a heading that says 'Planned'"


@pytest.mark.parametrize("token, exists", [
    ("scoring/answers.py", False), ("scoring/cache.py", True), ("data/<dataset>.py", True),
    ("biasflow.metrics.registry", False), ("biasflow.registry.register_metric", True),
    ("MetricSpec.answers", False), ("MetricSpec.score_keys", True), ("MetricSpec.name", True),
    ("stats.bootstrap_ci", False), ("stats.bootstrap.bootstrap_ci", True), ("stats.n_boot", True),
    ("model.threads", True), ("model.no_such_option", False), ("+model.threads=1", True),
    ("metric.stereoset.no_such_option=1", False),
    ("metric.<weat|seat>.bias_types", True), ("benchmark.crows_pairs.limit=100", True),
    ("conf/experiment/*.yaml", True), ("conf/experiment/no_such_*.yaml", False),
    ("src/biasflow/resources/{lpbs,cbs}/README.md", True), ("src/biasflow/resources/{lpbs,nope}/README.md", False),
    ("tests/test_docs.py::test_names_in_the_docs_exist", True), ("tests/test_docs.py::no_such_test", False),
])
def test_the_name_check_tells_drift_from_truth(token, exists, config_tree):
    classes = _biasflow_classes()
    top = {info.name for info in pkgutil.iter_modules(importlib.import_module("biasflow").__path__)}
    assert (check_token(token, config_tree, classes, top) is None) == exists
