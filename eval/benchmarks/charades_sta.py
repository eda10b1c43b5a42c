"""Charades-STA: temporal grounding of a sentence in an indoor Charades video (3,720 test queries).

Release layouts read (``annotations=`` names a file directly):

* The original release (Gao et al., TALL): ``charades_sta_test.txt``, one query a line as
  ``VIDEO_ID START END##sentence`` (e.g. ``3MSZA 24.3 30.4##person turn a light on.``), times in seconds;
  the videos are Charades ``Charades_v1_480/{VIDEO_ID}.mp4``. When the Charades ``Charades_v1_test.csv``
  (columns id, ..., length) lies beside them, each video's length in seconds goes into the metadata.
* lmms-lab/charades_sta on the Hugging Face hub, as lmms-eval uses it: ``data/test-00000-of-00001.parquet``
  with columns video (a file name under ``Charades_v1_480/``), caption, timestamp ([start, end]; stored as
  float16 there, so e.g. 30.4 reads back as 30.40625) (lmms_eval/tasks/charades_sta/utils.py). The same
  rows as ``charades_sta_test.json`` / ``.jsonl`` need no pyarrow.

Prompt: lmms-eval's ``temporal_grounding_doc_to_text`` with the pre/post prompts of charades.yaml, i.e.
``f"{PRE_PROMPT}{caption}. {POST_PROMPT}"`` (typos kept); a caption's own final full stop is dropped first so
it does not double.

Scoring (the default, ``score`` and the headline columns) reproduces lmms-eval's Charades-STA scorer exactly:
:mod:`mmagent.eval.scorers.lmms_charades` (EvolvingLMMs-Lab/lmms-eval ``lmms_eval/tasks/charades_sta/utils.py``
at 75571cfe: ``extract_time``, ``iou``, ``_temporal_grounding_compute_metrics``), applied to the answer text as
given (``mmagent eval`` gives the content of the ``<answer>`` block). An answer it cannot read scores IoU 0.
Reported: R@1 at IoU 0.3 / 0.5 / 0.7 (``r@0.3`` ...) and ``miou`` as fractions (lmms-eval prints them x100),
and ``parsed``, the share it could read. Extra columns, never in their place: ``r@0.3_lenient`` ... and
``miou_lenient`` from mmagent's own parser (:func:`mmagent.eval.parsing.interval.parse_interval`: the span the
answer states, no negative times) with plain IoU.

A malformed annotation line (wrong shape, no sentence, a start after its end) is skipped and reported by file
and line (``TaskList.skipped``), not fatal to the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from mmagent.eval.benchmarks.base import (ANNOTATIONS_HINT, DatasetError, check_media, check_unique, field, find_file,
                                          number, read_rows, share, skip_row, task_list)
from mmagent.eval.metrics import mean_iou, recall_at_iou, temporal_iou
from mmagent.eval.parsing.interval import parse_interval
from mmagent.eval.scorers import lmms_charades
from mmagent.trajectory import Task

NAME = "charades_sta"
REFERENCE = lmms_charades.SOURCE
VIDEO_DIR = "Charades_v1_480"
PRE_PROMPT = ("Please find the visual event described by a sentence in the video, determining its starting and "
              "ending times. The format should be: 'The event happens in the start time - end time'. For example, "
              "The event 'person turn a light on' happens in the 24.3 - 30.4 seonds. Now I will give you the "
              "textual sentence: ")
POST_PROMPT = "Please return its start time and end time."
THRESHOLDS = (0.3, 0.5, 0.7)


def annotation_files(split: str) -> tuple[str, ...]:
    return (f"charades_sta_{split}.txt", f"data/{split}-00000-of-00001.parquet", f"charades_sta_{split}.jsonl",
            f"charades_sta_{split}.json")


def load(data_dir: str | os.PathLike, limit: int | None = None, *, split: str = "test",
         annotations: str | os.PathLike | None = None) -> list[Task]:
    """The Charades-STA queries of ``split`` in ``data_dir`` (the first ``limit`` of them)."""
    root = Path(data_dir)
    path = Path(annotations) if annotations else find_file(
        root, annotation_files(split), "Charades-STA annotation file", hint=ANNOTATIONS_HINT)
    if not path.is_file():
        raise DatasetError(f"Charades-STA annotation file {path} does not exist")
    skipped: list[str] = []
    queries = _read_txt(path, skipped) if path.suffix == ".txt" else _read_table(path, skipped)
    lengths = _video_lengths(root, split)
    tasks, missing = [], []
    for k, (where, video, start, end, caption) in enumerate(queries[:limit] if limit is not None else queries):
        vid = Path(video).stem
        file = root / VIDEO_DIR / (video if Path(video).suffix else f"{video}.mp4")
        if not file.is_file():
            missing.append(f"{VIDEO_DIR}/{file.name}")
            continue
        meta = {"video_id": vid, "caption": caption, "start": start, "end": end, "duration": lengths.get(vid),
                "source": where}
        tasks.append(Task(question=build_prompt(caption), video=str(file.resolve()), id=f"{vid}_{k:04d}",
                          task_type="grounding", answer=[start, end], metadata=meta, benchmark=NAME))
    check_media(missing, root, "Charades videos")
    check_unique(tasks, path)
    return task_list(tasks, skipped, path)


def build_prompt(caption: str) -> str:
    """lmms-eval's Charades-STA prompt for one sentence."""
    return f"{PRE_PROMPT}{caption.strip().rstrip('.').strip()}. {POST_PROMPT}"


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``score`` = ``iou``: lmms-eval's IoU of the interval its ``extract_time`` reads (``pred``, None if none);
    ``iou_lenient`` / ``pred_lenient``: the same with mmagent's own parser."""
    text = answer_text or ""
    truth = (float(task.answer[0]), float(task.answer[1]))
    pred = lmms_charades.extract_interval(text)
    iou = 0.0 if pred is None else lmms_charades.iou(truth, pred)
    lenient = parse_interval(text)
    return {"score": iou, "iou": iou, "pred": list(pred) if pred else None,
            "iou_lenient": temporal_iou(lenient, truth), "pred_lenient": list(lenient) if lenient else None}


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """R@1 at IoU 0.3 / 0.5 / 0.7 (``r@0.3`` ...), ``miou`` and ``parsed`` by lmms-eval's rule, then the same
    by the lenient parser (``r@0.3_lenient`` ..., ``miou_lenient``, ``parsed_lenient``)."""
    if len(tasks) != len(scores):
        raise ValueError(f"{len(tasks)} tasks but {len(scores)} scores")
    if not scores:
        return {}
    row: dict[str, float] = {"n": len(scores)}
    for suffix in ("", "_lenient"):
        ious = [float(s.get(f"iou{suffix}") or 0.0) for s in scores]
        row.update({f"r@{t:g}{suffix}": v for t, v in recall_at_iou(ious, THRESHOLDS).items()})
        row[f"miou{suffix}"] = mean_iou(ious)
        row[f"parsed{suffix}"] = share(s.get(f"pred{suffix}") is not None for s in scores)
    return {"overall": row}


# --------------------------------------------------------------------------- reading the annotations

_Query = tuple[str, str, float, float, str]  # where, video file or id, start, end, caption


def _read_txt(path: Path, skipped: list[str]) -> list[_Query]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    out.append(_txt_query(line, f"{path}:{k}"))
                except DatasetError as exc:
                    skip_row(skipped, exc)
    return out


def _txt_query(line: str, where: str) -> _Query:
    head, sep, caption = line.strip().partition("##")
    parts = head.split()
    if not sep or len(parts) != 3:
        raise DatasetError(f"{where}: expected 'VIDEO_ID START END##sentence', got {line.strip()!r}")
    if not caption.strip():
        raise DatasetError(f"{where}: field 'sentence' is empty")
    row = {"start": parts[1], "end": parts[2]}
    start, end = number(row, "start", where), number(row, "end", where)
    return (where, parts[0], *_checked(start, end, where), caption.strip())


def _read_table(path: Path, skipped: list[str]) -> list[_Query]:
    out = []
    for where, row in read_rows(path, skipped):
        try:
            out.append(_table_query(row, where))
        except DatasetError as exc:
            skip_row(skipped, exc)
    return out


def _table_query(row: dict[str, Any], where: str) -> _Query:
    ts = row.get("timestamp")
    if hasattr(ts, "tolist"):
        ts = ts.tolist()
    if isinstance(ts, str):  # lmms-eval also accepts "[24.3, 30.4]"
        ts = re.findall(r"-?\d+(?:\.\d+)?", ts)
    if not isinstance(ts, (list, tuple)) or len(ts) != 2:
        raise DatasetError(f"{where}: field 'timestamp' is {row.get('timestamp')!r}, expected [start, end]")
    start, end = number({"timestamp": ts[0]}, "timestamp", where), number({"timestamp": ts[1]}, "timestamp", where)
    return (where, str(field(row, "video", where)), *_checked(start, end, where),
            field(row, "caption", where).strip())


def _checked(start: float, end: float, where: str) -> tuple[float, float]:
    if start < 0 or end < start:
        raise DatasetError(f"{where}: the segment [{start}, {end}] is not 0 <= start <= end")
    return start, end


def _video_lengths(root: Path, split: str) -> dict[str, float]:
    """Charades ``Charades_v1_{split}.csv`` id -> length in seconds, if that file is there."""
    for name in (f"Charades_v1_{split}.csv", f"Charades/Charades_v1_{split}.csv"):
        if (root / name).is_file():
            return {field(r, "id", w): number(r, "length", w) for w, r in read_rows(root / name)}
    return {}
