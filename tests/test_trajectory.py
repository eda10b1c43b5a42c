"""Trajectories: hand-built episodes round-trip through JSONL with their images; task checks; token views."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.trajectory import Task, ToolCallRecord, Trajectory, Turn, load_jsonl, save_jsonl
from mmagent.toolbox import Observation


def _image(seed: int, size=(12, 8)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def make_trajectory(question: str = "What colour is shown at 1.5 s?", seed: int = 0) -> Trajectory:
    task = Task(question=question, video="videos/clip.mp4", id=f"t{seed}", task_type="video_qa",
                options=["red", "green"], answer="green", metadata={"split": "dev", "n": 3})
    call = ToolCallRecord("resample_frames", {"start": 1.0, "end": 2.0, "num_frames": 2})
    obs = Observation(text="Video clip from 1.00 to 2.00 seconds: 2 frames at 1.25s, 1.75s",
                      images=[_image(seed), _image(seed + 1, (5, 7))], image_labels=["1.25s", "1.75s"],
                      handles=["obs:1", "obs:2"], data={"start": 1.0, "end": 2.0, "timestamps": [1.25, 1.75]})
    turns = [
        Turn("assistant", "<think>look</think><tool_call>{...}</tool_call>", tool_call=call, num_tokens=7,
             prefill_tokens=40, seconds=0.25),
        Turn("tool", obs.text, observation=obs, num_tokens=5),
        Turn("assistant", "<tool_call>{bad</tool_call>", error="malformed", num_tokens=3, prefill_tokens=5),
        Turn("tool", "Error: bad call", observation=Observation.error("bad call"), num_tokens=2),
        Turn("assistant", "<answer>green</answer>", num_tokens=4, seconds=0.5),
    ]
    # 4 prompt tokens, then policy (1) and observation (0) tokens
    token_ids = [10, 11, 12, 13, 20, 21, 22, 30, 31, 40, 41]
    loss_mask = [0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    logprobs = [0.0, 0.0, 0.0, 0.0, -0.5, -1.25, -0.125, 0.0, 0.0, -2.0, -0.0625]
    return Trajectory(task=task, system_prompt="sys", user_prompt="This is a video. Q?", turns=turns,
                      answer="green", stop_reason="answer", token_ids=token_ids, loss_mask=loss_mask,
                      logprobs=logprobs, prompt_length=4, visual_tokens=64, initial_frame_times=[0.5, 1.5],
                      timings={"generate": 1.5}, rewards={"accuracy": 1.0}, info={"seed": seed, "ü": "✓"})


def assert_same(a: Trajectory, b: Trajectory) -> None:
    """Every field equal; images compared pixel by pixel."""
    assert a.task == b.task
    for name in ("system_prompt", "user_prompt", "answer", "stop_reason", "token_ids", "loss_mask", "logprobs",
                 "prompt_length", "visual_tokens", "initial_frame_times", "timings", "rewards", "info"):
        assert getattr(a, name) == getattr(b, name), name
    assert len(a.turns) == len(b.turns)
    for ta, tb in zip(a.turns, b.turns):
        for name in ("role", "text", "tool_call", "error", "num_tokens", "prefill_tokens", "seconds"):
            assert getattr(ta, name) == getattr(tb, name), name
        assert (ta.observation is None) == (tb.observation is None)
        if ta.observation is not None:
            oa, ob = ta.observation, tb.observation
            for name in ("text", "image_labels", "is_error", "handles", "data"):
                assert getattr(oa, name) == getattr(ob, name), name
            assert len(oa.images) == len(ob.images)
            for ia, ib in zip(oa.images, ob.images):
                assert ia.size == ib.size and ib.mode == "RGB"
                assert np.array_equal(np.asarray(ia), np.asarray(ib))


def test_round_trip_every_field(tmp_path):
    traj = make_trajectory()
    image_root = save_jsonl([traj], tmp_path / "out" / "run.jsonl")
    assert image_root == tmp_path / "out" / "run_images"
    assert sorted(p.name for p in (image_root / "000000").iterdir()) == ["turn01_img00.png", "turn01_img01.png"]
    (loaded,) = list(load_jsonl(tmp_path / "out" / "run.jsonl"))
    assert_same(traj, loaded)
    assert loaded.tool_calls == [ToolCallRecord("resample_frames", {"start": 1.0, "end": 2.0, "num_frames": 2})]
    assert [o.is_error for o in loaded.observations] == [False, True]


def test_image_paths_are_relative_and_folder_can_move(tmp_path):
    traj = make_trajectory()
    save_jsonl([traj], tmp_path / "a" / "run.jsonl")
    line = json.loads((tmp_path / "a" / "run.jsonl").read_text(encoding="utf-8"))
    paths = line["turns"][1]["observation"]["images"]
    assert paths == ["run_images/000000/turn01_img00.png", "run_images/000000/turn01_img01.png"]
    shutil.copytree(tmp_path / "a", tmp_path / "moved")
    shutil.rmtree(tmp_path / "a")
    (loaded,) = list(load_jsonl(tmp_path / "moved" / "run.jsonl"))
    assert_same(traj, loaded)


def test_append_adds_a_line_with_its_own_image_folder(tmp_path):
    path = tmp_path / "run.jsonl"
    first, second = make_trajectory(seed=0), make_trajectory("Second question?", seed=5)
    save_jsonl([first], path)
    save_jsonl([second], path, append=True)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["turns"][1]["observation"]["images"][0] == "run_images/000001/turn01_img00.png"
    a, b = list(load_jsonl(path))
    assert_same(first, a)
    assert_same(second, b)
    assert not np.array_equal(np.asarray(a.observations[0].images[0]), np.asarray(b.observations[0].images[0]))


def test_save_without_append_overwrites(tmp_path):
    path = tmp_path / "run.jsonl"
    save_jsonl([make_trajectory(seed=0), make_trajectory(seed=1)], path)
    save_jsonl([make_trajectory(seed=2)], path)
    (only,) = list(load_jsonl(path))
    assert only.task.id == "t2"


def test_many_trajectories_in_one_call_number_their_folders(tmp_path):
    path = tmp_path / "run.jsonl"
    trajs = [make_trajectory(seed=k) for k in range(3)]
    root = save_jsonl(trajs, path)
    assert sorted(p.name for p in root.iterdir()) == ["000000", "000001", "000002"]
    for t, loaded in zip(trajs, load_jsonl(path)):
        assert_same(t, loaded)


def test_trajectory_without_images_round_trips_and_needs_no_folder(tmp_path):
    traj = Trajectory(task=Task("Q?"), turns=[Turn("assistant", "<answer>A</answer>")], answer="A")
    root = save_jsonl([traj], tmp_path / "plain.jsonl")
    assert not root.exists()
    (loaded,) = list(load_jsonl(tmp_path / "plain.jsonl"))
    assert_same(traj, loaded)


def test_the_benchmark_that_scores_a_task_round_trips_and_old_lines_load_without_it(tmp_path):
    traj = Trajectory(task=Task("Q?", id="v1", task_type="video_qa", answer="B", benchmark="videomme"),
                      answer="B", stop_reason="answer")
    save_jsonl([traj], tmp_path / "run.jsonl")
    line = json.loads((tmp_path / "run.jsonl").read_text(encoding="utf-8"))
    assert line["task"]["benchmark"] == "videomme"
    (loaded,) = list(load_jsonl(tmp_path / "run.jsonl"))
    assert loaded.task.benchmark == "videomme" and loaded.task == traj.task
    del line["task"]["benchmark"]  # a line written before Task.benchmark existed
    (tmp_path / "old.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    (old,) = list(load_jsonl(tmp_path / "old.jsonl"))
    assert old.task.benchmark == "" and old.task.id == "v1" and old.answer == "B"


def test_to_dict_with_images_needs_image_dir():
    with pytest.raises(ValueError, match="pass image_dir"):
        make_trajectory().to_dict()


def test_corrupt_line_names_the_line(tmp_path):
    path = tmp_path / "run.jsonl"
    save_jsonl([make_trajectory(seed=0), make_trajectory(seed=1)], path)
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text(lines[0] + "\n\n" + lines[1][: len(lines[1]) // 2] + "\n", encoding="utf-8")
    it = load_jsonl(path)
    assert next(it).task.id == "t0"  # earlier lines still load; the blank line is skipped
    with pytest.raises(ValueError, match=r"run\.jsonl:3: not valid JSON") as exc:
        next(it)
    assert str(path) in str(exc.value)


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    save_jsonl([make_trajectory()], path)
    path.write_text("\n" + path.read_text(encoding="utf-8") + "\n  \n", encoding="utf-8")
    assert len(list(load_jsonl(path))) == 1


# ----- Task -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("question", ["", "   ", "\n\t", None, 3])
def test_task_needs_a_question(question):
    with pytest.raises(ValueError, match="a task needs a non-empty question"):
        Task(question=question)


def test_task_paths_become_strings():
    task = Task("Q?", video=Path("a/b.mp4"), image=Path("c.png"))
    assert task.video == "a/b.mp4" and task.image == "c.png"
    assert Task("Q?").task_type == "open" and Task("Q?").metadata == {}


# ----- views ----------------------------------------------------------------------------------------
def test_prompt_and_response_views():
    traj = make_trajectory()
    assert traj.prompt_ids == [10, 11, 12, 13]
    assert traj.response_ids == [20, 21, 22, 30, 31, 40, 41]
    assert traj.response_mask == [1, 1, 1, 0, 0, 1, 1]
    assert traj.prompt_ids + traj.response_ids == traj.token_ids
    assert len(traj.response_mask) == len(traj.response_ids)
    assert sum(traj.response_mask) == sum(traj.loss_mask) == 5


def test_tool_calls_and_observations_views():
    traj = make_trajectory()
    assert [c.name for c in traj.tool_calls] == ["resample_frames"]
    assert [o.handles for o in traj.observations] == [["obs:1", "obs:2"], []]
    empty = Trajectory(task=Task("Q?"))
    assert empty.tool_calls == [] and empty.observations == [] and empty.prompt_ids == [] == empty.response_mask


def test_a_json_line_that_is_not_a_trajectory_is_named(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match=r"runs.jsonl:1: not a trajectory"):
        list(load_jsonl(path))
