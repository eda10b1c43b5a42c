"""``mmagent train rl``: multi-turn GRPO / DGRPO over live agent rollouts with the real toolbox.

Run it with ``mmagent train rl --config configs/rl_synth.yaml [key=value ...]``. One step:

1. pick ``prompts_per_step`` tasks (seeded by step and process) and roll each out ``group_size`` times
   through the :class:`~mmagent.agent.Agent` — sampling policy, real tools, real observations; the
   rollouts come from the trained model itself, or with ``rollout_backend=vllm`` from an in-process vLLM
   engine that gets the new weights after every step (:mod:`mmagent.training.vllm_rollouts`);
2. score every episode (:mod:`mmagent.training.rewards`: task + format + tool-efficiency terms);
3. advantages per group (:mod:`mmagent.training.advantages`): GRPO, or DGRPO, which re-weights them by the
   group's difficulty and by each task family's running success rate; groups whose rewards are all equal
   carry no signal and are skipped (counted in the logs);
4. take one PPO-clip step (:func:`update_policy`) on the policy's tokens only
   (:func:`mmagent.training.losses.policy_loss`), with an optional KL to the frozen starting model. Rollouts
   of the trained model itself keep the inputs they encoded (``Agent(keep_model_inputs=True)``), so the
   update runs nothing through the processor again; vLLM's episodes are re-encoded from their recorded
   token ids (:mod:`mmagent.training.encode`, which checks the ids round-trip).

The update is on-policy (one pass per batch of rollouts): the ratio's "old" policy is the sampler's own
recorded log-probabilities, so it starts near 1 and the clip guards against the sampler and the trainer
drifting apart (blocked vision tokens, cache numerics, a changed temperature). Episodes are forwarded one
at a time and their losses weighted so the sum equals the chosen aggregation over the whole batch. With
several processes each rank rolls out its own prompts; ranks may keep different numbers of episodes after
zero-variance groups are skipped, so every rank pads to the same number of backward passes (weight 0) and
the engine (DDP, FSDP, DeepSpeed) averages the gradients on the last one.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from mmagent.agent import Agent, Budgets
from mmagent.policy.sampling import SamplingConfig
from mmagent.trajectory import Task, Trajectory, save_jsonl
from mmagent.training.advantages import AdvantageConfig, DifficultyTracker, compute_advantages
from mmagent.training.common import (LoraSettings, finish_logging, latest_checkpoint, load_checkpoint, load_policy,
                             make_trainable, param_fingerprint, parameter_groups, save_checkpoint, save_final)
from mmagent.training.encode import encode_trajectory, forward_logits, next_token_targets
from mmagent.training.losses import AGGREGATIONS, policy_loss, token_logprobs
from mmagent.training.rewards import RewardConfig, reward_parts
from mmagent.training.vllm_rollouts import ROLLOUT_BACKENDS, push_weights, resolve_backend, start_engine

#: tool calls per episode below which the log warns that tool use is collapsing (if the run began above it)
TOOL_COLLAPSE_RATE = 0.1
#: steps in a row without a success or a group to learn from after which the log warns that the run is stuck
STALL_STEPS = 5


def stalled(history: Sequence[dict[str, Any]], steps: int = STALL_STEPS) -> bool:
    """True when the last ``steps`` steps had no success and every group's rollouts scored alike: no group has
    an advantage, so no update happens and the policy stays where it is (measured on the tests' one-prompt
    world at rate 2e-3: an update taught the policy to drop its closing tag, every rollout then failed alike,
    and 2 runs of 16 ended at 0.0 so)."""
    last = list(history[-steps:])
    return len(last) == steps and all(r["success"] == 0 and r["zero_variance_groups"] == 1.0 for r in last)


@dataclass
class RLConfig:
    #: hub id or folder of the starting checkpoint (usually the SFT result)
    model: str = ""
    #: the folder of RL prompts, in the release layout of ``bench``
    data: str = ""
    #: which benchmark's loader reads ``data`` (any of ``mmagent eval --bench``'s names); rewards score its
    #: tasks with that benchmark's own score
    bench: str = "synth"
    #: only these toy-world task families (default: all in the data; bench=synth only)
    families: list[str] | None = None
    output_dir: str = "runs/rl"
    steps: int = 20
    prompts_per_step: int = 8
    #: rollouts per prompt (G)
    group_size: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 160
    max_turns: int = 6
    #: episodes open at once in each step's rollout (None: all ``prompts_per_step * group_size``); when one ends
    #: the next starts, so rollout memory (KV caches, pixel values) stays bounded at any batch size
    max_open: int | None = None
    tools: list[str] = field(default_factory=lambda: ["resample_frames", "zoom", "web_search"])
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    #: KL to the frozen starting model (0 = no reference model is kept)
    kl_coef: float = 0.0
    #: loss aggregation: grpo | dapo | dr_grpo | bnpo
    aggregation: str = "grpo"
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    budget: str = "synth"
    freeze_vision: bool = True
    #: learning rate of the vision tower and merger when they train (None: ``lr``)
    vision_lr: float | None = None
    lora: LoraSettings = field(default_factory=LoraSettings)
    save_every: int = 10
    #: also write every step's rollouts to output_dir/rollouts/step-N.jsonl
    save_rollouts: bool = False
    seed: int = 0
    resume: bool = True
    device: str | None = None
    #: who generates the rollouts: hf (the trained model itself), vllm (an in-process vLLM engine, GPU,
    #: weights pushed after every step) or auto (vllm when installed and a GPU is visible)
    rollout_backend: str = "hf"
    vllm_gpu_memory_utilization: float = 0.4
    vllm_max_model_len: int = 16384

    def __post_init__(self) -> None:
        for name, kind in (("advantage", AdvantageConfig), ("rewards", RewardConfig), ("lora", LoraSettings)):
            if isinstance(getattr(self, name), dict):
                setattr(self, name, kind(**getattr(self, name)))
        if self.max_open is not None and self.max_open < 1:
            raise ValueError("max_open must be at least 1 (or unset: every episode of a step open at once)")
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2: advantages compare rollouts of the same prompt")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; use {', '.join(AGGREGATIONS)}")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"unknown rollout_backend {self.rollout_backend!r}; use {', '.join(ROLLOUT_BACKENDS)}")
        _check_bench(self.bench, self.families)


def _check_bench(bench: str, families: Sequence[str] | None) -> None:
    from mmagent.eval.registry import BENCHMARKS

    if bench not in BENCHMARKS:
        raise ValueError(f"unknown bench {bench!r}; use one of {', '.join(BENCHMARKS)}")
    if families is not None and bench != "synth":
        raise ValueError(f"families picks toy-world task families, so it needs bench=synth, not bench={bench}; "
                         "leave families unset")


def load_tasks(data: str, families: Sequence[str] | None = None, bench: str = "synth") -> list[Task]:
    """The RL prompts: the tasks in folder ``data`` as benchmark ``bench``'s own loader reads them (each
    names its benchmark, whose score the rewards pay); ``families`` keeps only those toy-world families."""
    from mmagent.eval import registry

    _check_bench(bench, families)
    tasks = registry.get(bench).load(data, families=families)
    if not tasks:
        raise ValueError(f"no {bench} tasks in {data}" + (f" for families {list(families)}" if families else ""))
    return tasks


def _policy_tokens(traj: Trajectory) -> int:
    return max(1, sum(traj.response_mask))


def batch_totals(trajs: Sequence[Trajectory]) -> tuple[int, int, int]:
    """(episodes, policy tokens, longest response) of a batch, the quantities the aggregations divide by."""
    return (len(trajs), sum(_policy_tokens(t) for t in trajs),
            max((len(t.response_mask) for t in trajs), default=1))


def episode_weights(trajs: Sequence[Trajectory], aggregation: str,
                    totals: tuple[int, int, int] | None = None, world: int = 1) -> list[float]:
    """Per-episode weights on each episode's mean token loss so the sum is the batch aggregation.

    ``totals`` = (episodes, policy tokens, longest episode) over every process, when there are
    ``world`` processes whose gradients the engine averages (so each weight is multiplied by ``world``);
    ``bnpo`` normalises by this process's own tokens only.
    """
    counts = [_policy_tokens(t) for t in trajs]
    local = batch_totals(trajs)
    n, tokens, longest = totals or local
    if aggregation == "grpo":  # mean over each sequence, then over sequences
        return [world / n] * len(trajs)
    if aggregation == "dapo":  # every active token counts the same
        return [world * c / tokens for c in counts]
    if aggregation == "bnpo":  # the same, within each process
        return [c / local[1] for c in counts]
    return [world * c / (n * longest) for c in counts]  # dr_grpo: sum / (B * max length)


def _rollout_tasks(tasks: Sequence[Task], cfg: RLConfig, step: int, rank: int) -> list[Task]:
    rng = np.random.default_rng([cfg.seed, step, rank])
    picked = rng.choice(len(tasks), size=min(cfg.prompts_per_step, len(tasks)), replace=False)
    return [tasks[int(i)] for i in picked]


def train_rl(cfg: RLConfig, progress: bool = True) -> dict[str, Any]:
    """Run RL; returns a summary with the per-step log."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    accelerator = Accelerator(log_with="tensorboard", project_dir=str(out), cpu=cfg.device == "cpu")
    policy = load_policy(cfg.model, cfg.budget, device=str(accelerator.device),
                         sampling=SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p))
    tasks = load_tasks(cfg.data, cfg.families, cfg.bench)
    reference = copy.deepcopy(policy.model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    trainable = make_trainable(policy, cfg.lora, cfg.freeze_vision)
    optimizer = torch.optim.AdamW(parameter_groups(trainable, cfg.lr, cfg.vision_lr), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    model, optimizer = accelerator.prepare(trainable, optimizer)
    accelerator.init_trackers("rl", config={k: str(v) for k, v in asdict(cfg).items()})
    llm = None
    rollout_policy: Any = policy
    if resolve_backend(cfg.rollout_backend) == "vllm":
        rollout_policy = start_engine(cfg, policy.media_budget, accelerator.num_processes)
        llm = rollout_policy.llm
    agent = Agent(rollout_policy, tools=list(cfg.tools), keep_model_inputs=rollout_policy is policy,
                  max_open=cfg.max_open, budgets=Budgets(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens))
    tracker = DifficultyTracker()
    step, history = 0, []
    ckpt = latest_checkpoint(out) if cfg.resume else None
    if ckpt is not None:
        state = load_checkpoint(accelerator, ckpt)
        step, history = state["step"], state["history"]
        tracker.load_state_dict(state["tracker"])
        accelerator.print(f"Resuming from {ckpt} (step {step})")
        if llm is not None:
            push_weights(llm, accelerator.unwrap_model(model))
    bar = tqdm(total=cfg.steps, initial=step, desc="rl", unit="step",
               disable=not progress or not accelerator.is_local_main_process)
    while step < cfg.steps:
        row = rl_step(cfg, policy, model, optimizer, agent, tasks, tracker, step, accelerator, reference)
        if llm is not None:  # the next rollouts must come from the updated weights
            push_weights(llm, accelerator.unwrap_model(model))
        step += 1
        history.append(row)
        accelerator.log({f"rl/{k}": v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}")
        if row["tool_calls_per_episode"] < TOOL_COLLAPSE_RATE <= history[0]["tool_calls_per_episode"]:
            accelerator.print(f"warning: step {step}: {row['tool_calls_per_episode']:.2f} tool calls per episode "
                              "— tool use is collapsing")
        if stalled(history) and not stalled(history[:-1]):
            accelerator.print(f"warning: step {step}: for {STALL_STEPS} steps no rollout succeeded and every group's "
                              f"rollouts scored alike (format {row['format']:.2f}): with no advantage nothing is "
                              "learned; a lower lr or a KL anchor to the start (kl_coef) keeps a run out of this")
        if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
            save_checkpoint(accelerator, out, step, {"step": step, "history": history,
                                                     "tracker": tracker.state_dict()})
    bar.close()
    save_checkpoint(accelerator, out, step, {"step": step, "history": history, "tracker": tracker.state_dict()})
    about = {"trained_by": f"mmagent train rl ({cfg.advantage.mode})", "steps": step, "tools": list(cfg.tools)}
    final = save_final(accelerator.unwrap_model(model), policy, out / "final", about) \
        if accelerator.is_main_process else None
    accelerator.wait_for_everyone()
    finish_logging(accelerator)
    summary = {"steps": step, "history": history, "final": str(final) if final else None,
               "param_fingerprint": param_fingerprint(policy.model)}
    if accelerator.is_main_process:
        (out / "rl_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def rl_step(cfg: RLConfig, policy: Any, model: torch.nn.Module, optimizer: Any, agent: Agent,
            tasks: Sequence[Task], tracker: DifficultyTracker, step: int, accelerator: Any,
            reference: torch.nn.Module | None = None) -> dict[str, Any]:
    """One rollout + update step; returns its log row."""
    t0 = time.perf_counter()
    prompts = _rollout_tasks(tasks, cfg, step, accelerator.process_index)
    rollout_tasks = [t for t in prompts for _ in range(cfg.group_size)]
    seed = (cfg.seed * 1_000_003 + step * 1_009 + accelerator.process_index * 101) % (2 ** 31)
    trajs = agent.run_batch(rollout_tasks, seed=seed, progress=False)
    t_rollout = time.perf_counter() - t0
    groups = []
    for g, task in enumerate(prompts):
        members = trajs[g * cfg.group_size:(g + 1) * cfg.group_size]
        for traj in members:
            traj.rewards.update(reward_parts(traj, cfg.rewards))
        groups.append({"family": task.task_type, "prompt_id": task.id,
                       "rewards": [t.rewards["total"] for t in members],
                       "successes": [t.rewards["task"] for t in members]})
    result = compute_advantages(groups, tracker, cfg.advantage)
    kept: list[tuple[Trajectory, float]] = []
    for g, advs in enumerate(result.advantages):
        if not result.zero_variance[g]:
            kept += list(zip(trajs[g * cfg.group_size:(g + 1) * cfg.group_size], advs))
    stats = update_policy(cfg, policy, model, optimizer, kept, trajs[0], accelerator, reference)
    if cfg.save_rollouts and accelerator.is_main_process:
        save_jsonl(trajs, Path(cfg.output_dir) / "rollouts" / f"step-{step + 1:06d}.jsonl")
    calls = [len(t.tool_calls) for t in trajs]
    row: dict[str, Any] = {
        "step": step + 1, "reward": float(np.mean([t.rewards["total"] for t in trajs])),
        "success": float(np.mean([t.rewards["task"] for t in trajs])),
        "format": float(np.mean([t.rewards["format"] for t in trajs])),
        "tool_calls_per_episode": float(np.mean(calls)),
        "zero_variance_groups": float(np.mean(result.zero_variance)), "episodes_trained": len(kept),
        "rollout_s": t_rollout, "update_s": time.perf_counter() - t0 - t_rollout, **stats,
    }
    for family in sorted({t.task_type for t in prompts}):
        vals = [t.rewards["task"] for t in trajs if t.task.task_type == family]
        row[f"success_{family}"] = float(np.mean(vals))
    for key, value in result.stats.items():
        if isinstance(value, (int, float)):
            row[f"adv_{key}"] = float(value)
    return row


def update_policy(cfg: RLConfig, policy: Any, model: torch.nn.Module, optimizer: Any,
                  kept: Sequence[tuple[Trajectory, float]], spare: Trajectory, accelerator: Any,
                  reference: torch.nn.Module | None = None) -> dict[str, float]:
    """One optimizer step on the kept ``(episode, advantage)`` pairs; returns the mean loss, clip fraction,
    KL and the gradient norm. ``model`` is the prepared (trainable) module, ``policy`` encodes episodes that
    carry no model inputs of their own.

    Every process runs the same number of backward passes (the most any process kept), padding with
    ``spare`` at weight 0, and only the last one synchronises: so DDP, FSDP or DeepSpeed average the
    gradients themselves even though zero-variance groups leave ranks with different episode counts.
    """
    trajs = [t for t, _ in kept]
    local = torch.tensor(batch_totals(trajs), device=accelerator.device)
    gathered = accelerator.gather(local[None]).reshape(-1, 3)
    n_total, n_max = int(gathered[:, 0].sum()), int(gathered[:, 0].max())
    stats: dict[str, list[float]] = {"loss": [], "clip_frac": [], "kl": []}
    if n_total == 0:  # every group on every rank had equal rewards: nothing to learn from this batch
        return {k: 0.0 for k in stats} | {"grad_norm": 0.0}
    totals = (n_total, int(gathered[:, 1].sum()), int(gathered[:, 2].max()))
    weights = episode_weights(trajs, cfg.aggregation, totals, accelerator.num_processes) if trajs else []
    batch = list(zip(trajs, [a for _, a in kept], weights)) + [(spare, 0.0, 0.0)] * (n_max - len(trajs))
    scale = cfg.temperature if cfg.temperature > 0 else 1.0
    model.train()
    optimizer.zero_grad()
    for k, (traj, adv, w) in enumerate(batch):
        episode = encode_trajectory(policy, traj)
        sync = accelerator.no_sync(model) if k < len(batch) - 1 else contextlib.nullcontext()
        with sync:
            # The sampler's distribution: logits over the temperature (its recorded log-probabilities are
            # the "old" policy of the ratio).
            logits = forward_logits(model, episode)[:-1] / scale
            targets, mask = next_token_targets(episode)
            targets, mask = targets.to(logits.device), mask.to(logits.device)
            old_logp = episode.old_logprobs[1:].to(logits.device)[None]
            logp = token_logprobs(logits[None], targets[None])
            ref_logp = None
            if reference is not None:
                with torch.no_grad():
                    ref_logp = token_logprobs(forward_logits(reference, episode)[:-1][None] / scale, targets[None])
            loss, s = policy_loss(logp, old_logp, torch.tensor([adv], device=logits.device), mask[None],
                                  clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, ref_logp=ref_logp,
                                  kl_coef=cfg.kl_coef, aggregation="grpo")
            accelerator.backward(loss * w)
        if w > 0:
            stats["loss"].append(float(loss.detach()))
            stats["clip_frac"].append(s["clip_frac"])
            stats["kl"].append(s["kl"])
    grad_norm = 0.0
    if cfg.max_grad_norm > 0:
        grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
    optimizer.step()
    optimizer.zero_grad()
    return {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()} | {"grad_norm": grad_norm}
