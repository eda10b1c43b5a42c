"""A [start, end] time span (seconds) read from free text: the lenient Charades-STA parser.

Where lmms-eval's rule (:mod:`mmagent.eval.scorers.lmms_charades`) takes whatever pair its patterns meet
first, this one looks for a span the answer states, in this order, and takes the first found:

1. a range: two times joined by "-", "–", "—", "~", "to", "until", "till", "through" or "and" (after
   "between"/"from" for "and"), each optionally followed by a unit ("12.5s-20s", "from 0:05 to 0:12",
   "[3.1 - 7.4] seconds", "between 4 and 9 s");
2. a bracketed pair "[a, b]" / "(a, b)";
3. labelled ends: "start(s/ing) (time) (at/is/:) a ... end(s/ing) (time) (at/is/:) b" in either order;
4. the only two time values in the text (numbers with a time unit or clock times; else the only two numbers).

Times are numbers or clock times (m:ss, h:mm:ss, with decimals); a hyphen is never a minus sign (times are not
negative), numbers glued to letters ("video2", "v1.5") are not times, and numbers followed by a unit that is not
a time ("30 fps", "2 people", "1080p") are skipped. The result is ordered so that start <= end; None when no
span is stated.
"""

from __future__ import annotations

import math
import re

from mmagent.eval.parsing import final_text

_T = (r"(?<![\w.:])(\d+(?::\d{1,2}){1,2}(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
      r"(?=(?:s|sec|secs|seconds?)?\b)(?![.:]\d)")
_UNIT = r"(?:\s*(?:s|sec|secs|second|seconds|seg|segundos)\b)?"
_TIME_UNIT = re.compile(r"\s*(?:s|sec|secs|second|seconds)\b", re.IGNORECASE)
_OTHER_UNIT = re.compile(r"\s*(?:fps|frames?|people|persons?|times|p\b|px|%|x\b|m\b|km|kg|cm|mm|"
                         r"minutes?\b|mins?\b|hours?\b|h\b|years?)", re.IGNORECASE)
_RANGE = re.compile(rf"{_T}{_UNIT}\s*(?:-|–|—|~|to|until|till|through|->|→)\s*{_T}{_UNIT}", re.IGNORECASE)
_BETWEEN = re.compile(rf"\b(?:between|from)\s+{_T}{_UNIT}\s*(?:and|,)\s*{_T}", re.IGNORECASE)
_BRACKET = re.compile(rf"[\[(]\s*{_T}{_UNIT}\s*[,;]\s*{_T}{_UNIT}\s*[\])]", re.IGNORECASE)
_START = re.compile(rf"\bstart(?:s|ing|ed)?(?:\s+time)?(?:\s+(?:at|is|of|from))?\s*[:=]?\s*(?:at\s+)?{_T}",
                    re.IGNORECASE)
_END = re.compile(rf"\b(?:end(?:s|ing|ed)?|finish(?:es|ed)?|stop(?:s|ped)?)(?:\s+time)?(?:\s+(?:at|is|of))?"
                  rf"\s*[:=]?\s*(?:at\s+)?{_T}", re.IGNORECASE)
_ANY = re.compile(_T)


def seconds(token: str) -> float:
    """A number or clock time (m:ss, h:mm:ss) in seconds."""
    total = 0.0
    for part in token.split(":"):
        total = total * 60.0 + float(part)
    return total


def _ordered(a: str, b: str) -> tuple[float, float] | None:
    x, y = seconds(a), seconds(b)
    if not (math.isfinite(x) and math.isfinite(y)):
        return None
    return (min(x, y), max(x, y))


def parse_interval(text: str) -> tuple[float, float] | None:
    """The (start, end) seconds an answer states (see the module docstring), or None."""
    s = final_text(text)
    for pattern in (_RANGE, _BETWEEN, _BRACKET):
        found = pattern.search(s)
        if found:
            return _ordered(found.group(1), found.group(2))
    start, end = _START.search(s), _END.search(s)
    if start and end:
        return _ordered(start.group(1), end.group(1))
    values = [m for m in _ANY.finditer(s) if not _OTHER_UNIT.match(s, m.end())]
    timed = [m for m in values if ":" in m.group(1) or _TIME_UNIT.match(s, m.end())]
    for group in (timed, values):
        if len(group) == 2:
            return _ordered(group[0].group(1), group[1].group(1))
    return None
