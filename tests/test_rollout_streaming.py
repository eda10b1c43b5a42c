"""Rollouts stream in RL and eval (at most ``max_open`` / ``--batch-size`` episodes in flight, a finished one
replaced at once rather than a chunk waiting for its slowest episode), and the rollout benchmark's
batch-synchronous baseline produces the engine's trajectories."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from mmagent.default_model import default_model_path
from mmagent.eval.benchmarks import synth
from mmagent.eval.runner import run_eval
from mmagent.agent import Agent, Budgets
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.toolbox.base import Observation, Tool
from mmagent.trajectory import Task
from mmagent.training.rl import RLConfig, train_rl

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CALL = format_tool_call("resample_frames", {"start": 0.0, "end": 2.0, "num_frames": 2})


@pytest.fixture
def in_flight(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, int]]]:
    """Before every step of every transformers turn stream: the (task id, turn) of each episode in flight."""
    steps: list[list[tuple[str, int]]] = []
    make = HFPolicy.stream

    def stream(self, max_new_tokens):
        inner = make(self, max_new_tokens)
        step = inner.step

        def recorded():
            steps.append([(s.task.id, s.turn) for s in inner.sessions()])
            for hook in HOOKS:
                hook(steps[-1])
            return step()

        inner.step = recorded
        return inner

    monkeypatch.setattr(HFPolicy, "stream", stream)
    yield steps
    HOOKS.clear()


HOOKS: list = []  # called with each recorded step


class Gate(Tool):
    """A tool that answers only once ``opened`` is set (or after 30 s)."""

    name = "gate"
    description = "wait"
    parameters = {"type": "object", "properties": {}, "required": []}

    def __init__(self) -> None:
        self.opened = threading.Event()

    def run(self, arguments: dict, context) -> Observation:
        return Observation(text="open" if self.opened.wait(30) else "timed out")


def test_eval_keeps_batch_size_episodes_in_flight_and_refills_at_once(tiny_model_dir, video_path, in_flight,
                                                                       tmp_path):
    gate = Gate()
    call = format_tool_call("gate", {})
    script = {"a": [call, "<answer>A</answer>"], "b": ["<answer>B</answer>"], "c": ["<answer>C</answer>"],
              "d": ["<answer>D</answer>"], "e": ["<answer>A</answer>"]}
    tasks = [Task(question="What colour?", video=str(video_path), id=k, options=["A. x", "B. y", "C. z", "D. w"],
                  answer="A", task_type="video_qa", benchmark="synth") for k in "abcde"]
    # a's tool call answers once c is generating: chunked by two, c would wait for a to end (and a for c)
    HOOKS.append(lambda step: ("c", 0) in step and gate.opened.set())
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(script))
    agent = Agent(policy, tools=[gate], budgets=Budgets(max_turns=4, max_new_tokens=80))
    result = run_eval(synth, agent, tasks, tmp_path / "run", batch_size=2, progress=False)
    assert sorted(r["id"] for r in result.predictions) == list("abcde")
    assert max(len(s) for s in in_flight) == 2
    first = {key: next(k for k, s in enumerate(in_flight) if key in s) for key in [("a", 1), ("c", 0)]}
    assert first[("c", 0)] < first[("a", 1)]
    gated = next(t for t in result.predictions if t["id"] == "a")
    assert gated["answer"] == "A"


def _rl(world: Path, out: Path, max_open: int | None) -> dict:
    cfg = RLConfig(model=str(default_model_path()), data=str(world), output_dir=str(out), steps=1,
                   prompts_per_step=1, group_size=4, max_new_tokens=24, max_turns=2, device="cpu", save_every=0,
                   max_open=max_open, temperature=1.0)
    return train_rl(cfg, progress=False)


def test_rl_rollouts_stream_with_max_open_and_train_the_same(in_flight, tmp_path, monkeypatch):
    import mmagent.training.rl as rl

    caps = []

    class Recording(Agent):
        def run_stream(self, tasks, **kwargs):
            caps.append((len(tasks), self.max_open))
            return super().run_stream(tasks, **kwargs)

    monkeypatch.setattr(rl, "Agent", Recording)
    world = tmp_path / "world"
    synth.build(world, per_family=1, seed=3, families=["video_qa"], progress=False)
    capped = _rl(world, tmp_path / "capped", max_open=2)
    assert caps == [(4, 2)] and in_flight and max(len(s) for s in in_flight) <= 2
    free = _rl(world, tmp_path / "free", max_open=None)
    assert caps[1] == (4, None)
    # each episode samples from its own seed, so how many are open at once changes nothing it learns from
    assert capped["history"][0]["reward"] == free["history"][0]["reward"]
    assert capped["param_fingerprint"] == pytest.approx(free["param_fingerprint"], rel=1e-9)
    with pytest.raises(ValueError, match="max_open must be at least 1"):
        RLConfig(model="m", data="d", max_open=0)


def test_the_batch_synchronous_baseline_rolls_out_the_engines_trajectories(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rollout

    torch.manual_seed(0)
    rows = rollout.run(per_family=1, turn_counts=[2], scripted=2, repeats=1, search_latency=0.0, quick=True)
    assert [r.label for r in rows][:2] == ["toy world, built-in model, greedy", "scripted, 2 turns"]
    for r in rows:  # run() raises when they differ; check what it reports, too
        assert r.identical == {loop: r.episodes for loop in rollout.LOOPS}
    assert rows[1].tool_calls == 2 and rows[1].policy_turns == 4


def test_the_baseline_runs_one_padded_generate_per_turn_for_every_open_episode(tiny_model_dir, video_path,
                                                                                monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from batch_sync import BatchSyncPolicy

    script = {"a": [CALL, CALL, "<answer>A</answer>"], "b": ["<answer>B</answer>"], "c": [CALL, "<answer>C</answer>"]}
    tasks = [Task(question="What colour?", video=str(video_path), id=k) for k in "abc"]
    policy = BatchSyncPolicy.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(script))
    batches = []
    generate = policy.model.generate
    policy.model.generate = lambda **kw: batches.append(tuple(kw["input_ids"].shape)) or generate(**kw)
    sync = Agent(policy, tools=["resample_frames"], budgets=Budgets(max_turns=4, max_new_tokens=80))
    got = sync.run_batch(tasks, progress=False)
    assert [b[0] for b in batches] == [3, 2, 1]  # all open episodes each turn, whole conversations re-prefilled
    assert batches[1][1] > batches[0][1]
    engine = Agent(HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(script)),
                   tools=["resample_frames"], budgets=Budgets(max_turns=4, max_new_tokens=80)).run_batch(
                       tasks, progress=False)
    assert [t.token_ids for t in got] == [t.token_ids for t in engine]
    assert [t.answer for t in got] == ["A", "B", "C"]
