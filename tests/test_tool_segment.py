"""The ``segment`` tool on a tiny random SAM of the real architecture, built in code (nothing is downloaded).

A random SAM's mask is arbitrary, so the tests check what can be checked exactly: the prompt reaching the
processor is the view->source mapped one, and the reported area, bounding box and IoU equal what the same
checkpoint gives when run here independently.
"""

from __future__ import annotations

import importlib
import math
import shutil
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (SamConfig, SamImageProcessor, SamMaskDecoderConfig, SamModel, SamProcessor,
                          SamPromptEncoderConfig, SamVisionConfig)

from mmagent import Agent
from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.toolbox import ToolError, create_tool

SAM_SIZE = 64


def _save_tiny_sam(path: Path) -> Path:
    torch.manual_seed(0)
    vision = SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2,
                             image_size=SAM_SIZE, patch_size=16, window_size=2, global_attn_indexes=[1],
                             num_pos_feats=8, mlp_dim=64)
    prompt = SamPromptEncoderConfig(hidden_size=16, image_size=SAM_SIZE, patch_size=16, mask_input_channels=8)
    decoder = SamMaskDecoderConfig(hidden_size=16, mlp_dim=32, num_hidden_layers=2, num_attention_heads=2,
                                   iou_head_hidden_dim=16)
    config = SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)
    SamModel(config).save_pretrained(path)
    image_processor = SamImageProcessor(size={"longest_edge": SAM_SIZE},
                                        pad_size={"height": SAM_SIZE, "width": SAM_SIZE},
                                        mask_size={"longest_edge": SAM_SIZE // 4},
                                        mask_pad_size={"height": SAM_SIZE // 4, "width": SAM_SIZE // 4})
    SamProcessor(image_processor=image_processor).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def seg() -> ModuleType:
    """``mmagent.toolbox.segment``, imported only once a test here runs.

    Importing it registers "segment", and ``mmagent.tiny`` trains the tiny checkpoints' tokenizer on the
    schemas of every registered tool: importing it at collection would change the session's tiny models
    (and the imprinted model's greedy behaviour) for the other test modules.
    """
    return importlib.import_module("mmagent.toolbox.segment")


@pytest.fixture(scope="module")
def sam_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny_sam(tmp_path_factory.mktemp("tiny-sam"))


@pytest.fixture(scope="module")
def tool(seg: ModuleType, sam_dir: Path):
    return seg.Segment(model_id=str(sam_dir), device="cpu")


def _image(w: int = 120, h: int = 80) -> Image.Image:
    rng = np.random.default_rng(0)
    arr = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    arr[h // 4: 3 * h // 4, w // 4: 3 * w // 4] = (200, 30, 30)
    return Image.fromarray(arr)


def _media(view: tuple[int, int] | None = (60, 40)) -> EpisodeMedia:
    media = EpisodeMedia(image=_image())
    if view is not None:
        media.set_view_size("image", view)
    return media


def _reference(sam_dir: Path, image: Image.Image, box=None, points=None, labels=None, binarize: bool = True):
    """Run the checkpoint directly (its own load, no tool code): best mask (or its logits) and its IoU."""
    model = SamModel.from_pretrained(str(sam_dir)).eval()
    processor = SamProcessor.from_pretrained(str(sam_dir))
    inputs = processor(images=image, input_boxes=[[box]] if box else None, input_points=[[points]] if points else None,
                       input_labels=[[labels]] if points else None, return_tensors="pt")
    with torch.no_grad():
        out = model(**{k: v for k, v in inputs.items() if k not in ("original_sizes", "reshaped_input_sizes")},
                    multimask_output=True)
    best = int(out.iou_scores[0, 0].argmax())
    masks = processor.post_process_masks(out.pred_masks, inputs["original_sizes"], inputs["reshaped_input_sizes"],
                                         binarize=binarize)
    return masks[0][0, best].numpy(), float(out.iou_scores[0, 0, best])


@pytest.fixture
def processor_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []
    original = SamProcessor.__call__

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SamProcessor, "__call__", spy)
    return calls


def test_coordinate_helpers(seg):
    assert seg.view_to_source([10, 5, 30, 20], (60, 40), (120, 80)) == [20, 10, 60, 40]
    assert seg.view_to_source([3, 4], (100, 50), (100, 50)) == [3, 4]
    assert seg.source_box_to_view((21, 11, 61, 41), (60, 40), (120, 80)) == [10, 5, 31, 21]
    assert seg.source_box_to_view((0, 0, 120, 80), (60, 40), (120, 80)) == [0, 0, 60, 40]
    mask = np.zeros((5, 7), bool)
    assert seg.mask_bbox(mask) is None
    mask[1:3, 2:6] = True
    assert seg.mask_bbox(mask) == (2, 1, 6, 3)


def test_box_and_points_match_an_independent_run(seg, tool, sam_dir, processor_calls):
    media = _media(view=(60, 40))
    args = {"source": "image", "box": [5, 5, 50, 35], "points": [[20, 20], [40, 10]], "labels": [1, 0]}
    obs = tool(args, media)
    # the prompt reached the processor in source pixels: the view is half the source's size
    (call,) = processor_calls
    assert call["input_boxes"] == [[[10.0, 10.0, 100.0, 70.0]]]
    assert call["input_points"] == [[[[40.0, 40.0], [80.0, 20.0]]]] and call["input_labels"] == [[[1, 0]]]

    mask, iou = _reference(sam_dir, media.image, [10, 10, 100, 70], [[40, 40], [80, 20]], [1, 0])
    area = int(mask.sum())
    assert 0 < area < 120 * 80  # the tiny random model gives a real, partial mask for this prompt
    ys, xs = np.nonzero(mask)
    bbox_view = [math.floor(xs.min() / 2), math.floor(ys.min() / 2),
                 math.ceil((xs.max() + 1) / 2), math.ceil((ys.max() + 1) / 2)]
    assert obs.data["area_px"] == area and obs.data["bbox_view"] == bbox_view
    assert obs.data["bbox_source"] == [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
    assert obs.data["iou"] == pytest.approx(iou, abs=1e-6)
    assert f"mask of {area} pixels ({100 * area / 9600:.1f}% of the 120x80 source)" in obs.text
    assert f"bounding box {bbox_view} in pixels of the view of image" in obs.text
    assert f"predicted IoU {iou:.2f}" in obs.text and "60x40 view" in obs.text and not obs.is_error

    # the overlay: the source's size, tinted inside the mask, untouched away from it
    (overlay,) = obs.images
    assert overlay.size == (120, 80) and obs.image_labels == [f"segment {bbox_view} of image"]
    src = np.asarray(media.image).astype(float)
    out = np.asarray(overlay).astype(float)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(mask, 2), (5, 5))
    inside, outside = windows.all(axis=(-1, -2)), ~windows.any(axis=(-1, -2))
    blend = (1 - seg.MASK_ALPHA) * src + seg.MASK_ALPHA * np.array(seg.MASK_COLOUR, float)
    assert np.abs(out[inside] - blend[inside]).max() <= 0.5 + 1e-6
    assert np.array_equal(out[outside], src[outside])
    assert (np.asarray(overlay)[~inside & ~outside] == seg.CONTOUR_COLOUR).all(axis=-1).any()


def test_the_bounding_box_is_reported_in_view_pixels(seg, sam_dir):
    # The random model's masks spread over the whole image; a higher logit threshold keeps a part of one,
    # so the box is not simply the image, and a 50x30 view makes the view->source ratios non-integer.
    media = _media(view=(50, 30))
    box_source = seg.view_to_source([10, 6, 40, 24], (50, 30), (120, 80))  # ~[24, 16, 96, 64], tested above
    logits, _ = _reference(sam_dir, media.image, box=box_source, binarize=False)
    threshold = float(np.quantile(logits, 0.97))
    mask = logits > threshold
    ys, xs = np.nonzero(mask)
    x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    assert (x1, y1, x2, y2) != (0, 0, 120, 80)
    sx, sy = 120 / 50, 80 / 30
    expected = [math.floor(x1 / sx), math.floor(y1 / sy), min(50, math.ceil(x2 / sx)), min(30, math.ceil(y2 / sy))]
    obs = seg.Segment(model_id=str(sam_dir), device="cpu", mask_threshold=threshold)({"box": [10, 6, 40, 24]}, media)
    assert obs.data["bbox_source"] == [x1, y1, x2, y2] and obs.data["bbox_view"] == expected
    assert obs.data["area_px"] == int(mask.sum()) and f"bounding box {expected} in pixels of the view" in obs.text


def test_points_alone_default_to_foreground_and_a_box_alone_works(tool, sam_dir, processor_calls):
    media = _media(view=None)  # the model saw the image at its own size
    obs = tool({"points": [[30, 60], [90, 20]]}, media)
    assert processor_calls[-1]["input_labels"] == [[[1, 1]]] and processor_calls[-1]["input_boxes"] is None
    mask, _ = _reference(sam_dir, media.image, points=[[30, 60], [90, 20]], labels=[1, 1])
    assert obs.data["area_px"] == int(mask.sum())

    obs = tool({"box": [-10, -10, 60, 50]}, media)  # partly outside the view: clamped, like zoom
    assert processor_calls[-1]["input_boxes"] == [[[0.0, 0.0, 60.0, 50.0]]]
    assert processor_calls[-1]["input_points"] is None
    mask, _ = _reference(sam_dir, media.image, box=[0, 0, 60, 50])
    assert obs.data["area_px"] == int(mask.sum()) and obs.data["source"] == "image"


def test_an_observation_image_is_a_valid_source(tool):
    media = _media(view=(60, 40))
    (handle,) = media.add_observation_images([_image(40, 30)])
    media.set_view_size(handle, (80, 60))
    obs = tool({"source": handle, "box": [0, 0, 80, 60]}, media)
    assert obs.images[0].size == (40, 30) and f"view of {handle}" in obs.text


@pytest.mark.parametrize("args, message", [
    ({"box": [1, 1, 10, 10], "source": "obs:3"}, "no image obs:3"),
    ({"box": [1, 1, 10, 10], "source": "frame@1.0"}, "no video"),
    ({"box": [1, 1, 10, 10], "source": "picture"}, "unknown image handle"),
    ({"box": [61, 41, 90, 70]}, "outside the 60x40 view"),
    ({"box": [10, 10, 10, 20]}, "x1 < x2"),
    ({"box": [30, 10, 20, 20]}, "x1 < x2"),
    ({"points": [[1, 1], [2, 2]], "labels": [1]}, "one entry per point"),
    ({"labels": [1]}, "labels were given without points"),
    ({}, "needs a prompt"),
    ({"source": "image"}, "needs a prompt"),
    ({"box": [1, 1, 10, 10], "mask": True}, "Additional properties"),
    ({"box": "1, 1, 10, 10"}, "box"),
    ({"box": [1, 1, 10]}, "box"),
    ({"box": [1, True, 10, 10]}, "box"),
    ({"points": [[1, "a"]]}, "points"),
    ({"points": [[1, 2, 3]]}, "points"),
    ({"points": []}, "points"),
    ({"points": [[1, 1]], "labels": [2]}, "labels"),
    ({"points": [[1, 1]], "labels": [0.5]}, "labels"),
    ({"box": [1, 1, 10, 10], "source": 5}, "source"),
    ({"points": [[i, i] for i in range(9)]}, "points"),
    ({"points": [[10, 10], [61, 5]]}, "outside the 60x40 view"),
    ({"points": [[-1, 5]]}, "outside the 60x40 view"),
    ({"box": [1, 1, float("nan"), 10]}, "finite"),
])
def test_bad_arguments_are_tool_errors(tool, args, message):
    with pytest.raises(ToolError, match=message):
        tool(args, _media(view=(60, 40)))


def test_arguments_must_be_an_object(tool):
    with pytest.raises(ToolError, match="JSON object"):
        tool([1, 2, 3], _media())


def test_an_empty_mask_is_reported_not_raised(seg, sam_dir):
    tool = seg.Segment(model_id=str(sam_dir), device="cpu", mask_threshold=1e9)
    obs = tool({"box": [5, 5, 50, 35]}, _media())
    assert not obs.is_error and obs.images == [] and "the mask is empty" in obs.text
    assert obs.data["area_px"] == 0 and obs.data["bbox_view"] is None


def test_the_overlay_is_bounded(seg, sam_dir):
    obs = seg.Segment(model_id=str(sam_dir), device="cpu", max_output_pixels=60 * 40)({"box": [5, 5, 50, 35]}, _media())
    assert obs.images[0].size == (60, 40)


def test_the_model_is_loaded_once_and_shared(seg, sam_dir, tmp_path, monkeypatch):
    copy = shutil.copytree(sam_dir, tmp_path / "sam-copy")  # a key no other test has loaded
    loads, real_load = [], seg.load_sam

    def counting_load(model_id, device):
        loads.append((model_id, device))
        return real_load(model_id, device)

    monkeypatch.setattr(seg, "load_sam", counting_load)
    first, second = seg.Segment(model_id=str(copy), device="cpu"), seg.Segment(model_id=str(copy), device="cpu")
    a = first({"box": [5, 5, 50, 35]}, _media())
    b = second({"box": [5, 5, 50, 35]}, _media())
    assert loads == [(str(copy), "cpu")]
    assert first.model()[0] is second.model()[0] and first.model()[1] is second.model()[1]
    assert a.data == b.data


def test_a_model_that_cannot_be_loaded_is_a_readable_tool_error(seg, tmp_path, monkeypatch):
    missing = str(tmp_path / "no-such-sam")
    with pytest.raises(ToolError, match="no-such-sam.*local folder"):
        seg.Segment(model_id=missing, device="cpu")({"box": [5, 5, 50, 35]}, _media())
    empty = tmp_path / "empty-sam"
    empty.mkdir()
    tool = seg.Segment(model_id=str(empty), device="cpu")
    with pytest.raises(ToolError, match=r"could not load the segmentation model .*empty-sam.*model_id="):
        tool({"box": [5, 5, 50, 35]}, _media())
    # a second call fails at once, without trying to load again
    monkeypatch.setattr(seg, "load_sam", lambda *a: pytest.fail("loaded twice"))
    with pytest.raises(ToolError, match="could not load"):
        tool({"box": [5, 5, 50, 35]}, _media())


def test_registered_and_schema(seg, sam_dir):
    tool = create_tool("segment", model_id=str(sam_dir), device="cpu")
    assert isinstance(tool, seg.Segment)
    fn = tool.schema()["function"]
    assert fn["name"] == "segment" and set(fn["parameters"]["properties"]) == {"source", "box", "points", "labels"}
    assert seg.Segment().model_id == "facebook/sam-vit-base"  # constructing loads nothing


def test_segment_through_the_agent_loop(seg, tiny_model_dir, sam_dir):
    image = _image(200, 100)
    call = format_tool_call("segment", {"source": "image", "box": [0, 0, 20, 20], "points": [[10, 10]]})
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu",
                                      chooser=ReplayChooser([call, "<answer>cat</answer>"]))
    agent = Agent(policy, tools=["zoom", seg.Segment(model_id=str(sam_dir), device="cpu")])
    result = agent.run("q", image=image)
    traj = result.trajectory
    assert result.answer == "cat" and traj.stop_reason == "answer"
    assert [c.name for c in traj.tool_calls] == ["segment"]
    (obs,) = traj.observations
    assert not obs.is_error, obs.text
    assert obs.text.startswith("Segmented image") and len(obs.images) == 1 and obs.images[0].size == (200, 100)
    assert obs.handles == ["obs:1"]
    view_w, view_h = traj.info["image_view_size"]
    assert f"{view_w}x{view_h} view" in obs.text
