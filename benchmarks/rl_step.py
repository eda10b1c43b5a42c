"""One ``mmagent train rl`` step on the toy world, profiled: where its time goes, and RL episodes per second.

Sets up exactly what ``train_rl`` sets up (the built-in tiny Qwen2.5-VL as the starting policy, the toy world
as prompts, the real tools, ``Agent(keep_model_inputs=True)``) and runs :func:`mmagent.training.rl.rl_step`
itself, timing its parts with ``perf_counter`` wrappers around the public functions it calls:

* rollout: ``Agent.run_batch`` (of which ``processor``: the real processor turning views into ids and pixel
  values, and ``model inputs``: the rollout handing each finished episode's inputs to training);
* re-encoding in the update: ``encode_trajectory`` (the episode as one forward's inputs; with the rollout's
  kept inputs it only checks them);
* forward (``forward_logits``), backward (``accelerator.backward``), optimizer (clip + ``optimizer.step``);
* the rest: rewards, advantages, the loss arithmetic;
* vision tower: the (frozen) vision encoder's share, inside the rollout's prefills and the update's forward.

Step 0 is a warm-up (first-call costs); the figures are the mean of the following ``--steps`` steps. The
baseline is the same step with the rollout re-encoded for the update (``keep_model_inputs=False``:
``encode_trajectory`` opens the media and runs the processor again), measured in the same run. The load
average is printed beside the figures.

    python benchmarks/rl_step.py             # about 2 minutes on 2 CPU cores
    python benchmarks/rl_step.py --quick     # seconds: checks that it works
    python benchmarks/rl_step.py --prompts 8 --group 4 --steps 3
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import mmagent.training.rl as rl
from mmagent.agent import Agent, Budgets
from mmagent.default_model import default_model_path
from mmagent.eval.benchmarks import synth
from mmagent.policy.sampling import SamplingConfig
from mmagent.training.advantages import DifficultyTracker
from mmagent.training.common import load_policy, make_trainable, trainable_parameters

TIMES: dict[str, float] = defaultdict(float)


def load_note() -> str:
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` adding its wall time to ``TIMES[label]``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[label] += time.perf_counter() - t0
    return wrapper


class TimedProcessor:
    """The policy's processor, its calls timed (every other attribute passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.call = timed("processor", inner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def setup(data: str, out: str, prompts: int, group: int, keep_inputs: bool, max_open: int | None
          ) -> tuple[Any, ...]:
    """What ``train_rl`` builds before its first step, with the timing wrappers in place."""
    from accelerate import Accelerator

    cfg = rl.RLConfig(model=str(default_model_path()), data=data, output_dir=out, prompts_per_step=prompts,
                      group_size=group, device="cpu", max_new_tokens=160, max_turns=6, max_open=max_open)
    accelerator = Accelerator(cpu=True)
    policy = load_policy(cfg.model, cfg.budget, device=str(accelerator.device),
                         sampling=SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p))
    policy.processor = TimedProcessor(policy.processor)
    policy.model_inputs = timed("model inputs", policy.model_inputs)
    visual = policy.model.model.visual  # frozen: it runs in the rollout's prefills and again in the update
    visual.forward = timed("vision tower", visual.forward)
    trainable = make_trainable(policy, cfg.lora, cfg.freeze_vision)
    optimizer = torch.optim.AdamW(trainable_parameters(trainable), lr=cfg.lr)
    model, optimizer = accelerator.prepare(trainable, optimizer)
    optimizer.step = timed("optimizer", optimizer.step)
    accelerator.backward = timed("backward", accelerator.backward)
    accelerator.clip_grad_norm_ = timed("optimizer", accelerator.clip_grad_norm_)
    agent = Agent(policy, tools=list(cfg.tools), keep_model_inputs=keep_inputs, max_open=cfg.max_open,
                  budgets=Budgets(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens))
    agent.run_batch = timed("rollout", agent.run_batch)
    return cfg, policy, model, optimizer, agent, rl.load_tasks(data), DifficultyTracker(), accelerator


def profile(variants: dict[str, tuple[bool, int | None]], data: str, out: str, prompts: int, group: int,
            steps: int) -> dict[str, dict[str, float]]:
    """Per variant (keep the rollout's inputs?, max_open): mean seconds per step of each part over ``steps``
    steps after a warm-up step, plus ``episodes`` and the load seen. The variants take turns step by step (who
    goes first rotating), so load from elsewhere hits them alike."""
    built = {name: setup(data, f"{out}/{k}", prompts, group, keep, cap)
             for k, (name, (keep, cap)) in enumerate(variants.items())}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    loads = [load_note()]
    for step in range(steps + 1):
        order = list(built.items())
        order = order[step % len(order):] + order[:step % len(order)]  # who goes first rotates
        for name, (cfg, policy, model, optimizer, agent, tasks, tracker, accelerator) in order:
            TIMES.clear()
            t0 = time.perf_counter()
            rl.rl_step(cfg, policy, model, optimizer, agent, tasks, tracker, step, accelerator)
            if step:
                rows[name].append(dict(TIMES, step=time.perf_counter() - t0))
    loads.append(load_note())
    result = {}
    for name, rs in rows.items():
        mean = {k: sum(r.get(k, 0.0) for r in rs) / len(rs) for k in {k for r in rs for k in r}}
        result[name] = mean | {"episodes": prompts * group, "load": " -> ".join(loads)}
    return result


PARTS = ("rollout", "processor", "model inputs", "encode", "forward", "backward", "optimizer", "vision tower")


def print_profile(label: str, p: dict[str, Any]) -> None:
    step = p["step"]
    rest = step - sum(p.get(k, 0.0) for k in ("rollout", "encode", "forward", "backward", "optimizer"))
    print(f"{label}: {step:.2f} s per step, {p['episodes'] / step:.2f} RL episodes/s")
    for k in PARTS:
        inner = {"processor": "  (inside rollout)", "model inputs": "  (inside rollout)",
                 "vision tower": "  (inside rollout and forward)"}.get(k, "")
        print(f"  {k:13s} {p.get(k, 0.0):7.3f} s  {100 * p.get(k, 0.0) / step:5.1f}%{inner}")
    print(f"  {'rest':13s} {rest:7.3f} s  {100 * rest / step:5.1f}%  (rewards, advantages, loss arithmetic)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (default: %(default)s)")
    ap.add_argument("--group", type=int, default=4, help="rollouts per prompt (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs (seconds)")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.steps = 1, 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rl.encode_trajectory = timed("encode", rl.encode_trajectory)
    rl.forward_logits = timed("forward", rl.forward_logits)
    n = args.prompts * args.group
    variants = {"rollout inputs kept (default)": (True, None),
                f"kept, streamed with max_open={max(1, n // 2)}": (True, max(1, n // 2)),
                "baseline: episodes re-encoded for the update": (False, None)}
    with tempfile.TemporaryDirectory() as tmp:
        synth.build(Path(tmp) / "toy", per_family=4, seed=0, progress=False)
        print(f"torch threads {torch.get_num_threads()}, {load_note()}, {args.prompts} prompts x {args.group} "
              f"rollouts per step, mean of {args.steps} step(s) after a warm-up step")
        found = profile(variants, str(Path(tmp) / "toy"), tmp, args.prompts, args.group, args.steps)
    for name, p in found.items():
        print_profile(f"{name} ({p['load']})", p)
    kept, streamed, again = found.values()
    print(f"\nre-encoding share of the step: {100 * kept.get('encode', 0) / kept['step']:.1f}% with the rollout's "
          f"inputs kept, {100 * again.get('encode', 0) / again['step']:.1f}% re-encoded")
    for name, p in found.items():
        print(f"  {name:48s} {p['episodes'] / p['step']:6.2f} RL episodes/s  {again['step'] / p['step']:5.2f}x "
              f"the re-encoding baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
