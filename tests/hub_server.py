"""A local stand-in for the Hugging Face hub's file API, for tests: a stdlib HTTP server in a thread on 127.0.0.1.

It answers what ``huggingface_hub`` (file downloads, ``model_info`` / ``resolve_revision``, ``list_repo_tree``) and
transformers' ``from_pretrained`` ask of the hub, for repos held in memory as commits of files and branches:

* ``HEAD|GET /{org}/{name}/resolve/{revision}/{path}``: the file at a branch or a commit, with the headers
  huggingface_hub checks (``X-Repo-Commit``, ``ETag``, ``Content-Length``) and ``Range`` requests (a resumed download);
* ``GET /api/models/{org}/{name}[/revision/{revision}]``: the repo's info (``sha``, ``siblings``);
* ``GET /api/models/{org}/{name}/tree/{revision}[/{path}]``: the files under a folder.

Errors carry the hub's ``X-Error-Code``: ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound`` (404), and
``GatedRepo`` (401) for a gated repo asked without its token. ``drop`` makes downloads of a file stop after that
many bytes with the connection closed (a connection lost mid-file); ``move_after_resolve`` moves a branch to
another commit right after the first time a revision of the repo is resolved (a push landing mid-load);
``GET /_test/heal/{org}/{name}`` ends the repo's dropped downloads. Every request
is recorded in ``requests`` (method, path, Range header). Nothing here is product code.
"""
from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: content}
    refs: dict[str, str] = field(default_factory=dict)  # branch -> sha
    token: str | None = None  # gated: only requests with "Authorization: Bearer <token>" are answered
    drop: dict[str, int] = field(default_factory=dict)  # filename -> downloads stop at this byte, connection closed
    move_after_resolve: tuple[str, str] | None = None  # (branch, sha): applied once, after a revision lookup

    def commit_of(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if revision in self.commits else None


class HubServer:
    """``with HubServer() as hub: hub.add_commit("org/name", files)``; ``hub.url`` goes into ``HF_ENDPOINT``."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.refuse = False  # answer every request with 503 (a hub that is down): offline runs must not ask
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def add_commit(self, repo_id: str, files: dict[str, bytes], branch: str = "main", move: bool = True) -> str:
        """A new commit of ``files`` (the whole tree) on ``branch`` (moved to it unless ``move`` is False): its sha."""
        repo = self.repos.setdefault(repo_id, Repo())
        h = hashlib.sha1(repo.refs.get(branch, "").encode())
        for path in sorted(files):
            h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        sha = h.hexdigest()
        repo.commits[sha] = dict(files)
        if move or branch not in repo.refs:
            repo.refs[branch] = sha
        return sha

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    def file_requests(self, repo_id: str) -> list[tuple[str, str, str | None]]:
        """(method, revision, filename) of every download request of ``repo_id`` so far."""
        prefix = f"/{repo_id}/resolve/"
        out = []
        for method, path, _range in list(self.requests):
            if path.startswith(prefix):
                revision, _, filename = path[len(prefix):].partition("/")
                out.append((method, unquote(revision), filename))
        return out


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (a ``save_pretrained`` output), by its relative path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        # -- helpers -------------------------------------------------------------------------------------------
        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  send_body: bool = True) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body and body:
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, send_body: bool) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                      "X-Error-Message": message}, send_body)

        def _json(self, data, send_body: bool) -> None:
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"}, send_body)

        def _repo(self, repo_id: str, send_body: bool) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", send_body)
                return None
            if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to "
                            f"it and be authenticated to access it. Please log in.", send_body)
                return None
            return repo

        def _commit(self, repo: Repo, revision: str, send_body: bool) -> str | None:
            sha = repo.commit_of(revision)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", send_body)
            return sha

        # -- routes --------------------------------------------------------------------------------------------
        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub._lock:
                hub.requests.append((self.command, path, self.headers.get("Range")))
            if hub.refuse:
                return self._error(503, "ServiceUnavailable", "the test hub is down", body)
            parts = path.strip("/").split("/")
            if parts[:2] == ["_test", "heal"] and len(parts) == 4:  # the connection of the test's hub is back
                hub.repos[f"{parts[2]}/{parts[3]}"].drop.clear()
                return self._json({"healed": True}, body)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._api(f"{parts[2]}/{parts[3]}", parts[4:], body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
            self._error(404, "NotFound", f"the test hub does not serve {path}", body)

        def _api(self, repo_id: str, rest: list[str], send_body: bool) -> None:
            repo = self._repo(repo_id, send_body)
            if repo is None:
                return
            if not rest or rest[0] == "revision":
                revision = rest[1] if len(rest) > 1 else "main"
                sha = self._commit(repo, revision, send_body)
                if sha is None:
                    return
                self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                            "gated": "manual" if repo.token else False,
                            "siblings": [{"rfilename": name} for name in sorted(repo.commits[sha])]}, send_body)
                if repo.move_after_resolve is not None:  # a push that lands right after this lookup
                    branch, new_sha = repo.move_after_resolve
                    repo.refs[branch], repo.move_after_resolve = new_sha, None
                return
            if rest[0] == "tree" and len(rest) >= 2:
                sha = self._commit(repo, rest[1], send_body)
                if sha is None:
                    return
                folder = "/".join(rest[2:]).strip("/")
                files = repo.commits[sha]
                under = {name: data for name, data in files.items()
                         if not folder or name.startswith(folder + "/")}
                if folder and not under:
                    return self._error(404, "EntryNotFound", f"{folder} does not exist", send_body)
                return self._json([{"type": "file", "path": name, "size": len(data),
                                    "oid": hashlib.sha1(data).hexdigest()} for name, data in sorted(under.items())],
                                  send_body)
            self._error(404, "NotFound", f"the test hub does not serve /api/models/{repo_id}/{'/'.join(rest)}",
                        send_body)

        def _file(self, repo_id: str, revision: str, filename: str, send_body: bool) -> None:
            repo = self._repo(repo_id, send_body)
            if repo is None:
                return
            sha = self._commit(repo, revision, send_body)
            if sha is None:
                return
            data = repo.commits[sha].get(filename)
            if data is None:
                return self._error(404, "EntryNotFound", f"{filename} does not exist at {revision}", send_body)
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            start = 0
            requested = self.headers.get("Range")
            if requested and requested.startswith("bytes=") and send_body:
                start = int(requested[len("bytes="):].split("-")[0] or 0)
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            status = 206 if start else 200
            drop_at = repo.drop.get(filename)
            if not send_body or drop_at is None:
                return self._send(status, data[start:], headers, send_body)
            # a connection lost mid-file: the headers promise the whole file, the body stops at drop_at
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            self.wfile.write(data[start:max(start, drop_at)])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    return Handler
