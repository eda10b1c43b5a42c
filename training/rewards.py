"""Rewards of an episode: the task's own score plus format and tool-efficiency terms.

``total = task + format_weight * format + tool_bonus - failed_calls - excess_calls`` where

* ``task`` is the task's score in [0, 1], 0 without an answer or with an answer longer than
  ``max_answer_chars`` (a guard against judge hacking, as DeepEyes does): the option letter for
  multiple choice, the IoU for grounding, and for geolocation a hierarchical score
  (:func:`geolocation_reward`: GeoVista's city / region / country tiers plus a GeoGuessr-style
  distance term, so a guess in the right country still beats one on the wrong continent);
* ``format`` is 1 when the episode ended with an answer and every policy turn held exactly one
  well-formed action (a call or an answer, never both), else 0;
* ``tool_bonus`` is paid when the answer is right *and* at least one tool call worked (DeepEyes: RL
  alone does not induce tool use, so reward using tools that helped);
* ``failed_calls`` charges every call that came back as an error or timed out and every malformed
  turn; ``excess_calls`` charges every call beyond what the task type needs (OTC-PO / TAPO: tool-call
  hacking — calling because calls pay — is priced out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mmagent.trajectory import Trajectory

@dataclass
class RewardConfig:
    #: weight of the format term
    format_weight: float = 0.5
    #: paid when the answer is right and at least one tool call succeeded
    tool_bonus: float = 0.2
    #: per failed tool call (error / timeout observation) or malformed policy turn
    failed_call_penalty: float = 0.1
    #: per tool call beyond the task type's budget
    excess_call_penalty: float = 0.05
    #: calls each task type needs (the toy world's oracle makes at most these)
    call_budget: dict[str, int] = field(default_factory=lambda: {"video_qa": 1, "grounding": 4, "image_qa": 1,
                                                                 "geolocation": 2})
    #: answers longer than this score 0 on the task
    max_answer_chars: int = 1000
    #: geolocation tiers (GeoVista's 4 / 2 / 1, scaled to 1)
    geo_city: float = 1.0
    geo_region: float = 0.5
    geo_country: float = 0.25
    #: share of the geolocation score paid by distance, exp(-km / geo_scale_km) (OSV-5M's GeoGuessr scale)
    geo_distance_weight: float = 0.2
    geo_scale_km: float = 1492.7


def format_score(traj: Trajectory) -> float:
    """1.0 for an episode that ended with an answer and whose every policy turn was one clean action."""
    if traj.stop_reason != "answer" or traj.answer is None:
        return 0.0
    for turn in traj.turns:
        if turn.role != "assistant":
            continue
        if turn.error is not None or ("<tool_call>" in turn.text and "<answer>" in turn.text):
            return 0.0
    return 1.0


def geolocation_reward(match: dict, cfg: RewardConfig | None = None) -> float:
    """Hierarchical score of a :func:`mmagent.eval.metrics.geo_match` result, in [0, 1].

    ``(1 - w) * tier + w * exp(-km / scale)``: the tier is the best level that is right (city, else
    region, else country, else 0) and ``w`` is ``geo_distance_weight``.
    """
    cfg = cfg or RewardConfig()
    tier = (cfg.geo_city if match["city"] else cfg.geo_region if match["region"]
            else cfg.geo_country if match["country"] else 0.0)
    distance = math.exp(-match["km"] / cfg.geo_scale_km) if math.isfinite(match["km"]) else 0.0
    return (1 - cfg.geo_distance_weight) * tier + cfg.geo_distance_weight * distance


def task_reward(traj: Trajectory, cfg: RewardConfig | None = None) -> float:
    """The task's score of the episode's answer, in [0, 1]."""
    cfg = cfg or RewardConfig()
    answer = traj.answer
    if answer is None or len(answer) > cfg.max_answer_chars:
        return 0.0
    task = traj.task
    if "family" in task.metadata:
        from mmagent.eval.synth.families import FAMILIES
        from mmagent.eval.synth.scoring import score_answer

        if task.task_type in FAMILIES:  # a toy-world task: its benchmark's own scoring
            parts = score_answer(task, answer)
            return geolocation_reward(parts, cfg) if task.task_type == "geolocation" else float(parts["score"])
    if task.options and isinstance(task.answer, str):
        from mmagent.eval.metrics import extract_option_letter

        return float(extract_option_letter(answer, official=False) == task.answer.strip().upper()[:1])
    if task.task_type == "grounding" and task.answer is not None:
        from mmagent.eval.metrics import parse_interval, temporal_iou

        return temporal_iou(parse_interval(answer), tuple(task.answer))
    if isinstance(task.answer, str):
        return float(answer.strip().lower() == task.answer.strip().lower())
    return 0.0


def reward_parts(traj: Trajectory, cfg: RewardConfig | None = None) -> dict[str, float]:
    """Every term and the total (the caller stores them in ``traj.rewards``)."""
    cfg = cfg or RewardConfig()
    task = task_reward(traj, cfg)
    fmt = format_score(traj)
    tool_turns = [t for t in traj.turns if t.role == "tool" and t.tool_call is not None]
    failed = sum(t.error is not None for t in tool_turns)
    malformed = sum(t.role == "assistant" and t.error is not None for t in traj.turns)
    calls = len(traj.tool_calls)
    budget = cfg.call_budget.get(traj.task.task_type, calls)
    succeeded = len(tool_turns) - failed
    bonus = cfg.tool_bonus if task >= 0.5 and succeeded > 0 else 0.0
    failed_pen = cfg.failed_call_penalty * (failed + malformed)
    excess_pen = cfg.excess_call_penalty * max(0, calls - budget)
    total = task + cfg.format_weight * fmt + bonus - failed_pen - excess_pen
    return {"task": task, "format": fmt, "tool_bonus": bonus, "failed_calls": failed_pen,
            "excess_calls": excess_pen, "total": total}
