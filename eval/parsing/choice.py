"""The option letter an answer chooses: the lenient multiple-choice parser (extra columns of Video-MME and V*).

The references read letters literally (Video-MME's first capital A-D anywhere once six prefixes are deleted;
lmms-eval's V* patterns on the upper-cased text, where "Answer: C" reads "A" from "ANSWER"). This rule reads the
answer as a person would, on the last ``<answer>`` block (or the text without ``<think>`` reasoning):

1. the whole answer is one letter, bare or marked: "c", "(C)", "C.", "[b]", "**D**", "Option B";
2. else the last explicit choice: "answer / final answer / best answer / correct option / choice (is / : / =)
   X", "I choose / I pick / I'd go with / it's / it is / select X" (upper or lower case; a lower-case "a" only
   when nothing but punctuation follows it, so "the answer is a dog" is not "A");
3. else the last capital letter standing alone ("(B)", "B.", " B "), skipping letters that are negated
   ("not A", "neither A nor B", "rather than C") and a sentence-initial article "A";
4. else "".

Only letters among ``letters`` (default "ABCD") count.
"""

from __future__ import annotations

import re

from mmagent.eval.parsing import final_text

_MARK = r"[\s*_`\"'“”‘’]*"
_SOLE = re.compile(rf"^{_MARK}(?:option|choice|answer)?\s*[:\-]?\s*[\(\[]?{_MARK}([A-Za-z]){_MARK}[\)\]]?"
                   rf"{_MARK}[.:!]?{_MARK}$", re.IGNORECASE)
_EXPLICIT = re.compile(
    r"(?:(?:final|best|correct|right|my)\s+)?(?:answer|option|choice)(?:\s+(?:is|would\s+be|will\s+be|should\s+be))?"
    r"\s*(?:[:=]|is|-)?\s*(?:option\s+|choice\s+)?[\(\[*\s]*([A-Za-z])(?![A-Za-z])"
    r"|(?:i\s+choose|i\s+pick|i\s+select|i'd\s+go\s+with|i\s+would\s+choose|go\s+with|it'?s|it\s+is|select|choose)"
    r"\s+(?:option\s+|choice\s+)?[\(\[*\s]*([A-Za-z])(?![A-Za-z])",
    re.IGNORECASE,
)
_NEGATED = re.compile(r"(?:\bnot|\bneither|\bnor|\bthan|\bexcept|\bexcluding|\brule\s+out|\beliminate)\s*"
                      r"(?:option\s+|choice\s+)?\(?$", re.IGNORECASE)
_STANDALONE = re.compile(r"(?<![A-Za-z])([A-Z])(?![A-Za-z'’])")


def _lower_ok(text: str, end: int, letter: str) -> bool:
    """A lower-case letter counts unless it is the article "a" followed by more words."""
    if not letter.islower() or letter != "a":
        return True
    return re.match(r"\s*[\)\].,;:!?*]*\s*(?:$|\n)", text[end:]) is not None


def extract_choice(text: str, letters: str = "ABCD") -> str:
    """The option letter ``text`` chooses among ``letters`` (see the module docstring), or ""."""
    s = final_text(text).strip()
    sole = _SOLE.match(s)
    if sole and sole.group(1).upper() in letters:
        return sole.group(1).upper()
    chosen = ""
    for m in _EXPLICIT.finditer(s):
        group = 1 if m.group(1) else 2
        letter = m.group(group)
        if letter.upper() in letters and _lower_ok(s, m.end(group), letter) \
                and (letter.isupper() or letter.lower() != "i"):
            chosen = letter.upper()
    if chosen:
        return chosen
    for m in reversed(list(_STANDALONE.finditer(s))):
        letter = m.group(1)
        if letter not in letters or _NEGATED.search(s[:m.start()]):
            continue
        opens_sentence = m.start() == 0 or re.search(r"[.!?]\s*$", s[:m.start()])
        if letter == "A" and re.match(r"\s+[a-z]", s[m.end():]) and opens_sentence:
            continue  # the article "A ..." opening a sentence
        return letter
    return ""
