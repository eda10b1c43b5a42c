"""mmagent.eval.benchmarks.charades_sta on tiny folders in the release layouts, with IoUs computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmagent.eval.benchmarks import charades_sta
from mmagent.eval.benchmarks.base import DatasetError
from mmagent.tiny import write_synthetic_video
from mmagent.trajectory import Task

LINES = ["AAAAA 24.3 30.4##person turn a light on.", "AAAAA 0.0 6.9##a person is sitting in a chair.",
         "BBBBB 4.4 9.2##the person puts down the bag."]


def release(root: Path, lines: list[str] = LINES, videos: tuple[str, ...] = ("AAAAA", "BBBBB")) -> Path:
    """``charades_sta_test.txt``, ``Charades_v1_test.csv`` and 2 s MP4s under ``Charades_v1_480/``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "charades_sta_test.txt").write_text("\n".join(lines) + "\n")
    (root / "Charades_v1_test.csv").write_text(
        "id,subject,scene,quality,relevance,verified,script,objects,descriptions,actions,length\n"
        "AAAAA,S1,Kitchen,6,7,Yes,x,light,y,c001 24.3 30.4,31.5\nBBBBB,S2,Hallway,5,7,Yes,x,bag,y,,12.25\n")
    for vid in videos:
        write_synthetic_video(root / "Charades_v1_480" / f"{vid}.mp4", seconds=2.0, fps=8, size=(64, 64))
    return root


def test_load_original_release(tmp_path: Path) -> None:
    root = release(tmp_path)
    tasks = charades_sta.load(root)
    assert [t.id for t in tasks] == ["AAAAA_0000", "AAAAA_0001", "BBBBB_0002"]
    t = tasks[0]
    assert t.question == (
        "Please find the visual event described by a sentence in the video, determining its starting and ending "
        "times. The format should be: 'The event happens in the start time - end time'. For example, The event "
        "'person turn a light on' happens in the 24.3 - 30.4 seonds. Now I will give you the textual sentence: "
        "person turn a light on. Please return its start time and end time.")
    assert t.video == str((root / "Charades_v1_480" / "AAAAA.mp4").resolve())
    assert (t.task_type, t.answer, t.options) == ("grounding", [24.3, 30.4], None)
    assert {k: t.metadata[k] for k in ("video_id", "caption", "start", "end", "duration")} == {
        "video_id": "AAAAA", "caption": "person turn a light on.", "start": 24.3, "end": 30.4, "duration": 31.5}
    assert tasks[2].metadata["duration"] == 12.25 and tasks[2].answer == [4.4, 9.2]
    assert t.metadata["source"].endswith("charades_sta_test.txt:1")
    assert [t.id for t in charades_sta.load(root, limit=2)] == ["AAAAA_0000", "AAAAA_0001"]


def test_load_lmms_eval_rows(tmp_path: Path) -> None:
    """lmms-lab/charades_sta's columns (video file name, caption, timestamp) as JSON Lines."""
    rows = [{"video": "AAAAA.mp4", "caption": "person opens the door", "timestamp": [1.0, 2.5]},
            {"video": "BBBBB.mp4", "caption": "person sits", "timestamp": "[0.5, 1.5]"}]
    release(tmp_path)
    (tmp_path / "charades_sta_test.txt").unlink()
    (tmp_path / "charades_sta_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = charades_sta.load(tmp_path)
    assert (a.answer, b.answer) == ([1.0, 2.5], [0.5, 1.5])
    assert a.question.endswith("sentence: person opens the door. Please return its start time and end time.")
    assert a.metadata["duration"] == 31.5 and b.metadata["video_id"] == "BBBBB"


def write_parquet(path: Path, rows: list[dict]) -> Path:
    """``rows`` as lmms-lab/charades_sta's Parquet: video and caption strings, timestamp a list of float16."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    np = pytest.importorskip("numpy")
    schema = pa.schema([("video", pa.string()), ("caption", pa.string()), ("timestamp", pa.list_(pa.float16()))])
    table = pa.table({"video": [r["video"] for r in rows], "caption": [r["caption"] for r in rows],
                      "timestamp": pa.array([np.array(r["timestamp"], np.float16) for r in rows],
                                            type=pa.list_(pa.float16()))}, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def test_lmms_eval_parquet_gives_the_same_tasks_as_json(tmp_path: Path) -> None:
    """data/test-00000-of-00001.parquet as on the hub (timestamps float16) read through pyarrow."""
    rows = [{"video": "AAAAA.mp4", "caption": "person opens the door.", "timestamp": [1.0, 2.5]},
            {"video": "BBBBB.mp4", "caption": "person sits", "timestamp": [0.5, 1.75]},
            {"video": "AAAAA.mp4", "caption": "person turn a light on.", "timestamp": [24.25, 30.5]}]
    release(tmp_path)
    (tmp_path / "charades_sta_test.txt").unlink()
    (tmp_path / "charades_sta_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet", rows)
    pq = pytest.importorskip("pyarrow.parquet")
    assert [(f.name, str(f.type)) for f in pq.read_schema(parquet)] == [
        ("video", "string"), ("caption", "string"), ("timestamp", "list<element: halffloat>")]

    def plain(tasks):  # metadata["source"] names the file and row each came from
        return [(t.id, t.question, t.video, t.task_type, t.answer, t.options,
                 {k: v for k, v in t.metadata.items() if k != "source"}) for t in tasks]

    from_parquet = charades_sta.load(tmp_path)  # found: the txt is gone and the Parquet comes before JSON Lines
    from_json = charades_sta.load(tmp_path, annotations=tmp_path / "charades_sta_test.jsonl")
    assert [t.id for t in from_parquet] == ["AAAAA_0000", "BBBBB_0001", "AAAAA_0002"]
    assert plain(from_parquet) == plain(from_json)
    assert [t.metadata["source"] for t in from_parquet] == [f"{parquet}:{k}" for k in (1, 2, 3)]
    assert all(type(x) is float for t in from_parquet for x in t.answer)
    assert from_parquet[1].metadata["duration"] == 12.25
    assert plain(charades_sta.load(tmp_path, limit=2)) == plain(from_json[:2])
    # times not exact in float16 come back as the hub's file holds them (30.4 -> 30.40625)
    write_parquet(parquet, [{"video": "AAAAA.mp4", "caption": "x", "timestamp": [24.3, 30.4]}])
    assert charades_sta.load(tmp_path)[0].answer == [24.296875, 30.40625]


def test_bad_parquet_row(tmp_path: Path) -> None:
    release(tmp_path)
    (tmp_path / "charades_sta_test.txt").unlink()
    path = write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet",
                         [{"video": "AAAAA.mp4", "caption": "fine", "timestamp": [1.0, 2.0]},
                          {"video": "AAAAA.mp4", "caption": "backwards", "timestamp": [5.0, 2.0]}])
    # the bad row is skipped and reported by file and row; the good one is kept
    tasks = charades_sta.load(tmp_path)
    assert [t.metadata["caption"] for t in tasks] == ["fine"]
    assert tasks.skipped == [f"{path}:2: the segment [5.0, 2.0] is not 0 <= start <= end"]
    write_parquet(path, [{"video": "AAAAA.mp4", "caption": "backwards", "timestamp": [5.0, 2.0]}])
    with pytest.raises(DatasetError) as err:  # no usable row at all
        charades_sta.load(tmp_path)
    assert "none of its rows could be used (1 malformed)" in str(err.value)
    assert f"{path}:1: the segment" in str(err.value)


def test_missing_annotation_file_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        charades_sta.load(tmp_path)
    assert "charades_sta_test.txt" in str(err.value) and "data/test-00000-of-00001.parquet" in str(err.value)
    with pytest.raises(DatasetError, match="charades_sta_train.txt"):
        charades_sta.load(tmp_path, split="train")


@pytest.mark.parametrize(("line", "needle"), [
    ("AAAAA 1.0 2.0 person without hashes", "expected 'VIDEO_ID START END##sentence'"),
    ("AAAAA 1.0##too few numbers", "expected 'VIDEO_ID START END##sentence'"),
    ("AAAAA abc 2.0##bad start", "field 'start' is 'abc', expected a finite number"),
    ("AAAAA 1.0 nan##bad end", "field 'end' is 'nan', expected a finite number"),
    ("AAAAA 5.0 2.0##backwards", "the segment [5.0, 2.0] is not 0 <= start <= end"),
    ("AAAAA 1.0 2.0##   ", "field 'sentence' is empty"),
])
def test_bad_line_names_file_line_and_field(tmp_path: Path, line: str, needle: str) -> None:
    # Before, one bad line made the whole file fail to load; now it is skipped and named by file and line.
    release(tmp_path, [LINES[0], line, LINES[2]])
    tasks = charades_sta.load(tmp_path)
    assert [t.metadata["video_id"] for t in tasks] == ["AAAAA", "BBBBB"]
    assert len(tasks.skipped) == 1 and f"charades_sta_test.txt:2: {needle}" in tasks.skipped[0]


def test_bad_table_row_and_bad_length(tmp_path: Path) -> None:
    release(tmp_path)
    (tmp_path / "charades_sta_test.txt").unlink()
    (tmp_path / "charades_sta_test.jsonl").write_text(json.dumps({"video": "AAAAA.mp4", "caption": "x",
                                                                  "timestamp": [1.0]}) + "\n")
    with pytest.raises(DatasetError, match=r"charades_sta_test\.jsonl:1: field 'timestamp' is \[1\.0\]"):
        charades_sta.load(tmp_path)
    release(tmp_path)
    (tmp_path / "Charades_v1_test.csv").write_text("id,length\nAAAAA,long\n")
    with pytest.raises(DatasetError, match=r"Charades_v1_test\.csv:2: field 'length' is 'long'"):
        charades_sta.load(tmp_path)


def test_missing_videos_listed_and_counted(tmp_path: Path) -> None:
    lines = LINES + [f"GONE{k} 1.0 2.0##x" for k in range(6)]
    release(tmp_path, lines, videos=("AAAAA",))
    with pytest.raises(DatasetError) as err:
        charades_sta.load(tmp_path)
    msg = str(err.value)
    assert "7 Charades videos missing: Charades_v1_480/BBBBB.mp4; Charades_v1_480/GONE0.mp4" in msg
    assert "(and 2 more)" in msg
    assert len(charades_sta.load(tmp_path, limit=2)) == 2  # only the kept items' media are checked


def test_score_and_summary_by_hand() -> None:
    # The default is lmms-eval's rule: "[12, 22]" (one number per sentence, no range) and "0:10 to 0:20 s"... are
    # read as it reads them; the lenient columns read the span the answer states.
    task = Task(question="q", task_type="grounding", answer=[10.0, 20.0])
    answers = ["The event happens in the 10 - 20 seconds.",  # IoU 1 (both rules)
               "<answer>[12, 22]</answer>",  # lmms-eval: no pair; lenient: inter 8, union 12
               "from 15 to 30 seconds",  # inter 5, union 20 (both)
               "0 - 9",  # no overlap
               "I could not find it"]  # nothing parsed
    scores = [charades_sta.score(task, a) for a in answers]
    assert [s["iou"] for s in scores] == pytest.approx([1.0, 0.0, 5 / 20, 0.0, 0.0])
    assert [s["pred"] for s in scores] == [[10.0, 20.0], None, [15.0, 30.0], [0.0, 9.0], None]
    assert [s["iou_lenient"] for s in scores] == pytest.approx([1.0, 8 / 12, 5 / 20, 0.0, 0.0])
    assert [s["pred_lenient"] for s in scores] == [[10.0, 20.0], [12.0, 22.0], [15.0, 30.0], [0.0, 9.0], None]
    assert all(s["score"] == s["iou"] for s in scores)
    out = charades_sta.summarise([task] * 5, scores)
    assert out == {"overall": {"n": 5, "r@0.3": 0.2, "r@0.5": 0.2, "r@0.7": 0.2, "miou": pytest.approx(1.25 / 5),
                               "parsed": 0.6, "r@0.3_lenient": 0.4, "r@0.5_lenient": 0.4, "r@0.7_lenient": 0.2,
                               "miou_lenient": pytest.approx((1 + 8 / 12 + 0.25) / 5), "parsed_lenient": 0.8}}
    assert charades_sta.summarise([], []) == {}
    assert charades_sta.score(task, None) == {"score": 0.0, "iou": 0.0, "pred": None, "iou_lenient": 0.0,
                                              "pred_lenient": None}
