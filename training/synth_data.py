"""SFT cold-start data from the toy world: the oracle's tool-using episodes, as trajectories.

:func:`write_sft_data` runs the tool oracle (:mod:`mmagent.eval.synth.oracle`) through the real agent loop and
tools over a toy-world folder's tasks and saves the episodes whose answer scores at least ``min_score``
as JSONL (+ the tool images), the schema SFT reads. The episodes hold the texts and observations, not
token ids (the oracle is not a model); :func:`sft_scripts` gives each episode's assistant turns, which
:class:`~mmagent.policy.replay.ReplayChooser` forces through a real policy to get the exact token ids
and loss masks that policy would have produced. The RL prompt set is the folder's ``tasks.jsonl``
itself (each task carries its family and difficulty).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from mmagent.eval.benchmarks.synth import evaluate, oracle_agent
from mmagent.eval.synth.families import SynthConfig
from mmagent.trajectory import Task, Trajectory, save_jsonl


def write_sft_data(tasks: Sequence[Task], out_path: str | os.PathLike, config: SynthConfig | None = None,
                   min_score: float = 0.5, progress: bool = True) -> dict[str, Any]:
    """Save the oracle's episodes on ``tasks`` that score at least ``min_score``; return counts per family."""
    trajectories, scores, summary = evaluate(oracle_agent(use_tools=True, config=config), tasks,
                                             progress=progress)
    kept = [t for t, s in zip(trajectories, scores) if s["score"] >= min_score]
    save_jsonl(kept, out_path)
    per_family: dict[str, dict[str, int]] = {}
    for traj, s in zip(trajectories, scores):
        row = per_family.setdefault(traj.task.task_type, {"episodes": 0, "kept": 0, "tool_calls": 0})
        row["episodes"] += 1
        row["kept"] += int(s["score"] >= min_score)
        row["tool_calls"] += len(traj.tool_calls)
    return {"path": str(out_path), "kept": len(kept), "total": len(trajectories), "families": per_family,
            "oracle": summary}


def sft_scripts(trajectories: Iterable[Trajectory]) -> dict[str, list[str]]:
    """Task id -> the assistant turns of its episode, in order (a :class:`ReplayChooser` script table)."""
    return {t.task.id: [turn.text for turn in t.turns if turn.role == "assistant"] for t in trajectories}


def default_sft_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / "sft" / "oracle.jsonl"
