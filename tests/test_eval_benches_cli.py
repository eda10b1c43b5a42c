"""`mmagent eval` end to end on each real benchmark's release layout: tiny folders, the tiny random model.

Video-MME and Charades-STA are given as their Hugging Face Parquet files (read through pyarrow), IM2GPS3K as
its CSV, V* as its JSON Lines. Each run must leave predictions.jsonl, summary.json with that benchmark's rows,
plot.png and report.html; a folder with a file missing must give exit code 2 and one line naming it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.cli import main
from mmagent.tiny import write_synthetic_video

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _video(path: Path) -> None:
    write_synthetic_video(path, seconds=2.0, fps=4, size=(64, 64))


def _image(path: Path, value: int = 120) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((48, 64, 3), value, np.uint8)).save(path)


def _videomme(root: Path) -> list[str]:
    """videomme/test-00000-of-00001.parquet (lmms-lab/Video-MME's columns) and data/{videoID}.mp4."""
    rows = [{"video_id": f"00{k}", "duration": d, "domain": "Knowledge", "sub_category": "Humanity & History",
             "url": f"https://www.youtube.com/watch?v=vid{k}", "videoID": f"vid{k}", "question_id": f"00{k}-1",
             "task_type": "Counting Problem", "question": "What colour comes first?",
             "options": ["A. Red.", "B. Green.", "C. Blue.", "D. Yellow."], "answer": "A"}
            for k, d in ((1, "short"), (2, "medium"), (3, "long"))]
    schema = pa.schema([(k, pa.list_(pa.string()) if k == "options" else pa.string()) for k in rows[0]])
    (root / "videomme").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), root / "videomme" / "test-00000-of-00001.parquet")
    for r in rows:
        _video(root / "data" / f"{r['videoID']}.mp4")
    return ["001-1", "002-1"]


def _charades(root: Path) -> list[str]:
    """data/test-00000-of-00001.parquet (lmms-lab/charades_sta: timestamps float16) and Charades_v1_480/."""
    rows = [("AAAAA.mp4", "person turns a light on.", [0.5, 1.5]), ("BBBBB.mp4", "person sits down", [0.0, 1.0]),
            ("AAAAA.mp4", "person opens the door", [1.0, 2.0])]
    table = pa.table({"video": [r[0] for r in rows], "caption": [r[1] for r in rows],
                      "timestamp": pa.array([np.array(r[2], np.float16) for r in rows],
                                            type=pa.list_(pa.float16()))})
    (root / "data").mkdir(parents=True)
    pq.write_table(table, root / "data" / "test-00000-of-00001.parquet")
    for name in ("AAAAA", "BBBBB"):
        _video(root / "Charades_v1_480" / f"{name}.mp4")
    return ["AAAAA_0000", "BBBBB_0001"]


def _geo(root: Path) -> list[str]:
    """im2gps3k_places365.csv and its images under im2gps3ktest/."""
    root.mkdir(parents=True)
    rows = ["paris_1_1_1@N00.jpg,1@N00,48.8566,2.3522,2,11,84,0.01,0.02,0.97",
            "nyc_2_2_2@N00.jpg,2@N00,40.7128,-74.006,2,15,307,0.1,0.1,0.8",
            "sydney_3_3_3@N00.jpg,3@N00,-33.8688,151.2093,1,6,48,0.0,0.9,0.1"]
    (root / "im2gps3k_places365.csv").write_text(
        "IMG_ID,AUTHOR,LAT,LON,S3_Label,S16_Label,S365_Label,Prob_indoor,Prob_natural,Prob_urban\n"
        + "\n".join(rows) + "\n")
    for k, r in enumerate(rows):
        _image(root / "im2gps3ktest" / r.split(",")[0], 60 * k + 40)
    return ["paris_1_1_1@N00", "nyc_2_2_2@N00"]


def _vstar(root: Path) -> list[str]:
    """test_questions.jsonl (craigwu/vstar_bench) and the images at the paths it names."""
    def q(qid: int, category: str, question: str, options: list[str], label: str) -> dict:
        text = (question + "\n" + "\n".join(f"({chr(65 + k)}) {o}" for k, o in enumerate(options))
                + "\nAnswer with the option's letter from the given choices directly.")
        return {"question_id": qid, "image": f"{category}/sa_{qid}.jpg", "text": text, "category": category,
                "label": label}

    rows = [q(0, "direct_attributes", "What is the color of the cup?", ["red", "blue", "green", "white"], "B"),
            q(1, "relative_position", "Is the cat on the left or right side of the dog?", ["left", "right"], "A"),
            q(2, "direct_attributes", "What is the material of the glove?", ["rubber", "cotton", "wool", "silk"], "A")]
    root.mkdir(parents=True)
    (root / "test_questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:
        _image(root / r["image"], 200)
    return ["0", "1"]


BUILDERS = {"videomme": _videomme, "charades_sta": _charades, "geo": _geo, "vstar": _vstar}
#: summary rows each benchmark must report for the two items run
ROWS = {"videomme": {"overall": "accuracy", "duration/short": "accuracy", "duration/medium": "accuracy",
                     "domain/Knowledge": "accuracy", "task_type/Counting Problem": "accuracy"},
        "charades_sta": {"overall": "r@0.5"},
        "geo": {"overall": "acc@25km"},
        "vstar": {"overall": "accuracy", "category/direct_attributes": "accuracy",
                  "category/relative_position": "accuracy"}}
#: what to delete from a good folder, and the name the error must give
BREAK = {"videomme": ("data/vid2.mp4", "data/vid2.mp4"),
         "charades_sta": ("data/test-00000-of-00001.parquet", "charades_sta_test.txt"),
         "geo": ("im2gps3ktest/nyc_2_2_2@N00.jpg", "im2gps3ktest/nyc_2_2_2@N00.jpg"),
         "vstar": ("test_questions.jsonl", "test_questions.jsonl")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """bench -> (its release folder of 3 items, the ids of the first 2)."""
    base = tmp_path_factory.mktemp("bench-folders")
    return {name: (base / name, build(base / name)) for name, build in BUILDERS.items()}


def _args(bench: str, data: Path, model: Path, out: Path) -> list[str]:
    return ["eval", "--bench", bench, "--data-dir", str(data), "--model", str(model), "--limit", "2",
            "--out", str(out), "--quiet", "--max-new-tokens", "16", "--max-turns", "2", "--device", "cpu"]


def _strict(text: str):
    """json.loads that refuses NaN/Infinity, which strict JSON readers reject."""
    def refuse(name: str):
        raise ValueError(f"{name} in JSON output")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("bench", list(BUILDERS))
def test_eval_runs_the_release_layout_end_to_end(bench, folders, tiny_model_dir, tmp_path, capsys):
    data, ids = folders[bench]
    out = tmp_path / "run"
    assert main(_args(bench, data, tiny_model_dir, out)) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "| overall | 2 |" in printed and f"2 of 2 items in {out}" in printed

    lines = (out / "predictions.jsonl").read_text().splitlines()
    recs = [_strict(x) for x in lines]
    assert sorted(r["id"] for r in recs) == sorted(ids)  # one line per item, in the order they finished
    assert all(isinstance(r["score"]["score"], float) and r["stop_reason"] for r in recs)
    for r in recs:  # the model saw the item's own video or image
        traj = json.loads((out / "trajectories" / r["trajectory"]).read_text())
        media = traj["task"]["video"] or traj["task"]["image"]
        assert traj["visual_tokens"] > 0 and Path(media).is_file() and Path(media).is_relative_to(data.resolve())

    summary = _strict((out / "summary.json").read_text())
    if bench == "geo":  # a random model gives no coordinates: infinite km, written as null
        assert summary["summary"]["overall"]["median_km"] is None and recs[0]["score"]["km"] is None
    assert (summary["bench"], summary["n_tasks"], summary["n_done"]) == (bench, 2, 2)
    for row, metric in ROWS[bench].items():
        assert row in summary["summary"], (row, list(summary["summary"]))
        assert 0.0 <= summary["summary"][row][metric] <= 1.0
    assert summary["summary"]["overall"]["n"] == 2
    if bench == "videomme":
        assert "duration/long" not in summary["summary"]  # the third item is past --limit
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert all(i in page for i in ids)
    run = json.loads((out / "run.json").read_text())
    assert run["identity"]["bench"] == bench
    assert run["reference"] == summary["reference"] and summary["reference"]  # the scorer the numbers reproduce
    assert summary["skipped_rows"] == {"n": 0, "rows": []}


@pytest.mark.parametrize("bench", list(BUILDERS))
def test_eval_names_the_missing_file_in_one_line(bench, folders, tiny_model_dir, tmp_path, capsys):
    good, _ = folders[bench]
    data = tmp_path / "data"
    shutil.copytree(good, data)
    gone, named = BREAK[bench]
    (data / gone).unlink()
    out = tmp_path / "run"
    assert main(_args(bench, data, tiny_model_dir, out)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmagent: error: "), captured.err
    assert named in lines[0] and str(data) in lines[0]
    assert captured.out == "" and not out.exists()  # nothing was run or written
