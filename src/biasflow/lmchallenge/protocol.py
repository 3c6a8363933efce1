"""The LM Challenge model API and its line protocol.

A model answers three commands (UTF-8, one per line, fields separated by TAB):

* ``predict<TAB>context[<TAB>candidate...]`` -> ONE line ``continuation<TAB>score<TAB>continuation<TAB>score...``
  (an empty line when it has nothing to say). Continuations follow the context's characters
  (context "I like bi" -> "rds"); bigger scores rank first. With candidates, the model scores those
  (it may omit candidates it cannot score).
* ``train<TAB>line`` and ``clear`` -> no answer at all.

``Model`` is the Python side of the same API; ``serve`` runs any ``Model`` as a protocol process.
"""
from __future__ import annotations

import abc
import math
import sys
from typing import IO, Iterable, Sequence

Prediction = tuple[str, float]


class ProtocolError(RuntimeError):
    """A model broke the protocol (garbage answer, crash, hang); the message names the request."""


class Model(abc.ABC):
    """Base class of every model: a protocol process, an n-gram model or a wrapped HF model."""

    @abc.abstractmethod
    def predict(self, context: str, candidates: Sequence[str] | None = None) -> list[Prediction]:
        """Scored continuations of ``context`` (of ``candidates`` when given)."""

    def train(self, line: str) -> None:  # adaptive models learn from a line after it was evaluated
        pass

    def clear(self) -> None:  # forget everything learnt through train()
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_field(value: str, what: str) -> str:
    if "\t" in value or "\n" in value or "\r" in value:
        raise ValueError(f"{what} {value!r} contains a TAB or newline, which the line protocol cannot carry")
    return value


def format_predict(context: str, candidates: Iterable[str] | None = None) -> str:
    fields = ["predict", _check_field(context, "context")]
    if candidates is not None:
        fields += [_check_field(c, "candidate") for c in candidates]
    return "\t".join(fields) + "\n"


def format_train(line: str) -> str:
    return "train\t" + _check_field(line, "training line") + "\n"


def format_response(predictions: Iterable[Prediction]) -> str:
    fields: list[str] = []
    for text, score in predictions:
        fields += [_check_field(text, "prediction"), repr(float(score))]
    return "\t".join(fields) + "\n"


def parse_response(line: str) -> list[Prediction]:
    """Parse one answer line into (continuation, score) pairs; raise ValueError saying what is wrong."""
    line = line.rstrip("\r\n")
    if not line:
        return []
    fields = line.split("\t")
    if len(fields) % 2:
        raise ValueError(f"odd number of TAB-separated fields ({len(fields)}); expected continuation/score pairs")
    out = []
    for i in range(0, len(fields), 2):
        try:
            score = float(fields[i + 1])
        except ValueError:
            raise ValueError(f"score {fields[i + 1]!r} of continuation {fields[i]!r} is not a number") from None
        if math.isnan(score) or score == math.inf:  # scores are log-probabilities: -inf (impossible) is the limit
            raise ValueError(f"score {fields[i + 1]!r} of continuation {fields[i]!r} is not a log-probability "
                             f"(NaN or +inf)")
        out.append((fields[i], score))
    return out


def parse_request(line: str) -> tuple[str, list[str]]:
    line = line.rstrip("\r\n")
    command, *args = line.split("\t")
    return command, args


def serve(model: Model, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
    """Answer protocol requests from ``stdin`` until EOF (the ``ngram`` subcommand runs this)."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    for line in stdin:
        command, args = parse_request(line)
        if command == "predict":
            if not args:
                raise ProtocolError(f"predict request without a context: {line!r}")
            context, candidates = args[0], (args[1:] if len(args) > 1 else None)
            stdout.write(format_response(model.predict(context, candidates)))
            stdout.flush()  # the caller waits for this line; never leave it in a buffer
        elif command == "train":
            model.train(args[0] if args else "")
        elif command == "clear":
            model.clear()
        elif command == "":
            continue
        else:
            raise ProtocolError(f"unknown command {command!r} in request {line!r}")
