"""Video-MME and V* scores equal their reference scorers' on raw outputs of the kinds VLMs write.

The references are written out again here, from their source, in this file's own code (not imported from
mmagent): Video-MME's 2024 ``extract_characters_regex`` (EvolvingLMMs-Lab/lmms-eval
lmms_eval/tasks/videomme/utils.py at d0c1eae7; BradyFU/Video-MME evaluation/eval_your_results.py) and V*'s
``extract_answer_letter`` (lmms-eval lmms_eval/tasks/vstar_bench/utils.py at 75571cfe). Both read the text as
given. Each output is scored against every possible true letter, so a wrong letter cannot hide.
"""

from __future__ import annotations

import re

import pytest

from mmagent.eval.benchmarks import videomme, vstar
from mmagent.trajectory import Task

OUTPUTS = [
    # bare letters and marked letters
    "A", "B", "C", "D", "a", "c", "(B)", "(d)", "C.", "D)", "[A]", "**B**", "  C  ", "B\n", "Option C", "option d",
    # prefixes
    "The answer is C", "The answer is C.", "the answer is c", "The Answer Is B", "The best answer is: D",
    "The best answer is D", "The correct answer is A", "The correct option is D", "The best option is B",
    "Best answer: C", "Best option: A", "Final Answer: C", "Final answer: (B)", "Answer: D", "ANSWER: b",
    "Correct answer - A", "My answer is D", "I choose B", "I'd go with option C.", "It's D",
    # letter with option text
    "C. Blue.", "(A) The man is cooking", "B) he opens the door", "D: at the end of the video",
    "A - a red car", "Option (B): the dog", "The answer is (C) green",
    # reasoning then answer
    "The person picks up the cup first, so the answer is B.",
    "Looking at the video, the woman enters at 0:35. Therefore, the correct answer is D.",
    "A man walks in, then the answer would be C",
    "Based on the frames, the car is red. Answer: A",
    "<think>The sign says 7, which matches option B.</think><answer>B</answer>",
    "<think>Maybe A.</think><answer>D</answer>",
    "<answer>C</answer>",
    "<answer>(a) the kitchen</answer>",
    "Step 1: count the birds. Step 2: there are 4. So D.",
    "First I rule out A and B. Between C and D, D fits better. Final answer: D",
    "neither A nor B; it's D",
    "Not A. The answer is C",
    "Both A and C are plausible, but B is the best.",
    "I think it's c.",
    "The best answer is: **A**",
    "The best option isThe correct option is B",
    "Therefore, (D) is correct.",
    "The video shows a cat, hence option b.",
    # refusals and nothing usable
    "", "   ", "I cannot tell from these frames.", "I cannot tell",
    "none of these options seem to match what happens in the video here",
    "Sorry, I am unable to determine the answer from the video provided to me today.",
    "E", "The answer is E", "unknown", "N/A", "There is not enough information.",
    "All of the above", "12", "Yes", "It is impossible to say",
]

LETTERS = "ABCD"


# --------------------------------------------------------------------------- Video-MME, 2024 rule

def reference_videomme(s: str) -> str:
    """extract_characters_regex as published: six list items, two of them joined by missing commas."""
    s = s.strip()
    answer_prefixes = ["The best answer is", "The correct answer is", "The answer is", "The answer",
                       "The best option isThe correct option is", "Best answer:Best option:"]
    for answer_prefix in answer_prefixes:
        s = s.replace(answer_prefix, "")
    if len(s.split()) > 10 and not re.search("[ABCD]", s):
        return ""
    hit = re.search(r"[ABCD]", s)
    return "" if hit is None else hit[0]


def reference_videomme_score(pred: str, gt: str) -> float:
    return 1.0 if pred.lower() == gt.lower() else 0.0


def test_there_are_enough_varied_outputs() -> None:
    assert len(OUTPUTS) >= 60 and len(set(OUTPUTS)) == len(OUTPUTS)


@pytest.mark.parametrize("raw", OUTPUTS)
def test_videomme_score_equals_the_2024_rule(raw: str) -> None:
    options = [f"{x}. option {x}" for x in LETTERS]
    for truth in LETTERS:
        task = Task(question="q", task_type="video_qa", options=options, answer=truth)
        got = videomme.score(task, raw)
        want = reference_videomme(raw)
        assert got["pred"] == want
        assert got["score"] == reference_videomme_score(want, truth)


def test_videomme_accuracy_equals_the_reference_aggregation() -> None:
    """videomme_aggregate_results: correct / answered, where every item counts as answered."""
    options = [f"{x}. option {x}" for x in LETTERS]
    tasks = [Task(question="q", id=str(k), task_type="video_qa", options=options, answer=LETTERS[k % 4],
                  metadata={"duration": ("short", "medium", "long")[k % 3], "domain": "Knowledge",
                            "sub_category": "Sub", "task_type": "OCR Problems"}) for k in range(len(OUTPUTS))]
    scores = [videomme.score(t, raw) for t, raw in zip(tasks, OUTPUTS)]
    correct = {d: 0 for d in ("short", "medium", "long")}
    total = dict(correct)
    for t, raw in zip(tasks, OUTPUTS):
        total[t.metadata["duration"]] += 1
        correct[t.metadata["duration"]] += reference_videomme(raw) == t.answer
    out = videomme.summarise(tasks, scores)
    assert out["overall"]["accuracy"] == pytest.approx(sum(correct.values()) / len(OUTPUTS))
    for d in correct:
        assert out[f"duration/{d}"]["accuracy"] == pytest.approx(correct[d] / total[d])


# --------------------------------------------------------------------------- V*, lmms-eval's rule

def reference_vstar(response: str) -> str | None:
    """extract_answer_letter: five patterns in order on the stripped, upper-cased text, then one-letter check."""
    response = response.strip().upper()
    patterns = [
        r"^([A-D])\s*[\.)\]]*",
        r"(?:THE\s+)?(?:ANSWER|CHOICE|OPTION)(?:\s+IS)?[\s:]+([A-D])",
        r"\(([A-D])\)",
        r"([A-D])\s*(?:\.|\)|])",
        r"(?:^|\s)([A-D])(?:\s|$)",
    ]
    for pattern in patterns:
        match = re.search(pattern, response, re.IGNORECASE)
        if match:
            return match.group(1).upper()
    letters = re.findall(r"[A-D]", response)
    if len(letters) == 1:
        return letters[0]
    if response and response[0] in "ABCD":
        return response[0]
    return None


@pytest.mark.parametrize("raw", OUTPUTS)
def test_vstar_score_equals_lmms_evals_rule(raw: str) -> None:
    for n in (2, 4):  # relative_position items have two options, direct_attributes four
        for truth in LETTERS[:n]:
            task = Task(question="q", task_type="image_qa", options=[f"{x}. o" for x in LETTERS[:n]], answer=truth)
            got = vstar.score(task, raw)
            want = reference_vstar(raw)
            assert got["pred"] == (want or "")
            assert got["score"] == (1.0 if want == truth.strip().upper() else 0.0)


def test_the_lenient_columns_differ_where_the_references_misread() -> None:
    """The extra columns read what the answer says; the defaults stay the references'."""
    four = Task(question="q", task_type="image_qa", options=[f"{x}. o" for x in LETTERS], answer="C")
    assert vstar.score(four, "Answer: C")["score"] == 0.0  # lmms-eval reads the A of "ANSWER"
    assert vstar.score(four, "Answer: C")["score_lenient"] == 1.0
    d = Task(question="q", task_type="image_qa", options=[f"{x}. o" for x in LETTERS], answer="D")
    assert vstar.score(d, "neither A nor B; it's D")["pred"] == "A"
    assert vstar.score(d, "neither A nor B; it's D")["pred_lenient"] == "D"
    assert videomme.score(four, "Best answer: C")["pred"] == "B"  # the missing-comma quirk
    assert videomme.score(four, "Best answer: C")["pred_lenient"] == "C"
    assert videomme.score(four, "the answer is c")["pred"] == "" and videomme.score(four, "the answer is c")[
        "pred_lenient"] == "C"
