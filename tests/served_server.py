"""A local completions server that answers as vLLM does, wrapping an in-process causal LM (tests and benchmarks).

``POST /v1/completions`` with ``echo``, ``logprobs``, ``max_tokens`` and vLLM's ``add_special_tokens`` (default
true) replies like vLLM's ``OpenAIServingCompletion``: ``choices[0].text`` is the prompt (plus generated text),
``choices[0].logprobs`` has ``tokens`` (each token decoded alone), ``token_logprobs`` (``null`` for the first prompt
token), ``top_logprobs`` (``null`` first, then the token's own and the best ``logprobs`` alternatives) and
``text_offset`` (running sum of the token strings' lengths), and ``usage`` counts the prompt and generated tokens.
An empty prompt is HTTP 400 (vLLM: the decoder prompt cannot be empty); an unknown model name is HTTP 404.

``add_bos`` makes it tokenise like a Llama-style server (the BOS token before every prompt sent with special
tokens); without it, like GPT-2 (nothing added). Misbehaviour on purpose, for the failure tests:

* HTTP: ``fail_status`` (every request gets that HTTP status, or only the first ``fail_times``), ``status_for``
  (prompt -> the HTTP status every request of that prompt gets), ``delay_s`` (sleep before answering), ``hang``
  (never answer: the request waits until the server is closed), ``html`` (HTTP 200 with a web page, as a proxy or
  login page in front of the server sends), ``broken_json`` (HTTP 200 with half a JSON reply);
* the reply: ``truncate`` (every list of ``logprobs`` one entry short), ``short_logprobs`` (only
  ``token_logprobs`` one short), ``usage_short`` (``usage.prompt_tokens`` that many below the echoed tokens),
  ``bad_logprob`` (every scored token's log-probability replaced by this value, e.g. ``-inf`` or ``nan``, sent as
  ``-Infinity`` / ``NaN`` as Python's json writes them; ``bad_logprob_at="last"``: the last token's only),
  ``bad_offsets`` (the last ``text_offset`` one too far), ``ignore_echo`` (answers as if echo were false: one
  generated token), ``generate_anyway`` (one token generated in spite of ``max_tokens: 0``, echoed after the
  prompt's and counted in ``usage.completion_tokens``).

Runs in a thread on 127.0.0.1 and a free port; ``log`` records every request body (misbehaving ones included),
``auth`` its Authorization header.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

from local_http import JSONHandler, LocalHTTPServer


class ServedLM:
    """What the server computes: the server-side tokenisation and log-probabilities of a causal LM adapter."""

    def __init__(self, adapter: Any, add_bos: bool = False):
        self.model, self.tok = adapter.model, adapter.tokenizer
        self.bos_id = adapter.bos_token_id
        self.add_bos = add_bos

    def encode(self, prompt: str, special_tokens: bool) -> list[int]:
        ids = list(self.tok(prompt, add_special_tokens=False)["input_ids"])
        return [self.bos_id] + ids if special_tokens and self.add_bos else ids

    def decode(self, token_id: int) -> str:
        return self.tok.decode([token_id])

    def completion(self, prompt: str, special_tokens: bool, echo: bool, n_top: int | None, max_tokens: int) -> dict:
        import torch

        ids = self.encode(prompt, special_tokens)
        n_prompt = len(ids)
        with torch.inference_mode():
            for _ in range(max_tokens):  # greedy continuation
                ids.append(int(self.model(torch.tensor([ids])).logits[0, -1].argmax()))
            logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].double(), dim=-1)
        tokens = [self.decode(i) for i in ids]
        token_lps: list[float | None] = [None] + [float(logp[j - 1, ids[j]]) for j in range(1, len(ids))]
        tops: list[dict | None] = [None]
        for j in range(1, len(ids)):
            best = torch.topk(logp[j - 1], max(1, n_top or 0))
            top = {tokens[j]: token_lps[j]}
            top.update({self.decode(int(i)): float(v) for v, i in zip(best.values, best.indices)})
            tops.append(top)
        shown = slice(0, None) if echo else slice(n_prompt, None)
        text = self.tok.decode(ids[n_prompt:])
        offsets, at = [], 0
        for t in tokens[shown]:
            offsets.append(at)
            at += len(t)
        logprobs = None if n_top is None else {"tokens": tokens[shown], "token_logprobs": token_lps[shown],
                                               "top_logprobs": tops[shown], "text_offset": offsets}
        return {"text": (prompt if echo else "") + text, "logprobs": logprobs, "n_prompt": n_prompt,
                "n_generated": len(ids) - n_prompt}


class CompletionsServer(LocalHTTPServer):
    def __init__(self, adapter: Any, served_name: str = "tiny-gpt2", add_bos: bool = False, api_key: str | None = None):
        self.lm = ServedLM(adapter, add_bos=add_bos)
        self.served_name = served_name
        self.api_key = api_key
        self.log: list[dict] = []
        self.auth: list[str | None] = []
        self.fail_status: int | None = None
        self.fail_times: int | None = None
        self.delay_s = 0.0
        self.status_for: dict[str, int] = {}
        self.hang = False
        self.html = False
        self.broken_json = False
        self.truncate = False
        self.short_logprobs = False
        self.usage_short = 0
        self.bad_logprob: float | None = None
        self.bad_logprob_at = "all"
        self.bad_offsets = False
        self.ignore_echo = False
        self.generate_anyway = False
        self.released = threading.Event()  # set on close: hung requests end (unanswered)
        self.lock = threading.Lock()
        server = self

        class Handler(JSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.log.append(body)
                    server.auth.append(self.headers.get("Authorization"))
                    failing = server.fail_status is not None and (server.fail_times is None or server.fail_times > 0)
                    if failing and server.fail_times is not None:
                        server.fail_times -= 1
                if server.delay_s:
                    time.sleep(server.delay_s)
                if server.hang:
                    server.released.wait(120)
                    return None  # the connection closes unanswered
                if failing:
                    return self._send(server.fail_status, {"object": "error", "message": "engine overloaded",
                                                           "type": "InternalServerError", "code": server.fail_status})
                if body.get("prompt") in server.status_for:
                    code = server.status_for[body["prompt"]]
                    return self._send(code, {"object": "error", "message": f"status {code} for this prompt",
                                             "type": "Error", "code": code})
                if server.html:
                    page = (b"<!DOCTYPE html><html><head><title>Sign in - Cluster Portal</title></head><body>"
                            b"<form action=/login>...</form></body></html>")
                    return self._send_raw(200, page, "text/html; charset=utf-8")
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._send(401, {"error": "Unauthorized"})
                if self.path != "/v1/completions":
                    return self._send(404, {"detail": "Not Found"})
                if body.get("model") != server.served_name:
                    return self._send(404, {"object": "error", "message": f"The model `{body.get('model')}` does "
                                            "not exist.", "type": "NotFoundError", "param": None, "code": 404})
                echo = bool(body.get("echo")) and not server.ignore_echo
                max_tokens = int(body.get("max_tokens", 16))
                if server.ignore_echo or server.generate_anyway:
                    max_tokens = max(1, max_tokens)
                prompt = body["prompt"]
                if not server.lm.encode(prompt, body.get("add_special_tokens", True)):
                    return self._send(400, {"object": "error", "message": "The decoder prompt cannot be empty",
                                            "type": "BadRequestError", "code": 400})
                out = server.lm.completion(prompt, body.get("add_special_tokens", True), echo, body.get("logprobs"),
                                           max_tokens)
                lp = out["logprobs"]
                if lp and server.truncate:
                    lp = {k: v[:-1] for k, v in lp.items()}
                if lp and server.short_logprobs:
                    lp["token_logprobs"] = lp["token_logprobs"][:-1]
                if lp and server.bad_logprob is not None:
                    values = lp["token_logprobs"]
                    at = range(1, len(values)) if server.bad_logprob_at == "all" else [len(values) - 1]
                    lp["token_logprobs"] = [server.bad_logprob if i in at and v is not None else v
                                            for i, v in enumerate(values)]
                if lp and server.bad_offsets:
                    lp["text_offset"] = lp["text_offset"][:-1] + [lp["text_offset"][-1] + 1]
                n_prompt = out["n_prompt"] - server.usage_short
                reply = {"id": "cmpl-test", "object": "text_completion", "created": int(time.time()),
                         "model": server.served_name,
                         "choices": [{"index": 0, "text": out["text"], "logprobs": lp,
                                      "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None}],
                         "usage": {"prompt_tokens": n_prompt, "completion_tokens": out["n_generated"],
                                   "total_tokens": n_prompt + out["n_generated"]}}
                if server.broken_json:
                    data = json.dumps(reply).encode()
                    return self._send_raw(200, data[:len(data) // 2], "application/json")
                self._send(200, reply)

            def _send_raw(self, code: int, data: bytes, content_type: str) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass


        self.base_url = self._serve(Handler)

    def __exit__(self, *exc):
        self.released.set()  # hung requests end, so the server can close
        super().__exit__(*exc)
