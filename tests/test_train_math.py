"""Rewards, advantages and losses on cases small enough to work out by hand (the numbers in comments)."""

from __future__ import annotations

import math

import pytest
import torch

from mmagent.eval.metrics import haversine_km
from mmagent.trajectory import Task, ToolCallRecord, Trajectory, Turn
from mmagent.training.advantages import AdvantageConfig, DifficultyTracker, compute_advantages, group_advantages
from mmagent.training.losses import aggregate, policy_loss, sft_loss, token_logprobs
from mmagent.training.rewards import (RewardConfig, format_score, geolocation_reward, place_reward, reward_parts,
                                     task_reward)

# ----- rewards ------------------------------------------------------------------------------------------

CALL = ToolCallRecord("resample_frames", {"start": 0, "end": 4})


def _episode(task: Task, turns: list[Turn], answer: str | None, stop: str = "answer") -> Trajectory:
    return Trajectory(task=task, turns=turns, answer=answer, stop_reason=stop)


def _call(error: str | None = None) -> list[Turn]:
    return [Turn("assistant", '<tool_call>{"name": "resample_frames"}</tool_call>', tool_call=CALL),
            Turn("tool", "frames", tool_call=CALL, error=error)]


def _answer(text: str) -> Turn:
    return Turn("assistant", f"<answer>{text}</answer>")


MCQ = Task(question="Which colour?", task_type="video_qa", options=["A. red", "B. blue", "C. green", "D. grey"],
           answer="B")


def test_a_right_answer_after_one_useful_call_earns_every_term() -> None:
    parts = reward_parts(_episode(MCQ, _call() + [_answer("B")], "B"))
    # task 1 + 0.5 * format 1 + tool bonus 0.2, nothing charged
    assert parts == {"task": 1.0, "place": 0.0, "format": 1.0, "tool_bonus": 0.2, "failed_calls": 0.0,
                     "excess_calls": 0.0, "total": pytest.approx(1.7)}


def test_failed_malformed_and_excess_calls_are_charged() -> None:
    turns = _call() + _call(error="tool_error") + [Turn("assistant", "<tool_call>{oops", error="parse_error")]
    turns += _call() + [_answer("C")]
    parts = reward_parts(_episode(MCQ, turns, "C"))
    # wrong answer, a malformed turn kills the format; 1 failed call + 1 malformed turn = 0.2;
    # 3 calls against video_qa's budget of 1 = 2 excess * 0.05 = 0.1
    assert parts["task"] == 0.0 and parts["format"] == 0.0 and parts["tool_bonus"] == 0.0
    assert parts["failed_calls"] == pytest.approx(0.2) and parts["excess_calls"] == pytest.approx(0.1)
    assert parts["total"] == pytest.approx(-0.3)


def test_a_right_answer_without_a_working_call_gets_no_tool_bonus() -> None:
    parts = reward_parts(_episode(MCQ, _call(error="timeout") + [_answer("B")], "B"))
    assert parts["tool_bonus"] == 0.0 and parts["failed_calls"] == pytest.approx(0.1)
    assert parts["total"] == pytest.approx(1.0 + 0.5 - 0.1)


def test_format_needs_an_answer_and_one_action_per_turn() -> None:
    assert format_score(_episode(MCQ, _call(), None, stop="max_turns")) == 0.0
    both = Turn("assistant", '<tool_call>{"name": "zoom"}</tool_call><answer>B</answer>')
    assert format_score(_episode(MCQ, [both], "B")) == 0.0
    assert format_score(_episode(MCQ, [_answer("B")], "B")) == 1.0


def test_overlong_answers_score_nothing_on_the_task() -> None:
    long = "B " * 600
    assert task_reward(_episode(MCQ, [_answer(long)], long)) == 0.0
    assert task_reward(_episode(MCQ, [_answer("B")], "(B) blue")) == 1.0


def test_grounding_reward_is_the_iou() -> None:
    task = Task(question="When?", task_type="grounding", answer=[2.0, 6.0])
    # [3, 7] against [2, 6]: overlap 3 s over a union of 5 s
    assert task_reward(_episode(task, [_answer("[3, 7]")], "[3, 7]")) == pytest.approx(0.6)
    assert task_reward(_episode(task, [_answer("later")], "later")) == 0.0


PARIS = {"name": "Paris", "country_code": "FR", "admin1_code": "11", "lat": 48.85341, "lon": 2.3488,
         "geonameid": 2988507}


def _geo(answer: str, cfg: RewardConfig | None = None) -> dict[str, float]:
    """The reward parts of a toy-world geolocation answer (no tool calls) for a photo taken in Paris."""
    task = Task(question="Where?", task_type="geolocation", answer=PARIS, metadata={"family": "geolocation"},
                benchmark="synth")
    return reward_parts(_episode(task, [_answer(answer)], answer), cfg)


@pytest.mark.parametrize("point,hit,tier", [((48.86, 2.35), True, 1.0),     # Paris itself: city
                                            ((48.80, 2.13), True, 1.0),     # Versailles, 17 km: city by distance
                                            ((45.75, 4.85), False, 0.25),   # Lyon: right country only
                                            ((40.71, -74.0), False, 0.0)])  # New York: nothing
def test_a_geolocation_hit_earns_the_task_score_and_a_miss_the_place_term(point: tuple[float, float], hit: bool,
                                                                          tier: float) -> None:
    parts = _geo(f"{point[0]}, {point[1]}")
    km = haversine_km(point, (PARIS["lat"], PARIS["lon"]))
    # the task term is the toy world's own score (1 within 25 km); only a miss is paid by how near it came
    assert parts["task"] == (1.0 if hit else 0.0)
    assert parts["place"] == (0.0 if hit else pytest.approx(0.8 * tier + 0.2 * math.exp(-km / 1492.7), rel=1e-6))
    assert parts["total"] == pytest.approx(parts["task"] + parts["place"] + 0.5)  # + format 0.5 * 1


def test_the_place_term_ranks_misses_and_scales_with_its_weight() -> None:
    lyon, new_york = _geo("45.75, 4.85"), _geo("40.71, -74.0")
    assert lyon["place"] > new_york["place"] > 0.0 == lyon["task"] == new_york["task"]
    half = _geo("45.75, 4.85", RewardConfig(place_weight=0.5))
    assert half["place"] == pytest.approx(lyon["place"] / 2) and half["task"] == 0.0
    assert _geo("no idea")["place"] == 0.0  # no coordinates: infinitely far, nothing to pay
    # a score without place parts (every other task) never earns it, nor does a hit
    assert place_reward({"score": 0.0, "pred": "B"}) == 0.0
    assert place_reward({"score": 1.0, "km": 3.0, "city": True, "region": True, "country": True}) == 0.0


def test_geolocation_region_tier() -> None:
    match = {"km": 300.0, "city": False, "region": True, "country": True}
    assert geolocation_reward(match) == pytest.approx(0.8 * 0.5 + 0.2 * math.exp(-300 / 1492.7))
    assert geolocation_reward({"km": math.inf, "city": False, "region": False, "country": False}) == 0.0
    flat = RewardConfig(geo_distance_weight=0.0)
    assert geolocation_reward(match, flat) == 0.5


# ----- advantages ---------------------------------------------------------------------------------------


def test_group_advantages_and_zero_variance() -> None:
    # mean 0.5, population std 0.5
    assert group_advantages([1, 0, 0, 1]) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert group_advantages([0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0]


GROUPS = [{"family": "video_qa", "prompt_id": "v1", "rewards": [1, 0, 1, 1], "successes": [1, 0, 1, 1]},
          {"family": "grounding", "prompt_id": "g1", "rewards": [0.5, 0.0], "successes": [0.5, 0.0]},
          {"family": "grounding", "prompt_id": "g2", "rewards": [0.3, 0.3], "successes": [0.3, 0.3]}]


def _tracker() -> DifficultyTracker:
    return DifficultyTracker(momentum=0.9, rates={"video_qa": 0.8, "grounding": 0.2})


def test_grpo_leaves_the_group_advantages_alone() -> None:
    tracker = _tracker()
    result = compute_advantages(GROUPS, tracker, AdvantageConfig(mode="grpo"))
    s = math.sqrt(0.1875)  # std of [1, 0, 1, 1]
    assert result.advantages[0] == pytest.approx([0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s], rel=1e-5)
    assert result.advantages[1] == pytest.approx([1, -1], rel=1e-5)
    assert result.zero_variance == [False, False, True] and result.advantages[2] == [0.0, 0.0]
    assert result.stats["task_weights"] == {"grounding": 1.0, "video_qa": 1.0}


def test_dgrpo_weights_by_group_and_task_difficulty() -> None:
    tracker = _tracker()
    result = compute_advantages(GROUPS, tracker, AdvantageConfig(mode="dgrpo", task_weight_clip=(0.5, 2.0)))
    # task difficulty: video 0.2, grounding 0.8, mean 0.5 -> weights 0.4 (clipped to 0.5) and 1.6
    assert result.stats["task_weights"] == pytest.approx({"video_qa": 0.5, "grounding": 1.6})
    s = math.sqrt(0.1875)
    # video group: success 0.75 -> d 0.25 -> (1 + 0.25) / 2 = 0.625, times 0.5
    assert result.advantages[0] == pytest.approx([x * 0.3125 for x in (0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s)],
                                                 rel=1e-5)
    # grounding group: success 0.25 -> d 0.75 -> 0.875, times 1.6 = 1.4
    assert result.advantages[1] == pytest.approx([1.4, -1.4], rel=1e-5)
    assert result.advantages[2] == [0.0, 0.0]
    # EMA after the batch: 0.9 * 0.8 + 0.1 * 0.75 and 0.9 * 0.2 + 0.1 * mean(0.5, 0, 0.3, 0.3)
    assert tracker.rate("video_qa") == pytest.approx(0.795)
    assert tracker.rate("grounding") == pytest.approx(0.9 * 0.2 + 0.1 * 0.275)
    assert tracker.rate("prompt:g1") == pytest.approx(0.9 * 0.5 + 0.1 * 0.25)


def test_tracker_round_trips_and_rejects_unknown_modes() -> None:
    tracker = _tracker()
    copy = DifficultyTracker()
    copy.load_state_dict(tracker.state_dict())
    assert copy == tracker
    with pytest.raises(ValueError, match="grpo or dgrpo"):
        AdvantageConfig(mode="ppo")


# ----- losses -------------------------------------------------------------------------------------------

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("name,expected", [("grpo", (1.5 + 4) / 2),  # mean per sequence, then over sequences
                                           ("dapo", 7 / 3),           # 1 + 2 + 4 over 3 tokens
                                           ("bnpo", 7 / 3),
                                           ("dr_grpo", 7 / 6)])       # over B * T = 6
def test_aggregations(name: str, expected: float) -> None:
    assert float(aggregate(PER_TOKEN, MASK, name)) == pytest.approx(expected)


def test_unknown_aggregation_is_refused() -> None:
    with pytest.raises(ValueError, match="dr_grpo"):
        aggregate(PER_TOKEN, MASK, "sum")


def test_policy_loss_on_policy_is_minus_the_advantage_and_its_gradient_is_the_advantage() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.2]])).requires_grad_(True)
    loss, stats = policy_loss(logp, logp.detach().clone(), torch.tensor([2.0, -1.0]), torch.ones(2, 2))
    assert float(loss.detach()) == pytest.approx(-(2.0 - 1.0) / 2)
    assert stats["ratio"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0
    loss.backward()
    # d(-ratio * A)/d logp = -A at ratio 1, over 2 tokens and 2 sequences
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.25, 0.25])


@pytest.mark.parametrize("ratio,adv,expected_loss,clipped", [
    (1.5, 1.0, -1.2, True),   # gain capped at 1 + eps
    (1.5, -1.0, 1.5, True),   # a loss is never capped: min picks the unclipped -1.5
    (0.5, 1.0, -0.5, True),   # min(0.5, 0.8): the pessimistic side
    (0.5, -1.0, 0.8, True),   # min(-0.5, -0.8)
    (1.1, 1.0, -1.1, False)])
def test_policy_loss_clips_like_ppo(ratio: float, adv: float, expected_loss: float, clipped: bool) -> None:
    old = torch.tensor([[math.log(0.4)]])
    loss, stats = policy_loss(old + math.log(ratio), old, torch.tensor([adv]), torch.ones(1, 1), clip_eps=0.2)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)
    assert stats["clip_frac"] == (1.0 if clipped else 0.0)


def test_asymmetric_clip_and_masked_tokens() -> None:
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(1.5), math.log(9.0)]])  # the second token is masked out
    loss, _ = policy_loss(new, old, torch.tensor([1.0]), torch.tensor([[1, 0]]), clip_eps=0.2, clip_eps_high=0.28)
    assert float(loss) == pytest.approx(-1.28, rel=1e-5)


def test_k3_kl_to_the_reference() -> None:
    logp = torch.tensor([[math.log(0.25)]])
    ref = torch.tensor([[math.log(0.5)]])
    loss, stats = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), ref_logp=ref, kl_coef=0.1)
    k3 = 2.0 - math.log(2.0) - 1.0  # exp(d) - d - 1 with d = log(0.5 / 0.25)
    assert stats["kl"] == pytest.approx(k3, rel=1e-5) and float(loss) == pytest.approx(0.1 * k3, rel=1e-5)


def test_the_logged_kl_does_not_touch_the_graph() -> None:
    """With the policy's log-probs requiring grad, logging the KL must not warn (it did, every RL step)."""
    import warnings

    logp = torch.tensor([[math.log(0.25)]], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, stats = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 1),
                                  ref_logp=torch.tensor([[math.log(0.5)]]), kl_coef=0.1)
    loss.backward()
    assert stats["kl"] > 0 and logp.grad is not None


def test_sft_loss_and_token_logprobs() -> None:
    logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: -log(1/4) each
    logits[0, 2, 1] = 100.0  # a confident, masked position
    targets = torch.tensor([[0, 3, 2]])
    assert float(sft_loss(logits, targets, torch.tensor([[1, 1, 0]]))) == pytest.approx(math.log(4))
    lp = token_logprobs(logits, targets)
    assert lp[0, :2].tolist() == pytest.approx([-math.log(4)] * 2)
    assert float(lp[0, 2]) < -90


def test_a_run_is_stalled_after_steps_with_no_success_and_no_advantage() -> None:
    from mmagent.training.rl import STALL_STEPS, stalled

    stuck = {"success": 0.0, "zero_variance_groups": 1.0}
    learning = {"success": 0.0, "zero_variance_groups": 0.5}  # some group still has rollouts that differ
    solved = {"success": 1.0, "zero_variance_groups": 1.0}  # alike because every rollout is right
    assert stalled([learning] + [stuck] * STALL_STEPS)
    assert not stalled([stuck] * (STALL_STEPS - 1))
    assert not stalled([stuck] * (STALL_STEPS - 1) + [learning])
    assert not stalled([solved] * (STALL_STEPS + 3))
