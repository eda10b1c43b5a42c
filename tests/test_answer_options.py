"""An answer that names none of the question's options: read as such, marked invalid in the trajectory and the
printed result, scored wrong by every scorer, and paid nothing by the format reward."""

from __future__ import annotations

import pytest

from mmagent import Agent, Budgets
from mmagent.agent import format_trajectory
from mmagent.choices import chosen_option, invalid_reason, option_labels
from mmagent import cli
from mmagent.eval import registry
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.trajectory import Task, Trajectory, Turn
from mmagent.training.rewards import format_score, reward_parts

AB = ["A. red", "B. blue"]


@pytest.mark.parametrize("answer, letter", [
    ("A", "A"), ("B.", "B"), ("(B)", "B"), ("b", "B"), ("B) blue", "B"), ("blue", "B"), ("B. blue", "B"),
    ("The answer is B.", "B"), ("I think it is B", "B"), ("**A**", "A"),
    ("C", None), ("C. green", None), ("A or B", None), ("purple", None), ("The best answer is C", None), ("", None),
])
def test_the_option_an_answer_names(answer, letter):
    assert chosen_option(answer, AB) == letter
    assert (invalid_reason(answer, AB) is None) == (letter is not None)


def test_unlabelled_options_are_lettered_in_order_and_no_options_means_no_check():
    assert option_labels(["red", "blue"]) == [("A", "red"), ("B", "blue")]
    assert chosen_option("blue", ["red", "blue"]) == "B" and chosen_option("C", ["red", "blue"]) is None
    assert invalid_reason("C", None) is None and invalid_reason(None, AB) is None
    assert invalid_reason("C", AB) == "'C' is not one of the options (A, B)"


@pytest.mark.parametrize("bench", ["", "videomme", "vstar", "synth"])
def test_every_scorer_scores_an_invalid_answer_wrong(bench):
    task = Task("Which colour?", options=AB, answer="A", benchmark=bench, task_type="video_qa",
                metadata={"duration": "short", "domain": "d", "sub_category": "s", "task_type": "t",
                          "category": "direct_attributes"})
    assert registry.score(task, "A")["score"] == 1.0
    wrong = registry.score(task, "C")
    assert wrong["score"] == 0.0 and wrong["invalid"] == "'C' is not one of the options (A, B)"


def _traj(answer: str, options=AB) -> Trajectory:
    traj = Trajectory(task=Task("Which colour?", options=options, answer="A"), answer=answer, stop_reason="answer")
    traj.turns = [Turn(role="assistant", text=f"<think>hm</think><answer>{answer}</answer>")]
    return traj


def test_the_format_reward_pays_nothing_for_an_invalid_answer():
    assert format_score(_traj("A")) == 1.0
    assert format_score(_traj("C")) == 0.0 and reward_parts(_traj("C"))["format"] == 0.0
    assert format_score(_traj("C", options=None)) == 1.0  # an open question takes any answer


def test_the_agent_marks_an_invalid_answer_and_the_transcript_says_so(tiny_model_dir, video_path):
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser(["<answer>C</answer>"]))
    agent = Agent(policy, tools=[], budgets=Budgets(max_turns=2, max_new_tokens=16))
    result = agent.run("Which colour?", video=video_path, options=AB)
    assert result.answer == "C"
    assert result.trajectory.info["invalid_answer"] == "'C' is not one of the options (A, B)"
    assert "Answer: C (invalid: 'C' is not one of the options (A, B))" in format_trajectory(result.trajectory)
    ok = agent.run("Which colour?", video=video_path, options=["A. red", "B. blue", "C. green"])
    assert "invalid_answer" not in ok.trajectory.info


def test_the_cli_json_says_whether_the_answer_is_valid():
    traj = _traj("C")
    traj.info["invalid_answer"] = invalid_reason("C", AB)
    summary = cli.trajectory_summary(traj)
    assert summary["answer"] == "C" and summary["answer_valid"] is False and summary["options"] == AB
    assert cli.trajectory_summary(_traj("B"))["answer_valid"] is True


def test_a_reference_scorer_keeps_its_own_reading_of_a_hedged_answer():
    """Video-MME's published rule reads "A or B" as A; the default score reproduces it, the flag still says why."""
    task = Task("Which colour?", options=AB, answer="A", benchmark="videomme", task_type="video_qa",
                metadata={"duration": "short", "domain": "d", "sub_category": "s", "task_type": "t"})
    hedged = registry.score(task, "A or B")
    assert hedged["score"] == 1.0 and "not one of the options" in hedged["invalid"]
    own = Task("Which colour?", options=AB, answer="A", benchmark="synth", task_type="video_qa")
    assert registry.score(own, "A or B")["score"] == 0.0
