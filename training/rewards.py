"""Rewards of an episode: the task's own score plus place, format and tool-efficiency terms.

``total = task + place + format_weight * format + tool_bonus - failed_calls - excess_calls`` where

* ``task`` is the task's own score in [0, 1] (:func:`mmagent.eval.registry.score`: the ``score`` of the
  benchmark named by ``Task.benchmark``, exactly the number ``mmagent eval`` reports, or the generic rule
  for a task of the user's own), 0 without an answer or with an answer longer than ``max_answer_chars``
  (a guard against judge hacking, as DeepEyes does). Nothing here picks a scorer, so any benchmark folder
  (Video-MME, Charades-STA, geo, V*, the toy world) can be RL prompts;
* ``place`` pays a geolocation miss by how near it came: when the task score is 0 and the score dict
  reports place parts (``city`` / ``region`` / ``country`` / ``km``, as geo's and the toy world's do), it
  is ``place_weight`` times :func:`geolocation_reward` (GeoVista's city / region / country tiers plus a
  GeoGuessr-style distance term), so a miss in the right country still beats one on the wrong continent;
  a hit is paid by ``task`` alone, so the ``task`` term stays what eval reports;
* ``format`` is 1 when the episode ended with an answer and every policy turn held exactly one
  well-formed action (a call or an answer, never both), else 0; an answer to a multiple-choice task that
  names none of its options (:func:`mmagent.choices.invalid_reason`) is not well formed either;
* ``tool_bonus`` is paid when the answer is right (task score >= 0.5) *and* at least one tool call
  worked (DeepEyes: RL alone does not induce tool use, so reward using tools that helped);
* ``failed_calls`` charges every call that came back as an error or timed out and every malformed
  turn; ``excess_calls`` charges every call beyond what the task type needs (OTC-PO / TAPO: tool-call
  hacking — calling because calls pay — is priced out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mmagent.choices import invalid_reason
from mmagent.eval import registry
from mmagent.trajectory import Trajectory

#: the keys of a score dict that make it eligible for the place term (geo's and the toy world's geolocation)
PLACE_PARTS = frozenset({"city", "region", "country", "km"})


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
    call_budget: dict[str, int] = field(default_factory=lambda: {"video_qa": 1, "grounding": 5, "image_qa": 1,
                                                                 "geolocation": 2})
    #: answers longer than this score 0 on the task
    max_answer_chars: int = 1000
    #: weight of the place term, paid on a geolocation miss (see :func:`place_reward`)
    place_weight: float = 1.0
    #: geolocation tiers (GeoVista's 4 / 2 / 1, scaled to 1)
    geo_city: float = 1.0
    geo_region: float = 0.5
    geo_country: float = 0.25
    #: share of the geolocation score paid by distance, exp(-km / geo_scale_km) (OSV-5M's GeoGuessr scale)
    geo_distance_weight: float = 0.2
    geo_scale_km: float = 1492.7


def format_score(traj: Trajectory) -> float:
    """1.0 for an episode that ended with an answer (one of the options, when the task has options) and whose
    every policy turn was one clean action."""
    if traj.stop_reason != "answer" or traj.answer is None:
        return 0.0
    if invalid_reason(traj.answer, traj.task.options):
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


def task_score(traj: Trajectory, cfg: RewardConfig | None = None) -> dict[str, Any]:
    """The task's own score dict of the episode's answer (:func:`mmagent.eval.registry.score`, what
    ``mmagent eval`` reports); ``{"score": 0.0}`` without an answer or with one over ``max_answer_chars``."""
    cfg = cfg or RewardConfig()
    answer = traj.answer
    if answer is None or len(answer) > cfg.max_answer_chars:
        return {"score": 0.0}
    return registry.score(traj.task, answer)


def task_reward(traj: Trajectory, cfg: RewardConfig | None = None) -> float:
    """The task's score of the episode's answer, in [0, 1]."""
    return float(task_score(traj, cfg)["score"])


def place_reward(score: dict[str, Any], cfg: RewardConfig | None = None) -> float:
    """``place_weight * geolocation_reward(score)`` for a missed answer (``score["score"] == 0``) whose score
    dict reports the place parts (city, region, country, km); 0.0 otherwise."""
    cfg = cfg or RewardConfig()
    if score["score"] > 0 or not PLACE_PARTS <= score.keys():
        return 0.0
    return cfg.place_weight * geolocation_reward(score, cfg)


def reward_parts(traj: Trajectory, cfg: RewardConfig | None = None) -> dict[str, float]:
    """Every term and the total (the caller stores them in ``traj.rewards``)."""
    cfg = cfg or RewardConfig()
    score = task_score(traj, cfg)
    task = float(score["score"])
    place = place_reward(score, cfg)
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
    total = task + place + cfg.format_weight * fmt + bonus - failed_pen - excess_pen
    return {"task": task, "place": place, "format": fmt, "tool_bonus": bonus, "failed_calls": failed_pen,
            "excess_calls": excess_pen, "total": total}
