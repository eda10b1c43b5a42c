"""Batched decoding across episodes: the same trajectories as one episode at a time, token for token.

Episodes of one batch end their turns at different lengths and finish after different numbers of turns,
so rows leave the stacked cache at different steps; every token, mask, log-probability and prefill count
must still equal the sequential loop's.
"""

from __future__ import annotations

import pytest

from eval.benchmarks import synth
from mmagent import Agent, Budgets
from mmagent.default_model import default_model_path
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.trajectory import Task

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
        assert [t.prefill_tokens for t in a.turns] == [t.prefill_tokens for t in b.turns]


def test_scripted_episodes_of_different_lengths_match(tiny_model_dir, video_path):
    script = {"one": ["<answer>A</answer>"], "two": [CALL, LONG + "<answer>B</answer>"],
              "four": [CALL, LONG + CALL, CALL, "<answer>C</answer>"]}
    tasks = [Task(question="What colour?", video=str(video_path), id=k) for k in ("four", "one", "two")]
    seq, bat = _pair(tiny_model_dir, tasks, chooser=lambda: ReplayChooser(script), max_turns=6, max_new_tokens=200)
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
    """The real policy, noting which episodes (by task id and turn) each generate call batched."""

    calls: list

    def generate(self, sessions, max_new_tokens):
        self.calls.append([(s.info["task_id"], s.turn) for s in sessions])
        return super().generate(sessions, max_new_tokens)


def test_waiting_episodes_join_as_others_finish(tiny_model_dir, video_path):
    script = {"a": [CALL, CALL, CALL, "<answer>A</answer>"], "b": ["<answer>B</answer>"],
              "c": [CALL, "<answer>C</answer>"], "d": ["<answer>D</answer>"], "e": [CALL, "<answer>E</answer>"]}
    tasks = [Task(question="What colour?", video=str(video_path), id=k) for k in "abcde"]
    seq, _ = _pair(tiny_model_dir, tasks, chooser=lambda: ReplayChooser(script), max_turns=6, max_new_tokens=80)
    policy = _Recording.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(script))
    policy.calls = []
    agent = Agent(policy, tools=["resample_frames", "zoom", "web_search"], budgets=Budgets(max_turns=6, max_new_tokens=80),
                  max_open=2)
    capped = agent.run_batch(tasks, seed=0, progress=False)
    _assert_same(seq, capped)
    assert max(len(c) for c in policy.calls) == 2
    # "a" runs four turns while b, c, d, e take the other slot in turn: a newcomer's first turn is batched
    # with a's later ones
    assert policy.calls[:3] == [[("a", 0), ("b", 0)], [("a", 1), ("c", 0)], [("a", 2), ("c", 1)]]
    assert sorted(k for c in policy.calls for k, t in c if t == 0) == list("abcde")
    with pytest.raises(ValueError, match="max_open must be at least 1"):
        Agent(policy, max_open=0)
