"""``python -m biasflow.lmchallenge <subcommand>``: run games and analyse their logs (thin layer over the package)."""
from __future__ import annotations

import argparse
import sys

from biasflow.errors import BiasflowError

from .logs import LogError
from .protocol import ProtocolError
from .text import DEFAULT_WORD_TOKENIZER, WORD_TOKENIZERS


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard expects K/N (e.g. 0/4), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise argparse.ArgumentTypeError(f"--shard {text}: need 0 <= K < N")
    return k, n


def cmd_run(a) -> int:
    from .errors import ErrorModel
    from .games import Reranking
    from .logs import write_log
    from .models import open_model
    from .runner import progress_bar, read_input, run_to_log

    reranking = None
    if a.game == "wr":
        if not a.vocab:
            raise ValueError("the wr game needs --vocab FILE (one word per line)")
        try:
            with open(a.vocab, encoding="utf-8") as fh:
                words = [w.strip() for w in fh if w.strip()]
        except OSError as e:
            raise ValueError(f"--vocab {a.vocab}: {e.strerror}") from None
        reranking = Reranking(words, num_candidates=a.num_candidates, seed=a.seed,
                              error_model=ErrorModel(p_anykey=a.p_anykey))
    messages = read_input(a.input, a.format, a.limit)
    with open_model(a.model, overrides=a.set, training_text=a.training_text, timeout=a.timeout,
                    tokenizer=a.tokenizer) as model:
        data = run_to_log(model, messages, a.game, next_word_only=a.next_word_only, reranking=reranking,
                          train=a.train, shard=a.shard, progress=progress_bar(len(messages), a.game),
                          tokenizer=a.tokenizer)
        n = write_log(data, a.output)
    print(f"{n} tokens -> {a.output or 'stdout'}", file=sys.stderr)
    return 0


def cmd_stats(a) -> int:
    from .logs import read_log
    from .stats import stats, to_csv, to_json
    import itertools

    rows = [{"log": p, **stats(itertools.islice(read_log(p), a.lines), counting=a.count)} for p in (a.logs or ["-"])]
    sys.stdout.write(to_csv(rows) if a.output == "csv" else to_json(rows))
    return 0


def cmd_pretty(a) -> int:
    from .logs import read_log
    from .pretty import render_lines, to_html, to_terminal
    from .stats import stats

    data = list(read_log(a.log))
    lines = render_lines(data)
    if a.html:
        from biasflow.io import write_text

        write_text(to_html(lines, title=f"LM Challenge: {a.log}", summary=stats(data)), a.html)
        print(f"wrote {a.html}", file=sys.stderr)
    else:
        to_terminal(lines, _console(a.color))
    return 0


def cmd_diff(a) -> int:
    from .logs import read_log
    from .pretty import diff, to_html, to_terminal
    from .stats import stats

    log, base = list(read_log(a.log)), list(read_log(a.baseline))
    fp_l, fp_b = stats(log)["fingerprint"], stats(base)["fingerprint"]
    if fp_l != fp_b and not a.force:
        raise ValueError(f"{a.log} and {a.baseline} are over different text (fingerprints {fp_l} != {fp_b}); "
                         "use --force to compare anyway")
    lines, counts = diff(log, base)
    if a.html:
        from biasflow.io import write_text

        write_text(to_html(lines, title=f"LM Challenge diff: {a.log} vs {a.baseline}", summary=counts), a.html)
    else:
        to_terminal(lines, _console(a.color))
    print(" ".join(f"{k}={v}" for k, v in counts.items()), file=sys.stderr)
    return 0


def cmd_grep(a) -> int:
    from .grep import select
    from .logs import read_logs, write_log

    write_log(select(read_logs(a.logs or ["-"]), [a.pattern, *a.and_patterns], keep=a.keep), a.output)
    return 0


def cmd_validate(a) -> int:
    from .logs import validate_file

    for p in a.logs or ["-"]:
        n = validate_file(p)
        print(f"{p}: {n} data OK", file=sys.stderr)
    return 0


def cmd_ngram(a) -> int:
    from .ngram import model_from_args
    from .protocol import serve

    serve(model_from_args(a))
    return 0


def _console(color: str):
    from rich.console import Console

    return Console(force_terminal={"always": True, "never": False}.get(color), no_color=color == "never",
                   highlight=False)


def _wr_defaults():
    """The options of the pipeline's metric ``lmc_wr``, defaults filled (its options model, in
    biasflow.metrics.lmchallenge)."""
    from biasflow.registry import metric_options

    return metric_options("lmc_wr")()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m biasflow.lmchallenge",
                                description="LM Challenge: games that evaluate predictive language models.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a game of a model over test text, writing a log")
    r.add_argument("model", help="a protocol command (as upstream's lmc run), or model=<config>: one of the "
                                 "pipeline's model configs (conf/model/: ngram2, ngram3, char3, lmc_command, "
                                 "Hugging Face models)")
    r.add_argument("--set", action="append", default=[], metavar="model.KEY=VALUE",
                   help="a setting of the model config (repeatable), e.g. --set model.order=4")
    r.add_argument("--training-text", metavar="FILE",
                   help="the text an n-gram or protocol-command model config trains on (lines)")
    r.add_argument("game", choices=["wc", "we", "ce", "wr"])
    r.add_argument("-i", "--input", default="-", help="test text (plain lines or JSON lines); default stdin")
    r.add_argument("-o", "--output", help="log file (written atomically); default stdout")
    r.add_argument("-f", "--format", choices=["auto", "text", "json"], default="auto")
    r.add_argument("-n", "--limit", type=int, help="only the first N lines of the input")
    r.add_argument("-p", "--next-word-only", action="store_true", help="wc: skip prefix completions (faster)")
    r.add_argument("--vocab", help="wr: vocabulary file, one candidate word per line")
    wr = _wr_defaults()  # the same defaults as the pipeline's metric lmc_wr
    r.add_argument("--num-candidates", type=int, default=wr.num_candidates,
                   help=f"wr: candidates per word (default {wr.num_candidates})")
    r.add_argument("--seed", type=int, default=wr.seed, help=f"wr: seed of the error model (default {wr.seed})")
    r.add_argument("--p-anykey", type=float, default=wr.p_anykey,
                   help=f"wr: per-character error probability (default {wr.p_anykey})")
    r.add_argument("-t", "--train", action="store_true", help="train the model on each line after evaluating it")
    r.add_argument("--shard", type=_shard, default=(0, 1), metavar="K/N", help="evaluate shard K of N")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds a process model may take per answer")
    r.add_argument("--tokenizer", choices=list(WORD_TOKENIZERS), default=DEFAULT_WORD_TOKENIZER,
                   help="word tokenizer of wc/we/wr (default lmchallenge = LM Challenge 5.2's; lossless keeps "
                        "every character, e.g. combining marks)")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("stats", help="summary statistics of logs (one row per log)")
    s.add_argument("logs", nargs="*", help="log files (default stdin); several are shown side by side")
    s.add_argument("-o", "--output", choices=["json", "csv"], default="json")
    s.add_argument("-n", "--lines", type=int, help="only the first N data of each log")
    s.add_argument("--count", choices=["consecutive", "distinct"], default="consecutive",
                   help="users/messages: consecutive = a new one whenever the key changes (LM Challenge's; a user "
                        "reappearing after another counts again), distinct = distinct keys (right for "
                        "concatenated shard logs of a multi-user text)")
    s.set_defaults(func=cmd_stats)

    pr = sub.add_parser("pretty", help="show a log token by token (terminal colours or HTML)")
    pr.add_argument("log")
    pr.add_argument("--html", metavar="OUT", help="write a self-contained HTML page instead")
    pr.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    pr.set_defaults(func=cmd_pretty)

    d = sub.add_parser("diff", help="compare a log with a baseline log over the same text")
    d.add_argument("log")
    d.add_argument("baseline")
    d.add_argument("--html", metavar="OUT")
    d.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    d.add_argument("--force", action="store_true", help="compare even when the fingerprints differ")
    d.set_defaults(func=cmd_diff)

    g = sub.add_parser("grep", help="select tokens by pattern (others are marked skipped)",
                       description=__import__("biasflow.lmchallenge.grep", fromlist=["x"]).__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("pattern")
    g.add_argument("logs", nargs="*")
    g.add_argument("-a", "--and", dest="and_patterns", action="append", default=[], help="another pattern to match")
    g.add_argument("-k", "--keep", choices=["all", "message", "token"], default="all")
    g.add_argument("-o", "--output", help="default stdout")
    g.set_defaults(func=cmd_grep)

    v = sub.add_parser("validate", help="check logs against the log JSON Schema")
    v.add_argument("logs", nargs="*")
    v.set_defaults(func=cmd_validate)

    from .ngram import build_parser as ngram_parser

    ng = sub.add_parser("ngram", help="serve the sample n-gram model over the line protocol (stdin/stdout)")
    ngram_parser(ng)
    ng.set_defaults(func=cmd_ngram)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (LogError, ProtocolError, ValueError, BiasflowError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
