"""The ``mmagent`` command as a user runs it: a subprocess on the tiny model and a synthetic video."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmagent.trajectory import load_jsonl


def _mmagent(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmagent", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_subcommands():
    out = _mmagent("--help")
    assert out.returncode == 0
    for command in ("run", "tools", "make-tiny"):
        assert command in out.stdout


def test_tools_lists_the_builtin_tools():
    out = _mmagent("tools", "--json")
    names = [s["function"]["name"] for s in json.loads(out.stdout)]
    assert {"resample_frames", "zoom"} <= set(names)


@pytest.mark.slow
def test_run_prints_a_multi_turn_episode_and_saves_it(imprinted_model_dir, video_path, tmp_path):
    saved = tmp_path / "runs.jsonl"
    out = _mmagent("run", "--model", str(imprinted_model_dir), "--video", str(video_path), "--device", "cpu",
                   "--save", str(saved), "What colour is the screen?")
    assert out.returncode == 0, out.stderr
    assert "[assistant]" in out.stdout and "[tool:resample_frames] [4 image(s): obs:1, obs:2, obs:3, obs:4]" in out.stdout
    assert "Answer: A" in out.stdout
    (traj,) = load_jsonl(saved)
    assert traj.stop_reason == "answer" and len(traj.observations[0].images) == 4
    # the saved loss mask covers exactly the policy's generated tokens
    assert sum(traj.loss_mask) == sum(t.num_tokens for t in traj.turns if t.role == "assistant")
    assert traj.loss_mask[:traj.prompt_length] == [0] * traj.prompt_length
    obs_turn = next(t for t in traj.turns if t.role == "tool")
    start = traj.prompt_length + traj.turns[0].num_tokens
    assert traj.loss_mask[start:start + obs_turn.num_tokens] == [0] * obs_turn.num_tokens


@pytest.mark.slow
def test_run_json_output(imprinted_model_dir, video_path):
    out = _mmagent("run", "--model", str(imprinted_model_dir), "--video", str(video_path), "--device", "cpu",
                   "--json", "What happens in the video?")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["stop_reason"] in ("answer", "max_turns")
    assert data["turns"][0]["role"] == "assistant" and data["num_tokens"] > data["policy_tokens"] > 0


def test_run_reports_missing_inputs_clearly(tmp_path, video_path):
    out = _mmagent("run", "--model", str(tmp_path), "--video", str(tmp_path / "missing.mp4"), "q")
    assert out.returncode == 2 and "video not found" in out.stderr
    out = _mmagent("run", "--model", str(tmp_path / "no-model"), "--video", str(video_path), "q")
    assert out.returncode == 2 and "no model folder" in out.stderr and "make-tiny" in out.stderr
    out = _mmagent("run", "--model", "m", "q")
    assert out.returncode == 2 and "one of the arguments --video --image is required" in out.stderr


def test_make_tiny_writes_a_loadable_model_and_a_video(tmp_path):
    out = _mmagent("make-tiny", str(tmp_path / "tiny"), "--no-imprint", "--video", str(tmp_path / "clip.mp4"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "tiny" / "model.safetensors").is_file() and (tmp_path / "clip.mp4").stat().st_size > 1000
    out = _mmagent("run", "--model", str(tmp_path / "tiny"), "--video", str(tmp_path / "clip.mp4"),
                   "--max-turns", "2", "--max-new-tokens", "8", "--device", "cpu", "q")
    # a random model rarely produces a valid action: the episode ends on the turn budget, with error notes
    assert out.returncode == 0, out.stderr
    assert "Answer:" in out.stdout and "[stop:" in out.stdout


def test_train_takes_overrides_after_the_config_and_refuses_typos():
    out = _mmagent("train", "sft", "--config", "sft_synth", "model=./m", "stepz=3")
    assert out.returncode == 2 and "unknown key 'stepz'" in out.stderr and "known: model" in out.stderr
    out = _mmagent("train", "rl", "--config", "rl_synth")
    assert out.returncode == 2 and "set model" in out.stderr
    out = _mmagent("train", "sft", "--config", "sft_synth", "--epochs", "3")
    assert out.returncode == 2 and "unrecognized arguments: --epochs 3" in out.stderr
    out = _mmagent("train", "sft", "--config", "no_such_config")
    assert out.returncode == 2 and "shipped configs: rl_synth, sft_synth" in out.stderr


@pytest.mark.slow
def test_run_passes_answer_options_to_the_prompt(imprinted_model_dir, video_path, tmp_path):
    saved = tmp_path / "runs.jsonl"
    out = _mmagent("run", "--model", str(imprinted_model_dir), "--video", str(video_path), "--device", "cpu",
                   "--option", "A. red", "--option", "B. blue", "--save", str(saved), "What colour is it?")
    assert out.returncode == 0, out.stderr
    (traj,) = load_jsonl(saved)
    assert traj.task.options == ["A. red", "B. blue"] and "B. blue" in traj.user_prompt
