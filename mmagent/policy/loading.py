"""Loading a policy: the one place that decides its device, its dtype and its pixel budget.

* device: the one asked for, else ``cuda`` when a GPU is visible, else ``cpu``;
* dtype: the one asked for, else float32 on the CPU (half precision is slow there and tiny models are saved
  in float32) and the checkpoint's own dtype (``"auto"``, bf16 for Qwen2.5-VL) on a GPU;
* pixel budget: the one asked for, else the one recorded in the folder's ``mmagent.json`` (a model trained
  at one budget reads images best at it), else :class:`~mmagent.policy.render.MediaBudget`'s defaults.

:func:`load_policy` gives the policy of any backend by name; ``Agent.from_pretrained``, the CLI, the server,
the demo and the trainers all load through it (or, for the transformers backend, through
:meth:`HFPolicy.from_pretrained <mmagent.policy.hf.HFPolicy.from_pretrained>`, which applies the same rule).
"""

from __future__ import annotations

import os
from typing import Any

from mmagent.policy.base import Policy
from mmagent.policy.checkpoint import saved_media_budget
from mmagent.policy.render import MediaBudget
from mmagent.policy.sampling import SamplingConfig

BACKENDS = ("hf", "vllm", "openai")


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


def load_policy(model: str | None, backend: str = "hf", *, device: str | None = None, dtype: Any = None,
                media_budget: MediaBudget | None = None, sampling: SamplingConfig | None = None,
                **kwargs: Any) -> Policy:
    """The policy of ``backend`` over ``model``.

    ``hf``: transformers in this process (``kwargs`` go to :class:`~mmagent.policy.hf.HFPolicy`); ``vllm``: the
    vLLM offline engine (``kwargs`` go to :meth:`VLLMPolicy.from_pretrained`); ``openai``: an OpenAI-compatible
    server, ``model`` being the served name (``kwargs``: ``base_url``, ``api_key``, ...).
    """
    sampling = sampling or SamplingConfig()
    if backend == "hf":
        from mmagent.policy.hf import HFPolicy

        if model is None:
            raise ValueError("give a model: a hub id such as Qwen/Qwen2.5-VL-7B-Instruct or a local folder")
        return HFPolicy.from_pretrained(model, device=device, dtype=dtype, media_budget=media_budget,
                                        sampling=sampling, **kwargs)
    if backend == "vllm":
        from mmagent.policy.vllm_engine import VLLMPolicy

        if model is None:
            raise ValueError("give a model: a hub id such as Qwen/Qwen2.5-VL-7B-Instruct or a local folder")
        return VLLMPolicy.from_pretrained(model, media_budget=budget_for(model, media_budget),
                                          temperature=sampling.temperature, top_p=sampling.top_p, **kwargs)
    if backend == "openai":
        from mmagent.policy.openai_http import OpenAIPolicy

        return OpenAIPolicy(model=model, media_budget=media_budget, temperature=sampling.temperature,
                            top_p=sampling.top_p, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; use {', '.join(BACKENDS)}")
