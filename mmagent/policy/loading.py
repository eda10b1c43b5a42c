"""Loading a policy of any backend by name: :func:`load_policy`.

``Agent.from_pretrained``, the CLI, the server and the demo load through it (the trainers through
:meth:`HFPolicy.from_pretrained <mmagent.policy.hf.HFPolicy.from_pretrained>`); the device, dtype and pixel
budget follow the one rule of :mod:`mmagent.policy.placement`.
"""

from __future__ import annotations

from typing import Any

from mmagent.policy.base import Policy
from mmagent.policy.placement import budget_for
from mmagent.policy.render import MediaBudget
from mmagent.policy.sampling import SamplingConfig

BACKENDS = ("hf", "vllm", "openai")


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
