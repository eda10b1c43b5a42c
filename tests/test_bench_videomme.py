"""mmagent.eval.benchmarks.videomme on tiny folders in the release layouts, with hand-computed scores."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mmagent.eval.benchmarks import videomme
from mmagent.eval.benchmarks.base import DatasetError
from mmagent.tiny import write_synthetic_video
from mmagent.trajectory import Task

OPTIONS = ["A. Red.", "B. Green.", "C. Blue.", "D. Yellow."]
LMMS_HEAD = ("Select the best answer to the following multiple-choice question based on the video and the "
             "subtitles. Respond with only the letter (A, B, C, or D) of the correct option.")


def row(qid: str, video: str, duration: str = "short", answer: str = "A", **extra) -> dict:
    """One question in the lmms-lab/Video-MME columns."""
    return {"video_id": qid.split("-")[0], "duration": duration, "domain": "Knowledge",
            "sub_category": "Humanity & History", "url": f"https://www.youtube.com/watch?v={video}",
            "videoID": video, "question_id": qid, "task_type": "Counting Problem",
            "question": f"Question {qid}?", "options": OPTIONS, "answer": answer, **extra}


def release(root: Path, rows: list[dict], videos: tuple[str, ...] | None = None) -> Path:
    """``videomme.jsonl`` and a 4 s, 8 fps, 64x64 MP4 per videoID under ``data/``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "videomme.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for vid in videos if videos is not None else sorted({r["videoID"] for r in rows}):
        write_synthetic_video(root / "data" / f"{vid}.mp4", seconds=4.0, fps=8, size=(64, 64))
    return root


def test_load_fields(tmp_path: Path) -> None:
    root = release(tmp_path, [row("001-1", "vidA", answer="C"), row("002-1", "vidB", "long", "B")])
    tasks = videomme.load(root)
    assert [t.id for t in tasks] == ["001-1", "002-1"]
    t = tasks[0]
    assert t.question == (LMMS_HEAD + "\nQuestion 001-1?\nA. Red.\nB. Green.\nC. Blue.\nD. Yellow.\n"
                          "\nAnswer with the option's letter from the given choices directly.")
    assert t.video == str((root / "data" / "vidA.mp4").resolve()) and Path(t.video).is_absolute()
    assert (t.task_type, t.options, t.answer, t.image) == ("video_qa", OPTIONS, "C", None)
    assert t.metadata == {"duration": "short", "domain": "Knowledge", "sub_category": "Humanity & History",
                          "task_type": "Counting Problem", "video_id": "001", "videoID": "vidA",
                          "question_id": "001-1", "url": "https://www.youtube.com/watch?v=vidA"}
    assert tasks[1].metadata["duration"] == "long" and tasks[1].answer == "B"


def test_official_prompt_limit_and_durations(tmp_path: Path) -> None:
    rows = [row("001-1", "vidA"), row("002-1", "vidB", "medium"), row("003-1", "vidC", "long"),
            row("003-2", "vidC", "long")]
    root = release(tmp_path, rows)
    assert videomme.load(root, prompt="official")[0].question == (
        "Select the best answer to the following multiple-choice question based on the video. Respond with only "
        "the letter (A, B, C, or D) of the correct option.\nQuestion 001-1?\nA. Red.\nB. Green.\nC. Blue.\n"
        "D. Yellow.\nThe best answer is:")
    assert [t.id for t in videomme.load(root, limit=2)] == ["001-1", "002-1"]
    assert [t.id for t in videomme.load(root, durations=["long"])] == ["003-1", "003-2"]
    assert [t.id for t in videomme.load(root, limit=1, durations=["long"])] == ["003-1"]


def test_official_json_layout(tmp_path: Path) -> None:
    """BradyFU/Video-MME's per-video JSON: choices, duration_category, video_category, videoID from the url."""
    data = [{"video_id": "001", "duration_category": "medium", "video_category": "Sports Competition",
             "video_subcategory": "Football", "url": "https://www.youtube.com/watch?v=fFjv93ACGo8",
             "questions": [{"question_id": "001-1", "task_type": "Action Reasoning", "question": "Who wins?",
                            "choices": ["A. Red.", "B. Blue.", "C. Nobody.", "D. Both."], "answer": "B"},
                           {"question_id": "001-2", "task_type": "OCR Problems", "question": "Score?",
                            "choices": ["A. 1-0.", "B. 2-0.", "C. 0-0.", "D. 3-1."], "answer": "D"}]}]
    (tmp_path / "videomme.json").write_text(json.dumps(data))
    write_synthetic_video(tmp_path / "data" / "fFjv93ACGo8.mp4", seconds=2.0, fps=8, size=(64, 64))
    a, b = videomme.load(tmp_path)
    assert (a.id, b.id, a.answer, b.answer) == ("001-1", "001-2", "B", "D")
    assert a.metadata["domain"] == "Sports Competition" and a.metadata["sub_category"] == "Football"
    assert a.metadata["duration"] == "medium" and a.metadata["videoID"] == "fFjv93ACGo8"
    assert b.options == ["A. 1-0.", "B. 2-0.", "C. 0-0.", "D. 3-1."]
    assert "\nScore?\nA. 1-0.\n" in b.question


SRT = """1
00:00:00,000 --> 00:00:01,000
<font color="white" size=".72c">hello there</font>

2
00:00:01,000 --> 00:00:02,000
plain <i>world</i>

3
00:00:10,000 --> 00:00:11,000
<font color="white" size=".72c">after the end</font>

4
00:00:03,500 --> 00:00:04,000
<font color="white" size=".72c">the end</font>
"""


def test_subtitles_as_lmms_eval(tmp_path: Path) -> None:
    root = release(tmp_path, [row("001-1", "vidA"), row("002-1", "vidB")])
    (root / "subtitle").mkdir()
    (root / "subtitle" / "vidA.srt").write_text(SRT)
    # 32 frames at 8 fps; cue frames [0, 8), [8, 16), [80, 88), [28, 32).
    tail = "\n" + LMMS_HEAD + "\nQuestion 001-1?\n" + "\n".join(OPTIONS) + "\nThe best answer is:"
    every = videomme.load(root, subtitles=True)  # 32 sampled frames = every frame
    assert every[0].question == "This video's subtitles are listed below: \nhello there\nplain world\nthe end" + tail
    assert every[0].metadata["has_subtitles"] is True
    assert every[0].metadata["subtitle_file"] == str((root / "subtitle" / "vidA.srt").resolve())
    two = videomme.load(root, subtitles=True, subtitle_frames=2)  # frames 0 and 31
    assert two[0].question == "This video's subtitles are listed below: \nhello there\nthe end" + tail
    full = videomme.load(root, subtitles=True, subtitle_frames=None)  # every cue, in file order
    assert full[0].question.startswith("This video's subtitles are listed below: \nhello there\nplain world\n"
                                       "after the end\nthe end\nSelect")
    no_srt = every[1]
    assert no_srt.question.startswith("This video's subtitles are listed below: \nNo subtitles available\nSelect")
    assert no_srt.metadata["has_subtitles"] is False and no_srt.metadata["subtitle_file"] is None
    assert "has_subtitles" not in videomme.load(root)[0].metadata


def _bad(tmp_path: Path, rows: list[dict]) -> str:
    release(tmp_path, rows, videos=("vidA",))
    with pytest.raises(DatasetError) as err:
        videomme.load(tmp_path)
    return str(err.value)


def _skipped(tmp_path: Path, rows: list[dict]) -> list[str]:
    """Load a release with malformed rows: the good rows come back, the bad ones are listed in ``skipped``."""
    release(tmp_path, rows, videos=("vidA",))
    tasks = videomme.load(tmp_path)
    assert len(tasks) == len(rows) - len(tasks.skipped) > 0
    return tasks.skipped


def test_missing_annotation_file_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        videomme.load(tmp_path)
    msg = str(err.value)
    assert "videomme/test-00000-of-00001.parquet" in msg and "videomme.json" in msg and "videomme.jsonl" in msg
    with pytest.raises(DatasetError, match="does not exist"):
        videomme.load(tmp_path, annotations=tmp_path / "nope.json")
    with pytest.raises(DatasetError, match="no Video-MME annotation file folder"):
        videomme.load(tmp_path / "absent")


@pytest.mark.parametrize(("bad", "needle"), [
    ({"answer": "E"}, "field 'answer' is 'E', expected one of A, B, C, D"),
    ({"options": "A. Red."}, "field 'options'"),
    ({"options": None}, "field 'options'"),
    ({"duration": "tiny"}, "field 'duration' is 'tiny'"),
    ({"question": ""}, "field 'question'"),
    ({"task_type": None}, "field 'task_type' is missing"),
])
def test_bad_row_names_file_row_and_field(tmp_path: Path, bad: dict, needle: str) -> None:
    # A malformed row is skipped and named by file and row, not fatal to the file.
    skipped = _skipped(tmp_path, [row("001-1", "vidA"), row("001-2", "vidA", **bad)])
    assert len(skipped) == 1 and f"videomme.jsonl:2: {needle}" in skipped[0]
    assert f"videomme.jsonl:1: {needle}" in _bad(tmp_path, [row("001-2", "vidA", **bad)])  # nothing usable


def test_bad_json_and_duplicates(tmp_path: Path) -> None:
    release(tmp_path, [row("001-1", "vidA")])
    with open(tmp_path / "videomme.jsonl", "a") as fh:
        fh.write("{not json\n")
    tasks = videomme.load(tmp_path)
    assert len(tasks) == 1 and len(tasks.skipped) == 1 and "videomme.jsonl:2: not valid JSON" in tasks.skipped[0]
    msg = _bad(tmp_path, [row("001-1", "vidA"), row("001-1", "vidA")])
    assert "question_id '001-1' appears more than once" in msg


def test_missing_videos_listed_and_counted(tmp_path: Path) -> None:
    rows = [row("001-1", "vidA")] + [row(f"{k:03d}-1", f"gone{k}") for k in range(2, 9)]
    msg = _bad(tmp_path, rows)
    assert "7 Video-MME videos missing: data/gone2.mp4; data/gone3.mp4" in msg
    assert "data/gone6.mp4 (and 2 more)" in msg and "gone7" not in msg


#: lmms-lab/Video-MME's features (its README's dataset_info): every column a string, options a list of strings
PARQUET_SCHEMA = {"video_id": "string", "duration": "string", "domain": "string", "sub_category": "string",
                  "url": "string", "videoID": "string", "question_id": "string", "task_type": "string",
                  "question": "string", "options": "list<string>", "answer": "string"}


def write_parquet(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a Parquet file with lmms-lab/Video-MME's column names, order and types."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    schema = pa.schema([(name, pa.list_(pa.string()) if kind == "list<string>" else pa.string())
                        for name, kind in PARQUET_SCHEMA.items()])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_lmms_eval_parquet_gives_the_same_tasks_as_json(tmp_path: Path) -> None:
    """videomme/test-00000-of-00001.parquet, as on the hub, read through pyarrow: the tasks of the same rows."""
    rows = [row("001-1", "vidA", answer="C"), row("001-2", "vidA", "short", "D"), row("002-1", "vidB", "long", "B")]
    root = release(tmp_path, rows)
    parquet = write_parquet(root / "videomme" / "test-00000-of-00001.parquet", rows)
    pq = pytest.importorskip("pyarrow.parquet")
    assert {f.name: str(f.type) for f in pq.read_schema(parquet)} == {
        **PARQUET_SCHEMA, "options": "list<element: string>"}
    from_json = videomme.load(root, annotations=root / "videomme.jsonl")
    from_parquet = videomme.load(root)  # the hub's file is found first
    assert [t.id for t in from_parquet] == ["001-1", "001-2", "002-1"]
    assert from_parquet == from_json
    assert from_parquet[0].options == OPTIONS and isinstance(from_parquet[0].options, list)
    assert videomme.load(root, limit=1, durations=["long"]) == from_json[2:]
    sub = videomme.load(root, subtitles=True, subtitle_frames=None)
    assert sub == videomme.load(root, subtitles=True, subtitle_frames=None, annotations=root / "videomme.jsonl")


def test_bad_parquet_row_and_unreadable_parquet(tmp_path: Path) -> None:
    rows = [row("001-1", "vidA"), row("001-2", "vidA", answer="E")]
    release(tmp_path, rows, videos=("vidA",))
    path = write_parquet(tmp_path / "videomme" / "test-00000-of-00001.parquet", rows)
    tasks = videomme.load(tmp_path)
    assert [t.id for t in tasks] == ["001-1"]
    assert tasks.skipped == [f"{path}:2: field 'answer' is 'E', expected one of A, B, C, D"]
    path.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(DatasetError, match=r"test-00000-of-00001\.parquet: not a readable Parquet file"):
        videomme.load(tmp_path)


def test_summary_per_duration_domain_and_task_type() -> None:
    specs = [  # (duration, domain, task type, truth, raw answer)
        ("short", "Knowledge", "OCR Problems", "A", "A"),
        ("short", "Knowledge", "Counting Problem", "B", "C"),
        ("medium", "Multilingual", "OCR Problems", "C", "(C) blue"),
        ("long", "Knowledge", "OCR Problems", "D", "I cannot tell from these frames at all, sorry about that"),
        ("long", "Multilingual", "Counting Problem", "A", "The answer is A"),
    ]
    tasks = [Task(question="q", id=str(k), task_type="video_qa", options=OPTIONS, answer=truth,
                  metadata={"duration": d, "domain": dom, "sub_category": "Sub", "task_type": tt})
             for k, (d, dom, tt, truth, _) in enumerate(specs)]
    scores = [videomme.score(t, raw) for t, (*_, raw) in zip(tasks, specs)]
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0, 0.0, 1.0]
    out = videomme.summarise(tasks, scores)
    assert list(out)[:4] == ["overall", "duration/short", "duration/medium", "duration/long"]
    assert out["overall"] == {"n": 5, "accuracy": 0.6, "answered": 0.8, "accuracy_answered": 0.75,
                              "accuracy_lenient": 0.6}
    assert out["duration/short"] == {"n": 2, "accuracy": 0.5, "answered": 1.0, "accuracy_answered": 0.5,
                                     "accuracy_lenient": 0.5}
    assert out["duration/medium"] == {"n": 1, "accuracy": 1.0, "answered": 1.0, "accuracy_answered": 1.0,
                                      "accuracy_lenient": 1.0}
    assert out["duration/long"] == {"n": 2, "accuracy": 0.5, "answered": 0.5, "accuracy_answered": 1.0,
                                    "accuracy_lenient": 0.5}
    assert out["domain/Knowledge"]["n"] == 3 and out["domain/Knowledge"]["accuracy"] == pytest.approx(1 / 3)
    assert out["domain/Multilingual"]["accuracy"] == 1.0
    assert out["task_type/OCR Problems"]["accuracy"] == pytest.approx(2 / 3)
    assert out["task_type/Counting Problem"]["accuracy"] == 0.5
    assert out["sub_category/Sub"]["n"] == 5
    assert list(out)[4:6] == ["domain/Knowledge", "domain/Multilingual"]  # the official order
    assert videomme.summarise([], []) == {}


def official_rule(text: str) -> str:
    """The Video-MME rule as eval/metrics.py documents it, written out again for the parity check.

    ``extract_characters_regex`` (BradyFU/Video-MME eval_your_results.py, lmms-eval videomme/utils.py)
    strips the prefixes of its list; two missing commas make two of its items
    "The best option isThe correct option is" and "Best answer:Best option:". Then: "" if more than 10
    words and no A-D, else the first A-D, on the text as given (lmms-eval does not narrow it to <answer>).
    """
    s = text.strip()
    for prefix in ["The best answer is", "The correct answer is", "The answer is", "The answer",
                   "The best option is" "The correct option is", "Best answer:" "Best option:"]:
        s = s.replace(prefix, "")
    if len(s.split()) > 10 and not re.search("[ABCD]", s):
        return ""
    m = re.search(r"[ABCD]", s)
    return m[0] if m else ""


PARITY = [  # (raw answer, the letter read by hand)
    ("A", "A"), ("(B) the cat", "B"), ("The answer is C", "C"),
    ("Answer: D.", "A"),  # no prefix matches "Answer:", so the "A" of "Answer" is read ("I cannot tell", ""),
    ("", ""), ("E", ""), ("b", ""), ("The best answer is: D", "D"), ("Best answer: C", "B"),
    ("The correct option is D", "D"), ("C. Blue.", "C"), ("the answer is c", ""),
    ("A man walks in, then the answer would be C", "A"),
    ("none of these options seem to match what happens in the video here", ""),
    ("<think>Maybe A.</think><answer>D</answer>", "A"),  # the reference reads the whole text
    ("  B  ", "B"),
]


@pytest.mark.parametrize(("raw", "letter"), PARITY)
def test_score_parity_with_official_rule(raw: str, letter: str) -> None:
    task = Task(question="q", task_type="video_qa", options=OPTIONS, answer="D")
    s = videomme.score(task, raw)
    assert s["pred"] == official_rule(raw) == letter
    assert s["score"] == float(letter == "D") and s["answered"] == (letter != "")


def test_score_none_answer() -> None:
    task = Task(question="q", task_type="video_qa", options=OPTIONS, answer="A")
    assert videomme.score(task, None) == {"score": 0.0, "pred": "", "answered": False, "score_lenient": 0.0,
                                          "pred_lenient": ""}
