"""Charades-STA's interval rule and metrics as lmms-eval scores them: ``extract_time`` and ``iou``.

Source: EvolvingLMMs-Lab/lmms-eval, ``lmms_eval/tasks/charades_sta/utils.py`` at commit
75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3 (the file last changed in 26f1d8e3, which moved scoring into the
harness; the older offline ``eval_tvg.py`` beside it lacks the clock-range step and treats sentences without
keywords differently).

``extract_time``, on the model's text as given:

1. lower-case it, delete the prompt's example sentence "a specific example is : 20.8 - 30.0 seconds", and
   replace every "to" with "-" (inside words too: "tomato" -> "-mato");
2. split into sentences at "!", "?" and newlines (not at full stops); the candidates are the sentences
   holding one of the keywords starts / ends / happens in / start time / end time / start / end / happen, or
   every sentence if none does;
3. the first of these that finds anything decides, each going through the candidates in order:
   a. clock ranges "m:ss - m:ss" (or h:mm:ss, "-" or an en dash): all of them in the first sentence with one;
   b. number ranges "a - b": all of them in the first sentence with one;
   c. every clock time of every candidate, paired up in order (an odd last one dropped);
   d. the first number of each candidate, paired up in order (an odd last one dropped);
   e. "a s - b s" ranges (never reached in practice: b. finds them first);
4. only the first pair counts, ordered so that start <= end.

An answer without a pair scores IoU 0 (a "bad prediction"). ``iou(a, b)`` is intersection over the span
from the earliest start to the latest end (equal to the union whenever the two overlap), 0 when that span is
empty. R@1 at IoU 0.3 / 0.5 / 0.7 is the share of IoUs >= the threshold, mIoU their mean (lmms-eval prints
both x100; we keep fractions).
"""

from __future__ import annotations

import re

SOURCE = {
    "benchmark": "Charades-STA",
    "repo": "EvolvingLMMs-Lab/lmms-eval",
    "file": "lmms_eval/tasks/charades_sta/utils.py",
    "commit": "75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3",
    "functions": ["extract_time", "iou", "_temporal_grounding_compute_metrics"],
}

EXAMPLE = "a specific example is : 20.8 - 30.0 seconds"
KEYWORDS = ("starts", "ends", "happens in", "start time", "end time", "start", "end", "happen")
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?"
_NUM = r"\d+(?:\.\d+)?"
_CLOCK_RANGE = re.compile(rf"\b({_CLOCK})\s*[–-]\s*({_CLOCK})\b")
_NUM_RANGE = re.compile(rf"({_NUM})\s*[–-]\s*({_NUM})")
_CLOCK_TIME = re.compile(rf"\b({_CLOCK})\b")
_FIRST_NUMBER = re.compile(rf"\b({_NUM})\b")
_UNIT_RANGE = re.compile(rf"({_NUM})\s*s?\s*[–-]\s*({_NUM})\s*s?")


def clock_seconds(clock: str) -> float:
    """"m:ss" or "h:mm:ss" in seconds."""
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part)
    return total


def _pairs(values: list[float]) -> list[tuple[float, float]]:
    return list(zip(values[0::2], values[1::2]))


def _first_sentence_ranges(sentences: list[str], pattern: re.Pattern[str], convert) -> list[tuple[float, float]]:
    for sentence in sentences:
        found = pattern.findall(sentence)
        if found:
            return [(convert(a), convert(b)) for a, b in found]
    return []


def extract_interval(text: str) -> tuple[float, float] | None:
    """The (start, end) lmms-eval's ``extract_time`` reads from ``text``, or None (a bad prediction)."""
    s = text.lower().replace(EXAMPLE, "").replace("to", "-")
    sentences = re.split(r"[!?\n]", s)
    candidates = [x for x in sentences if any(k in x for k in KEYWORDS)] or sentences
    found = _first_sentence_ranges(candidates, _CLOCK_RANGE, clock_seconds)
    if not found:
        found = _first_sentence_ranges(candidates, _NUM_RANGE, float)
    if not found:
        found = _pairs([clock_seconds(c) for x in candidates for c in _CLOCK_TIME.findall(x)])
    if not found:
        firsts = [_FIRST_NUMBER.search(x) for x in candidates]
        found = _pairs([float(m.group(1)) for m in firsts if m])
    if not found:
        found = _first_sentence_ranges(candidates, _UNIT_RANGE, float)
    if not found:
        return None
    a, b = found[0]
    return (a, b) if b > a else (b, a)


def iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """lmms-eval's ``iou``: overlap over the hull of both segments (0 when the hull is empty)."""
    hull = max(a[1], b[1]) - min(a[0], b[0])
    if hull <= 0:
        return 0.0
    return max(min(a[1], b[1]) - max(a[0], b[0]), 0) / hull


def score_text(text: str, truth: tuple[float, float]) -> float:
    """The IoU lmms-eval gives ``text`` against ``truth`` (0.0 for a bad prediction)."""
    pred = extract_interval(text)
    return 0.0 if pred is None else iou(truth, pred)
