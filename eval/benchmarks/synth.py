"""The toy world as a benchmark: build a dataset folder, load and check it, run an agent on it, score it.

A dataset folder holds::

    tasks.jsonl      one Task per line (question, options, ground truth, difficulty, layout for the oracles)
    config.json      the SynthConfig and seed it was built with, and the MediaBudget it is meant for
    media/           the videos (MP4) and images (PNG) the tasks name, by file name

``build(dir, per_family=50, seed=0)`` writes it (items are generated one at a time with a progress bar;
the same seed gives the same items, and asking for more items keeps the first ones). ``load(dir)`` reads
it back with the media paths resolved and says exactly what is missing or malformed. ``evaluate`` runs
an :class:`~mmagent.agent.Agent` over the tasks and scores every answer (:mod:`mmagent.eval.synth.scoring`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from mmagent.eval.benchmarks.base import DatasetError as BenchmarkDatasetError
from mmagent.eval.synth.families import FAMILIES, SynthConfig, make_item
from mmagent.eval.synth.oracle import SYNTH_TOOLS, OraclePolicy
from mmagent.eval.synth.scoring import format_table, score_answer, summarise
from mmagent.agent import Agent, Budgets
from mmagent.trajectory import Task, Trajectory

NAME = "synth"
TASKS_FILE, CONFIG_FILE, MEDIA_DIR = "tasks.jsonl", "config.json", "media"
#: turns an episode gets (the grounding oracle needs six: the whole video, two looks at each boundary, the answer)
MAX_TURNS = 6

__all__ = ["build", "load", "evaluate", "oracle_agent", "model_agent", "score_answer", "summarise", "format_table",
           "SynthConfig", "FAMILIES", "SYNTH_TOOLS", "DatasetError"]


class DatasetError(BenchmarkDatasetError):
    """A toy-world folder that cannot be used: missing files, bad lines, missing media."""


#: the name every benchmark module scores one answer by
score = score_answer


def build(out_dir: str | os.PathLike, per_family: int = 50, seed: int = 0,
          families: Sequence[str] = FAMILIES, config: SynthConfig | None = None,
          progress: bool = True) -> list[Task]:
    """Generate ``per_family`` items of each family into ``out_dir``; return the tasks (paths resolved)."""
    if per_family < 1:
        raise ValueError("per_family must be at least 1")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown toy-world families {unknown}; choose from {', '.join(FAMILIES)}")
    cfg = config or SynthConfig()
    out = Path(out_dir)
    media = out / MEDIA_DIR
    media.mkdir(parents=True, exist_ok=True)
    tasks = []
    jobs = [(f, i) for f in families for i in range(per_family)]
    tmp = out / (TASKS_FILE + ".part")
    with open(tmp, "w", encoding="utf-8") as fh:
        for family, index in tqdm(jobs, desc="toy world", unit="item", disable=not progress):
            task = replace(make_item(family, index, seed, media, cfg), benchmark=NAME)
            fh.write(json.dumps(asdict(task)) + "\n")
            tasks.append(task)
    os.replace(tmp, out / TASKS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps({
        "benchmark": NAME, "seed": seed, "per_family": per_family, "families": list(families),
        "config": asdict(cfg), "media_budget": asdict(cfg.media_budget())}, indent=2) + "\n")
    return [_resolved(t, media) for t in tasks]


def _resolved(task: Task, media: Path) -> Task:
    data = asdict(task)
    data["benchmark"] = NAME  # tasks.jsonl files written before Task.benchmark existed lack it
    for key in ("video", "image"):
        if data[key] is not None:
            data[key] = str(media / data[key])
    return Task(**data)


def load_config(data_dir: str | os.PathLike) -> SynthConfig:
    path = Path(data_dir) / CONFIG_FILE
    if not path.is_file():
        raise DatasetError(f"{path} is missing: build the folder with `mmagent synth {data_dir}`")
    try:
        raw = json.loads(path.read_text())["config"]
        return SynthConfig(**{f.name: raw[f.name] for f in fields(SynthConfig) if f.name in raw})
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: not a toy-world config ({type(exc).__name__}: {exc})") from None


def load(data_dir: str | os.PathLike, families: Sequence[str] | None = None, limit: int | None = None) -> list[Task]:
    """Read a folder written by :func:`build`; ``limit`` keeps the first N items of each family."""
    root = Path(data_dir)
    path = root / TASKS_FILE
    if not root.is_dir():
        raise DatasetError(f"no toy-world folder at {root}: build one with `mmagent synth {root}`")
    if not path.is_file():
        raise DatasetError(f"{path} is missing: build the folder with `mmagent synth {root}`")
    media = root / MEDIA_DIR
    tasks, counts, problems = [], {}, []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                task = Task(**json.loads(line))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise DatasetError(f"{path}:{line_no}: not a task ({type(exc).__name__}: {exc})") from None
            if task.task_type not in FAMILIES or "family" not in task.metadata:
                raise DatasetError(f"{path}:{line_no}: task type {task.task_type!r} is not a toy-world family")
            if families is not None and task.task_type not in families:
                continue
            counts[task.task_type] = counts.get(task.task_type, 0) + 1
            if limit is not None and counts[task.task_type] > limit:
                continue
            task = _resolved(task, media)
            for key in ("video", "image"):
                p = getattr(task, key)
                if p is not None and not Path(p).is_file():
                    problems.append(f"{task.id}: {key} {p} is missing")
            tasks.append(task)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DatasetError(f"{root}: media files are missing: " + "; ".join(problems[:5]) + more)
    return tasks


def oracle_agent(use_tools: bool = True, config: SynthConfig | None = None, offer_tools: bool = True) -> Agent:
    """An agent whose policy is the toy world's oracle (see :mod:`mmagent.eval.synth.oracle`).

    The no-tool oracle (``use_tools=False``) still sees the tools in its prompt unless ``offer_tools`` is
    False (then its episodes are SFT data for a policy that is run without tools).
    """
    tools = list(SYNTH_TOOLS) if offer_tools else []
    return Agent(OraclePolicy(config=config, use_tools=use_tools), tools=tools,
                 budgets=Budgets(max_turns=MAX_TURNS))


def model_agent(model: str, use_tools: bool = True, device: str | None = None, max_new_tokens: int = 160,
                temperature: float = 0.0, config: SynthConfig | None = None) -> Agent:
    """An agent over a transformers checkpoint with the toy world's tools (none if not ``use_tools``), turn
    limit and pixel budget (on the CPU unless ``device`` says otherwise: the toy world's models are tiny)."""
    return Agent.from_pretrained(model, tools=list(SYNTH_TOOLS) if use_tools else [],
                                 budgets=Budgets(max_turns=MAX_TURNS, max_new_tokens=max_new_tokens),
                                 media_budget=(config or SynthConfig()).media_budget(), temperature=temperature,
                                 device=device or "cpu")


def evaluate(agent: Agent, tasks: Sequence[Task], progress: bool = True, seed: int = 0, batch_size: int = 32
             ) -> tuple[list[Trajectory], list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Run ``agent`` on ``tasks``, ``batch_size`` episodes at a time (each holds its media in memory);
    return the trajectories (the score in ``rewards["task"]``), the scores and the summary."""
    tasks = list(tasks)
    trajectories: list[Trajectory] = []
    with tqdm(total=len(tasks), desc="episodes", unit="ep", disable=not progress) as bar:
        for k in range(0, len(tasks), batch_size):
            chunk = tasks[k:k + batch_size]
            trajectories += agent.run_batch(chunk, seed=seed + k, progress=False)
            bar.update(len(chunk))
    scores = []
    for task, traj in zip(tasks, trajectories):
        s = score_answer(task, traj.answer)
        traj.rewards["task"] = float(s["score"])
        scores.append(s)
    return trajectories, scores, summarise(tasks, scores)
