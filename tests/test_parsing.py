"""mmagent's own parsers (mmagent.eval.parsing): the cases the issue names, where the references misread."""

from __future__ import annotations

import pytest

from mmagent.eval.parsing.choice import extract_choice
from mmagent.eval.parsing.interval import parse_interval


@pytest.mark.parametrize(("raw", "span"), [
    ("12.5s-20s", (12.5, 20.0)),  # a hyphen after a unit is not a minus sign
    ("12.5 s - 20 s", (12.5, 20.0)),
    ("The video is 30 seconds long. The event happens from 5 to 10 seconds.", (5.0, 10.0)),  # not the length
    ("In video 2, the person opens the door from 3.5s to 7s.", (3.5, 7.0)),  # not "video 2"
    ("-3 - 5", (3.0, 5.0)),  # never a negative time
    ("[4.2, 9.8]", (4.2, 9.8)), ("between 4 and 9 s", (4.0, 9.0)), ("00:01:05 - 00:01:20", (65.0, 80.0)),
    ("It starts at 4.2 seconds and ends at 9.8 seconds.", (4.2, 9.8)), ("ends at 30, starts at 4", (4.0, 30.0)),
    ("1080p, 30 fps, 2.0 - 4.5", (2.0, 4.5)), ("7.5 - 3.2", (3.2, 7.5)),
    ("<think>1 to 2</think><answer>3 - 7.5</answer>", (3.0, 7.5)),
    ("around 12 seconds", None), ("There are 2 people.", None), ("v1.5 model", None), ("", None),
])
def test_parse_interval(raw: str, span: tuple[float, float] | None) -> None:
    assert parse_interval(raw) == span


@pytest.mark.parametrize(("raw", "letter"), [
    ("c", "C"), ("(b)", "B"), ("**D**", "D"), ("Option B", "B"), ("Final Answer: C", "C"), ("Best answer: C", "C"),
    ("The Answer Is b", "B"), ("neither A nor B; it's D", "D"), ("Not A. The answer is C", "C"),
    ("<think>A or B?</think><answer>(B)</answer>", "B"), ("A man walks in, so the answer is C.", "C"),
    ("The answer is a dog.", ""), ("The answer is a.", "A"), ("I cannot tell", ""), ("E", ""),
])
def test_extract_choice(raw: str, letter: str) -> None:
    assert extract_choice(raw) == letter


def test_extract_choice_keeps_to_the_items_letters() -> None:
    assert extract_choice("C", "AB") == "" and extract_choice("The answer is B", "AB") == "B"
