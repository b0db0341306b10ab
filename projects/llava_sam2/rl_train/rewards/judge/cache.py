"""Persistent judge-response cache: SQLite on disk, an LRU dict in front.

Keys are opaque digests computed by the client from (model, prompt, sampling parameters); the
API key never enters them. SQLite in WAL mode lets several processes (ranks) share one file;
it needs a local file system (SQLite locking is unreliable on NFS).
"""
from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path


class ResponseCache:
    """``key -> response text`` store.

    Args:
        path: SQLite file (created with its folder); ``None`` keeps entries in memory only.
        max_memory_entries: size of the in-process LRU front.
    """

    def __init__(self, path: str | Path | None = None, max_memory_entries: int = 100_000) -> None:
        self.path = Path(path).expanduser() if path is not None else None
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, str] = OrderedDict()
        self._max_memory = max_memory_entries
        self._db: sqlite3.Connection | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, fast commits
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses "
                "(key TEXT PRIMARY KEY, model TEXT NOT NULL, response TEXT NOT NULL, created REAL NOT NULL)"
            )

    def _remember(self, key: str, value: str) -> None:
        self._memory[key] = value
        self._memory.move_to_end(key)
        if len(self._memory) > self._max_memory:
            self._memory.popitem(last=False)

    def get(self, key: str) -> str | None:
        """The cached response, or None."""
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
            if self._db is None:
                return None
            row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
            if row is not None:
                self._remember(key, row[0])
            return None if row is None else row[0]

    def put(self, key: str, model: str, response: str) -> None:
        """Store a response (last write wins)."""
        with self._lock:
            self._remember(key, response)
            if self._db is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO responses (key, model, response, created) VALUES (?, ?, ?, ?)",
                    (key, model, response, time.time()),
                )

    def __len__(self) -> int:
        with self._lock:
            if self._db is None:
                return len(self._memory)
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __repr__(self) -> str:
        return f"ResponseCache(path={str(self.path) if self.path else None!r})"
