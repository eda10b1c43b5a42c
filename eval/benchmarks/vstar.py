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
Scoring (the default: ``score`` and ``accuracy``) reproduces lmms-eval's V* rule exactly:
:mod:`mmagent.eval.scorers.lmms_vstar` (EvolvingLMMs-Lab/lmms-eval ``lmms_eval/tasks/vstar_bench/utils.py`` at
75571cfe, ``extract_answer_letter``: upper-cased text, five patterns, A-D for every item), on the answer text
as given (``mmagent eval`` gives the content of the ``<answer>`` block). Accuracy overall (micro, as
vstar_bench_eval.py and lmms-eval report) and per category. Extra column: ``accuracy_lenient``, by mmagent's
own letter parser over the item's own letters (:func:`mmagent.eval.parsing.choice.extract_choice`), which
reads "Answer: C" as C where lmms-eval's first pattern reads the A of "ANSWER".

A malformed question line is skipped and reported by file and line (``TaskList.skipped``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from mmagent.eval.benchmarks.base import (DatasetError, check_media, check_unique, field, find_file, groups,
                                          option_letters, read_rows, share, skip_row, task_list)
from mmagent.eval.parsing.choice import extract_choice
from mmagent.eval.scorers import lmms_vstar
from mmagent.trajectory import Task

NAME = "vstar"
REFERENCE = lmms_vstar.SOURCE
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
    skipped: list[str] = []
    tasks, missing = [], []
    for where, row in read_rows(path, skipped):
        if limit is not None and len(tasks) + len(missing) >= limit:
            break
        try:
            task = _task(row, where, root)
        except DatasetError as exc:
            skip_row(skipped, exc)
            continue
        if not Path(task.image or "").is_file():
            missing.append(task.metadata["image"])
            continue
        tasks.append(task)
    check_media(missing, root, "V* images")
    check_unique(tasks, path, "question_id")
    return task_list(tasks, skipped, path)


def _task(row: dict[str, Any], where: str, root: Path) -> Task:
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
    qid = str(field(row, "question_id", where, (str, int)))
    question = text if INSTRUCTION in text else text.rstrip() + "\n" + INSTRUCTION
    image = root / rel
    return Task(question=question, image=str(image.resolve()) if image.is_file() else str(image), id=qid,
                task_type="image_qa", options=[f"{x}. {o}" for x, o in options], answer=label,
                metadata={"category": field(row, "category", where), "question_id": qid, "image": rel},
                benchmark=NAME)


def parse_options(text: str) -> list[tuple[str, str]]:
    """The ``(A) option`` lines of a V* question text as (letter, option) pairs."""
    return [(m.group(1), m.group(2)) for m in map(_OPTION_LINE.match, text.splitlines()) if m]


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``score`` 1.0 if lmms-eval's V* rule reads the right letter (``pred``, "" if none);
    ``score_lenient`` / ``pred_lenient`` by mmagent's own letter parser."""
    text = answer_text or ""
    pred = lmms_vstar.extract_letter(text) or ""
    lenient = extract_choice(text, option_letters(len(task.options or ()) or 4))
    return {"score": float(pred == str(task.answer).strip().upper()), "pred": pred, "answered": pred != "",
            "score_lenient": float(lenient == task.answer), "pred_lenient": lenient}


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Accuracy (and the share of answers with a letter) overall and per category."""
    return {name: {"n": len(items), "accuracy": sum(s["score"] for s in items) / len(items),
                   "answered": share(s["answered"] for s in items),
                   "accuracy_lenient": sum(float(s.get("score_lenient") or 0.0) for s in items) / len(items)}
            for name, items in groups(tasks, scores, ("category",), order={"category": CATEGORIES}).items()}
