"""mmagent.eval.benchmarks.vstar on a tiny folder in the craigwu/vstar_bench layout, with hand-counted accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.eval.benchmarks import vstar
from mmagent.eval.benchmarks.base import DatasetError
from mmagent.trajectory import Task

INSTRUCTION = "Answer with the option's letter from the given choices directly."


def q(qid: int, category: str, question: str, options: list[str], label: str, image: str | None = None) -> dict:
    text = question + "\n" + "\n".join(f"({chr(65 + k)}) {o}" for k, o in enumerate(options)) + "\n" + INSTRUCTION
    return {"question_id": qid, "image": image or f"{category}/sa_{qid}.jpg", "text": text, "category": category,
            "label": label}


ROWS = [q(0, "direct_attributes", "What is the material of the glove?", ["rubber", "cotton", "kevlar", "leather"], "A"),
        q(1, "direct_attributes", "What is the color of the cup?", ["red", "blue", "green", "white"], "B"),
        q(2, "direct_attributes", "What is the breed of the dog?", ["pug", "corgi", "husky", "poodle"], "D"),
        q(3, "relative_position", "Is the cat on the left or right side of the dog?", ["left", "right"], "A"),
        q(4, "relative_position", "Is the lamp on the left or right side of the bed?", ["right", "left"], "B")]


def release(root: Path, rows: list[dict] = ROWS, images: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "test_questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows if images else ():
        (root / r["image"]).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((40, 60, 3), 200, np.uint8)).save(root / r["image"])
    return root


def test_load_fields(tmp_path: Path) -> None:
    root = release(tmp_path)
    tasks = vstar.load(root)
    assert [t.id for t in tasks] == ["0", "1", "2", "3", "4"]
    t = tasks[0]
    assert t.question == ("What is the material of the glove?\n(A) rubber\n(B) cotton\n(C) kevlar\n(D) leather\n"
                          "Answer with the option's letter from the given choices directly.")
    assert t.image == str((root / "direct_attributes" / "sa_0.jpg").resolve())
    assert (t.task_type, t.answer, t.video) == ("image_qa", "A", None)
    assert t.options == ["A. rubber", "B. cotton", "C. kevlar", "D. leather"]
    assert t.metadata == {"category": "direct_attributes", "question_id": "0", "image": "direct_attributes/sa_0.jpg"}
    assert tasks[3].options == ["A. left", "B. right"] and tasks[4].answer == "B"
    assert [t.id for t in vstar.load(root, limit=2)] == ["0", "1"]


def test_instruction_added_only_when_missing(tmp_path: Path) -> None:
    row = dict(ROWS[0], text="What is the material of the glove?\n(A) rubber\n(B) cotton")
    (t,) = vstar.load(release(tmp_path, [row]))
    assert t.question == "What is the material of the glove?\n(A) rubber\n(B) cotton\n" + INSTRUCTION


def test_missing_question_file_says_why_the_json_files_do_not_do(tmp_path: Path) -> None:
    (tmp_path / "direct_attributes").mkdir()
    (tmp_path / "direct_attributes" / "sa_0.json").write_text(json.dumps({"question": "?", "options": ["a", "b"]}))
    with pytest.raises(DatasetError) as err:
        vstar.load(tmp_path)
    msg = str(err.value)
    assert "looked for: test_questions.jsonl" in msg and "carry no option letters or labels" in msg


@pytest.mark.parametrize(("change", "needle"), [
    ({"label": "C"}, "field 'label' is 'C', expected one of A, B"),
    ({"label": ""}, "field 'label' is ''"),
    ({"text": "Is the cat on the left?"}, "field 'text' has 0 option lines like '(A) ...', expected 2+"),
    ({"text": "Left?\n(A) left\n(C) right"}, "field 'text' letters its options AC, expected AB"),
    ({"category": None}, "field 'category' is missing"),
    ({"image": 7}, "field 'image' is 7, expected a non-empty str"),
])
def test_bad_row_names_file_row_and_field(tmp_path: Path, change: dict, needle: str) -> None:
    release(tmp_path, ROWS[:3] + [ROWS[3]])
    lines = (tmp_path / "test_questions.jsonl").read_text().splitlines()
    lines[3] = json.dumps({**ROWS[3], **change})
    (tmp_path / "test_questions.jsonl").write_text("\n".join(lines) + "\n")
    # Skipped and named by file and line, not fatal to the file.
    tasks = vstar.load(tmp_path)
    assert [t.id for t in tasks] == ["0", "1", "2"]
    assert len(tasks.skipped) == 1 and f"test_questions.jsonl:4: {needle}" in tasks.skipped[0]


def test_missing_images_and_duplicate_ids(tmp_path: Path) -> None:
    rows = ROWS + [q(k, "relative_position", "?", ["left", "right"], "A") for k in range(5, 8)]
    release(tmp_path, rows, images=False)
    with pytest.raises(DatasetError) as err:
        vstar.load(tmp_path)
    msg = str(err.value)
    assert "8 V* images missing: direct_attributes/sa_0.jpg; direct_attributes/sa_1.jpg" in msg
    assert "relative_position/sa_4.jpg (and 3 more)" in msg
    release(tmp_path, [ROWS[0], dict(ROWS[1], question_id=0)])
    with pytest.raises(DatasetError, match="question_id '0' appears more than once"):
        vstar.load(tmp_path)


def test_score_and_summary_by_hand(tmp_path: Path) -> None:
    tasks = vstar.load(release(tmp_path))
    answers = ["A", "<answer>(C) green</answer>", "The answer is D.", "B", "I cannot tell"]
    scores = [vstar.score(t, a) for t, a in zip(tasks, answers)]
    assert [s["pred"] for s in scores] == ["A", "C", "D", "B", ""]
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0, 0.0, 0.0]
    out = vstar.summarise(tasks, scores)
    assert list(out) == ["overall", "category/direct_attributes", "category/relative_position"]
    assert [s["pred_lenient"] for s in scores] == ["A", "C", "D", "B", ""]
    assert out["overall"] == {"n": 5, "accuracy": 0.4, "answered": 0.8, "accuracy_lenient": 0.4}
    assert out["category/direct_attributes"] == {"n": 3, "accuracy": pytest.approx(2 / 3), "answered": 1.0,
                                                 "accuracy_lenient": pytest.approx(2 / 3)}
    assert out["category/relative_position"] == {"n": 2, "accuracy": 0.0, "answered": 0.5, "accuracy_lenient": 0.0}


def test_default_is_lmms_evals_rule_and_lenient_uses_the_items_own_letters() -> None:
    # The default reproduces lmms-eval's extract_answer_letter, quirks included: it reads A-D on every item and
    # its first pattern takes the "A" of "ANSWER: B". The lenient column reads the item's own letters.
    two = Task(question="q", task_type="image_qa", options=["A. left", "B. right"], answer="B")
    assert vstar.score(two, "C")["pred"] == "C" and vstar.score(two, "C")["pred_lenient"] == ""
    got = vstar.score(two, "Answer: B")
    assert (got["pred"], got["score"], got["pred_lenient"], got["score_lenient"]) == ("A", 0.0, "B", 1.0)
    assert vstar.score(two, "b")["pred"] == "B"  # lower case is read (upper-cased first)
    assert vstar.score(two, None) == {"score": 0.0, "pred": "", "answered": False, "score_lenient": 0.0,
                                      "pred_lenient": ""}
