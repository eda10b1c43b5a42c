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

Scoring: the first [start, end] pair in the answer (:func:`mmagent.eval.metrics.parse_interval`) against the
truth by IoU; an answer without one scores IoU 0, as lmms-eval's bad predictions do. lmms-eval's own
``extract_time`` searches sentences with words such as "start"/"happens in" first, so a few free-form
answers parse differently; answers of the form "24.3 - 30.4" agree. Reported: R@1 at IoU 0.3/0.5/0.7 and
mIoU (as fractions; lmms-eval prints them x100).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from mmagent.eval.benchmarks.base import (ANNOTATIONS_HINT, DatasetError, check_media, check_unique, field, find_file,
                                          number, read_rows, share)
from mmagent.eval.metrics import mean_iou, parse_interval, recall_at_iou, temporal_iou
from mmagent.trajectory import Task

NAME = "charades_sta"
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
    queries = _read_txt(path) if path.suffix == ".txt" else _read_table(path)
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
    return tasks


def build_prompt(caption: str) -> str:
    """lmms-eval's Charades-STA prompt for one sentence."""
    return f"{PRE_PROMPT}{caption.strip().rstrip('.').strip()}. {POST_PROMPT}"


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``score`` = ``iou`` of the first parsed interval with the truth; ``pred`` None if none was parsed."""
    pred = parse_interval(answer_text or "")
    iou = temporal_iou(pred, tuple(task.answer))
    return {"score": iou, "iou": iou, "pred": list(pred) if pred else None}


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """R@1 at IoU 0.3 / 0.5 / 0.7 (``r@0.3`` ...), ``miou`` and the share of answers with an interval."""
    if len(tasks) != len(scores):
        raise ValueError(f"{len(tasks)} tasks but {len(scores)} scores")
    if not scores:
        return {}
    ious = [s["iou"] for s in scores]
    row: dict[str, float] = {"n": len(ious)}
    row.update({f"r@{t:g}": v for t, v in recall_at_iou(ious, THRESHOLDS).items()})
    row["miou"] = mean_iou(ious)
    row["parsed"] = share(s["pred"] is not None for s in scores)
    return {"overall": row}


# --------------------------------------------------------------------------- reading the annotations

_Query = tuple[str, str, float, float, str]  # where, video file or id, start, end, caption


def _read_txt(path: Path) -> list[_Query]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{k}"
            head, sep, caption = line.strip().partition("##")
            parts = head.split()
            if not sep or len(parts) != 3:
                raise DatasetError(f"{where}: expected 'VIDEO_ID START END##sentence', got {line.strip()!r}")
            if not caption.strip():
                raise DatasetError(f"{where}: field 'sentence' is empty")
            row = {"start": parts[1], "end": parts[2]}
            start, end = number(row, "start", where), number(row, "end", where)
            out.append((where, parts[0], *_checked(start, end, where), caption.strip()))
    return out


def _read_table(path: Path) -> list[_Query]:
    out = []
    for where, row in read_rows(path):
        ts = row.get("timestamp")
        if hasattr(ts, "tolist"):
            ts = ts.tolist()
        if isinstance(ts, str):  # lmms-eval also accepts "[24.3, 30.4]"
            ts = re.findall(r"-?\d+(?:\.\d+)?", ts)
        if not isinstance(ts, (list, tuple)) or len(ts) != 2:
            raise DatasetError(f"{where}: field 'timestamp' is {row.get('timestamp')!r}, expected [start, end]")
        start, end = number({"timestamp": ts[0]}, "timestamp", where), number({"timestamp": ts[1]}, "timestamp", where)
        out.append((where, str(field(row, "video", where)), *_checked(start, end, where),
                    field(row, "caption", where).strip()))
    return out


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
