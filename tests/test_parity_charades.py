"""Charades-STA scores equal lmms-eval's on raw outputs of the kinds VLMs write.

The reference is written out again here from EvolvingLMMs-Lab/lmms-eval
lmms_eval/tasks/charades_sta/utils.py at 75571cfe (``extract_time``, ``iou``,
``_temporal_grounding_compute_metrics``), in this file's own code, and applied to each output against several
true segments; the per-item IoU and the R@0.3/0.5/0.7 and mIoU of the whole set must be equal.
"""

from __future__ import annotations

import re

import pytest

from mmagent.eval.benchmarks import charades_sta
from mmagent.trajectory import Task

OUTPUTS = [
    # the prompt's own format
    "The event happens in the 24.3 - 30.4 seconds.", "The event happens in 0.0 - 6.9 seconds",
    "24.3 - 30.4", "24.3-30.4", "24.3 – 30.4 seconds", "12.5s-20s", "12.5 s - 20 s", "3.1s – 7.4s",
    # to / from
    "from 12.5 to 20 seconds", "The event starts at 12.5 and ends at 20.", "It happens from 5 to 11.2s.",
    "Start time: 3.0 seconds\nEnd time: 9.5 seconds", "start: 4.2, end: 9.8",
    "The start time is 0 seconds, and the end time is 12 seconds.",
    "The event starts at 00:00:18 and ends at 00:00:23.", "0:05 - 0:12", "00:01:05 - 00:01:20",
    "1:05 to 1:20", "from 0:03 to 0:09.", "Between 2 and 9 seconds.",
    # brackets and answer tags
    "[12, 22]", "[12.0, 22.0]", "(3.5, 8.0)", "<answer>[4.2, 9.8]</answer>", "<answer>4.2 - 9.8</answer>",
    "<answer>12.5-20</answer>", "<answer>start: 1.5 end: 6.0</answer>", "[3.1 - 7.4] seconds",
    # reasoning then answer, prose with other numbers
    "The video is 30 seconds long. The event happens in 5 - 10 seconds.",
    "In video 2, the person opens the door from 3.5s to 7s.",
    "<think>The person stands up around 10s and sits at 20s.</think><answer>10 - 20</answer>",
    "The person turns on the light at 12.5 seconds and it stays on until 18 seconds.",
    "There are 2 people. The first one opens the fridge between 4.0 and 9.0 seconds.",
    "The clip is 32.1s long; the action is at 14.0-18.5s.",
    "Looking at frames 3 to 8, the event happens in 6.2 - 12.8 seconds!",
    "The event happens in 20.8 - 30.0 seconds. A specific example is : 20.8 - 30.0 seconds",
    "person turn a light on happens at 8.0 to 15.5",
    "The answer is 7.5 - 3.2",  # reversed
    "It starts around 4 s. It ends around 9 s.", "It starts around 4 s? It ends around 9 s?",
    "Starts: 2.5\nEnds: 11", "begin 3 finish 8", "The action takes place during 6.5-13 s of the video.",
    "Timestamps: 00:12 - 00:19", "0:12-0:19", "The event occurs at 12.0 seconds.",
    "The event happens at the start of the video.", "The event happens towards the end, at 28 seconds - 31 seconds.",
    "-3.0 - 5.0", "5 to -2", "The tomato is cut from 2 to 6 seconds",
    "3.5 - 3.5", "10 - 10.000", "0 - 0", "1e3 - 2e3", "12.5.3 - 20",
    "I'm sorry, I can't determine when this happens.", "", "no numbers here", "The event does not happen.",
    "around 12 seconds", "The person is sitting in a chair", "1080p video, 30 fps: 2.0 - 4.5",
    "from 1 minute 5 seconds to 1 minute 20 seconds", "between 0:05.5 and 0:09.25",
    "The event happens in the 15.2 - 21.9 seonds.", "Event: [ 7.0 , 12.3 ]",
]

TRUTHS = [(24.3, 30.4), (0.0, 6.9), (4.2, 9.8), (12.0, 20.0), (24.296875, 30.40625)]


# --------------------------------------------------------------------------- the reference, written again

def _to_seconds(t: str) -> float:
    parts = t.split(":")
    if len(parts) == 3:
        h, m, s = map(float, parts)
        return h * 3600 + m * 60 + s
    m, s = map(float, parts)
    return m * 60 + s


def reference_extract_time(paragraph: str) -> list:
    paragraph = paragraph.lower().replace("A specific example is : 20.8 - 30.0 seconds".lower(), "")
    paragraph = paragraph.replace("to", "-")
    sentences = re.split(r"[!?\n]", paragraph)
    keywords = ["starts", "ends", "happens in", "start time", "end time", "start", "end", "happen"]
    candidates = [x for x in sentences if any(k in x for k in keywords)]
    if not candidates:
        candidates = sentences
    stamps: list = []
    for x in candidates:
        found = re.findall(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\s*[–-]\s*(\d{1,2}:\d{2}(?::\d{2})?)\b", x)
        if found:
            stamps = [[_to_seconds(a), _to_seconds(b)] for a, b in found]
            break
    if not stamps:
        for x in candidates:
            found = re.findall(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)", x)
            if found:
                stamps = [[float(a), float(b)] for a, b in found]
                break
    if not stamps:
        times = []
        for x in candidates:
            times.extend(_to_seconds(t) for t in re.findall(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\b", x))
        times = times[: len(times) // 2 * 2]
        stamps = [(times[i], times[i + 1]) for i in range(0, len(times), 2)]
    if not stamps:
        times = []
        for x in candidates:
            nums = re.findall(r"\b(\d+(?:\.\d+)?)\b", x)
            if nums:
                times.append(float(nums[0]))
        times = times[: len(times) // 2 * 2]
        stamps = [(times[i], times[i + 1]) for i in range(0, len(times), 2)]
    if not stamps:
        for x in candidates:
            found = re.findall(r"(\d+(?:\.\d+)?)\s*s?\s*[–-]\s*(\d+(?:\.\d+)?)\s*s?", x)
            if found:
                stamps = [[float(a), float(b)] for a, b in found]
                break
    return [[a, b] if b > a else [b, a] for a, b in stamps[:1]]


def reference_iou(a, b) -> float:
    max0, min0 = max(a[0], b[0]), min(a[0], b[0])
    max1, min1 = max(a[1], b[1]), min(a[1], b[1])
    denom = max1 - min0
    return 0.0 if denom <= 0 else max(min1 - max0, 0) / denom


def reference_item_iou(pred_text: str, gt) -> float:
    try:
        pred = reference_extract_time(pred_text)
        return 0.0 if len(pred) != 1 else reference_iou(gt, pred[0])
    except Exception:  # the reference counts any failure as a bad prediction
        return 0.0


def reference_metrics(ious: list[float]) -> dict[str, float]:
    n = len(ious)
    out = {f"r@{t:g}": sum(1 for v in ious if v >= t) / n for t in (0.3, 0.5, 0.7)}
    out["miou"] = sum(ious) / n
    return out


# --------------------------------------------------------------------------- the checks

def test_there_are_enough_varied_outputs() -> None:
    assert len(OUTPUTS) >= 60 and len(set(OUTPUTS)) == len(OUTPUTS)


@pytest.mark.parametrize("raw", OUTPUTS)
def test_item_iou_equals_lmms_eval(raw: str) -> None:
    for truth in TRUTHS:
        task = Task(question="q", task_type="grounding", answer=list(truth))
        got = charades_sta.score(task, raw)
        assert got["iou"] == reference_item_iou(raw, truth) == got["score"]
        want = reference_extract_time(raw)
        assert got["pred"] == (want[0] if want else None)


@pytest.mark.parametrize("truth", TRUTHS)
def test_recall_and_miou_equal_lmms_eval(truth: tuple[float, float]) -> None:
    tasks = [Task(question="q", task_type="grounding", answer=list(truth)) for _ in OUTPUTS]
    row = charades_sta.summarise(tasks, [charades_sta.score(t, raw) for t, raw in zip(tasks, OUTPUTS)])["overall"]
    want = reference_metrics([reference_item_iou(raw, truth) for raw in OUTPUTS])
    assert {k: row[k] for k in want} == pytest.approx(want, abs=0, rel=1e-12)


def test_the_lenient_column_reads_the_stated_span() -> None:
    """Where lmms-eval misreads, the extra column reads the span the answer states (and never a negative time)."""
    task = Task(question="q", task_type="grounding", answer=[5.0, 10.0])
    cases = {"[5, 10]": (None, [5.0, 10.0]),
             "The video is 30 seconds long. It happens from 5 s to 10 s.": ([5.0, 10.0], [5.0, 10.0]),
             "In video 2, the person opens the door at 5 s and closes it at 10 s.": (None, [5.0, 10.0]),
             "-3.0 - 5.0": ([3.0, 5.0], [3.0, 5.0]),
             "12.5s-20s": ([12.5, 20.0], [12.5, 20.0])}
    for raw, (ref, lenient) in cases.items():
        got = charades_sta.score(task, raw)
        assert (got["pred"], got["pred_lenient"]) == (ref, lenient), raw
