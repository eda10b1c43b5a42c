"""The demo's parts without a browser: upload checks, the episode drawn turn by turn, errors, stop, export, CLI.

Episodes run the real agent on the tiny model with scripted turns (ReplayChooser) and the real tools.
"""

from __future__ import annotations

import json
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.demo.app import DemoRunner
from mmagent.demo.episode_view import EpisodeView, export_trajectory, title_of
from mmagent.demo.uploads import UploadError, UploadLimits, check_image, check_video
from mmagent.cli import main
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.trajectory import Trajectory
from mmagent.toolbox import Observation, Tool

RESAMPLE = "<think>Look again.</think>" + format_tool_call("resample_frames", {"start": 1.0, "end": 2.0, "num_frames": 2})
BAD_ZOOM = "<think>Closer.</think>" + format_tool_call("zoom", {"bbox": [0, 0, 40, 28], "source": "obs:99"})
ANSWER = "<think>It is green.</think><answer>green</answer>"


class Explode(Tool):
    """A tool with a bug: it raises something that is not a ToolError."""

    name = "explode"
    description = "always fails"
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def run(self, arguments, context) -> Observation:
        raise RuntimeError("disk on fire")


def _runner(model_dir, script, tmp_path, tools=("resample_frames", "zoom"), **kwargs) -> DemoRunner:
    policy = HFPolicy.from_pretrained(str(model_dir), device="cpu", chooser=ReplayChooser(script))
    return DemoRunner(policy, list(tools), tmp_path / "work", **kwargs)


def _last(updates):
    updates = list(updates)
    return updates, updates[-1]


# ----- uploads ------------------------------------------------------------------------------------
def test_upload_checks_refuse_bad_files_with_plain_messages(video_path, tmp_path):
    limits = UploadLimits()
    assert check_video(video_path, limits) == pytest.approx(4.0)
    with pytest.raises(UploadError, match="longer than the 2 s limit"):
        check_video(video_path, UploadLimits(max_video_s=2))
    with pytest.raises(UploadError, match=r"MB is over the 0\.001 MB limit"):
        check_video(video_path, UploadLimits(max_video_mb=0.001))
    fake = tmp_path / "fake.mp4"
    fake.write_text("this is not a video")
    with pytest.raises(UploadError, match="fake.mp4: cannot be read as a video"):
        check_video(fake, limits)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(UploadError, match="the file is empty"):
        check_video(tmp_path / "empty.mp4", limits)
    with pytest.raises(UploadError, match="not a supported video type"):
        check_video(tmp_path / "clip.exe", limits)
    img = tmp_path / "big.png"
    Image.fromarray(np.zeros((300, 400, 3), np.uint8)).save(img)
    assert check_image(img, limits) == (400, 300)
    with pytest.raises(UploadError, match="400x300 is over the 100,000 pixel limit"):
        check_image(img, UploadLimits(max_image_pixels=100_000))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(UploadError, match="broken.jpg: cannot be read as an image"):
        check_image(broken, limits)


def test_missing_inputs_and_bad_uploads_become_a_message(tiny_model_dir, video_path, tmp_path):
    runner = _runner(tiny_model_dir, [ANSWER], tmp_path)
    (_, last) = _last(runner.stream(None, None, "What colour?"))
    assert last.status.startswith("❌ Upload a video or an image first") and last.messages == []
    (_, last) = _last(runner.stream(str(video_path), None, "   "))
    assert "Type a question" in last.status
    fake = tmp_path / "fake.mp4"
    fake.write_text("nope")
    (_, last) = _last(runner.stream(str(fake), None, "What colour?"))
    assert "fake.mp4: cannot be read as a video" in last.status
    # and the runner still answers the next, good request
    (_, last) = _last(runner.stream(str(video_path), None, "What colour?"))
    assert last.answer == "green" and last.status.startswith("✅ answered")


# ----- one episode, streamed ----------------------------------------------------------------------
def test_episode_streams_thoughts_calls_images_and_answer(family_model_dir, video_path, tmp_path):
    """For each model family: the page shows what the agent did, and the tool's frames are what it saw."""
    runner = _runner(family_model_dir, [RESAMPLE, ANSWER], tmp_path)
    updates, last = _last(runner.stream(str(video_path), None, "What colour is shown at 1.5 s?",
                                        options="A. green\nB. red", max_turns=4))
    # first the question and the prompt's frames, then one update per turn, then the final one
    assert updates[0].messages == [{"role": "user", "content": "What colour is shown at 1.5 s?\n\n- A. green\n- B. red"}]
    n_prompt = runner.policy.media_budget.video_frames
    assert len(updates[0].gallery) == n_prompt
    assert len(updates) == 1 + 3 + 1  # start, (call, observation, answer), done
    titles = [title_of(m) for m in last.messages]
    assert titles == ["", "💭 Turn 1: thinking", "🔧 Turn 1: calls resample_frames",
                      "📎 resample_frames returned 2 images (obs:1 … obs:2)", "💭 Turn 2: thinking", "Answer: green"]
    assert last.messages[1]["content"].endswith("> Look again.")
    args = last.messages[2]["content"].split("```json\n", 1)[1].rsplit("\n```", 1)[0]
    assert json.loads(args) == {"start": 1.0, "end": 2.0, "num_frames": 2}
    captions = [c for _, c in last.gallery]
    assert captions[0].startswith("prompt frame · ") and len(captions) == n_prompt + 2
    assert captions[n_prompt:] == ["turn 1 · resample_frames · obs:1 · 1.25s", "turn 1 · resample_frames · obs:2 · 1.75s"]
    # the frame at 1.25 s of the clip is green (red, green, blue, yellow for a second each)
    # every gallery item is a PNG under the work folder, written once: the same image keeps its file across
    # updates (Gradio rewrote its cache copy of a PIL image on each update, under a browser's reads)
    path = Path(last.gallery[n_prompt][0])
    assert path.parent == tmp_path / "work" / "gallery" and path.suffix == ".png"
    assert [p for p, _ in updates[0].gallery] == [p for p, _ in last.gallery[:n_prompt]]
    assert not [f for f in path.parent.iterdir() if f.name.startswith(".")]  # no staging file left behind
    r, g, b = np.asarray(Image.open(path).convert("RGB"), dtype=float).reshape(-1, 3).mean(0)
    assert g > 150 and r < 80 and b < 80
    assert last.answer == "green" and "2 turns, 1 tool call" in last.status
    json_path, zip_path = last.files
    traj = Trajectory.from_dict(json.loads(open(json_path).read()), base_dir=tmp_path / "work" / "trajectories" /
                                json_path.split("/")[-2])
    assert traj.answer == "green" and [len(o.images) for o in traj.observations] == [2]
    with zipfile.ZipFile(zip_path) as zf:
        assert sorted(zf.namelist()) == ["images/turn01_img00.png", "images/turn01_img01.png", "trajectory.json"]


def test_failing_tools_show_in_the_page_and_the_episode_goes_on(tiny_model_dir, video_path, tmp_path):
    script = [BAD_ZOOM, format_tool_call("explode", {}), "<tool_call>{oops</tool_call>", ANSWER]
    runner = _runner(tiny_model_dir, script, tmp_path, tools=["resample_frames", "zoom", Explode()])
    _, last = _last(runner.stream(str(video_path), None, "What colour?", max_turns=6))
    titles = [title_of(m) for m in last.messages]
    assert "❌ zoom: error" in titles and "❌ explode: error" in titles
    assert "⚠️ Turn 3: not understood (malformed)" in titles
    assert titles[titles.index("⚠️ Turn 3: not understood (malformed)") + 1] == "↩️ the agent's reply to the model"
    texts = "\n".join(m["content"] for m in last.messages)
    assert "obs:99" in texts and "explode failed: RuntimeError: disk on fire" in texts
    assert last.answer == "green" and last.status.startswith("✅ answered")


def test_a_model_error_is_reported_and_the_app_keeps_serving(tiny_model_dir, video_path, tmp_path):
    calls = {"n": 0}

    def script(session, turn):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return ANSWER

    runner = _runner(tiny_model_dir, script, tmp_path)
    _, last = _last(runner.stream(str(video_path), None, "What colour?"))
    assert last.status == "❌ Error: the model failed: RuntimeError: CUDA out of memory (simulated)"
    _, last = _last(runner.stream(str(video_path), None, "What colour?"))
    assert last.answer == "green"


def test_closing_the_stream_stops_the_episode(tiny_model_dir, video_path, tmp_path):
    gate, turns = threading.Event(), []

    def script(session, turn):
        turns.append(turn)
        gate.wait(10)  # hold the turn until the visitor has left
        return RESAMPLE

    runner = _runner(tiny_model_dir, script, tmp_path)
    stream = runner.stream(str(video_path), None, "What colour?", max_turns=12)
    next(stream)  # the question is on the page; the worker is generating turn 1
    for _ in range(200):
        if turns:
            break
        time.sleep(0.05)
    stream.close()  # what Gradio does when the visitor presses Stop or leaves
    gate.set()
    assert runner._lock.acquire(timeout=30), "the worker did not stop"
    runner._lock.release()
    assert turns == [0]  # it finished the turn it was generating and went no further (12 were allowed)


def test_episode_view_of_a_budget_stop_without_answer(tiny_model_dir, video_path, tmp_path):
    runner = _runner(tiny_model_dir, [RESAMPLE] * 3, tmp_path)
    _, last = _last(runner.stream(str(video_path), None, "What colour?", max_turns=2))
    assert last.status.startswith("⚠️ stopped: turn limit reached") and last.answer == ""


def test_export_round_trips(tiny_model_dir, video_path, tmp_path):
    from mmagent import Agent

    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser([RESAMPLE, ANSWER]))
    traj = Agent(policy).run("What colour?", video=video_path).trajectory
    view = EpisodeView()
    for turn in traj.turns:
        view.add(turn)
    assert view.policy_turns == 2 and view.tool_calls == 1 and view.answer == "green"
    json_path, zip_path = export_trajectory(traj, tmp_path / "out")
    back = Trajectory.from_dict(json.loads(json_path.read_text()), base_dir=json_path.parent)
    assert back.token_ids == traj.token_ids and back.answer == "green"
    assert np.array_equal(np.asarray(back.observations[0].images[0]), np.asarray(traj.observations[0].images[0]))


def test_examples_are_toy_world_items_with_browser_playable_video(tmp_path):
    import av

    from mmagent.demo.examples import toy_examples
    from mmagent.media import open_video

    examples = toy_examples(tmp_path)
    assert [e.family for e in examples] == ["video_qa", "grounding", "image_qa", "geolocation"]
    video = examples[0]
    assert video.options.count("\n") == 3 and video.image is None
    with av.open(video.video) as c:
        assert c.streams.video[0].codec_context.name == "h264"
    original, playable = open_video(video.video.replace(".h264.mp4", ".mp4")), open_video(video.video)
    assert playable.duration == original.duration and playable.num_frames == original.num_frames
    times = [0.1, 17.3, 35.0, 59.9]
    for a, b in zip(original.frames_at(times), playable.frames_at(times)):
        assert a.timestamp == b.timestamp
        assert np.abs(np.asarray(a.image, float) - np.asarray(b.image, float)).mean() < 1.0


# ----- CLI ----------------------------------------------------------------------------------------
def test_demo_cli_errors(tmp_path, capsys):
    assert main(["demo", "--model", str(tmp_path / "nope")]) == 2
    assert "no model folder" in capsys.readouterr().err
    assert main(["demo", "--tools", "resample_frames,telepathy"]) == 2
    assert "unknown tool 'telepathy'" in capsys.readouterr().err
    assert main(["demo", "--max-video-seconds", "0"]) == 2
    assert "max_video_s must be positive" in capsys.readouterr().err


def test_mmagent_demo_serves_the_page_on_loopback(tmp_path):
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mmagent", "demo", "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, page = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert page is not None, f"the demo did not come up: {proc.poll()}"
        assert "mmagent demo" in page
        config = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=5).read())
        labels = [c.get("props", {}).get("label") for c in config["components"]]
        assert "Question" in labels and any(str(lab).startswith("Video (") for lab in labels)
        assert any("Toy-world examples" in str(lab) for lab in labels)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"127.0.0.1:{port}" in out


def test_model_text_cannot_inject_html_or_fetch_urls():
    from mmagent.trajectory import Turn

    view = EpisodeView()
    view.add(Turn(role="assistant", text='<think>see <img src=x onerror=alert(1)> and ![t](http://evil/x.png)</think>'
                                         '<answer>[a](http://evil) <b>B</b></answer>'))
    thought, answer = (m["content"] for m in view.messages)
    assert "<img" not in thought and "&lt;img src=x onerror=alert(1)&gt;" in thought
    assert "](http" not in thought and "](http" not in answer and "<b>" not in answer
    assert view.answer == "[a](http://evil) <b>B</b>"  # the answer itself is kept as the model wrote it
