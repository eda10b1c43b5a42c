"""What the SFT and RL trainers share: loading the policy, choosing what trains, checkpoints, saving.

* :func:`load_policy` loads a checkpoint (hub id or folder) as an :class:`~mmagent.policy.hf.HFPolicy`
  with the pixel budget the data was made for (on the CPU unless a device is given: the trainers pass
  accelerate's);
* :func:`make_trainable` freezes the vision tower (default) and adds LoRA adapters with peft when asked;
  the policy keeps the same model object, so rollouts and re-encoding see the adapters too;
* checkpoints are accelerate states (model, optimizer, scheduler, RNGs) under ``output_dir/checkpoints/
  step-NNNNNN`` plus ``trainer_state.json``; :func:`latest_checkpoint` finds the one to resume from;
* :func:`save_final` writes a plain transformers folder (LoRA merged) that ``from_pretrained`` and
  ``mmagent run --model`` load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmagent.policy.checkpoint import write_policy_record
from mmagent.policy.hf import HFPolicy
from mmagent.policy.render import MediaBudget
from mmagent.policy.sampling import SamplingConfig

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"


@dataclass
class LoraSettings:
    """LoRA adapters on the language model's attention (peft); ``enabled: false`` trains all weights."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def media_budget(name: str) -> MediaBudget:
    """``synth``: the toy world's budget; ``default``: :class:`MediaBudget`'s defaults."""
    if name == "synth":
        from mmagent.eval.synth.families import SynthConfig

        return SynthConfig().media_budget()
    if name == "default":
        return MediaBudget()
    raise ValueError(f"unknown media budget {name!r}; use 'synth' or 'default'")


def load_policy(model: str, budget: str = "synth", device: str | None = None,
                sampling: SamplingConfig | None = None) -> HFPolicy:
    """The policy to train, in float32 on any device (the optimizer updates full-precision weights)."""
    return HFPolicy.from_pretrained(model, device=device or "cpu", dtype=torch.float32,
                                    media_budget=media_budget(budget), sampling=sampling)


def make_trainable(policy: HFPolicy, lora: LoraSettings, freeze_vision: bool = True) -> torch.nn.Module:
    """Return the module to optimise (the model, or its peft wrapper) with the right weights trainable."""
    model = policy.model
    if lora.enabled:
        from peft import LoraConfig, get_peft_model

        wrapped = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                   target_modules=list(lora.target_modules)))
        trainable: torch.nn.Module = wrapped
    else:
        trainable = model
    if freeze_vision:
        for name, p in model.named_parameters():
            if ".visual." in f".{name}" or name.startswith("visual."):
                p.requires_grad_(False)
    if not any(p.requires_grad for p in trainable.parameters()):
        raise ValueError("nothing to train: every weight is frozen")
    return trainable


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def parameter_groups(module: torch.nn.Module, lr: float, vision_lr: float | None = None) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: every trainable weight at ``lr``, or, with ``vision_lr``, the vision
    tower's and merger's at that rate. A tiny vision transformer stops learning at the rates a tiny language
    model needs (measured: large digits, 32 a step, 600 steps: 0.97 at 3e-4, chance at 1e-3)."""
    params = trainable_parameters(module)
    if vision_lr is None:
        return [{"params": params, "lr": lr}]
    visual = {id(p) for name, p in module.named_parameters() if ".visual." in f".{name}"}
    groups = [{"params": [p for p in params if id(p) not in visual], "lr": lr},
              {"params": [p for p in params if id(p) in visual], "lr": vision_lr}]
    return [g for g in groups if g["params"]]


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    root = Path(output_dir) / CHECKPOINTS
    found = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
    return found[-1] if found else None


def save_checkpoint(accelerator: Any, output_dir: str | os.PathLike, step: int, state: dict[str, Any]) -> Path:
    path = Path(output_dir) / CHECKPOINTS / f"step-{step:06d}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        tmp = path / (STATE_FILE + ".part")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, path / STATE_FILE)  # written last: a checkpoint without it is incomplete
    accelerator.wait_for_everyone()
    return path


def load_checkpoint(accelerator: Any, path: Path) -> dict[str, Any]:
    accelerator.load_state(str(path))
    return json.loads((path / STATE_FILE).read_text())


def save_final(trainable: torch.nn.Module, policy: HFPolicy, out: str | os.PathLike,
               about: dict[str, Any] | None = None) -> Path:
    """A transformers folder with the trained weights (LoRA merged into a copy), the processor and
    ``mmagent.json`` (the pixel budget it was trained at, which loading it uses again, plus ``about``)."""
    import copy

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = trainable
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(out)
    policy.processor.save_pretrained(out)
    write_policy_record(out, policy.media_budget, about)
    return out


def param_fingerprint(model: torch.nn.Module) -> float:
    """A number that changes with any weight (position-weighted sum): equal on ranks whose weights agree."""
    return float(sum(p.detach().double().sum() * (k + 1) for k, p in enumerate(model.parameters())))


def finish_logging(accelerator: Any) -> None:
    """Close the trackers; unlike ``end_training`` keep the process group (the caller may still use it)."""
    for tracker in accelerator.trackers:
        tracker.finish()
