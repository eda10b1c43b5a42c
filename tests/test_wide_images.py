"""Images of any aspect ratio: fitted within the budget with a minimum side (and a note when squeezed), or
refused up front; through the renderer, the agent, the CLI and the demo (whose gallery gets browser-sized copies)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent import Agent, Budgets
from mmagent.cli import main
from mmagent.demo.app import DemoRunner
from mmagent.demo.display import DISPLAY_MAX_SIDE, display_image
from mmagent.demo.uploads import UploadError, UploadLimits, check_image
from mmagent.media import MediaError
from mmagent.policy.hf import HFPolicy
from mmagent.policy.render import PATCH_FACTOR, MediaBudget, Renderer, fitted_size, squeeze_note
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call

#: a small budget (the toy world's 168x168 view), so the long, thin images must be squeezed
SMALL = MediaBudget(image_max_pixels=168 * 168, observation_max_pixels=224 * 224)
SIZES = [(20000, 200), (200, 20000), (1, 150), (150, 1)]
ANSWER = "<answer>A</answer>"


def _png(folder: Path, size: tuple[int, int]) -> Path:
    """A valid PNG of ``size``: a gradient along the long side (compresses well, like a scanned strip)."""
    w, h = size
    ramp = (np.arange(max(w, h)) % 256).astype(np.uint8)
    arr = np.broadcast_to(ramp[None, :, None] if w >= h else ramp[:, None, None], (h, w, 3)).copy()
    path = folder / f"strip-{w}x{h}.png"
    Image.fromarray(arr).save(path)
    return path


@pytest.mark.parametrize("size", SIZES + [(20000, 100), (1344, 1344), (640, 480)])
@pytest.mark.parametrize("bounds", [(3136, 168 * 168), (3136, 1024 * 28 * 28)])
def test_every_fitted_size_is_whole_tokens_within_the_budget(size, bounds):
    w, h = fitted_size(*size, *bounds)
    assert w % PATCH_FACTOR == 0 and h % PATCH_FACTOR == 0 and min(w, h) >= PATCH_FACTOR
    assert w * h <= max(bounds[1], PATCH_FACTOR ** 2) and max(w, h) / min(w, h) <= 200
    assert (w >= h) == (size[0] >= size[1])  # the long side stays the long side


def test_squeezed_images_get_a_note_and_ordinary_ones_do_not():
    assert fitted_size(20000, 200, 3136, 168 * 168) == (1008, 28)
    assert "20000x200 image is shown at 1008x28, squeezed" in squeeze_note((20000, 200), (1008, 28))
    assert squeeze_note((640, 480), fitted_size(640, 480, 3136, 168 * 168)) is None
    assert squeeze_note((20000, 200), fitted_size(20000, 200, 3136, 1024 * 28 * 28)) is None  # room enough


def _agent(model_dir, script, tools=("zoom",)) -> Agent:
    policy = HFPolicy.from_pretrained(str(model_dir), device="cpu", chooser=ReplayChooser(script), media_budget=SMALL)
    return Agent(policy, tools=list(tools), budgets=Budgets(max_turns=3, max_new_tokens=48))


def test_the_agent_answers_any_aspect_ratio_and_notes_the_squeeze(tiny_model_dir, tmp_path):
    zoom = format_tool_call("zoom", {"bbox": [0, 0, 1008, 28]})
    agent = _agent(tiny_model_dir, [zoom, ANSWER])  # each episode replays the script from its start
    wide = agent.run("What does the strip say?", image=_png(tmp_path, (20000, 200)), options=["A. 1", "B. 2"])
    traj = wide.trajectory
    assert traj.stop_reason == "answer" and wide.answer == "A" and not traj.info.get("error")
    assert traj.info["image_view_size"] == [1008, 28]
    assert "squeezed along its long side" in traj.info["view_notes"][0]
    assert traj.observations[0].images and not traj.observations[0].is_error  # the zoom worked on the view
    for size in SIZES[1:]:
        result = agent.run("What is it?", image=_png(tmp_path, size))
        assert result.trajectory.stop_reason == "answer" and result.answer == "A", size
        assert not result.trajectory.info.get("error"), size


def test_too_thin_images_are_refused_up_front_with_the_reason(tiny_model_dir, tmp_path):
    agent = _agent(tiny_model_dir, [ANSWER])
    with pytest.raises(MediaError, match="1x300 is more than 200 times longer on one side"):
        agent.run("What is it?", image=_png(tmp_path, (1, 300)))


def test_mmagent_run_answers_a_20000x200_png_and_refuses_a_needle(tiny_model_dir, tmp_path, capsys):
    for size in [(20000, 200), (200, 20000)]:
        path = _png(tmp_path, size)
        assert path.stat().st_size < 20 * 2 ** 20
        code = main(["run", "--model", str(tiny_model_dir), "--image", str(path), "--device", "cpu", "--tools", "zoom",
                     "--max-turns", "1", "--max-new-tokens", "4", "What is it?"])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert "height and width must be > 0" not in out.err and "[stop:" in out.out
    code = main(["run", "--model", str(tiny_model_dir), "--image", str(_png(tmp_path, (300, 1))), "--device", "cpu",
                 "What is it?"])
    err = capsys.readouterr().err
    assert code == 2 and "300x1 is more than 200 times longer on one side" in err
    assert err.count("\n") == 1 and "Loading weights" not in err  # one line, before the model loads


def test_display_copies_fit_the_browser():
    wide = Image.new("RGB", (20000, 200))
    shown = display_image(wide)
    assert shown.size == (DISPLAY_MAX_SIDE, 20)
    shown.save(io.BytesIO(), "WEBP")  # what Gradio's gallery encodes; the original is over WebP's 16383 px
    assert display_image(Image.new("RGB", (1, 150))).size == (1, 150)
    assert display_image(Image.new("RGB", (40000, 20))).size == (DISPLAY_MAX_SIDE, 1)


def test_the_demo_answers_wide_images_with_a_gallery_the_browser_takes(tiny_model_dir, tmp_path):
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu",
                                      chooser=ReplayChooser([format_tool_call("zoom", {"bbox": [0, 0, 1008, 28]}),
                                                             ANSWER]), media_budget=SMALL)
    runner = DemoRunner(policy, ["zoom"], tmp_path / "work")
    for size in SIZES:
        path = _png(tmp_path, size)
        assert check_image(path, UploadLimits()) == size
        last = list(runner.stream(None, str(path), "What is it?", options="A. 1\nB. 2", max_turns=3))[-1]
        assert last.status.startswith("✅ answered"), last.status
        assert last.gallery[0][1] == "question image"  # then the zoom's crop, where the zoom could crop
        for file, _ in last.gallery:  # PNG files the page serves as they are
            with Image.open(file) as image:
                image.load()
                assert image.format == "PNG" and max(image.size) <= DISPLAY_MAX_SIDE and min(image.size) >= 1
    with pytest.raises(UploadError, match=r"^strip-1x300.png: 1x300 is more than 200 times longer"):
        check_image(_png(tmp_path, (1, 300)), UploadLimits())


def test_a_renderer_observation_notes_a_squeezed_tool_image():
    from mmagent.toolbox import Observation

    view = Renderer(SMALL).observation(Observation(text="crop", images=[Image.new("RGB", (6000, 30))]))
    assert view.notes and "6000x30 image is shown at" in view.notes[0] and view.notes[0] in view.text()
