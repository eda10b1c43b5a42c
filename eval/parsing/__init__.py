"""mmagent's own answer parsers, for where a reference scorer is silent or too literal.

* :mod:`.coords` reads (latitude, longitude) from free text (no geolocation reference parses text);
* :mod:`.interval` reads a [start, end] time span (the lenient Charades-STA column);
* :mod:`.choice` reads an option letter (the lenient Video-MME and V* columns).

Each narrows the text to its last ``<answer>...</answer>`` block first, when there is one. The benchmarks'
headline numbers come from the reference re-implementations in :mod:`mmagent.eval.scorers`; these parsers
feed extra columns named ``*_lenient`` there, and are the whole story for the coordinates.
"""

from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def answer_content(text: str) -> str:
    """The content of the last ``<answer>...</answer>`` block, or the whole text if there is none."""
    found = _ANSWER_TAG.findall(text)
    return found[-1] if found else text


def final_text(text: str) -> str:
    """:func:`answer_content`, with any closed ``<think>...</think>`` reasoning removed when no answer tag is
    there (so a reasoning block's numbers or letters are not read as the answer)."""
    found = _ANSWER_TAG.findall(text)
    return found[-1] if found else _THINK.sub(" ", text)
