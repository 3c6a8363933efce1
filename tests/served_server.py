"""A local completions server that answers as vLLM does, wrapping an in-process causal LM (tests and benchmarks).

``POST /v1/completions`` with ``echo``, ``logprobs``, ``max_tokens`` and vLLM's ``add_special_tokens`` (default
true) replies like vLLM's ``OpenAIServingCompletion``: ``choices[0].text`` is the prompt (plus generated text),
``choices[0].logprobs`` has ``tokens`` (each token decoded alone), ``token_logprobs`` (``null`` for the first prompt
token), ``top_logprobs`` (``null`` first, then the token's own and the best ``logprobs`` alternatives) and
``text_offset`` (running sum of the token strings' lengths), and ``usage`` counts the prompt and generated tokens.
An empty prompt is HTTP 400 (vLLM: the decoder prompt cannot be empty); an unknown model name is HTTP 404.

``add_bos`` makes it tokenise like a Llama-style server (the BOS token before every prompt sent with special
tokens); without it, like GPT-2 (nothing added). Misbehaviour on purpose, for the failure tests: ``fail_status``
(every request gets that HTTP status, or only the first ``fail_times``), ``delay_s`` (sleep before answering),
``truncate`` (the last log-probability missing), ``ignore_echo`` (answers as if echo were false: one generated
token). Runs in a thread on 127.0.0.1 and a free port; ``log`` records every request body, ``auth`` its
Authorization header.
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
        self.truncate = False
        self.ignore_echo = False
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
                if failing:
                    return self._send(server.fail_status, {"object": "error", "message": "engine overloaded",
                                                           "type": "InternalServerError", "code": server.fail_status})
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._send(401, {"error": "Unauthorized"})
                if self.path != "/v1/completions":
                    return self._send(404, {"detail": "Not Found"})
                if body.get("model") != server.served_name:
                    return self._send(404, {"object": "error", "message": f"The model `{body.get('model')}` does "
                                            "not exist.", "type": "NotFoundError", "param": None, "code": 404})
                echo = bool(body.get("echo")) and not server.ignore_echo
                max_tokens = int(body.get("max_tokens", 16))
                if server.ignore_echo:
                    max_tokens = max(1, max_tokens)
                prompt = body["prompt"]
                if not server.lm.encode(prompt, body.get("add_special_tokens", True)):
                    return self._send(400, {"object": "error", "message": "The decoder prompt cannot be empty",
                                            "type": "BadRequestError", "code": 400})
                out = server.lm.completion(prompt, body.get("add_special_tokens", True), echo, body.get("logprobs"),
                                           max_tokens)
                if server.truncate and out["logprobs"]:
                    out["logprobs"] = {k: v[:-1] for k, v in out["logprobs"].items()}
                self._send(200, {
                    "id": "cmpl-test", "object": "text_completion", "created": int(time.time()),
                    "model": server.served_name,
                    "choices": [{"index": 0, "text": out["text"], "logprobs": out["logprobs"],
                                 "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None}],
                    "usage": {"prompt_tokens": out["n_prompt"], "completion_tokens": out["n_generated"],
                              "total_tokens": out["n_prompt"] + out["n_generated"]}})


        self.base_url = self._serve(Handler)
