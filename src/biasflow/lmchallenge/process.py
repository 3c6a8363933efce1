"""Run a model as a child process speaking the line protocol (any language)."""
from __future__ import annotations

import collections
import os
import queue
import shlex
import signal
import subprocess
import threading
from typing import Sequence

from .protocol import Model, Prediction, ProtocolError, format_predict, format_train, parse_response

_EOF = object()


def _shorten(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class ProcessModel(Model):
    """A protocol model in a child process.

    ``command`` is a shell-like string (split with shlex) or an argv list. Every answer must arrive within
    ``timeout`` seconds; a crash, a hang or a malformed answer raises ``ProtocolError`` naming the request,
    and the process is killed. ``close()`` (or leaving the ``with`` block) closes stdin, waits briefly
    for a clean exit and then kills the whole process group, so no zombie or orphan survives.
    """

    def __init__(self, command: str | Sequence[str], timeout: float = 60.0, startup_timeout: float | None = None,
                 env: dict | None = None, cwd: str | None = None):
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise ValueError("empty model command")
        self.timeout = timeout
        # the first answer may include loading/training the model, so it gets its own allowance
        self.startup_timeout = startup_timeout if startup_timeout is not None else max(timeout, 600.0)
        self._answered = False
        self._last_silent: str | None = None
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, encoding="utf-8", bufsize=1, env=env, cwd=cwd,
                start_new_session=True,  # own process group: close() kills the model's children too
            )
        except OSError as e:
            raise ProtocolError(f"cannot start model {self.command_str}: {e}") from e
        self._lines: queue.Queue = queue.Queue()
        self._stderr: collections.deque = collections.deque(maxlen=20)
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def command_str(self) -> str:
        return shlex.join(self.argv)

    @staticmethod
    def _pump(stream, sink, mark_eof: bool) -> None:
        try:
            for line in stream:
                sink(line)
        except (ValueError, OSError):  # stream closed under us during close()
            pass
        finally:
            if mark_eof:
                sink(_EOF)

    # -- protocol ---------------------------------------------------------------------------------------
    def _fail(self, request: str, what: str) -> ProtocolError:
        self._kill()
        # the process is dead: let the stderr reader drain the pipe, or its last words (the useful ones) are lost
        self._threads[1].join(timeout=2.0)
        err = "".join(self._stderr).strip()
        tail = f"\nmodel stderr (last lines):\n{err}" if err else ""
        shown = _shorten(request.rstrip("\n"))
        return ProtocolError(f"model {self.command_str} {what} on request {shown!r}{tail}")

    def _send(self, request: str) -> None:
        if self.proc.poll() is not None:
            raise self._fail(request, f"is not running (exit code {self.proc.returncode})")
        try:
            self.proc.stdin.write(request)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._wait_exit(1.0)
            raise self._fail(request, f"crashed (exit code {self.proc.returncode})") from None

    def _wait_exit(self, seconds: float) -> None:
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pass

    def predict(self, context: str, candidates: Sequence[str] | None = None) -> list[Prediction]:
        request = format_predict(context, candidates)
        # train/clear must not answer; an answer arriving now would be read as this request's answer
        try:
            stray = self._lines.get_nowait()
        except queue.Empty:
            stray = None
        if stray is not None and stray is not _EOF:
            raise self._fail(self._last_silent or request, f"answered a command that takes no answer ({_shorten(stray)!r})")
        if stray is _EOF:
            self._lines.put(_EOF)
        self._send(request)
        timeout = self.timeout if self._answered else self.startup_timeout
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise self._fail(request, f"did not answer within {timeout:g} s") from None
        if line is _EOF:
            self._lines.put(_EOF)
            self._wait_exit(1.0)
            code = self.proc.returncode
            raise self._fail(request, "crashed" + (f" (exit code {code})" if code is not None else " (closed its output)"))
        try:
            out = parse_response(line)
        except ValueError as e:
            raise self._fail(request, f"gave a malformed answer {_shorten(line.rstrip())!r}: {e}") from None
        self._answered = True
        return out

    def train(self, line: str) -> None:
        request = format_train(line)
        self._send(request)
        self._last_silent = request

    def clear(self) -> None:
        self._send("clear\n")
        self._last_silent = "clear\n"

    # -- lifetime ---------------------------------------------------------------------------------------
    def _kill(self) -> None:
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    self.proc.wait(2.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            # the leader is gone; children it left in the group must not outlive us
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()  # reap: no zombie

    def close(self, grace: float = 2.0) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.stdin.close()  # polite: a protocol model exits at EOF
            except (BrokenPipeError, OSError, ValueError):
                pass
            self._wait_exit(grace)
        self._kill()
        for t in self._threads:  # the pipes hit EOF once the process group is gone
            t.join(1.0)
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except (OSError, ValueError):
                pass

    def __del__(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                self._kill()
            except Exception:
                pass
