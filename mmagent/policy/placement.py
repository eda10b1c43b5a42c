"""Where and how a policy's model loads: its device, its dtype and its pixel budget (the one rule).

* device: the one asked for, else ``cuda`` when a GPU is visible, else ``cpu``;
* dtype: the one asked for, else float32 on the CPU (half precision is slow there and tiny models are saved
  in float32) and the checkpoint's own dtype (``"auto"``, bf16 for Qwen2.5-VL) on a GPU;
* pixel budget: the one asked for, else the one recorded in the folder's ``mmagent.json`` (a model trained
  at one budget reads images best at it), else :class:`~mmagent.policy.render.MediaBudget`'s defaults.

:meth:`HFPolicy.from_pretrained <mmagent.policy.hf.HFPolicy.from_pretrained>` and
:func:`~mmagent.policy.loading.load_policy` apply it; nothing else decides a device or a dtype.
"""

from __future__ import annotations

import os
from typing import Any

from mmagent.policy.checkpoint import saved_media_budget
from mmagent.policy.render import MediaBudget


def placement(device: str | None = None, dtype: Any = None) -> tuple[str, Any]:
    """(device, dtype) a transformers model loads with (see the module docstring)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else "auto"
    return device, dtype


def is_local(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a local folder (an existing path, or one written as a path)."""
    return os.path.isabs(name_or_path) or name_or_path.startswith((".", "~")) or os.path.exists(name_or_path)


def budget_for(name_or_path: str, media_budget: MediaBudget | None) -> MediaBudget | None:
    """``media_budget``, else the one a local checkpoint folder records (None for a hub id)."""
    if media_budget is not None or not is_local(name_or_path):
        return media_budget
    folder = os.path.expanduser(name_or_path)
    return saved_media_budget(folder) if os.path.isdir(folder) else None
