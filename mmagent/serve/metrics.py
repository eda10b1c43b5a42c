"""The server's counters, for ``GET /health`` (JSON) and ``GET /metrics`` (Prometheus text format).

:class:`Metrics` counts requests by outcome and tokens, and measures generation speed over a sliding
window; the engine adds what it knows at the moment of asking (queue depth, requests in the batch, kept
sessions and their bytes). Thread-safe.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Metrics:
    """Request and token counters, and tokens per second over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()
        self.counts: dict[str, int] = {
            "requests": 0,  # admitted to the engine (checked, in the queue)
            "invalid": 0,  # refused before the queue: not JSON, a field out of range, an unknown model, too big
            "completed": 0,  # answered with a completion
            "failed": 0,  # refused or failed after admission (unreadable media, model errors)
            "rejected_busy": 0,  # refused with 503: the queue was full
            "cancelled": 0,  # the client left before its turn was done
            "session_hits": 0,  # picked up a kept session
            "session_misses": 0,  # encoded from the messages
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def generated(self, tokens: int) -> None:
        """``tokens`` new tokens just came out of the model."""
        now = time.monotonic()
        with self._lock:
            self.counts["completion_tokens"] += tokens
            self._recent.append((now, tokens))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def tokens_per_second(self) -> float:
        """New tokens a second over the window (or since the start, when that is shorter)."""
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            total = sum(n for _, n in self._recent)
        return total / max(1e-9, min(self.window_s, now - self.started))

    def snapshot(self, **gauges: Any) -> dict[str, Any]:
        """Every counter, the speed, the uptime and the caller's ``gauges``, as one flat dict."""
        with self._lock:
            out: dict[str, Any] = dict(self.counts)
        out["tokens_per_second"] = round(self.tokens_per_second(), 3)
        out["uptime_s"] = round(time.monotonic() - self.started, 3)
        rss = resident_bytes()
        if rss is not None:
            out["resident_bytes"] = rss
        out.update(gauges)
        return out


_HELP = {
    "requests": ("counter", "requests admitted to the engine"),
    "invalid": ("counter", "requests refused with a 4xx before the queue"),
    "completed": ("counter", "requests answered with a completion"),
    "failed": ("counter", "admitted requests that ended in an error"),
    "rejected_busy": ("counter", "requests refused with 503 because the queue was full"),
    "cancelled": ("counter", "requests whose client left before the answer"),
    "session_hits": ("counter", "requests that continued a kept session"),
    "session_misses": ("counter", "requests encoded from their messages"),
    "prompt_tokens": ("counter", "prompt tokens of answered requests"),
    "completion_tokens": ("counter", "tokens generated"),
    "tokens_per_second": ("gauge", "tokens generated per second over the last minute"),
    "uptime_s": ("gauge", "seconds since the server started"),
    "resident_bytes": ("gauge", "resident memory of the server process"),
    "queue_depth": ("gauge", "requests waiting for a place in the batch"),
    "queue_limit": ("gauge", "requests that may wait before new ones get 503"),
    "running": ("gauge", "requests being generated"),
    "cache_sessions": ("gauge", "kept sessions (KV caches between turns)"),
    "cache_bytes": ("gauge", "bytes held by kept sessions"),
    "cache_budget_bytes": ("gauge", "byte budget of kept sessions"),
    "cache_evicted": ("counter", "kept sessions ended to stay within the count or byte budget"),
    "cache_expired": ("counter", "kept sessions ended after their idle time"),
}


def prometheus_text(snapshot: dict[str, Any], prefix: str = "mmagent_") -> str:
    """``snapshot`` in the Prometheus text exposition format (numbers only; counters end in ``_total``)."""
    lines = []
    for name, value in snapshot.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        kind, doc = _HELP.get(name, ("gauge", name.replace("_", " ")))
        metric = prefix + name + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {metric} {doc}", f"# TYPE {metric} {kind}", f"{metric} {value}"]
    return "\n".join(lines) + "\n"
