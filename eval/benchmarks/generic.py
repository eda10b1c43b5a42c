"""Scoring a task of the user's own (``Task.benchmark == ""``): the plain rule for its kind of answer.

No benchmark owns such a task, so :func:`mmagent.eval.registry.score` sends it here. The first rule that
fits decides:

* options and a string answer: 1.0 if the option letter read from the answer
  (:func:`mmagent.eval.metrics.extract_option_letter` with ``official=False``, the prefixes as their authors
  meant them) is the first letter of the true one;
* ``task_type == "grounding"`` with a true segment: the temporal IoU of the first [start, end] pair read
  from the answer;
* a string answer: 1.0 for a case-insensitive exact match (surrounding spaces ignored);
* anything else (no answer, no ground truth, or one of another shape): 0.0.

There is no loader and no summary: this is not a benchmark ``mmagent eval --bench`` can run.
"""

from __future__ import annotations

from typing import Any

from mmagent.eval.metrics import extract_option_letter, parse_interval, temporal_iou
from mmagent.trajectory import Task

NAME = "generic"


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``score`` in [0, 1] by the first rule above that fits; ``pred`` what was read from the answer."""
    truth = task.answer
    if answer_text is None:
        return {"score": 0.0, "pred": None}
    text = answer_text
    if task.options and isinstance(truth, str):
        pred = extract_option_letter(text, official=False)
        return {"score": float(pred == truth.strip().upper()[:1]), "pred": pred}
    if task.task_type == "grounding" and truth is not None:
        interval = parse_interval(text)
        return {"score": temporal_iou(interval, tuple(truth)), "pred": list(interval) if interval else None}
    if isinstance(truth, str):
        return {"score": float(text.strip().lower() == truth.strip().lower()), "pred": text.strip()}
    return {"score": 0.0, "pred": None}
