"""V* Bench: 191 multiple-choice questions about small details in high-resolution images.

Release layout read: craigwu/vstar_bench on the Hugging Face hub (the data of penghao-wu/vstar):
``test_questions.jsonl`` with one object a line, fields question_id, image (a path such as
``direct_attributes/sa_4690.jpg``), text, category (direct_attributes: 115, relative_position: 76) and
label (the right letter); the images lie at that path under the folder. ``text`` is already the full
LLaVA-style prompt: the question, one option a line as ``(A) ...``, then "Answer with the option's letter
from the given choices directly." (four options for direct_attributes, two for relative_position).
The per-image ``.json`` files beside the images put the right option first (vstar_bench_eval.py scores
them by likelihood) and carry no letters, so they are not read.

Prompt: ``text`` as released (lmms-eval's vstar_doc_to_text rewrites the options as "A. ..." and appends
the same instruction again; we keep the release's wording, with the instruction added only if missing).
Scoring: :func:`mmagent.eval.metrics.extract_option_letter` over the item's own letters with the intended prefix
list (``official=False``: the missing-comma quirk is Video-MME's); lmms-eval's vstar extractor also reads
lower-case letters, which this rule does not. Accuracy overall (micro, as vstar_bench_eval.py and
lmms-eval report) and per category.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from mmagent.eval.benchmarks.base import (DatasetError, check_media, check_unique, field, find_file, groups,
                                          option_letters, read_rows, share)
from mmagent.eval.metrics import extract_option_letter
from mmagent.trajectory import Task

NAME = "vstar"
ANNOTATION_FILE = "test_questions.jsonl"
CATEGORIES = ("direct_attributes", "relative_position")
INSTRUCTION = "Answer with the option's letter from the given choices directly."
_OPTION_LINE = re.compile(r"^\s*\(([A-Z])\)\s*(.*\S)\s*$")


def load(data_dir: str | os.PathLike, limit: int | None = None, *,
         annotations: str | os.PathLike | None = None) -> list[Task]:
    """The V* Bench questions in ``data_dir`` (the first ``limit`` of them)."""
    root = Path(data_dir)
    path = Path(annotations) if annotations else find_file(
        root, (ANNOTATION_FILE,), "V* Bench question file",
        hint="The per-image .json files are not enough: they carry no option letters or labels")
    if not path.is_file():
        raise DatasetError(f"V* Bench question file {path} does not exist")
    rows = read_rows(path)
    tasks, missing = [], []
    for where, row in rows[:limit] if limit is not None else rows:
        text = field(row, "text", where)
        options = parse_options(text)
        if len(options) < 2:
            raise DatasetError(f"{where}: field 'text' has {len(options)} option lines like '(A) ...', expected 2+")
        letters = option_letters(len(options))
        if "".join(x for x, _ in options) != letters:
            raise DatasetError(f"{where}: field 'text' letters its options {''.join(x for x, _ in options)}, "
                               f"expected {letters}")
        label = field(row, "label", where).strip().upper()
        if label not in letters:
            raise DatasetError(f"{where}: field 'label' is {row['label']!r}, expected one of {', '.join(letters)}")
        rel = field(row, "image", where)
        image = root / rel
        if not image.is_file():
            missing.append(rel)
            continue
        qid = str(field(row, "question_id", where, (str, int)))
        question = text if INSTRUCTION in text else text.rstrip() + "\n" + INSTRUCTION
        tasks.append(Task(question=question, image=str(image.resolve()), id=qid, task_type="image_qa",
                          options=[f"{x}. {o}" for x, o in options], answer=label,
                          metadata={"category": field(row, "category", where), "question_id": qid, "image": rel},
                          benchmark=NAME))
    check_media(missing, root, "V* images")
    check_unique(tasks, path, "question_id")
    return tasks


def parse_options(text: str) -> list[tuple[str, str]]:
    """The ``(A) option`` lines of a V* question text as (letter, option) pairs."""
    return [(m.group(1), m.group(2)) for m in map(_OPTION_LINE.match, text.splitlines()) if m]


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``score`` 1.0 for the right letter; ``pred`` the letter read ("" if none)."""
    letters = option_letters(len(task.options or ()) or 4)
    pred = extract_option_letter(answer_text or "", letters, official=False)
    return {"score": float(pred == task.answer), "pred": pred, "answered": pred != ""}


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Accuracy (and the share of answers with a letter) overall and per category."""
    return {name: {"n": len(items), "accuracy": sum(s["score"] for s in items) / len(items),
                   "answered": share(s["answered"] for s in items)}
            for name, items in groups(tasks, scores, ("category",), order={"category": CATEGORIES}).items()}
