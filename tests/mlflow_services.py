"""Real services for the MLflow tests, all on 127.0.0.1: a PostgreSQL cluster in a temporary folder, an MLflow
server, and headless Chromium driven over the DevTools protocol.

Locally a missing program skips its test with the command that installs it; in CI (CI=true) it fails the test, since
.ci/run installs them there.
"""
from __future__ import annotations

import asyncio
import contextlib
import glob
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def need(found: bool, what: str, install: str) -> None:
    """Skip (locally) or fail (CI) when ``what`` is not installed."""
    if found:
        return
    message = f"{what} is not installed; install it with:  {install}"
    if IN_CI:
        pytest.fail(f"{message} (.ci/run installs it in CI)")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).ok:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, grace: float = 3) -> None:
    """Stop a process started in its own session, with the workers it started (a test server holds nothing to
    save: after a short grace it is killed, as MLflow's server takes 20 s and more to stop on SIGTERM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- PostgreSQL ----------------------------------------------------------------------------------------------------

def postgres_bin() -> Path | None:
    """Debian's PostgreSQL programs (the newest installed version), or initdb's folder on the PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(re.sub(r"\D", "", p) or 0))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1; yields the URI of an empty database ``mlflow``.

    PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres`` user (runuser), in a folder
    outside pytest's private temporary folder so that user can reach it."""
    bindir = postgres_bin()
    need(bindir is not None, "PostgreSQL", "apt-get install postgresql")
    need(importlib.util.find_spec("psycopg2") is not None, "The PostgreSQL driver psycopg2",
         "pip install -e '.[server]'")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="biasflow-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    try:
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "mlflow", "--auth=trust",
                        "-E", "UTF8", "--locale=C.UTF-8"], check=True, capture_output=True, timeout=120)
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
                        "-t", "60", "-o", f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off", "start"],
                       check=True, capture_output=True, timeout=90)
        subprocess.run([*as_user, str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow",
                        "mlflow"], check=True, capture_output=True, timeout=60)
        yield f"postgresql://mlflow@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


# --- MLflow server -------------------------------------------------------------------------------------------------

class Server:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url, self.proc, self.log = url, proc, log

    def wait(self, timeout: float = 180) -> str:
        """The URL, once /health answers."""
        _wait_for(f"{self.url}/health", self.proc, self.log, timeout)
        return self.url


@contextlib.contextmanager
def mlflow_server(backend_uri: str, workdir: Path, command: str = "server", ready: bool = True) -> Iterator[Server]:
    """``mlflow server`` (artifacts proxied, stored under ``workdir``) or ``mlflow ui`` (its defaults), run in
    ``workdir`` on 127.0.0.1 with one worker over ``backend_uri``. Yields once /health answers (``ready``), or at
    once: the caller does other work while it starts and calls ``wait()`` before using it."""
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", command, "--backend-store-uri", backend_uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    if command == "server":
        cmd += ["--serve-artifacts", "--artifacts-destination", str(workdir / "mlartifacts")]
    log = workdir / f"mlflow-server-{port}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
    try:
        server = Server(f"http://127.0.0.1:{port}", proc, log)
        if ready:
            server.wait()
        yield server
    finally:
        _stop(proc)


# --- headless Chromium over the DevTools protocol -------------------------------------------------------------------

def chromium_path() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class Browser:
    """One headless Chromium page: ``text(url, expected)`` loads a page of a single-page app and returns its visible
    text once every expected string is on it (or the timeout passes)."""

    def __init__(self, workdir: Path):
        import aiohttp  # noqa: F401  (MLflow's own dependency: the DevTools websocket client)

        exe = chromium_path()
        need(exe is not None, "Chromium", "apt-get install chromium")
        self.loop = asyncio.new_event_loop()
        # a window large enough that the UI's tables render their rows
        self.proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--window-size=1600,1200",
                                      "--remote-debugging-port=0", "--remote-allow-origins=*",
                                      f"--user-data-dir={workdir / 'chromium-profile'}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        endpoint = None
        for line in self.proc.stderr:  # Chromium says where its DevTools endpoint is
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if match:
                endpoint = f"http://127.0.0.1:{match.group(1)}"
                break
        if endpoint is None:
            raise RuntimeError(f"Chromium did not start (exit {self.proc.poll()})")
        threading_drain(self.proc.stderr)
        self.ids = 0
        self.loop.run_until_complete(self._connect(endpoint))

    async def _connect(self, endpoint: str) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession()
        async with self.session.get(f"{endpoint}/json/list") as response:
            page = next(t for t in await response.json() if t["type"] == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    async def _call(self, method: str, **params):
        self.ids += 1
        await self.ws.send_json({"id": self.ids, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json()
            if message.get("id") == self.ids:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def _text(self, url: str, ready: Callable[[str], bool], timeout: float) -> str:
        await self._call("Page.navigate", url=url)
        deadline, text = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            result = await self._call("Runtime.evaluate", returnByValue=True,
                                      expression="document.body ? document.body.innerText : ''")
            text = result["result"].get("value") or ""
            if ready(text):
                break
            await asyncio.sleep(0.25)
        return text

    def text(self, url: str, expected: Iterable[str] | Callable[[str], bool] = (), timeout: float = 60) -> str:
        """The page's visible text once ``expected`` (strings, or a test of the text) is there, or at ``timeout``."""
        ready = expected if callable(expected) else (lambda text, wanted=list(expected): all(e in text
                                                                                            for e in wanted))
        return self.loop.run_until_complete(self._text(url, ready, timeout))

    def close(self) -> None:
        async def close():
            await self.ws.close()
            await self.session.close()

        with contextlib.suppress(Exception):
            self.loop.run_until_complete(close())
        self.loop.close()
        _stop(self.proc)


def threading_drain(stream) -> None:
    """Keep reading a pipe so the process writing to it never blocks on a full buffer."""
    import threading

    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()
