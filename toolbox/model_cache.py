"""A process-wide cache of the models behind tools (depth, segmentation), loaded on first use.

Tools are created per agent, but their models are large: every tool instance asking for the same
(model id, device, dtype) gets the one loaded object. Loading is guarded by a lock so concurrent
episodes do not load a model twice.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_models: dict[Hashable, Any] = {}


def shared_model(key: Hashable, load: Callable[[], T]) -> T:
    """Return the object cached under ``key``, calling ``load()`` the first time."""
    with _lock:
        if key not in _models:
            _models[key] = load()
        return _models[key]


def clear_shared_models() -> None:
    """Drop every cached model (tests, or to free memory)."""
    with _lock:
        _models.clear()


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
