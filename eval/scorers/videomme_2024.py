"""Video-MME's answer rule as its published results use it: ``extract_characters_regex`` (2024).

Source: EvolvingLMMs-Lab/lmms-eval, ``lmms_eval/tasks/videomme/utils.py`` at commit
d0c1eae757432949cc276537e9d883934738ae21 (the parent of 9ca4445d, which on 2026-04-11 swapped it for the
ranking extractor ``extract_mcq_answer``); the same function is in BradyFU/Video-MME
``evaluation/eval_your_results.py`` (2024). The Video-MME README now links a newer parser
(thanku-all/parse_answer); neither newer rule is the default here, because the numbers the papers report
were scored with this one.

The rule, applied to the model's text exactly as given (lmms-eval does not narrow it to an ``<answer>`` block):

1. strip surrounding whitespace;
2. delete every occurrence (anywhere, case-sensitively) of six prefix strings. Two commas are missing in
   the source's list, so Python joins "The best option is" + "The correct option is" and "Best answer:" +
   "Best option:" into two long strings; those four prefixes are therefore *not* removed on their own, and
   "Best answer: C" reads "B" (from "Best");
3. the first upper-case A, B, C or D left is the answer; "" if there is none (the source's "> 10 words and no
   letter" test returns "" too, so it changes nothing).

Scoring: 1 if that letter equals the truth, else 0; accuracy = correct / all items (an unread answer is wrong).
"""

from __future__ import annotations

import re

SOURCE = {
    "benchmark": "Video-MME",
    "repo": "EvolvingLMMs-Lab/lmms-eval",
    "file": "lmms_eval/tasks/videomme/utils.py",
    "commit": "d0c1eae757432949cc276537e9d883934738ae21",
    "functions": ["extract_characters_regex", "videomme_process_results", "videomme_aggregate_results"],
    "note": "the 2024 rule (as in BradyFU/Video-MME evaluation/eval_your_results.py); lmms-eval replaced it "
            "with extract_mcq_answer in 9ca4445d (2026-04-11)",
}

#: what the source's list strips, in its order, with the two missing commas' concatenations
PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is" + "The correct option is",
    "Best answer:" + "Best option:",
)
_LETTER = re.compile("[ABCD]")


def extract_letter(text: str) -> str:
    """The letter the 2024 Video-MME rule reads from ``text`` ("" if none)."""
    s = text.strip()
    for prefix in PREFIXES:
        s = s.replace(prefix, "")
    found = _LETTER.search(s)
    return found.group(0) if found else ""


def is_correct(text: str, truth: str) -> bool:
    """``videomme_process_results``: the read letter equals the true one (compared lower-cased)."""
    return extract_letter(text).lower() == truth.lower()
