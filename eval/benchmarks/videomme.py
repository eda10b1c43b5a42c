"""Video-MME: 2,700 four-option questions on 900 videos (short < 2 min, medium 4-15 min, long 30-60 min).

Release layouts read (``annotations=`` names a file directly):

* lmms-lab/Video-MME on the Hugging Face hub, as lmms-eval uses it: ``videomme/test-00000-of-00001.parquet``
  with columns video_id, duration, domain, sub_category, url, videoID, question_id, task_type, question,
  options (``["A. ...", ...]``), answer (a letter); the unzipped video chunks give ``data/{videoID}.mp4``
  (lmms-eval also tries ``.MP4`` and ``.mkv``) and subtitle.zip gives ``subtitle/{videoID}.srt``
  (lmms_eval/tasks/videomme/utils.py, ``videomme_doc_to_visual`` and ``videomme_doc_to_text_subtitle``).
  The same rows as ``videomme.json`` / ``videomme.jsonl`` need no pyarrow.
* The official JSON (BradyFU/Video-MME README, evaluation/output_test_template.json): one object per
  video with video_id, duration_category, video_category, video_subcategory (README: video_sub_category),
  url, questions [{question_id, task_type, question, choices, answer}]; videoID is taken from the url.

Prompt (``prompt="lmms-eval"``, the default): lmms-eval's ``videomme_doc_to_text`` with its default
post_prompt (videomme.yaml), i.e. "Select the best answer ... based on the video and the subtitles. Respond
with only the letter (A, B, C, or D) of the correct option." + question + options + a blank line + "Answer
with the option's letter from the given choices directly."; with ``subtitles=True``, its
``videomme_doc_to_text_subtitle``: "This video's subtitles are listed below: " + the subtitle text + the
same instruction + question + options + "The best answer is:". ``prompt="official"`` is the README's
wording ("... based on the video. Respond ..." and "The best answer is:").

Subtitles as lmms-eval inserts them (frame_num 32 in videomme_w_subtitle.yaml): sample ``subtitle_frames``
frame indices uniformly over the video, keep the cues shown at any of them, in order, one a line, each the
text of its first ``<font color="white" size=".72c">`` tag (a cue without that tag keeps its plain text,
where lmms-eval would drop it); ``subtitle_frames=None`` keeps every cue. A video without an .srt gets
"No subtitles available", as in lmms-eval, and ``metadata["has_subtitles"] = False``.

Scoring (the default: ``score`` and the headline columns) is the rule Video-MME's published results use, the
2024 ``extract_characters_regex`` as lmms-eval had it before 2026 and BradyFU/Video-MME's
eval_your_results.py has it: :mod:`mmagent.eval.scorers.videomme_2024` (EvolvingLMMs-Lab/lmms-eval
``lmms_eval/tasks/videomme/utils.py`` at d0c1eae7, missing-comma quirk included), on the answer text as given
(``mmagent eval`` gives the content of the ``<answer>`` block). Not the default: lmms-eval's 2026
``extract_mcq_answer`` (9ca4445d) and the newer parser the Video-MME README links (thanku-all/parse_answer).
``accuracy`` counts an unparsed answer as wrong (lmms-eval's aggregation: correct / all items, overall and per
duration, domain, sub-category, task type); ``accuracy_answered`` divides by the parsed ones only, as
eval_your_results.py does. Extra column: ``accuracy_lenient``, by mmagent's own letter parser
(:func:`mmagent.eval.parsing.choice.extract_choice`: lower case, prefixes, negations).

A malformed annotation row is skipped and reported by file and row (``TaskList.skipped``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import parse_qs, urlparse

from mmagent.eval.benchmarks.base import (ANNOTATIONS_HINT, DatasetError, check_media, check_unique, field, find_file,
                                          groups, option_letters, read_rows, skip_row, task_list)
from mmagent.eval.parsing.choice import extract_choice
from mmagent.eval.scorers import videomme_2024
from mmagent.trajectory import Task

NAME = "videomme"
REFERENCE = videomme_2024.SOURCE
ANNOTATION_FILES = ("videomme/test-00000-of-00001.parquet", "videomme.json", "videomme.jsonl", "Video-MME.json")
VIDEO_DIR, SUBTITLE_DIR = "data", "subtitle"
VIDEO_EXTS = (".mp4", ".MP4", ".mkv")
DURATIONS = ("short", "medium", "long")
# The official orders (CATEGORIES and TASK_CATEGORIES in eval_your_results.py), used to order report rows.
DOMAINS = ("Knowledge", "Film & Television", "Sports Competition", "Artistic Performance", "Life Record",
           "Multilingual")
TASK_TYPES = ("Temporal Perception", "Spatial Perception", "Attribute Perception", "Action Recognition",
              "Object Recognition", "OCR Problems", "Counting Problem", "Temporal Reasoning", "Spatial Reasoning",
              "Action Reasoning", "Object Reasoning", "Information Synopsis")

INSTRUCTION = {
    "lmms-eval": "Select the best answer to the following multiple-choice question based on the video and the "
                 "subtitles. Respond with only the letter (A, B, C, or D) of the correct option.",
    "official": "Select the best answer to the following multiple-choice question based on the video. "
                "Respond with only the letter (A, B, C, or D) of the correct option.",
}
LMMS_POST_PROMPT = "\nAnswer with the option's letter from the given choices directly."  # videomme.yaml default
BEST_ANSWER = "The best answer is:"
SUBTITLES_HEADER = {"lmms-eval": "This video's subtitles are listed below: \n",
                    "official": "This video's subtitles are listed below:\n"}
NO_SUBTITLES = "No subtitles available"
_FONT = re.compile(r'<font color="white" size=".72c">(.*?)</font>')
_TAG = re.compile(r"<[^>]+>")
_SRT_TIME = re.compile(r"(\d+):(\d{1,2}):(\d{1,2})[,.](\d{1,3})")


def load(data_dir: str | os.PathLike, limit: int | None = None, *, subtitles: bool = False,
         subtitle_frames: int | None = 32, prompt: str = "lmms-eval", durations: Sequence[str] | None = None,
         annotations: str | os.PathLike | None = None) -> list[Task]:
    """The Video-MME questions in ``data_dir`` (the first ``limit`` of them, of the given ``durations``)."""
    if prompt not in INSTRUCTION:
        raise ValueError(f"prompt must be one of {', '.join(INSTRUCTION)}, not {prompt!r}")
    bad = [d for d in durations or () if d not in DURATIONS]
    if bad:
        raise ValueError(f"unknown durations {bad}; choose from {', '.join(DURATIONS)}")
    root = Path(data_dir)
    path = Path(annotations) if annotations else find_file(
        root, ANNOTATION_FILES, "Video-MME annotation file", hint=ANNOTATIONS_HINT)
    if not path.is_file():
        raise DatasetError(f"Video-MME annotation file {path} does not exist")
    skipped: list[str] = []
    rows = _flat_rows(read_rows(path, skipped), skipped)
    tasks, missing, kept = [], [], 0
    for where, row in rows:
        try:
            item = _parse(row, where)
        except DatasetError as exc:
            skip_row(skipped, exc)
            continue
        if durations and item["duration"] not in durations:
            continue
        if limit is not None and kept >= limit:
            break
        kept += 1
        video = _find_video(root / VIDEO_DIR, item["videoID"])
        if video is None:
            missing.append(f"{VIDEO_DIR}/{item['videoID']}.mp4")
            continue
        meta = {k: item[k] for k in ("duration", "domain", "sub_category", "task_type", "video_id", "videoID",
                                     "question_id", "url")}
        subtitle_text = None
        if subtitles:
            srt = root / SUBTITLE_DIR / f"{item['videoID']}.srt"
            meta["has_subtitles"] = srt.is_file()
            meta["subtitle_file"] = str(srt.resolve()) if srt.is_file() else None
            subtitle_text = subtitle_prompt_text(srt, video, subtitle_frames) if srt.is_file() else NO_SUBTITLES
        tasks.append(Task(question=build_prompt(item["question"], item["options"], prompt, subtitle_text),
                          video=str(video.resolve()), id=item["question_id"], task_type="video_qa",
                          options=item["options"], answer=item["answer"], metadata=meta, benchmark=NAME))
    check_media(missing, root, "Video-MME videos")
    check_unique(tasks, path, "question_id")
    return task_list(tasks, skipped, path)


def build_prompt(question: str, options: Sequence[str], style: str = "lmms-eval", subtitles: str | None = None) -> str:
    """The text the model sees, in lmms-eval's or the README's wording; ``subtitles`` None: no subtitle block."""
    body = INSTRUCTION[style] + "\n" + question + "\n" + "\n".join(options) + "\n"
    if subtitles is None:
        return body + (LMMS_POST_PROMPT if style == "lmms-eval" else BEST_ANSWER)
    return SUBTITLES_HEADER[style] + subtitles + "\n" + body + BEST_ANSWER


def parse_srt(path: str | os.PathLike) -> list[tuple[float, float, str]]:
    """(start s, end s, text) for each cue of an .srt file; a cue's lines are joined with spaces."""
    text = Path(path).read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    cues = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.strip().split("\n") if ln.strip()]
        timing = next((k for k, ln in enumerate(lines) if "-->" in ln), None)
        if timing is None:
            continue
        times = _SRT_TIME.findall(lines[timing])
        if len(times) != 2:
            raise DatasetError(f"{path}: bad subtitle timing line {lines[timing]!r}")
        (h1, m1, s1, ms1), (h2, m2, s2, ms2) = times
        start = int(h1) * 3600 + int(m1) * 60 + int(s1) + int(ms1) / 1000
        end = int(h2) * 3600 + int(m2) * 60 + int(s2) + int(ms2) / 1000
        cues.append((start, end, " ".join(lines[timing + 1:])))
    return cues


def _cue_text(raw: str) -> str:
    match = _FONT.search(raw)
    return match.group(1) if match else _TAG.sub("", raw).strip()


def subtitle_prompt_text(srt: str | os.PathLike, video: str | os.PathLike, frames: int | None = 32) -> str:
    """The subtitle lines lmms-eval would insert for ``frames`` uniformly sampled frames (None: every cue)."""
    cues = parse_srt(srt)
    if frames is not None:
        import cv2
        import numpy as np

        cap = cv2.VideoCapture(str(video))
        fps, total = cap.get(cv2.CAP_PROP_FPS), int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        cap.release()
        if fps <= 0 or total <= 0:
            raise DatasetError(f"{video}: cannot read its frame rate and frame count to place the subtitles")
        sampled = np.linspace(0, total - 1, total if frames == -1 else frames, dtype=int)
        spans = [(int(s * fps), int(e * fps)) for s, e, _ in cues]
        keep = sorted({k for f in sampled for k, (a, b) in enumerate(spans) if a <= f < b})
        cues = [cues[k] for k in keep]
    return "\n".join(t for t in (_cue_text(c[2]) for c in cues) if t)


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``score`` 1.0 if the 2024 Video-MME rule reads the right letter (``pred``, "" if none);
    ``score_lenient`` / ``pred_lenient`` by mmagent's own letter parser."""
    text = answer_text or ""
    pred = videomme_2024.extract_letter(text)
    lenient = extract_choice(text, "".join(o[:1] for o in task.options or ()) or "ABCD")
    return {"score": float(pred.lower() == str(task.answer).lower()), "pred": pred, "answered": pred != "",
            "score_lenient": float(lenient == task.answer), "pred_lenient": lenient}


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Accuracy overall and per duration, domain, sub-category and task type."""
    out = {}
    rows = groups(tasks, scores, ("duration", "domain", "sub_category", "task_type"),
                  order={"duration": DURATIONS, "domain": DOMAINS, "task_type": TASK_TYPES})
    for name, items in rows.items():
        correct = sum(s["score"] for s in items)
        answered = sum(bool(s["answered"]) for s in items)
        out[name] = {"n": len(items), "accuracy": correct / len(items), "answered": answered / len(items),
                     "accuracy_answered": correct / answered if answered else 0.0,
                     "accuracy_lenient": sum(float(s.get("score_lenient") or 0.0) for s in items) / len(items)}
    return out


# --------------------------------------------------------------------------- reading the rows

def _flat_rows(rows: list[tuple[str, dict[str, Any]]], skipped: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """One row per question: the official per-video JSON is flattened into the lmms-eval columns."""
    out = []
    for where, row in rows:
        if "questions" not in row:
            out.append((where, row))
            continue
        questions = row["questions"]
        if not isinstance(questions, list) or not questions:
            skip_row(skipped, DatasetError(f"{where}: field 'questions' is {questions!r}, expected a non-empty list"))
            continue
        video = {"video_id": row.get("video_id"), "url": row.get("url"),
                 "duration": row.get("duration_category", row.get("duration")),
                 "domain": row.get("video_category", row.get("domain")),
                 "sub_category": row.get("video_subcategory", row.get("video_sub_category", row.get("sub_category"))),
                 "videoID": row.get("videoID") or _youtube_id(row.get("url")) or row.get("video_id")}
        for j, q in enumerate(questions, start=1):
            if not isinstance(q, dict):
                skip_row(skipped, DatasetError(f"{where}.{j}: expected a question object, got {type(q).__name__}"))
                continue
            out.append((f"{where}.{j}", {**video, **q, "options": q.get("options", q.get("choices"))}))
    return out


def _youtube_id(url: Any) -> str | None:
    if not isinstance(url, str) or not url:
        return None
    parsed = urlparse(url)
    if parsed.hostname and parsed.hostname.endswith("youtu.be"):
        return parsed.path.strip("/") or None
    return (parse_qs(parsed.query).get("v") or [None])[0]


def _parse(row: dict[str, Any], where: str) -> dict[str, Any]:
    options = row.get("options")
    if hasattr(options, "tolist"):  # a numpy array from a Parquet reader
        options = options.tolist()
    if not isinstance(options, (list, tuple)) or len(options) < 2 or not all(
            isinstance(o, str) and o.strip() for o in options):
        raise DatasetError(f"{where}: field 'options' is {options!r}, expected a list of at least two strings")
    letters = option_letters(len(options))
    options = [o if o.startswith(f"{x}.") else f"{x}. {o}" for x, o in zip(letters, options)]
    answer = field(row, "answer", where).strip()
    if answer not in letters:
        raise DatasetError(f"{where}: field 'answer' is {answer!r}, expected one of {', '.join(letters)}")
    duration = field(row, "duration", where)
    if duration not in DURATIONS:
        raise DatasetError(f"{where}: field 'duration' is {duration!r}, expected one of {', '.join(DURATIONS)}")
    qid = field(row, "question_id", where, (str, int))
    return {"question": field(row, "question", where), "options": options, "answer": answer,
            "duration": duration, "domain": field(row, "domain", where),
            "sub_category": field(row, "sub_category", where), "task_type": field(row, "task_type", where),
            "videoID": str(field(row, "videoID", where, (str, int))), "question_id": str(qid),
            "video_id": str(row.get("video_id") or ""), "url": str(row.get("url") or "")}


def _find_video(folder: Path, video_id: str) -> Path | None:
    for ext in VIDEO_EXTS:
        if (folder / f"{video_id}{ext}").is_file():
            return folder / f"{video_id}{ext}"
    return None

