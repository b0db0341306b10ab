"""Async judge client: the ``openai`` async client against any OpenAI-compatible server.

* Endpoint from config or environment: ``base_url`` (else ``$JUDGE_BASE_URL``), ``model`` (else
  ``$JUDGE_MODEL``, else DLC-Bench's Llama-3.1-8B-Instruct), the API key from the environment
  variable named by ``api_key_env`` (default ``OPENAI_API_KEY``; servers such as vLLM accept any
  key, so a missing variable sends ``"EMPTY"``). The key is never logged, cached or shown in a repr, nor are a user
  name and password embedded in the base URL (``https://user:pass@host/v1``: shown as ``https://***@host/v1``).
* Bounded concurrency (one semaphore per event loop), per-request timeout, the openai client's own
  retries (429, 5xx, timeouts, with back-off and ``Retry-After``).
* Throughput: the client uses openai's aiohttp transport (``http_backend="aiohttp"``) and posts the
  chat-completion body through ``AsyncOpenAI.post(..., cast_to=object)`` (openai's documented
  route for raw requests: same retries, timeouts and error classes), skipping the typed request
  transform and pydantic response models — together ~2x more requests/s per CPU core.
* A persistent cache keyed by (model, prompt, sampling parameters); identical prompts in flight at
  the same time are sent once. Replies are cached only when the caller's ``validate`` accepts them.
* Every failure becomes :class:`JudgeError` with a ``cause`` (``timeout``, ``http_429``,
  ``http_500``, ``connection``, ``empty_answer``, ``unparsable``, ``api_error``) for the
  failure counts.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import openai

from .cache import ResponseCache

logger = logging.getLogger(__name__)

DEFAULT_JUDGE_MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct"  # DLC-Bench's judge


def redact_url(url: str | None) -> str | None:
    """``url`` with the credentials it embeds (``scheme://user:password@host``) replaced by ``***``, for logs."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


class JudgeError(Exception):
    """A judge request failed; ``cause`` is the failure-count key."""

    def __init__(self, cause: str, detail: str = "") -> None:
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause


@dataclass
class JudgeConfig:
    """Where and how to ask the judge.

    Attributes:
        base_url: OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8000/v1``; None reads
            ``$<base_url_env>``; if that is unset too, no endpoint is configured.
        base_url_env: environment variable holding the base URL.
        model: model name; None reads ``$<model_env>``, else DLC-Bench's judge.
        model_env: environment variable holding the model name.
        api_key_env: environment variable holding the API key (never stored in this config).
        max_concurrency: requests in flight at once.
        timeout_s: per-request timeout (each retry gets its own).
        max_retries: the openai client's retries on 408/409/429/5xx/timeouts/connection errors.
        temperature, max_tokens, top_p: sampling parameters (DLC-Bench: 0, 300, 1).
        cache_path: SQLite cache file; None caches in memory for this process only.
        http_backend: ``"aiohttp"`` (openai's aiohttp transport, faster) or ``"httpx"`` (its default).
    """

    base_url: str | None = None
    base_url_env: str = "JUDGE_BASE_URL"
    model: str | None = None
    model_env: str = "JUDGE_MODEL"
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 16
    timeout_s: float = 60.0
    max_retries: int = 2
    temperature: float = 0.0
    max_tokens: int = 300
    top_p: float = 1.0
    cache_path: str | None = None
    http_backend: str = "aiohttp"

    @classmethod
    def from_any(cls, config: JudgeConfig | Mapping[str, Any] | None) -> JudgeConfig:
        """Accept a JudgeConfig, a plain dict (from an MMEngine config) or None (defaults)."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if not isinstance(config, Mapping):
            raise TypeError(f"judge config must be a dict or JudgeConfig, got {type(config).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(config) - known
        if unknown:
            raise ValueError(f"unknown judge config keys {sorted(unknown)}; known keys: {sorted(known)}")
        return cls(**config)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"judge max_concurrency must be >= 1, got {self.max_concurrency}")
        if not self.timeout_s > 0:
            raise ValueError(f"judge timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"judge max_retries must be >= 0, got {self.max_retries}")
        if self.http_backend not in ("aiohttp", "httpx"):
            raise ValueError(f"judge http_backend must be 'aiohttp' or 'httpx', got {self.http_backend!r}")


def _refused(error: BaseException) -> bool:
    """True when the chain of causes holds a refused/failed TCP connect."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, ConnectionRefusedError) or type(error).__name__ == "ClientConnectorError":
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _classify(error: Exception) -> str:
    """openai exception -> failure cause."""
    if isinstance(error, openai.APITimeoutError):
        # openai's aiohttp transport reports a refused connect as a connect *timeout*
        return "connection" if _refused(error) else "timeout"
    if isinstance(error, openai.APIStatusError):
        return f"http_{error.status_code}"
    if isinstance(error, openai.APIConnectionError):
        return "connection"
    return "api_error"


class JudgeClient:
    """Cached, bounded, fault-classifying chat-completion client (see module doc)."""

    def __init__(self, config: JudgeConfig | Mapping[str, Any] | None = None) -> None:
        self.config = JudgeConfig.from_any(config)
        self.base_url = self.config.base_url or os.environ.get(self.config.base_url_env) or None
        self.model = self.config.model or os.environ.get(self.config.model_env) or DEFAULT_JUDGE_MODEL
        self.cache = ResponseCache(self.config.cache_path)
        self.counters: Counter[str] = Counter()  # requests, cache_hits, errors/<cause>
        self._per_loop: dict[int, tuple[asyncio.AbstractEventLoop, Any, asyncio.Semaphore, dict]] = {}

    @property
    def endpoint_configured(self) -> bool:
        return self.base_url is not None

    def __repr__(self) -> str:
        return (f"JudgeClient(base_url={redact_url(self.base_url)!r}, model={self.model!r}, "
                f"max_concurrency={self.config.max_concurrency}, cache={self.cache!r})")

    def _loop_state(self):
        """(openai client, semaphore, in-flight map) for the running loop; created on first use."""
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(id(loop))
        if state is None or state[0] is not loop:
            if not self.endpoint_configured:
                raise JudgeError("no_endpoint", f"set judge base_url or ${self.config.base_url_env}")
            api_key = os.environ.get(self.config.api_key_env) or "EMPTY"
            extra = {"http_client": openai.DefaultAioHttpClient()} if self.config.http_backend == "aiohttp" else {}
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=api_key,
                timeout=self.config.timeout_s,
                max_retries=self.config.max_retries,
                **extra,
            )
            state = (loop, client, asyncio.Semaphore(self.config.max_concurrency), {})
            self._per_loop = {k: v for k, v in self._per_loop.items() if not v[0].is_closed()}
            self._per_loop[id(loop)] = state
        return state[1], state[2], state[3]

    def request_params(self, max_tokens: int | None = None) -> dict[str, Any]:
        return {
            "temperature": self.config.temperature,
            "max_tokens": max_tokens or self.config.max_tokens,
            "top_p": self.config.top_p,
        }

    def cache_key(self, prompt: str, params: Mapping[str, Any]) -> str:
        """Digest of (model, prompt, sampling parameters); no credentials."""
        blob = json.dumps({"model": self.model, "prompt": prompt, "params": dict(params)}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    async def complete(
        self,
        prompt: str,
        *,
        validate: Callable[[str], Any] | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """The judge's reply to one user message (DLC-Bench sends the prompt as the only message).

        Raises :class:`JudgeError`. ``validate(text)`` may raise ValueError: the reply is then not
        cached and the call fails with cause ``unparsable``.
        """
        params = self.request_params(max_tokens)
        key = self.cache_key(prompt, params)
        cached = self.cache.get(key)
        if cached is not None:
            self.counters["cache_hits"] += 1
            return cached
        _, _, in_flight = self._loop_state()
        if key in in_flight:  # same prompt already on the wire: share its answer
            self.counters["deduplicated"] += 1
            return await asyncio.shield(in_flight[key])
        task = asyncio.ensure_future(self._request(prompt, params, key, validate))
        in_flight[key] = task

        def _forget(done: asyncio.Future) -> None:
            in_flight.pop(key, None)
            if not done.cancelled():
                done.exception()  # retrieved here, so an abandoned failure is not reported as lost

        task.add_done_callback(_forget)
        # shield: a caller's deadline cancels its wait, not the request other callers may share.
        return await asyncio.shield(task)

    async def _request(self, prompt: str, params: dict, key: str, validate) -> str:
        client, semaphore, _ = self._loop_state()
        async with semaphore:
            self.counters["requests"] += 1
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "frequency_penalty": 0,
                "presence_penalty": 0,
                **params,
            }
            try:
                response = await client.post("/chat/completions", cast_to=object, body=body)
            except openai.OpenAIError as error:
                cause = _classify(error)
                self.counters[f"errors/{cause}"] += 1
                raise JudgeError(cause, type(error).__name__) from None
            except ValueError:  # a 200 whose body is not JSON
                response = None
        try:
            text = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            self.counters["errors/bad_response"] += 1
            raise JudgeError("bad_response", "no choices[0].message.content in the reply") from None
        if not isinstance(text, str) or not text.strip():
            self.counters["errors/empty_answer"] += 1
            raise JudgeError("empty_answer")
        if validate is not None:
            try:
                validate(text)
            except ValueError as error:
                self.counters["errors/unparsable"] += 1
                raise JudgeError("unparsable", str(error)[:200]) from None
        self.cache.put(key, self.model, text)
        return text

    async def aclose(self) -> None:
        """Close the HTTP connections opened on the running loop."""
        state = self._per_loop.pop(id(asyncio.get_running_loop()), None)
        if state is not None:
            await state[1].close()

    def describe(self) -> dict[str, Any]:
        """Loggable settings (no credentials)."""
        out = asdict(self.config)
        out.update(base_url=redact_url(self.base_url), model=self.model,
                   api_key_set=bool(os.environ.get(self.config.api_key_env)))
        return out
