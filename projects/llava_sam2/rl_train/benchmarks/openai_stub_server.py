"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scripted answers and injected faults (the judge's tests
and ``sa2va-rl bench judge`` use it; it serves no model).

Speaks ``POST /v1/chat/completions`` (aiohttp). Each request's reply comes from a *responder*
``(prompt, attempt) -> str | Fault``: ``prompt`` is the last user message and ``attempt`` counts
earlier requests with the same prompt (0 on the first), so "fail once, then answer" is scriptable.
Faults: HTTP 500, HTTP 429 (with ``retry-after-ms``), a hang longer than the client's timeout,
a non-JSON body, an empty answer. ``latency_s`` delays every reply.

Use in a test (server thread in-process)::

    with StubServer(responder, latency_s=0.0) as server:
        client = JudgeClient(dict(base_url=server.base_url))

or as its own process (the benchmark does this, to keep the server off the client's core)::

    python -m projects.llava_sam2.rl_train.benchmarks.openai_stub_server --latency-ms 50
    # prints "READY http://127.0.0.1:<port>/v1", serves until its stdin closes
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from projects.llava_sam2.rl_train.rewards.judge import prompts


@dataclass(frozen=True)
class Fault:
    """An injected failure: ``kind`` in {"http_500", "http_429", "hang", "bad_json", "empty"}."""

    kind: str
    hang_s: float = 30.0


Responder = Callable[[str, int], "str | Fault"]

GENERATED_QA = {
    "class_name": "object",
    "positive": [
        {"question": "Which of the following is applicable to the description?", "choices": [
            ["The color of the object is mentioned in the description and is red.", 1],
            ["The color of the object is not mentioned, but the object is mentioned.", 0.5],
            ["The object is not mentioned.", 0],
            ["The color of the object is mentioned in the description but is not red.", -1]]},
    ],
    "negative": [
        {"question": "Which of the following is applicable to the description?", "subtype": "salient negative",
         "choices": [["The sky is not mentioned in the description.", 1],
                     ["The sky is mentioned in the description.", -1]]},
    ],
}


def default_responder(prompt: str, attempt: int) -> str:
    """Answers every prompt kind validly: "A" per question, JSON letters, fixed generated QA."""
    if prompts.is_question_generation_prompt(prompt):
        return json.dumps(GENERATED_QA)
    if prompts.is_batched_eval_prompt(prompt):
        n = int(re.search(r"\((\d+) letters\)", prompt).group(1))
        return json.dumps({"answers": ["A"] * n})
    return "A"


def varied_responder(prompt: str, attempt: int) -> str:
    """Like ``default_responder``, but each answer letter is "A" or "B" by a hash of the prompt (zlib.crc32: the same
    in every process): captions that differ get different judge scores, so GRPO groups scored by the judge have
    non-zero advantages (``sa2va-rl check gpu`` trains random-weight models with it)."""
    if prompts.is_question_generation_prompt(prompt):
        return json.dumps(GENERATED_QA)
    letter = "AB"[zlib.crc32(prompt.encode()) % 2]
    if prompts.is_batched_eval_prompt(prompt):
        n = int(re.search(r"\((\d+) letters\)", prompt).group(1))
        return json.dumps({"answers": ["AB"[zlib.crc32(f"{prompt}#{i}".encode()) % 2] for i in range(n)]})
    return letter


RESPONDERS = {"default": default_responder, "varied": varied_responder}


def _completion(text: str, model: str) -> dict:
    return {
        "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class StubServer:
    """The stub server in a background thread (its own event loop).

    Attributes:
        requests: prompts received, in arrival order.
        auth_headers: distinct ``Authorization`` headers seen.
        counts: requests per outcome ("ok", "http_500", ...).
    """

    def __init__(self, responder: Responder | None = None, latency_s: float = 0.0, port: int = 0) -> None:
        self.responder = responder or default_responder
        self.latency_s = latency_s
        self.port = port
        self.requests: list[str] = []
        self.auth_headers: set[str] = set()
        self.counts: Counter[str] = Counter()
        self._attempts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _record(self, prompt: str) -> int:
        with self._lock:
            self.requests.append(prompt)
            attempt = self._attempts[prompt]
            self._attempts[prompt] += 1
            return attempt

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        attempt = self._record(prompt)
        self.auth_headers.add(request.headers.get("Authorization", ""))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        reply = self.responder(prompt, attempt)
        kind = reply.kind if isinstance(reply, Fault) else "ok"
        with self._lock:
            self.counts[kind] += 1
        if kind == "http_500":
            return web.json_response({"error": {"message": "injected 500", "type": "server_error"}}, status=500)
        if kind == "http_429":
            return web.json_response({"error": {"message": "injected 429", "type": "rate_limit"}}, status=429,
                                     headers={"retry-after-ms": "10"})
        if kind == "hang":
            await asyncio.sleep(reply.hang_s)
            return web.json_response(_completion("too late", body.get("model", "")))
        if kind == "bad_json":
            return web.Response(text="<html>not json</html>", content_type="application/json")
        if kind == "empty":
            return web.json_response(_completion("", body.get("model", "")))
        return web.json_response(_completion(reply, body.get("model", "")))

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # (host, port) of the bound socket

    def start(self) -> StubServer:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="openai-stub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("stub server did not start within 10 s")
        return self

    async def _shutdown(self) -> None:
        await self._runner.cleanup()
        # handlers still sleeping in an injected hang: cancel them so none outlives the loop
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="OpenAI-compatible stub server (default answers)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--answers", choices=sorted(RESPONDERS), default="default",
                        help="default: always 'A'; varied: 'A' or 'B' by a hash of the prompt")
    args = parser.parse_args()
    server = StubServer(RESPONDERS[args.answers], latency_s=args.latency_ms / 1000.0, port=args.port).start()
    print(f"READY {server.base_url}", flush=True)
    try:
        sys.stdin.read()  # serve until the parent closes our stdin
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
