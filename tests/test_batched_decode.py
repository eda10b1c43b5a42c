"""Batched decoding across episodes: the same trajectories as one episode at a time, token for token.

Episodes of one batch end their turns at different lengths and finish after different numbers of turns,
so rows leave the stacked cache at different steps; every token, mask, log-probability and prefill count
must still equal the sequential loop's.
"""

from __future__ import annotations

import threading

import pytest

from mmagent.eval.benchmarks import synth
from mmagent import Agent, Budgets
from mmagent.default_model import default_model_path
from mmagent.media import EpisodeMedia
from mmagent.policy.batching import SharedPrefixes
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.trajectory import Task
from mmagent.toolbox.base import Observation, Tool

CALL = "<think>Again.</think>" + format_tool_call("resample_frames", {"start": 0.5, "end": 3.5, "num_frames": 2})
LONG = "<think>" + "Let me think about the colours once more. " * 6 + "</think>"


def _pair(model_dir, tasks, chooser=None, **budgets):
    out = []
    for batch in (False, True):
        policy = HFPolicy.from_pretrained(str(model_dir), device="cpu", batch_decode=batch,
                                          chooser=chooser() if chooser else None)
        agent = Agent(policy, tools=["resample_frames", "zoom", "web_search"], budgets=Budgets(**budgets))
        out.append(agent.run_batch(tasks, seed=0, progress=False))
    return out


def _assert_same(seq, bat):
    for a, b in zip(seq, bat):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.answer == b.answer
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert [t.prefill_tokens for t in a.turns[1:]] == [t.prefill_tokens for t in b.turns[1:]]
    # The batch computes the shared system-prompt prefix once, for whichever episode started first; the
    # others prefill only what follows it. One at a time, every episode prefills its whole prompt.
    first_seq, first_bat = [x.turns[0].prefill_tokens for x in seq], [x.turns[0].prefill_tokens for x in bat]
    assert first_seq == [x.prompt_length for x in seq]
    assert sum(a == b for a, b in zip(first_seq, first_bat)) == 1
    assert all(b < a - SharedPrefixes.MIN_TOKENS for a, b in zip(first_seq, first_bat) if a != b)


def test_scripted_episodes_of_different_lengths_match(family_model_dir, video_path):
    script = {"one": ["<answer>A</answer>"], "two": [CALL, LONG + "<answer>B</answer>"],
              "four": [CALL, LONG + CALL, CALL, "<answer>C</answer>"]}
    tasks = [Task(question="What colour?", video=str(video_path), id=k) for k in ("four", "one", "two")]
    seq, bat = _pair(family_model_dir, tasks, chooser=lambda: ReplayChooser(script), max_turns=6, max_new_tokens=200)
    assert [sum(t.role == "assistant" for t in x.turns) for x in bat] == [4, 1, 2]
    assert [x.answer for x in bat] == ["C", "A", "B"]
    _assert_same(seq, bat)


def test_the_built_in_model_greedy_rollouts_match(tmp_path):
    tasks = synth.build(tmp_path, per_family=2, seed=1, progress=False)
    seq, bat = _pair(default_model_path(), tasks, max_turns=6, max_new_tokens=160)
    turns = {sum(t.role == "assistant" for t in x.turns) for x in bat}
    assert len(turns) > 1  # the batch really had episodes finishing at different turns
    _assert_same(seq, bat)


class _Recording(HFPolicy):
    """The real policy, noting before every stream step which episodes (task id, turn) are in flight."""

    steps: list

    def stream(self, max_new_tokens):
        inner = super().stream(max_new_tokens)
        step = inner.step

        def recorded():
            self.steps.append([(s.task.id, s.turn) for s in inner.sessions()])
            return step()

        inner.step = recorded
        return inner


def test_waiting_episodes_join_as_others_finish(tiny_model_dir, video_path):
    script = {"a": [CALL, CALL, CALL, "<answer>A</answer>"], "b": ["<answer>B</answer>"],
              "c": [CALL, "<answer>C</answer>"], "d": ["<answer>D</answer>"], "e": [CALL, "<answer>E</answer>"]}
    tasks = [Task(question="What colour?", video=str(video_path), id=k) for k in "abcde"]
    seq, _ = _pair(tiny_model_dir, tasks, chooser=lambda: ReplayChooser(script), max_turns=6, max_new_tokens=80)
    policy = _Recording.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(script))
    policy.steps = []
    agent = Agent(policy, tools=["resample_frames", "zoom", "web_search"], budgets=Budgets(max_turns=6, max_new_tokens=80),
                  max_open=2)
    capped = agent.run_batch(tasks, seed=0, progress=False)
    _assert_same(seq, capped)
    assert max(len(s) for s in policy.steps) == 2  # never more than max_open episodes in flight
    assert {k for s in policy.steps for k, t in s if t == 0} == set("abcde")
    # "a" runs four turns while b, c, d, e take the other slot in turn: newcomers decode beside a's later turns
    assert any(("a", t) in s and any(k != "a" for k, _ in s) for s in policy.steps for t in (1, 2, 3))
    with pytest.raises(ValueError, match="max_open must be at least 1"):
        Agent(policy, max_open=0)


def test_a_session_joins_a_running_batch_between_tokens(family_model_dir, video_path):
    """The stream itself: b joins while a is mid-turn, c while both are; each turn equals its one-at-a-time run."""
    turns = {"a": LONG + CALL, "b": "<think>Red.</think><answer>B</answer>", "c": LONG + "<answer>C</answer>"}
    chooser = ReplayChooser(lambda s, t: turns[s.task.id] if t == 0 else None)

    def session(policy, key):
        view = policy.renderer.prompt("You answer.", "What colour?", EpisodeMedia(video=str(video_path)))
        return policy.start(view, seed=0, task=Task(question="What colour?", id=key))

    alone = HFPolicy.from_pretrained(str(family_model_dir), device="cpu", batch_decode=False, chooser=chooser)
    expected = {k: alone.generate([session(alone, k)], 200)[0] for k in turns}
    policy = HFPolicy.from_pretrained(str(family_model_dir), device="cpu", chooser=chooser)
    stream = policy.stream(200)
    assert stream.joins_running
    order, got = [], {}
    joins = {0: "a", 5: "b", 9: "c"}  # step at which each joins
    for step in range(400):
        if step in joins:
            stream.add(session(policy, joins[step]))
        if step == 9:
            assert len(stream.active) == 2 and all(t.generated for t in stream.active)  # both mid-turn
        for s, gen in stream.step():
            order.append(s.task.id)
            got[s.task.id] = gen
        if not len(stream) and step > 9:
            break
    assert order == ["b", "c", "a"] or order == ["b", "a", "c"]
    head = stream.prefixes.reused_tokens // 2  # b and c took the shared prompt head that a computed
    assert head >= SharedPrefixes.MIN_TOKENS
    for k, gen in got.items():
        assert gen.token_ids == expected[k].token_ids and gen.text == expected[k].text
        assert gen.prefill_tokens == expected[k].prefill_tokens - (head if k != "a" else 0)
        assert gen.logprobs == pytest.approx(expected[k].logprobs, abs=1e-4)
    assert stream.batch is None  # nothing left stacked once every turn has ended


class _Gate(Tool):
    """A tool that returns only once the test opens the gate (or after 30 s)."""

    name = "gate"
    description = "waits"
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.open = threading.Event()

    def run(self, arguments, context) -> Observation:
        return Observation(text="released" if self.open.wait(30) else "still shut")


def test_one_episodes_slow_tool_does_not_hold_up_the_others(tiny_model_dir, video_path):
    """While a's tool call waits, b runs three more turns and answers; the gate opens only on b's answer,
    so a lock-step loop (every episode waits for every tool) would leave a's tool shut."""
    gate = _Gate()
    script = {"a": [format_tool_call("gate", {}), "<answer>A</answer>"], "b": [CALL, CALL, CALL, "<answer>B</answer>"]}
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(script))
    agent = Agent(policy, tools=[gate, "resample_frames"], budgets=Budgets(max_turns=6, max_new_tokens=80))
    seen = []

    def on_turn(turn):
        seen.append(turn.text if turn.role == "tool" else turn.role)
        if "<answer>" in turn.text:
            gate.open.set()

    tasks = [Task(question="What colour?", video=str(video_path), id=k) for k in "ab"]
    a, b = agent.run_batch(tasks, seed=0, progress=False, on_turn=on_turn)
    assert (a.answer, b.answer) == ("A", "B")
    assert a.observations[0].text == "released"
    # a's call, then all four of b's turns, came before a's tool returned
    assert seen[:seen.index("released")].count("assistant") == 5
