"""What the tests' local HTTP servers share (the fake chat server, the vLLM-like completions server): JSON replies
that survive a client that left, and a server on 127.0.0.1 and a free port that serves in a thread while it is used
as a context manager."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def _send(self, code: int, payload, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass


class LocalHTTPServer:
    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> str:
        """Bind ``handler`` to 127.0.0.1 on a free port; returns the ``/v1`` base URL."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
