"""vLLM as RL's rollout generator: start the engine beside the trainer and push the trained weights into it.

``mmagent train rl rollout_backend=vllm`` (GPU, ``pip install mmagent[vllm]``) generates the rollouts with
an in-process ``vllm.LLM`` (:class:`~mmagent.policy.vllm_engine.VLLMPolicy` with ``token_in_out=True``,
so every episode carries the exact ids, mask and sampling log-probabilities the update needs) while the
transformers model is trained; after each optimizer step :func:`push_weights` loads the new weights into
the engine's model, the way TRL's colocate mode does, and drops the prefix cache (it holds keys and values
of the old weights). ``rollout_backend=auto`` picks vLLM when it is installed and a GPU is visible.

It runs in one process: with several (``accelerate launch``) each rank would need its own engine and
device share, which is not wired yet, so that combination is refused with a message.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Iterator

import torch

ROLLOUT_BACKENDS = ("hf", "vllm", "auto")


def resolve_backend(name: str) -> str:
    """``hf`` or ``vllm`` for a ``rollout_backend`` that :class:`~mmagent.training.rl.RLConfig` has checked."""
    if name == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"
    return name


def start_engine(cfg: Any, media_budget: Any, num_processes: int) -> Any:
    """The rollout policy: a :class:`VLLMPolicy` on ``cfg.model`` that records ids and log-probabilities."""
    from mmagent.policy.vllm_engine import VLLMPolicy

    if num_processes > 1:
        raise ValueError("rollout_backend=vllm runs in a single process for now; under `accelerate launch` with "
                         "several processes use rollout_backend=hf")
    return VLLMPolicy.from_pretrained(cfg.model, media_budget=media_budget, temperature=cfg.temperature,
                                      top_p=cfg.top_p, seed=cfg.seed, token_in_out=True,
                                      gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                      max_model_len=cfg.vllm_max_model_len, logprobs_mode="processed_logprobs")


def engine_model(llm: Any) -> Any:
    """The ``torch.nn.Module`` inside an in-process ``vllm.LLM`` (V1 engine, multiprocessing off)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError as exc:
        raise RuntimeError("cannot reach the model inside the vLLM engine to update its weights (it must run "
                           "in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0)") from exc


def trained_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of ``model``'s weights as a plain checkpoint would name them.

    A peft model yields its base weights with the adapters merged in: call this inside
    :func:`merged` (or on a model without adapters).
    """
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        yield name, tensor.detach()


class merged:
    """Context manager: a peft model's adapters merged into its weights inside, unmerged after."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.is_peft = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")

    def __enter__(self) -> torch.nn.Module:
        if self.is_peft:
            self.model.merge_adapter()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        if self.is_peft:
            self.model.unmerge_adapter()


@torch.no_grad()
def push_weights(llm: Any, model: torch.nn.Module) -> int:
    """Load ``model``'s current weights (adapters merged) into ``llm``; return how many tensors were sent."""
    target = engine_model(llm)
    with merged(model) as m:
        weights = list(trained_weights(m))
        target.load_weights(iter(weights))
    llm.reset_prefix_cache()
    return len(weights)
