"""Benchmark names -> their modules and the agent settings an eval of them starts from.

``get("videomme")`` gives a :class:`BenchSpec`; ``spec.module`` is the benchmark module (``load``, ``score``,
``summarise``); ``spec.load(data_dir, limit, **options)`` reads its tasks, passing on only the options
that benchmark takes. An unknown name raises :class:`UnknownBenchmark` listing the known ones.

:func:`score` is the one place an answer is judged: by the ``score`` of the task's own benchmark
(``Task.benchmark``), the number ``mmagent eval`` reports and RL rewards pay; a task of the user's own
(``benchmark == ""``) by :mod:`mmagent.eval.benchmarks.generic`, which is no benchmark and not listed here.
An answer to a multiple-choice task that names none of its options (:mod:`mmagent.choices`: "C" when the
options are A and B) gets ``invalid`` saying why, and scores 0 — except on a benchmark whose module names a
public ``REFERENCE`` scorer: there the reference's own reading decides the score (its published numbers
count "A or B" as A), and ``invalid`` only flags the answer.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from mmagent.choices import invalid_reason
from mmagent.trajectory import Task


class UnknownBenchmark(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0])


@dataclass(frozen=True)
class BenchSpec:
    name: str
    #: import path of the benchmark module
    module_name: str
    description: str
    #: tools offered by default (``mmagent tools`` lists them all)
    tools: tuple[str, ...]
    max_turns: int = 6
    max_new_tokens: int = 1024
    #: options of the module's ``load`` that the CLI exposes (flag name -> load keyword)
    options: dict[str, str] = field(default_factory=dict)

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(self.module_name)

    def load(self, data_dir: str | os.PathLike, limit: int | None = None, **options: Any) -> list[Task]:
        """The benchmark's tasks; options its ``load`` does not take are refused."""
        load = self.module.load
        accepted = set(inspect.signature(load).parameters)
        unknown = sorted(k for k, v in options.items() if v is not None and k not in accepted)
        if unknown:
            raise ValueError(f"benchmark {self.name} takes no option {', '.join(unknown)}")
        return load(data_dir, limit=limit, **{k: v for k, v in options.items() if v is not None})


BENCHMARKS: dict[str, BenchSpec] = {spec.name: spec for spec in (
    BenchSpec("synth", "mmagent.eval.benchmarks.synth", "the toy world (build it with `mmagent synth DIR`)",
              ("resample_frames", "zoom", "web_search"), max_turns=6, max_new_tokens=160,
              options={"families": "families"}),
    BenchSpec("videomme", "mmagent.eval.benchmarks.videomme", "Video-MME multiple-choice video QA",
              ("resample_frames",), options={"subtitles": "subtitles"}),
    BenchSpec("charades_sta", "mmagent.eval.benchmarks.charades_sta", "Charades-STA temporal grounding",
              ("resample_frames",)),
    BenchSpec("geo", "mmagent.eval.benchmarks.geo", "geolocation (IM2GPS3K, GeoBench)", ("zoom", "web_search")),
    BenchSpec("vstar", "mmagent.eval.benchmarks.vstar", "V* Bench high-resolution detail QA", ("zoom",)),
)}


def names() -> list[str]:
    return list(BENCHMARKS)


def get(name: str) -> BenchSpec:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise UnknownBenchmark(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}") from None


def module(name: str) -> ModuleType:
    """The benchmark module of ``name`` (has NAME, load, score, summarise)."""
    return get(name).module


#: scores the tasks no benchmark owns
GENERIC_SCORER = "mmagent.eval.benchmarks.generic"


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """The task's own score of ``answer_text`` (always with a float ``"score"``): its benchmark's ``score``,
    or the generic one for a task whose ``benchmark`` is "". An unknown name raises :class:`UnknownBenchmark`.
    An answer that names none of the task's options scores 0 (``invalid``: why)."""
    if not task.benchmark:
        result = dict(importlib.import_module(GENERIC_SCORER).score(task, answer_text))
    elif task.benchmark not in BENCHMARKS:
        raise UnknownBenchmark(f"task {task.id!r} names an unknown benchmark {task.benchmark!r}; known: "
                               f"{', '.join(BENCHMARKS)} (or \"\" for a task of your own)")
    else:
        result = dict(module(task.benchmark).score(task, answer_text))
    if reason := invalid_reason(answer_text, task.options):
        result["invalid"] = reason
        if not (task.benchmark and getattr(module(task.benchmark), "REFERENCE", None)):
            result["score"] = 0.0
    return result
