"""A local OpenAI-compatible chat-completions server for tests (http.server in a thread, 127.0.0.1, any port).

Answers ``echo|<prompt>|<seed>|<system>`` unless ``reply(body)`` says otherwise; prompts starting with a keyword
misbehave on purpose: ``fail500``: HTTP 500 while ``broken`` is set; ``flaky``: one 500 per sample, then fine;
``rate``: one 429 with Retry-After 0 per sample; ``slow``: sleeps past the client's timeout; ``bad``: HTTP 400
(not retried). ``fail_first(body)`` true: the first request of that sample gets a 500 whose body quotes the
Authorization header it came with, as some servers quote the key they reject.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Callable

from local_http import JSONHandler, LocalHTTPServer


class FakeChatServer(LocalHTTPServer):
    def __init__(self, delay_s: float = 0.0, reply: Callable[[dict], str] | None = None,
                 fail_first: Callable[[dict], bool] | None = None):
        self.log: list[dict] = []
        self.broken = True
        self.delay_s = delay_s
        self.reply = reply
        self.fail_first = fail_first
        self.seen: dict[tuple, int] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(JSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                system = body["messages"][0]["content"] if len(body["messages"]) > 1 else None
                ident = (prompt, body.get("seed"), body.get("temperature"))
                auth = self.headers.get("Authorization")
                with server.lock:
                    server.log.append({"prompt": prompt, "seed": body.get("seed"), "path": self.path,
                                       "auth": auth, "model": body.get("model")})
                    n = server.seen[ident] = server.seen.get(ident, 0) + 1
                if server.delay_s:
                    time.sleep(server.delay_s)
                if prompt.startswith("slow"):
                    time.sleep(0.6)
                if prompt.startswith("bad"):
                    return self._send(400, {"error": "bad request"})
                if prompt.startswith("fail500") and server.broken:
                    return self._send(500, {"error": "boom"})
                if prompt.startswith("flaky") and n == 1:
                    return self._send(500, {"error": "transient"})
                if prompt.startswith("rate") and n == 1:
                    return self._send(429, {"error": "slow down"}, {"Retry-After": "0"})
                if server.fail_first is not None and n == 1 and server.fail_first(body):
                    key = (auth or "").removeprefix("Bearer ")
                    return self._send(500, {"error": {"message": f"overloaded; request with key {key} failed"}})
                text = server.reply(body) if server.reply else f"echo|{prompt}|{body.get('seed')}|{system}"
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": text}}]})


        self.url = self._serve(Handler)
