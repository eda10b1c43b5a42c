"""V* Bench's answer rule as lmms-eval scores it: ``extract_answer_letter``.

Source: EvolvingLMMs-Lab/lmms-eval, ``lmms_eval/tasks/vstar_bench/utils.py`` at commit
75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3 (the file last changed in c7eaef37). The V* authors'
repository (penghao-wu/vstar) scores by option likelihood and has no text parser, so this is the text rule
that published generative V* numbers use.

The rule, on the model's text as given: strip and upper-case it, then try in order (first match wins)

1. a letter A-D at the very start (so "Answer: C" reads "A", from "ANSWER": a quirk kept here);
2. "(THE) ANSWER / CHOICE / OPTION (IS)" then spaces or colons then a letter;
3. "(X)";
4. a letter followed by ".", ")" or "]";
5. a letter standing alone between spaces or the ends of the text;
6. if exactly one A-D appears anywhere, that one;
7. (the source's last resort, the first character, can never fire after 1.)

otherwise None. Letters are A-D for every item (relative_position items have two options; a C or D read
there is simply wrong). Score: 1 if the letter equals the label, else 0; accuracy is micro over items.
"""

from __future__ import annotations

import re

SOURCE = {
    "benchmark": "V* Bench",
    "repo": "EvolvingLMMs-Lab/lmms-eval",
    "file": "lmms_eval/tasks/vstar_bench/utils.py",
    "commit": "75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3",
    "functions": ["extract_answer_letter", "vstar_process_results", "vstar_aggregate_results"],
}

_RULES = tuple(re.compile(p) for p in (
    r"^([A-D])",
    r"(?:THE\s+)?(?:ANSWER|CHOICE|OPTION)(?:\s+IS)?[\s:]+([A-D])",
    r"\(([A-D])\)",
    r"([A-D])\s*[.)\]]",
    r"(?:^|\s)([A-D])(?:\s|$)",
))


def extract_letter(text: str) -> str | None:
    """The letter lmms-eval's V* rule reads from ``text``, or None."""
    s = text.strip().upper()
    for rule in _RULES:
        found = rule.search(s)
        if found:
            return found.group(1)
    letters = [c for c in s if c in "ABCD"]
    return letters[0] if len(letters) == 1 else None


def is_correct(text: str, truth: str) -> bool:
    """``vstar_process_results``: the read letter equals the label (stripped, upper-cased)."""
    return extract_letter(text) == truth.strip().upper()
