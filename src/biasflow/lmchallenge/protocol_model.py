"""LM Challenge protocol models (kinds ``ngram`` and ``lmc_process``): programs that answer the line protocol.

The adapter is cheap to build (config only): a model is started when a game line needs answering, trained on the
training text that line's request carries (``ngram``: biasflow's sample n-gram model, trained once per process and
training text and saved for the shard processes; ``lmc_process``: ``model.command`` with ``{train}`` = the training
text file and ``{python}`` = this interpreter). Config keys beyond the model's own: ``shards`` (protocol processes
playing in parallel, each a share of the lines; 1) and ``timeout_s`` (seconds per answer; 120). Answers:
``biasflow.lmchallenge.pipeline.answer_lmc_line``.
"""
from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from biasflow.errors import ConfigError
from biasflow.io import stable_hash
from biasflow.models.fingerprint import config_fingerprint
from biasflow.schema import ModelOptions, model_options


class ProtocolModel:
    def __init__(self, cfg: Mapping[str, Any] | ModelOptions):
        opts = self.opts = model_options(cfg)
        self.cfg = opts.written()  # as written: what the fingerprint hashes
        self.kind = opts.kind
        self.name = opts.name or self.kind
        if self.kind == "lmc_process" and not opts.command:
            raise ConfigError(f"model {self.name!r} (kind lmc_process) needs model.command")
        self.shards = int(opts.shards or 1)
        self.timeout = float(opts.timeout_s)
        self.fingerprint = stable_hash({"config": config_fingerprint(self.cfg), "adapter": "lmc-protocol"}, 24)
        self._folder: Path | None = None
        self._commands: dict[str, str] = {}

    def _work_folder(self) -> Path:
        if self._folder is None:  # training files and saved models of this process, removed with the adapter
            self._folder = Path(tempfile.mkdtemp(prefix="biasflow-lmc-"))
            weakref.finalize(self, shutil.rmtree, self._folder, True)
        return self._folder

    def command(self, train_lines: Sequence[str], digest: str) -> str:
        """The command serving this model trained on ``train_lines`` (sha256 ``digest``)."""
        if digest not in self._commands:
            from biasflow.lmchallenge.pipeline import trained_ngram, training_file

            python = shlex.quote(sys.executable)
            if self.kind == "ngram":
                saved = trained_ngram(self.cfg, train_lines, self._work_folder())
                self._commands[digest] = (f"{python} -m biasflow.lmchallenge.ngram --load {shlex.quote(str(saved))} "
                                          f"--predictions {int(self.opts.predictions or 20)}")
            else:
                train = shlex.quote(str(training_file(train_lines, self._work_folder())))
                self._commands[digest] = self.opts.command.replace("{train}", train).replace("{python}", python)
        return self._commands[digest]

    def provenance(self) -> dict[str, str]:
        from biasflow.secrets import redact_text

        out = {"model.kind": self.kind, "model.fingerprint": self.fingerprint}
        if self.kind == "lmc_process":
            out["model.command"] = redact_text(str(self.opts.command))
        return out
