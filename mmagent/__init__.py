"""mmagent: multimodal agents that think with tools.

``from mmagent import Agent`` is the entry point; heavy modules (torch, transformers) load only
when first used, so ``import mmagent`` and ``mmagent --help`` stay fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Agent", "Budgets", "RunResult", "MediaBudget", "Task", "Trajectory", "load_jsonl", "save_jsonl"]

_LAZY = {
    "Agent": "mmagent.agent", "Budgets": "mmagent.agent", "RunResult": "mmagent.agent",
    "MediaBudget": "mmagent.policy.render", "Task": "mmagent.trajectory", "Trajectory": "mmagent.trajectory",
    "load_jsonl": "mmagent.trajectory", "save_jsonl": "mmagent.trajectory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmagent' has no attribute {name!r}")
