"""What the rollout benchmarks run: a search tool with a remote backend's varying latency, and scripted episodes.

Not a script: ``rollout.py`` imports it. Real search backends (Serper, Tavily, DuckDuckGo) answer in a few
hundred milliseconds with a long tail; the toy world's BM25 backend answers in about a millisecond.
:class:`SlowTool` wraps a real tool and sleeps first for a latency drawn from a log-normal distribution (median
``median_s``, ``sigma`` in log space, at most ``cap_s``), seeded by the call's arguments so that every loop
compared sees the same latency for the same call. The latency is simulated; the tool's work and its observation
are real.
"""

from __future__ import annotations

import json
import math
import random
import time
import zlib
from typing import Any, Sequence

from mmagent.protocol import format_tool_call
from mmagent.toolbox.base import Observation, Tool, ToolContext
from mmagent.trajectory import Task


class SlowTool(Tool):
    """``inner`` behind a remote call's latency (see the module docstring)."""

    def __init__(self, inner: Tool, median_s: float = 0.3, sigma: float = 0.75, cap_s: float = 3.0) -> None:
        self.inner, self.median_s, self.sigma, self.cap_s = inner, median_s, sigma, cap_s
        self.name, self.description, self.parameters = inner.name, inner.description, inner.parameters
        self.timeout_s = max(inner.timeout_s, cap_s + 5.0)

    def latency(self, arguments: dict[str, Any]) -> float:
        """Seconds this call waits: the same for the same arguments in every run."""
        if self.median_s <= 0:
            return 0.0
        seed = zlib.crc32(json.dumps(arguments, sort_keys=True).encode())
        return min(self.cap_s, random.Random(seed).lognormvariate(math.log(self.median_s), self.sigma))

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        time.sleep(self.latency(arguments))
        return self.inner.run(arguments, context)


def scripted_turns(n_turns: int, key: int) -> list[str]:
    """An episode of ``n_turns`` policy turns: frame re-sampling and searches taking turns, then an answer.
    ``key`` varies the windows and queries (so search latencies vary between episodes)."""
    turns = []
    for t in range(n_turns - 1):
        if t % 2 == 0:
            start = float((key + t) % 20)
            call = format_tool_call("resample_frames", {"start": start, "end": start + 8.0, "num_frames": 4})
            turns.append(f"<think>Look at {start:g}-{start + 8:g} s again.</think>{call}")
        else:
            call = format_tool_call("web_search", {"query": f"city landmark {key} {t}"})
            turns.append(f"<think>Search for it.</think>{call}")
    return turns + ["<think>Done.</think><answer>A</answer>"]


def scripted_batch(video: Task, turn_counts: Sequence[int], prefix: str = "s") -> tuple[list[Task], dict[str, list[str]]]:
    """One task per entry of ``turn_counts`` on ``video``'s clip and question, and each one's script (by task id)."""
    tasks, scripts = [], {}
    for k, n in enumerate(turn_counts):
        task = Task(question=video.question, video=video.video, id=f"{prefix}{k}-{n}t")
        tasks.append(task)
        scripts[task.id] = scripted_turns(n, k)
    return tasks, scripts
