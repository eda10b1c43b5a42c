"""``mmagent train sft``: supervised fine-tuning on agent trajectories (the cold start before RL).

Run it with ``mmagent train sft --config configs/sft_synth.yaml [key=value ...]`` (or under
``accelerate launch`` for several processes). Design choices, bluntly:

* One micro-batch is one episode: every image and frame of every turn goes through the processor and the
  vision tower in one forward with its own M-RoPE positions (:mod:`mmagent.training.encode`); episodes are
  accumulated (``grad_accum`` per optimizer step) instead of padded together.
* Loss only on the policy's tokens: prompt and observation tokens have mask 0
  (:func:`mmagent.training.losses.sft_loss`).
* accelerate does devices, processes (each rank takes its share of the episodes), gradient accumulation,
  TensorBoard logging and the checkpoint state; ``resume: true`` continues from the latest checkpoint with
  the same data order, so a resumed run ends with the same weights as an uninterrupted one.
* The result is a plain transformers folder (``output_dir/final``) that ``mmagent run --model`` loads.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from mmagent.trajectory import Trajectory, load_jsonl
from mmagent.training.common import (LoraSettings, finish_logging, latest_checkpoint, load_checkpoint, load_policy,
                             make_trainable, param_fingerprint, parameter_groups, save_checkpoint, save_final)
from mmagent.training.encode import encode_trajectory, forward_logits, next_token_targets
from mmagent.training.losses import sft_loss


@dataclass
class SFTConfig:
    #: hub id or folder of the starting checkpoint
    model: str = ""
    #: trajectory JSONL files (e.g. the toy world's sft/oracle.jsonl)
    data: list[str] = field(default_factory=list)
    #: where checkpoints, TensorBoard logs and the final model go
    output_dir: str = "runs/sft"
    #: passes over the data (ignored when max_steps is set)
    epochs: int = 1
    #: optimizer steps to run; 0 = epochs * episodes / (grad_accum * processes)
    max_steps: int = 0
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    #: episodes per optimizer step (per process)
    grad_accum: int = 8
    max_grad_norm: float = 1.0
    #: pixel budget the data was made for: synth | default
    budget: str = "synth"
    freeze_vision: bool = True
    #: learning rate of the vision tower and merger when they train (None: ``lr``)
    vision_lr: float | None = None
    lora: LoraSettings = field(default_factory=LoraSettings)
    #: optimizer steps between checkpoints (0 = only at the end)
    save_every: int = 50
    log_every: int = 5
    seed: int = 0
    #: continue from the latest checkpoint in output_dir if there is one
    resume: bool = True
    #: keep each episode's encoding (token ids, pixel tensors) in memory after its first epoch instead of
    #: re-running the processor every epoch (about a fifth of a tiny model's step; costs RAM: ~5 MB per
    #: toy-world episode)
    cache_episodes: bool = False
    #: cpu, cuda, ... (default: accelerate's choice)
    device: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)
        if isinstance(self.data, str):
            self.data = [self.data]
        if self.grad_accum < 1 or self.epochs < 1:
            raise ValueError("grad_accum and epochs must be at least 1")


def load_trajectories(paths: list[str]) -> list[Trajectory]:
    if not paths:
        raise ValueError("no training data: set data to one or more trajectory JSONL files")
    out: list[Trajectory] = []
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"trajectory file not found: {p}")
        out.extend(load_jsonl(p))
    if not out:
        raise ValueError(f"no trajectories in {', '.join(paths)}")
    return out


def _order(n: int, epoch: int, seed: int) -> list[int]:
    return np.random.default_rng([seed, epoch]).permutation(n).tolist()


def train_sft(cfg: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Run SFT; returns a summary (steps, final loss, seconds, output folder)."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, log_with="tensorboard", project_dir=str(out),
                              cpu=cfg.device == "cpu")
    policy = load_policy(cfg.model, cfg.budget, device=str(accelerator.device))
    trajectories = load_trajectories(cfg.data)
    trainable = make_trainable(policy, cfg.lora, cfg.freeze_vision)
    rank, world = accelerator.process_index, accelerator.num_processes
    per_rank = math.ceil(len(trajectories) / world)
    steps_per_epoch = max(1, per_rank // cfg.grad_accum)
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(parameter_groups(trainable, cfg.lr, cfg.vision_lr), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * max(0.0, 1 - s / total_steps))
    model, optimizer, scheduler = accelerator.prepare(trainable, optimizer, scheduler)
    accelerator.init_trackers("sft", config={k: str(v) for k, v in asdict(cfg).items()})

    step, cursor = 0, 0  # optimizer steps done; episodes consumed by this rank
    ckpt = latest_checkpoint(out) if cfg.resume else None
    if ckpt is not None:
        state = load_checkpoint(accelerator, ckpt)
        step, cursor = state["step"], state["cursor"]
        accelerator.print(f"Resuming from {ckpt} (step {step})")
    bar = tqdm(total=total_steps, initial=step, desc="sft", unit="step",
               disable=not progress or not accelerator.is_local_main_process)
    t0, tokens, last_loss, window = time.perf_counter(), 0, float("nan"), []
    cache: dict[int, Any] = {}
    model.train()
    while step < total_steps:
        epoch, k = divmod(cursor, per_rank)
        order = _order(len(trajectories), epoch, cfg.seed)
        index = order[(k * world + rank) % len(order)]
        episode = cache.get(index)
        if episode is None:
            episode = encode_trajectory(policy, trajectories[index])
            if cfg.cache_episodes:
                cache[index] = episode
        with accelerator.accumulate(model):
            logits = forward_logits(model, episode)[:-1]
            targets, mask = next_token_targets(episode)
            loss = sft_loss(logits[None], targets[None].to(logits.device), mask[None].to(logits.device))
            accelerator.backward(loss)
            if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        cursor += 1
        tokens += episode.policy_tokens
        window.append(float(loss.detach()))
        if accelerator.sync_gradients:
            step += 1
            last_loss = float(np.mean(window))
            window = []
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.4f}")
            if step % cfg.log_every == 0 or step == total_steps:
                accelerator.log({"train/loss": last_loss, "train/lr": scheduler.get_last_lr()[0],
                                 "train/policy_tokens_per_s": tokens / (time.perf_counter() - t0)}, step=step)
            if cfg.save_every and step % cfg.save_every == 0 and step < total_steps:
                save_checkpoint(accelerator, out, step, {"step": step, "cursor": cursor})
    bar.close()
    save_checkpoint(accelerator, out, step, {"step": step, "cursor": cursor})
    final = None
    if accelerator.is_main_process:
        final = save_final(accelerator.unwrap_model(model), policy, out / "final",
                           {"trained_by": "mmagent train sft", "steps": step})
    accelerator.wait_for_everyone()
    finish_logging(accelerator)
    summary = {"steps": step, "loss": last_loss, "seconds": time.perf_counter() - t0,
               "episodes": len(trajectories), "final": str(final) if final else None,
               "param_fingerprint": param_fingerprint(policy.model)}
    if accelerator.is_main_process:
        (out / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
