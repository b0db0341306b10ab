"""A background event loop for calling async rewards from synchronous training code.

The judge's ``openai.AsyncOpenAI`` client and its connection pool belong to one event loop, so
every step must use the same loop: a fresh ``asyncio.run`` per step would rebuild the connection
pool and break connections left from the last loop. :class:`AsyncRunner` keeps one loop alive in a
daemon thread; :meth:`AsyncRunner.run` submits a coroutine and blocks for its result.
"""
from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class AsyncRunner:
    """One event loop in a daemon thread, started on first use."""

    def __init__(self, name: str = "rewards-async") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the background loop and return its result (raises its exception)."""
        loop = self._ensure_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise RuntimeError("AsyncRunner.run called from its own loop; await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)
        if not loop.is_running():
            loop.close()


_DEFAULT: AsyncRunner | None = None


def default_runner() -> AsyncRunner:
    """The process-wide runner shared by every composer (so they share judge connections)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AsyncRunner()
        atexit.register(_DEFAULT.close)
    return _DEFAULT
