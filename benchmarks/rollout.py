"""Rollout speed: the agent's engine vs a naive loop, on the toy world, measured in one run.

* naive: one episode at a time, the whole conversation re-encoded every turn
  (``HFPolicy(reuse_cache=False, batch_decode=False)``, ``run_batch([task])`` per task);
* engine: every episode at once (``Agent.run_batch`` over the transformers backend's continuous-batching
  stream): each episode keeps its KV cache across turns and prefills only its new tokens, the system
  prompt's cache is computed once and shared, sessions that are ready prefill together in one forward,
  the open episodes decode together (a finished turn leaves the batch at once, a session whose tool
  result arrives joins between two tokens), and media opening and tool calls run in a thread pool
  while the others keep generating.

Both run the built-in tiny Qwen2.5-VL (trained on the toy world, so it really calls tools) greedily on the
same held-out toy-world tasks; the script checks the trajectories are identical token for token and prints
episodes/s and the ratio. Then it times scripted episodes of 1, 2, 4 and 8 turns (each turn a
``resample_frames`` call, the last the answer) both ways, to show how time per episode grows with turns,
and the engine's peak KV-cache memory with and without a visual-token budget (with it, memory stops
growing once the budget is spent: later images become a text note).

    python benchmarks/rollout.py                  # about 3 minutes on 2 CPU cores
    python benchmarks/rollout.py --per-family 8 --turns 1,2,4,8 --scripted 8 --visual-budget 300 --repeats 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Sequence

import torch

from mmagent.eval.benchmarks import synth
from mmagent.agent import Agent, Budgets
from mmagent.default_model import default_model_info, default_model_path
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.trajectory import Task, Trajectory

TOOLS = default_model_info()["tools"]


def _policy(fast: bool, chooser=None) -> HFPolicy:
    return HFPolicy.from_pretrained(str(default_model_path()), device="cpu", dtype=torch.float32,
                                    reuse_cache=fast, batch_decode=fast, chooser=chooser)


def run_naive(tasks: Sequence[Task], budgets: Budgets, chooser=None) -> tuple[list[Trajectory], float]:
    agent = Agent(_policy(False, chooser), tools=TOOLS, budgets=budgets, max_workers=1)
    t0 = time.perf_counter()
    trajs = [agent.run_batch([task], seed=k, progress=False)[0] for k, task in enumerate(tasks)]
    return trajs, time.perf_counter() - t0


def run_engine(tasks: Sequence[Task], budgets: Budgets, chooser=None) -> tuple[list[Trajectory], float, int]:
    """(trajectories, seconds, peak bytes of the stacked KV caches)."""
    policy = _policy(True, chooser)
    streams = []
    make_stream = policy.stream
    policy.stream = lambda n: streams.append(make_stream(n)) or streams[-1]
    agent = Agent(policy, tools=TOOLS, budgets=budgets)
    t0 = time.perf_counter()
    trajs = agent.run_batch(list(tasks), seed=0, progress=False)
    return trajs, time.perf_counter() - t0, streams[-1].peak_cache_bytes


def _same(a: Sequence[Trajectory], b: Sequence[Trajectory]) -> int:
    return sum(x.token_ids == y.token_ids and x.answer == y.answer for x, y in zip(a, b))


def scripted_turns(n_turns: int) -> list[str]:
    call = format_tool_call("resample_frames", {"start": 10.0, "end": 20.0, "num_frames": 4})
    return [f"<think>Look at 10-20 s again.</think>{call}"] * (n_turns - 1) + ["<think>Done.</think><answer>A</answer>"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=6, help="toy-world items per family (default: %(default)s)")
    ap.add_argument("--turns", default="1,2,4,8", help="turn counts of the scripted episodes")
    ap.add_argument("--scripted", type=int, default=8, help="scripted episodes per turn count")
    ap.add_argument("--repeats", type=int, default=2,
                    help="rounds of the toy-world comparison; the best time of each side counts (default: %(default)s)")
    ap.add_argument("--visual-budget", type=int, default=200,
                    help="visual tokens per episode for the memory column (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = synth.build(tmp, per_family=args.per_family, seed=1, progress=False)
        budgets = Budgets(max_turns=6, max_new_tokens=160)
        run_engine(tasks[:2], budgets)  # warm-up: first-call costs out of both timings
        t_naive = t_engine = float("inf")
        for _ in range(args.repeats):  # alternate the two, keep each one's best: load from elsewhere hits both
            naive, t = run_naive(tasks, budgets)
            t_naive = min(t_naive, t)
            engine, t, _ = run_engine(tasks, budgets)
            t_engine = min(t_engine, t)
        turns = sum(sum(t.role == "assistant" for t in x.turns) for x in engine)
        calls = sum(len(x.tool_calls) for x in engine)
        print(f"toy world, {len(tasks)} episodes ({turns} policy turns, {calls} tool calls), greedy:")
        print(f"  naive loop : {t_naive:7.2f} s  {len(tasks) / t_naive:6.2f} episodes/s")
        print(f"  engine     : {t_engine:7.2f} s  {len(tasks) / t_engine:6.2f} episodes/s")
        print(f"  speed-up   : {t_naive / t_engine:.2f}x   identical trajectories: {_same(naive, engine)}/{len(tasks)}")

        video = next(t for t in tasks if t.video)
        print(f"\nscripted episodes ({args.scripted} at once for the engine): seconds per episode, and the "
              f"engine's peak KV cache\nwithout / with a budget of {args.visual_budget} visual tokens per episode")
        print("  turns   naive  engine  ratio   visual tokens   peak KV MiB")
        for n in [int(x) for x in args.turns.split(",")]:
            batch = [Task(question=video.question, video=video.video, id=f"s{k}") for k in range(args.scripted)]
            script = scripted_turns(n)
            b = Budgets(max_turns=n, max_new_tokens=160)
            a, t_a = run_naive(batch, b, ReplayChooser(script))
            e, t_e, peak = run_engine(batch, b, ReplayChooser(script))
            assert _same(a, e) == len(batch), "the two loops disagree"
            assert all(sum(t.role == "assistant" for t in x.turns) == n for x in e)
            capped, _, peak_capped = run_engine(batch, Budgets(max_turns=n, max_new_tokens=160,
                                                               max_visual_tokens=args.visual_budget),
                                                ReplayChooser(script))
            vis = f"{e[0].visual_tokens:5d} / {capped[0].visual_tokens:5d}"
            print(f"  {n:5d} {t_a / len(batch):7.3f} {t_e / len(batch):7.3f} {t_a / t_e:6.2f}x   {vis}   "
                  f"{peak / 2 ** 20:5.1f} / {peak_capped / 2 ** 20:5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
