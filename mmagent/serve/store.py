"""The server's kept episodes: sessions (KV cache and ids) under a key, within a count, a byte budget and an
idle time.

:class:`SessionStore` is least-recently-used: storing past ``max_sessions`` or ``max_bytes`` ends the oldest
sessions, a session bigger than the whole budget is not kept at all, and a session idle for ``ttl_s``
seconds is ended by :meth:`SessionStore.expire` (the engine calls it about once a second). Ending is the
policy's ``end`` (which frees the cache). Taking a session out (:meth:`SessionStore.pop`) hands it over:
the store no longer counts it. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class _Entry:
    session: Any
    nbytes: int
    last_used: float


class SessionStore:
    """Sessions under keys, least recently used first out, within a count, a byte budget and an idle time."""

    def __init__(self, end: Callable[[Any], None], sizeof: Callable[[Any], int], max_sessions: int = 64,
                 max_bytes: int = 1 << 30, ttl_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 0 or max_bytes < 0 or ttl_s <= 0:
            raise ValueError("max_sessions and max_bytes must be >= 0 and ttl_s > 0")
        self.end, self.sizeof, self.clock = end, sizeof, clock
        self.max_sessions, self.max_bytes, self.ttl_s = int(max_sessions), int(max_bytes), float(ttl_s)
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        #: sessions ended to stay within the count or the bytes, sessions ended idle, sessions too big to keep
        self.evicted = self.expired = self.refused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def pop(self, key: str) -> Any | None:
        """The session under ``key``, taken out of the store (None when there is none)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.nbytes -= entry.nbytes
            return entry.session

    def put(self, key: str, session: Any) -> bool:
        """Keep ``session`` under ``key`` (ending the oldest ones if needed); False when it was too big to keep,
        or keeping is off, and it was ended instead."""
        size = int(self.sizeof(session))
        ended = []
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
                if old.session is not session:
                    ended.append(old.session)
            kept = self.max_sessions > 0 and size <= self.max_bytes
            if kept:
                self._entries[key] = _Entry(session, size, self.clock())
                self.nbytes += size
                while len(self._entries) > self.max_sessions or self.nbytes > self.max_bytes:
                    _, entry = self._entries.popitem(last=False)
                    self.nbytes -= entry.nbytes
                    self.evicted += 1
                    ended.append(entry.session)
            else:
                self.refused += 1
                ended.append(session)
        for s in ended:
            self.end(s)
        return kept

    def expire(self) -> int:
        """End the sessions idle for longer than ``ttl_s``; how many."""
        cutoff = self.clock() - self.ttl_s
        ended = []
        with self._lock:
            while self._entries:
                key, entry = next(iter(self._entries.items()))
                if entry.last_used > cutoff:
                    break
                del self._entries[key]
                self.nbytes -= entry.nbytes
                ended.append(entry.session)
            self.expired += len(ended)
        for s in ended:
            self.end(s)
        return len(ended)

    def clear(self) -> None:
        """End every kept session."""
        with self._lock:
            ended = [e.session for e in self._entries.values()]
            self._entries.clear()
            self.nbytes = 0
        for s in ended:
            self.end(s)
