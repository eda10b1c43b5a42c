"""Rollout speed: the agent's engine vs the batch-synchronous loop and a naive loop, measured in one run.

Three ways to roll out the same episodes, all through :class:`~mmagent.agent.Agent` with the same tools:

* naive: one episode at a time, the whole conversation re-encoded every turn
  (``HFPolicy(reuse_cache=False, batch_decode=False)``, ``run_batch([task])`` per task);
* batch-sync: what users would otherwise pick, TRL's multi-turn tool loop (``batch_sync.BatchSyncPolicy``):
  each turn one left-padded ``model.generate`` over every open episode's whole conversation (a fresh cache
  per turn, re-prefilling everything), waiting for the slowest row, then every tool call awaited before
  the next turn;
* engine: ``Agent.run_batch`` over the transformers backend's continuous-batching stream: each episode keeps
  its KV cache across turns and prefills only its new tokens, the system prompt's cache is shared, finished
  turns leave the decode batch at once and an episode whose tool result arrives joins between two tokens,
  while tools run in a thread pool.

The tools are the real ones (``resample_frames``, ``zoom``, ``web_search`` over the offline BM25 corpus), with
``web_search`` behind a remote backend's varying latency (``workload.SlowTool``: log-normal, median
``--search-latency`` seconds; simulated, the same for the same call in every loop). Workloads:

1. the toy world played greedily by the built-in tiny Qwen2.5-VL (trained on it, so it calls tools itself);
2. scripted episodes (``ReplayChooser``) of 1, 2, 4 and 8 turns, frame re-sampling and searches taking turns:
   one batch per turn count (seconds per episode and the ratios per turn count), then all of them mixed in
   one batch (what a real RL batch looks like: short and long episodes together).

Every comparison checks that the three loops produce the same trajectories token for token (greedy) and
stops if they do not. The load average is printed beside the figures: this machine's timings swing with it.

    python benchmarks/rollout.py                  # about 10 minutes on 2 busy CPU cores
    python benchmarks/rollout.py --quick          # seconds: checks that it works, figures mean little
    python benchmarks/rollout.py --per-family 8 --turns 1,2,4,8 --scripted 8 --search-latency 0.5 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from batch_sync import BatchSyncPolicy
from mmagent.agent import Agent, Budgets
from mmagent.default_model import default_model_info, default_model_path
from mmagent.eval.benchmarks import synth
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.toolbox.registry import create_tool
from mmagent.trajectory import Task, Trajectory
from workload import SlowTool, scripted_batch

LOOPS = ("naive", "batch-sync", "engine")


def load_note() -> str:
    """The 1-minute load average against the cores, e.g. ``load 5.7 on 2 cores``."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def make_tools(search_latency: float) -> list[Any]:
    names = default_model_info()["tools"]
    return [SlowTool(create_tool(n), median_s=search_latency) if n == "web_search" else n for n in names]


def make_policy(loop: str, chooser: Any = None) -> HFPolicy:
    cls = BatchSyncPolicy if loop == "batch-sync" else HFPolicy
    fast = loop != "naive"
    return cls.from_pretrained(str(default_model_path()), device="cpu", dtype=torch.float32,
                               reuse_cache=fast, batch_decode=fast, chooser=chooser)


def run_loop(loop: str, tasks: Sequence[Task], budgets: Budgets, tools: list[Any], chooser: Any = None
             ) -> tuple[list[Trajectory], float]:
    """Roll ``tasks`` out the ``loop`` way; (trajectories, seconds)."""
    agent = Agent(make_policy(loop, chooser), tools=tools, budgets=budgets)
    t0 = time.perf_counter()
    if loop == "naive":
        trajs = [agent.run_batch([task], seed=k, progress=False)[0] for k, task in enumerate(tasks)]
    else:
        trajs = agent.run_batch(list(tasks), seed=0, progress=False)
    return trajs, time.perf_counter() - t0


def same(a: Sequence[Trajectory], b: Sequence[Trajectory]) -> int:
    """How many episodes of ``a`` and ``b`` have the same token ids, answer and tool calls."""
    return sum(x.token_ids == y.token_ids and x.answer == y.answer
               and [(c.name, c.arguments) for c in x.tool_calls] == [(c.name, c.arguments) for c in y.tool_calls]
               for x, y in zip(a, b))


@dataclass
class Comparison:
    """One workload rolled out the three ways: best seconds of each, and its trajectories."""

    label: str
    episodes: int
    seconds: dict[str, float]
    identical: dict[str, int]  # per loop: episodes identical to the engine's
    policy_turns: int
    tool_calls: int
    load: str
    #: per loop: tokens run through the model before each turn's first new token, summed (the prefill work)
    prefilled: dict[str, int] = field(default_factory=dict)
    #: the engine's floor: the longest time one episode spent waiting on its own tools (no batching shortens it)
    tool_wait: float = 0.0

    def ratio(self, baseline: str) -> float:
        return self.seconds[baseline] / self.seconds["engine"]


def compare(label: str, tasks: Sequence[Task], budgets: Budgets, tools: list[Any], script: Any = None,
            repeats: int = 1) -> Comparison:
    """Roll ``tasks`` out with each loop ``repeats`` times (alternating, best time counts: load from elsewhere
    hits all of them) and check every loop's trajectories equal the engine's."""
    best = {loop: float("inf") for loop in LOOPS}
    trajs: dict[str, list[Trajectory]] = {}
    load = load_note()
    for _ in range(repeats):
        for loop in LOOPS:
            trajs[loop], t = run_loop(loop, tasks, budgets, tools, ReplayChooser(script) if script else None)
            best[loop] = min(best[loop], t)
    identical = {loop: same(trajs[loop], trajs["engine"]) for loop in LOOPS}
    if min(identical.values()) != len(tasks):
        raise AssertionError(f"{label}: the loops disagree ({identical} of {len(tasks)} identical)")
    engine = trajs["engine"]
    return Comparison(label, len(tasks), best, identical,
                      sum(sum(t.role == "assistant" for t in x.turns) for x in engine),
                      sum(len(x.tool_calls) for x in engine), f"{load} -> {load_note()}",
                      tool_wait=max(sum(t.seconds for t in x.turns if t.role == "tool") for x in engine),
                      prefilled={loop: sum(t.prefill_tokens for x in trajs[loop] for t in x.turns if t.role == "assistant")
                       for loop in LOOPS})


def print_comparison(c: Comparison) -> None:
    print(f"{c.label}: {c.episodes} episodes ({c.policy_turns} policy turns, {c.tool_calls} tool calls), {c.load}")
    for loop in LOOPS:
        ratio = "" if loop == "engine" else f"   engine is {c.ratio(loop):.2f}x this"
        print(f"  {loop:10s} {c.seconds[loop]:7.2f} s  {c.episodes / c.seconds[loop]:6.2f} episodes/s"
              f"   identical: {c.identical[loop]}/{c.episodes}   prefilled {c.prefilled[loop]:6d} tokens{ratio}")
    print(f"  (the engine's floor: one episode waited {c.tool_wait:.2f} s on its own tool calls in a row)")


def run(per_family: int, turn_counts: Sequence[int], scripted: int, repeats: int, search_latency: float,
        visual_budget: int = 200, quick: bool = False) -> list[Comparison]:
    """Every comparison of the module docstring, printed as it is measured."""
    tools = make_tools(search_latency)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tasks = synth.build(tmp, per_family=per_family, seed=1, progress=False)
        video = next(t for t in tasks if t.video)
        if quick:
            tasks = tasks[:2]
        else:  # warm-up: first-call costs (the search index, the kernels) out of every timing
            for loop in ("engine", "batch-sync"):
                run_loop(loop, tasks[:2], Budgets(max_turns=6, max_new_tokens=160), tools)
            warm, script = scripted_batch(video, [3], prefix="warm-")
            run_loop("engine", warm, Budgets(max_turns=3, max_new_tokens=160), tools, ReplayChooser(script))
        out.append(compare("toy world, built-in model, greedy", tasks, Budgets(max_turns=6, max_new_tokens=160),
                           tools, repeats=repeats))
        print_comparison(out[-1])
        for n in turn_counts:
            batch, script = scripted_batch(video, [n] * scripted, prefix=f"t{n}-")
            out.append(compare(f"scripted, {n} turns", batch, Budgets(max_turns=n, max_new_tokens=160), tools,
                               script, repeats=1))
            print_comparison(out[-1])
        n = max(turn_counts)
        batch, script = scripted_batch(video, [n] * scripted, prefix="vb-")
        v0, v1, m0, m1 = visual_budget_effect(batch, n, script, tools, visual_budget)
        print(f"visual-token budget ({n} turns, engine): {v0} -> {v1} visual tokens per episode with a budget of "
              f"{visual_budget}, peak KV cache {m0:.1f} -> {m1:.1f} MiB")
        if len(set(turn_counts)) > 1:
            mixed = [turn_counts[k % len(turn_counts)] for k in range(scripted * len(turn_counts) // 2)]
            batch, script = scripted_batch(video, mixed, prefix="mix-")
            out.append(compare(f"scripted, mixed {sorted(set(mixed))} turns", batch,
                               Budgets(max_turns=max(mixed), max_new_tokens=160), tools, script, repeats=1))
            print_comparison(out[-1])
    return out


def visual_budget_effect(tasks: Sequence[Task], n_turns: int, script: Any, tools: list[Any], budget: int
                         ) -> tuple[int, int, float, float]:
    """The engine on ``tasks`` without and with a visual-token budget of ``budget`` per episode: (visual tokens
    of the first episode, the same with the budget, peak MiB of the stacked KV caches, the same with it)."""
    found = []
    for b in (Budgets(max_turns=n_turns, max_new_tokens=160),
              Budgets(max_turns=n_turns, max_new_tokens=160, max_visual_tokens=budget)):
        policy, streams = make_policy("engine", ReplayChooser(script)), []
        make_stream = policy.stream
        policy.stream = lambda n: streams.append(make_stream(n)) or streams[-1]
        trajs = Agent(policy, tools=tools, budgets=b).run_batch(list(tasks), progress=False)
        found.append((trajs[0].visual_tokens, streams[-1].peak_cache_bytes / 2 ** 20))
    return found[0][0], found[1][0], found[0][1], found[1][1]


def print_summary(rows: Sequence[Comparison]) -> None:
    print("\nsummary: engine speed-up over each baseline, measured in this run")
    print(f"  {'workload':40s} {'vs naive':>9s} {'vs batch-sync':>14s}   load")
    for c in rows:
        print(f"  {c.label:40s} {c.ratio('naive'):8.2f}x {c.ratio('batch-sync'):13.2f}x   {c.load}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=6, help="toy-world items per family (default: %(default)s)")
    ap.add_argument("--turns", default="1,2,4,8", help="turn counts of the scripted episodes (default: %(default)s)")
    ap.add_argument("--scripted", type=int, default=8, help="scripted episodes per turn count (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="rounds of the toy-world comparison; each loop's best time counts (default: %(default)s)")
    ap.add_argument("--search-latency", type=float, default=0.3,
                    help="median seconds of a web_search call (log-normal, sigma 0.75; default: %(default)s)")
    ap.add_argument("--visual-budget", type=int, default=200,
                    help="visual tokens per episode for the memory line (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs (seconds)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.per_family, args.turns, args.scripted, args.repeats, args.search_latency = 1, "1,3", 2, 1, 0.01
    torch.manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}, {load_note()}, web_search median latency {args.search_latency} s")
    rows = run(args.per_family, [int(x) for x in args.turns.split(",")], args.scripted, args.repeats,
               args.search_latency, args.visual_budget, args.quick)
    print_summary(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
