"""Which of a multiple-choice question's options an answer names, or that it names none of them.

A question with options ("A. red", "B. blue") takes an answer that is one of them. :func:`chosen_option` reads
the letter an answer names: a bare letter ("B", "(B)", "B.", "B) blue"), an option's own text ("blue", "B. blue"),
or one option letter standing alone in a short sentence ("The answer is B."). Anything else, such as "C" when
the options are A and B, or a sentence that names two letters, names none of them: :func:`invalid_reason` says
why in one line. The agent marks such an answer invalid in the trajectory, :func:`mmagent.eval.registry.score`
scores it wrong and the RL format reward pays nothing for it.

Options without a label of their own ("red", "blue") are lettered A, B, ... in order.
"""

from __future__ import annotations

import re
from typing import Sequence

_LABEL = re.compile(r"^\s*\(?([A-Za-z])\s*[.):]\s*(.*)$", re.S)
_BARE = re.compile(r"^\(?([A-Za-z])\)?[.):]?$")
_LEADING = re.compile(r"^\(?([A-Z])\s*[.):]\s*(.*)$", re.S)
_PREFIXES = re.compile(r"^(?:(?:the\s+)?(?:best|correct|final)?\s*(?:answer|option|choice)\s*(?:is|:)?\s*"
                       r"|(?:option|choice)\s+)", re.I)
_STANDALONE = re.compile(r"(?<![A-Za-z0-9'])([A-Z])(?![A-Za-z0-9'])")
#: a sentence longer than this many words names an option only by a bare letter or an option's text
MAX_SENTENCE_WORDS = 12


def option_labels(options: Sequence[str]) -> list[tuple[str, str]]:
    """(letter, text) of each option: its own label ("A. red" -> ("A", "red")), or A, B, ... in order when
    any option has none."""
    parsed = [_LABEL.match(o) for o in options]
    if options and all(parsed) and len({m.group(1).upper() for m in parsed}) == len(options):
        return [(m.group(1).upper(), m.group(2).strip()) for m in parsed]
    return [(chr(ord("A") + k), str(o).strip()) for k, o in enumerate(options)]


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().strip("*`\"'").strip()).rstrip(".").strip()


def chosen_option(answer: str | None, options: Sequence[str]) -> str | None:
    """The letter of the option ``answer`` names, or None when it names none (or no answer was given)."""
    if answer is None or not options:
        return None
    labels = option_labels(options)
    letters = {letter for letter, _ in labels}
    text = _PREFIXES.sub("", _clean(answer)).strip()
    if m := _BARE.match(text):
        letter = m.group(1).upper()
        return letter if letter in letters else None
    folded = text.casefold()
    for letter, option_text in labels:
        if folded in (option_text.casefold().rstrip("."), f"{letter} {option_text}".casefold()):
            return letter
    if m := _LEADING.match(text):  # "B. blue" with a different wording of the option's text
        return m.group(1) if m.group(1) in letters else None
    if len(text.split()) > MAX_SENTENCE_WORDS:
        return None
    named = {c for c in _STANDALONE.findall(text) if c != "I"}  # "I think it is B"
    return named.pop() if len(named) == 1 and named <= letters else None


def invalid_reason(answer: str | None, options: Sequence[str] | None) -> str | None:
    """One line saying why ``answer`` is not one of ``options``; None when it is, or when there are no options
    (or no answer: a missing answer is a budget stop, not an invalid one)."""
    if not options or answer is None or chosen_option(answer, options) is not None:
        return None
    letters = ", ".join(letter for letter, _ in option_labels(options))
    shown = _clean(answer)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{shown!r} is not one of the options ({letters})"
