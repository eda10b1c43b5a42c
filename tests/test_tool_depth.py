"""The depth tool on a tiny random Depth Anything (the real architecture and processor), built in code.

Values are checked against a depth map computed here directly with transformers, so the tool's
normalisation, view -> source mapping and medians are asserted as numbers, not just as "in range".
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (AutoImageProcessor, AutoModelForDepthEstimation, DepthAnythingConfig,
                          DepthAnythingForDepthEstimation, Dinov2Config, DPTImageProcessor)

import mmagent.toolbox.depth as depth_module
from mmagent import Agent
from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.toolbox import ToolError
from mmagent.toolbox.depth import Depth, normalise_nearness


@pytest.fixture(scope="module")
def depth_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Depth Anything (DINOv2 backbone 32 wide) with the hub checkpoint's processor class."""
    path = tmp_path_factory.mktemp("tiny-depth-anything")
    torch.manual_seed(0)
    # A wider init than the default 0.02 keeps the random head's ReLU output from being nearly flat.
    backbone = Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, out_indices=[1, 2], reshape_hidden_states=False,
                            initializer_range=0.2)
    config = DepthAnythingConfig(backbone_config=backbone, reassemble_hidden_size=32, reassemble_factors=[2, 1],
                                 neck_hidden_sizes=[16, 32], fusion_hidden_size=16, head_hidden_size=8,
                                 initializer_range=0.2)
    DepthAnythingForDepthEstimation(config).eval().save_pretrained(path)
    # As in depth-anything/Depth-Anything-V2-Small-hf, with 56 instead of 518.
    DPTImageProcessor(size={"height": 56, "width": 56}, keep_aspect_ratio=True, ensure_multiple_of=14, resample=3,
                      do_normalize=True, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
                      ).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tool(depth_model_dir: Path) -> Depth:
    return Depth(model_id=str(depth_model_dir), device="cpu")


def scene(width: int = 90, height: int = 60) -> Image.Image:
    """A deterministic picture with structure: gradients plus a bright block."""
    y, x = np.mgrid[0:height, 0:width]
    arr = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], -1).astype(np.uint8)
    arr[height // 4: height // 2, width // 2: width * 3 // 4] = 255
    return Image.fromarray(arr)


@functools.cache
def _reference_model(model_dir: Path) -> tuple:
    return AutoImageProcessor.from_pretrained(model_dir), AutoModelForDepthEstimation.from_pretrained(model_dir).eval()


def reference_nearness(model_dir: Path, image: Image.Image, size: tuple[int, int] | None = None) -> np.ndarray:
    """Depth computed here straight from transformers, normalised by hand: 1 = largest output = nearest."""
    processor, model = _reference_model(model_dir)
    w, h = size or image.size
    with torch.no_grad():
        out = model(**processor(images=image, return_tensors="pt"))
    d = processor.post_process_depth_estimation(out, target_sizes=[(h, w)])[0]["predicted_depth"].numpy()
    return (d - d.min()) / (d.max() - d.min())


def test_observation_image_text_and_values(tool, depth_model_dir):
    image = scene()
    ref = reference_nearness(depth_model_dir, image)
    assert ref.std() > 0.05  # the tiny model's map has real structure, so the checks below mean something
    obs = tool({"source": "image", "points": [[10, 20], [89, 59], [90, 60]], "boxes": [[0, 0, 45, 30]]},
               EpisodeMedia(image=image))
    assert not obs.is_error and len(obs.images) == 1 and obs.image_labels == ["depth map of image"]
    assert obs.images[0].size == (90, 60) and obs.images[0].mode == "RGB"
    expected_rgb = cv2.cvtColor(cv2.applyColorMap(np.rint(ref * 255).astype(np.uint8), cv2.COLORMAP_INFERNO),
                                cv2.COLOR_BGR2RGB)
    assert np.abs(np.asarray(obs.images[0]).astype(int) - expected_rgb).max() <= 1
    text = obs.text
    assert "Depth of image" in text and "90x60" in text
    assert "relative inverse depth (larger = nearer)" in text and "1 = nearest, 0 = farthest" in text
    values = [p["nearness"] for p in obs.data["points"]] + [b["nearness"] for b in obs.data["boxes"]]
    assert all(0.0 <= v <= 1.0 for v in values)
    # the view is the source here; the right/bottom edge (90, 60) is the last pixel
    assert values[:3] == pytest.approx([ref[20, 10], ref[59, 89], ref[59, 89]], abs=1e-5)
    assert values[3] == pytest.approx(float(np.median(ref[0:30, 0:45])), abs=1e-5)
    assert f"point [10, 20]: nearness {values[0]:.3f}" in text
    assert f"box [0, 0, 45, 30]: median nearness {values[3]:.3f}" in text


def test_points_and_boxes_are_in_view_pixels(tool, depth_model_dir):
    image = scene(120, 90)
    ref = reference_nearness(depth_model_dir, image)
    media = EpisodeMedia(image=image)
    media.set_view_size("image", (40, 30))  # the model saw the image at a third of its size
    obs = tool({"points": [[5, 10], [39.9, 29.9]], "boxes": [[2, 3, 12.5, 20], [30, 20, 50, 40]]}, media)
    assert obs.images[0].size == (120, 90)
    assert "source 120x90 pixels" in obs.text and "40x30 view" in obs.text
    assert [p["point"] for p in obs.data["points"]] == [[5, 10], [39.9, 29.9]]
    assert [p["nearness"] for p in obs.data["points"]] == pytest.approx([ref[30, 15], ref[89, 119]], abs=1e-5)
    first, clipped = obs.data["boxes"]
    assert first["nearness"] == pytest.approx(float(np.median(ref[9:60, 6:38])), abs=1e-5)
    # a box sticking out of the view is clipped to it, and the text says so
    assert clipped["box"] == [30, 20, 40, 30]
    assert clipped["nearness"] == pytest.approx(float(np.median(ref[60:90, 90:120])), abs=1e-5)
    assert "box [30, 20, 40, 30] (clipped from [30, 20, 50, 40])" in obs.text


def test_frames_and_tool_images_as_sources(tool, video_path):
    media = EpisodeMedia(video=video_path)
    obs = tool({"source": "frame@1.5"}, media)
    assert obs.images[0].size == (96, 64) and "Depth of frame@1.5" in obs.text
    media.add_observation_images([scene(50, 40).convert("L")])
    obs = tool({"source": "obs:1", "points": [[0, 0]]}, media)
    assert obs.images[0].size == (50, 40) and "Depth of obs:1" in obs.text and len(obs.data["points"]) == 1


def test_large_sources_get_a_bounded_map(depth_model_dir):
    image = scene(90, 60)
    small = Depth(model_id=str(depth_model_dir), device="cpu", max_map_pixels=30 * 20)
    ref = reference_nearness(depth_model_dir, image, size=(30, 20))
    obs = small({"points": [[45, 30]]}, EpisodeMedia(image=image))
    assert obs.images[0].size == (30, 20) and "depth map 30x20" in obs.text
    assert obs.data["points"][0]["nearness"] == pytest.approx(float(ref[10, 15]), abs=1e-5)


@pytest.mark.parametrize("arguments, message", [
    ({"source": "picture"}, "unknown image handle"),
    ({"source": "obs:2"}, "no image obs:2"),
    ({"source": "frame@1.0"}, "no video"),
    ({"source": 3}, "invalid arguments for depth: source"),
    ({"points": [[91, 10]]}, "outside the 90x60 view"),
    ({"points": [[5, -1]]}, "outside the 90x60 view"),
    ({"points": [[1]]}, "invalid arguments for depth: points.0"),
    ({"points": [["a", 2]]}, "invalid arguments for depth: points.0.0"),
    ({"points": [[True, 2]]}, "invalid arguments for depth: points.0.0"),
    ({"points": "10,20"}, "invalid arguments for depth: points"),
    ({"points": [[float("nan"), 1]]}, "finite"),
    ({"points": [[1, 1]] * 17}, "is too long"),
    ({"boxes": [[0, 0, 1, 1]] * 17}, "is too long"),
    ({"boxes": [[10, 10, 10, 20]]}, "x1 < x2 and y1 < y2"),
    ({"boxes": [[20, 10, 10, 30]]}, "x1 < x2 and y1 < y2"),
    ({"boxes": [[1, 2, 3]]}, "invalid arguments for depth: boxes.0"),
    ({"boxes": [[95, 65, 120, 80]]}, "outside the 90x60 view"),
    ({"bbox": [0, 0, 1, 1]}, "Additional properties are not allowed"),
    ("image", "must be a JSON object"),
])
def test_bad_arguments_are_tool_errors(tool, arguments, message):
    with pytest.raises(ToolError, match=message.replace("[", r"\[")):
        tool(arguments, EpisodeMedia(image=scene()))


def test_model_is_loaded_once_and_shared(depth_model_dir, tmp_path, monkeypatch):
    # a copy of the checkpoint under a new path is a cache key no other test has loaded
    model_dir = shutil.copytree(depth_model_dir, tmp_path / "copy")
    loads = []

    def counting_load(model_id, device):
        loads.append((model_id, device))
        return load_depth_model(model_id, device)

    load_depth_model = depth_module.load_depth_model
    monkeypatch.setattr(depth_module, "load_depth_model", counting_load)
    first, second = Depth(model_id=str(model_dir), device="cpu"), Depth(model_id=str(model_dir), device="cpu")
    media = EpisodeMedia(image=scene())
    a, b = first({"points": [[3, 4]]}, media), second({"points": [[3, 4]]}, media)
    first({}, media)
    assert loads == [(str(model_dir), "cpu")]
    assert first.load()[1] is second.load()[1]
    assert a.data["points"] == b.data["points"]


def test_a_model_that_cannot_be_loaded_is_a_tool_error(tmp_path, monkeypatch):
    missing = Depth(model_id=str(tmp_path / "no-such-model"), device="cpu")
    with pytest.raises(ToolError, match="no-such-model") as info:
        missing({}, EpisodeMedia(image=scene()))
    assert "Depth(model_id='/path/to/folder')" in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ToolError, match="cannot load its local folder"):
        Depth(model_id=str(tmp_path / "empty"), device="cpu")({}, EpisodeMedia(image=scene()))
    # the failure is remembered: the next call does not try to load again
    monkeypatch.setattr(depth_module, "load_depth_model", lambda *a: pytest.fail("loaded again"))
    with pytest.raises(ToolError, match="no-such-model"):
        missing({}, EpisodeMedia(image=scene()))


def test_normalisation_direction_and_flat_maps():
    d = np.array([[1.0, 2.0], [3.0, 5.0]])
    assert normalise_nearness(d, larger_is_nearer=True).tolist() == [[0.0, 0.25], [0.5, 1.0]]
    assert normalise_nearness(d, larger_is_nearer=False).tolist() == [[1.0, 0.75], [0.5, 0.0]]
    assert not normalise_nearness(np.full((3, 3), 7.0), larger_is_nearer=True).any()


def test_depth_in_the_agent_loop(tiny_model_dir, depth_model_dir):
    call = format_tool_call("depth", {"source": "image", "points": [[10, 20]], "boxes": [[0, 0, 45, 30]]})
    bad = format_tool_call("depth", {"points": [[1000, 1000]]})
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu",
                                      chooser=ReplayChooser([call, bad, "<answer>near</answer>"]))
    agent = Agent(policy, tools=["zoom", Depth(model_id=str(depth_model_dir), device="cpu")])
    image = scene(200, 100)
    traj = agent.run("Is the block near?", image=image).trajectory
    assert traj.answer == "near" and traj.stop_reason == "answer"
    obs, error = traj.observations[0], traj.observations[1]
    assert len(obs.images) == 1 and obs.images[0].size == (200, 100) and obs.handles == ["obs:1"]
    assert not obs.is_error and "1 = nearest" in obs.text and 0 <= obs.data["points"][0]["nearness"] <= 1
    # the model saw the image resized; the tool answered in the pixels of that view
    view_w, view_h = traj.info["image_view_size"]
    assert f"{view_w}x{view_h} view" in obs.text
    assert error.is_error and "outside the" in error.text and traj.turns[3].error == "tool_error"
