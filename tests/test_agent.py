"""The agent loop end to end: scripted turns forced through the real tiny model, real tools, real media."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from mmagent import Agent, Budgets
from mmagent.media import MediaError
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.trajectory import Task, load_jsonl, save_jsonl
from mmagent.toolbox import Observation, Tool

RESAMPLE = "<think>Look again.</think>" + format_tool_call("resample_frames", {"start": 1.0, "end": 2.0, "num_frames": 2})
ZOOM = "<think>Closer.</think>" + format_tool_call("zoom", {"bbox": [0, 0, 40, 28], "source": "obs:1"})
ANSWER = "<think>It is green.</think><answer>green</answer>"


def _agent(model_dir, script, **kwargs) -> Agent:
    policy = HFPolicy.from_pretrained(str(model_dir), device="cpu", chooser=ReplayChooser(script))
    return Agent(policy, **kwargs)


def test_multi_turn_episode_with_a_malformed_call(tiny_model_dir, video_path, tmp_path):
    agent = _agent(tiny_model_dir, [RESAMPLE, "<tool_call>{not json</tool_call>", ZOOM, ANSWER])
    seen = []
    result = agent.run("What colour is shown at 1.5 s?", video=video_path, on_turn=seen.append)
    traj = result.trajectory
    assert result.answer == "green" and traj.stop_reason == "answer"
    roles = [t.role for t in traj.turns]
    assert roles == ["assistant", "tool"] * 3 + ["assistant"] and seen == traj.turns
    frames_obs, error_obs, zoom_obs = (t.observation for t in traj.turns if t.role == "tool")
    # the frames really come from 1.25 s and 1.75 s: the green second of the clip
    assert "1.25s" in frames_obs.text and "1.75s" in frames_obs.text and frames_obs.handles == ["obs:1", "obs:2"]
    first = frames_obs.images[0].convert("RGB")
    r, g, b = first.getpixel((first.width - 3, 3))  # away from the time stamp, the square and the counter
    assert g > 150 and r < 100 and b < 100
    # the malformed call became an error observation and the episode went on
    assert traj.turns[2].error == "malformed" and error_obs.is_error and "not valid JSON" in error_obs.text
    assert traj.turns[3].error == "tool_error"
    assert zoom_obs.handles == ["obs:3"] and not zoom_obs.is_error
    assert [c.name for c in traj.tool_calls] == ["resample_frames", "zoom"]
    # the loss mask covers exactly the policy's tokens
    policy_tokens = sum(t.num_tokens for t in traj.turns if t.role == "assistant")
    assert sum(traj.loss_mask) == policy_tokens and len(traj.loss_mask) == len(traj.token_ids)
    assert len(traj.token_ids) == traj.prompt_length + sum(t.num_tokens for t in traj.turns)
    tok = agent.policy.tokenizer
    assert tok.decode([i for i, m in zip(traj.token_ids, traj.loss_mask) if m]) == (
        RESAMPLE + "<tool_call>{not json</tool_call>" + ZOOM + ANSWER)
    # and it all survives a save/load round trip
    save_jsonl([traj], tmp_path / "runs.jsonl")
    (loaded,) = load_jsonl(tmp_path / "runs.jsonl")
    assert loaded.token_ids == traj.token_ids and loaded.loss_mask == traj.loss_mask
    assert loaded.answer == "green" and len(loaded.observations[0].images) == 2
    assert np.array_equal(np.asarray(loaded.observations[0].images[0]), np.asarray(frames_obs.images[0]))


def test_kv_reuse_shows_in_the_trajectory(tiny_model_dir, video_path):
    traj = _agent(tiny_model_dir, [RESAMPLE, RESAMPLE, ANSWER]).run("q", video=video_path).trajectory
    assistant = [t for t in traj.turns if t.role == "assistant"]
    observations = [t for t in traj.turns if t.role == "tool"]
    assert assistant[0].prefill_tokens == traj.prompt_length
    for later, obs in zip(assistant[1:], observations):
        assert later.prefill_tokens == obs.num_tokens + 1


def test_turn_budget_stops_the_episode_and_warns_on_the_last_turn(tiny_model_dir, video_path):
    agent = _agent(tiny_model_dir, [RESAMPLE] * 5, budgets=Budgets(max_turns=3))
    traj = agent.run("q", video=video_path).trajectory
    assert traj.stop_reason == "max_turns" and traj.answer is None
    assert sum(t.role == "assistant" for t in traj.turns) == 3
    last_obs = [t for t in traj.turns if t.role == "tool"][-1]
    assert "last turn" in last_obs.text


def test_visual_budget_turns_images_into_a_note(tiny_model_dir, video_path):
    probe = _agent(tiny_model_dir, [ANSWER]).run("q", video=video_path).trajectory
    agent = _agent(tiny_model_dir, [RESAMPLE, ANSWER], budgets=Budgets(max_visual_tokens=probe.visual_tokens + 1))
    traj = agent.run("q", video=video_path).trajectory
    obs = traj.observations[0]
    assert obs.images == [] and "visual budget" in obs.text and obs.data["images_dropped"] == 2
    assert traj.visual_tokens == probe.visual_tokens and traj.answer == "green"


def test_context_budget_stops_the_episode(tiny_model_dir, video_path):
    probe = _agent(tiny_model_dir, [ANSWER]).run("q", video=video_path).trajectory
    budgets = Budgets(max_context_tokens=probe.prompt_length + 80, max_new_tokens=64)
    traj = _agent(tiny_model_dir, [RESAMPLE, ANSWER], budgets=budgets).run("q", video=video_path).trajectory
    assert traj.stop_reason == "max_tokens" and traj.answer is None


class _Blocking(Tool):
    name = "wait_forever"
    description = "never returns in time"
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.release = threading.Event()

    def run(self, arguments, context) -> Observation:
        self.release.wait(10)
        return Observation(text="too late")


class _Broken(Tool):
    name = "broken"
    description = "raises"
    parameters = {"type": "object", "properties": {}}

    def run(self, arguments, context) -> Observation:
        raise RuntimeError("boom")


def test_tool_timeouts_and_crashes_become_error_observations(tiny_model_dir, video_path):
    slow = _Blocking()
    script = [format_tool_call("wait_forever", {}), format_tool_call("broken", {}),
              format_tool_call("resample_frames", {"start": 1, "end": 2, "nope": 1}),
              format_tool_call("no_such_tool", {}), ANSWER]
    agent = _agent(tiny_model_dir, script, tools=[slow, _Broken(), "resample_frames"],
                   budgets=Budgets(tool_timeout_s=0.2, max_turns=8))
    try:
        traj = agent.run("q", video=video_path).trajectory
    finally:
        slow.release.set()
    texts = [t.text for t in traj.turns if t.role == "tool"]
    assert "took longer than 0.2 s" in texts[0] and traj.turns[1].error == "timeout"
    assert "boom" in texts[1] and "RuntimeError" in texts[1]
    assert "invalid arguments for resample_frames" in texts[2]
    assert "unknown tool 'no_such_tool'" in texts[3] and traj.turns[6].error == "unknown_tool"
    assert traj.answer == "green"


def test_image_episode_zooms_into_the_image(tiny_model_dir):
    image = Image.new("RGB", (200, 100), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 100, 100))  # left half red
    agent = _agent(tiny_model_dir, [format_tool_call("zoom", {"bbox": [0, 0, 20, 20], "source": "image"}), ANSWER])
    traj = agent.run("What colour is the top left?", image=image).trajectory
    crop = traj.observations[0].images[0].convert("RGB")
    assert crop.getpixel((crop.width // 2, crop.height // 2)) == (255, 0, 0)
    assert traj.task.image == "<in-memory image>" and traj.info["image_view_size"][0] % 28 == 0


def test_run_batch_keeps_order_and_reports_bad_media(tiny_model_dir, video_path, tmp_path):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video at all")
    tasks = [Task("a?", video=str(video_path), id="a"), Task("b?", video=str(bad), id="b"),
             Task("c?", video=str(video_path), id="c")]
    agent = _agent(tiny_model_dir, {"a": [ANSWER], "c": [RESAMPLE, "<answer>blue</answer>"]})
    trajs = agent.run_batch(tasks, progress=False)
    assert [t.task.id for t in trajs] == ["a", "b", "c"]
    assert trajs[0].answer == "green" and trajs[2].answer == "blue"
    assert trajs[1].stop_reason == "error" and "broken.mp4" in trajs[1].info["error"]
    with pytest.raises(MediaError, match="broken.mp4"):
        agent.run("b?", video=bad)


def test_run_needs_media(tiny_model_dir):
    with pytest.raises(ValueError, match="video=... or an image"):
        _agent(tiny_model_dir, [ANSWER]).run("q")


@pytest.mark.slow
def test_from_pretrained_runs_the_imprinted_model_greedily(imprinted_model_dir, video_path):
    """The Python API with real greedy decoding: the imprinted tiny model calls a tool, then answers."""
    agent = Agent.from_pretrained(str(imprinted_model_dir), tools=["resample_frames", "zoom"], device="cpu")
    result = agent.run("What colour is the screen?", video=video_path)
    traj = result.trajectory
    assert [c.name for c in traj.tool_calls] == ["resample_frames"]
    assert len(traj.observations[0].images) == 4
    assert result.answer == "A" and result.stop_reason == "answer"
    assert "[tool:resample_frames]" in str(result)
