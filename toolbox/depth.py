"""``depth``: estimate how near or far things are in an image the model saw, with a monocular depth model.

The model (Depth Anything V2 Small by default, through ``transformers``' ``AutoModelForDepthEstimation``)
is loaded on the first call and shared by every tool instance in the process (``mmagent.toolbox.model_cache``).
The tool returns a colourised depth map of the source image and, for each point or box asked for (in
pixels of the view the model was shown), a nearness value normalised to 0..1 over the image:
1 is the nearest thing in the image, 0 the farthest. Values are relative, never metres, unless the
model is a metric one.
"""

from __future__ import annotations

import math
import os
from typing import Any

import cv2
import numpy as np
from PIL import Image

from mmagent.toolbox.base import Observation, Tool, ToolContext, ToolError
from mmagent.toolbox.model_cache import default_device, shared_model
from mmagent.toolbox.registry import register

DEFAULT_MODEL_ID = "depth-anything/Depth-Anything-V2-Small-hf"
MAX_POINTS = 16
MAX_BOXES = 16
#: the depth map (and the returned image) is computed at the source size, scaled down to fit this
MAX_MAP_PIXELS = 2048 * 2048


def load_depth_model(model_id: str, device: str) -> tuple[Any, Any]:
    """Load ``(image_processor, model)`` for ``model_id`` (a hub id or a local folder) onto ``device``."""
    from transformers import AutoImageProcessor, AutoModelForDepthEstimation

    processor = AutoImageProcessor.from_pretrained(model_id)
    model = AutoModelForDepthEstimation.from_pretrained(model_id).to(device).eval()
    return processor, model


def map_size(width: int, height: int, max_pixels: int = MAX_MAP_PIXELS) -> tuple[int, int]:
    """(width, height) of the depth map for a ``width`` x ``height`` source: the same, or scaled to fit."""
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    return max(1, round(width * scale)), max(1, round(height * scale))


def normalise_nearness(depth: np.ndarray, larger_is_nearer: bool) -> np.ndarray:
    """Rescale a depth map to 0..1 with 1 = nearest; a flat map becomes all zeros."""
    near = depth if larger_is_nearer else -depth
    lo, hi = float(near.min()), float(near.max())
    if not hi > lo:
        return np.zeros(depth.shape, dtype=np.float32)
    return ((near - lo) / (hi - lo)).astype(np.float32)


def colourise(nearness: np.ndarray) -> Image.Image:
    """An RGB image of a 0..1 nearness map: bright yellow = near, dark purple = far (inferno)."""
    grey = np.clip(np.rint(nearness * 255.0), 0, 255).astype(np.uint8)
    bgr = cv2.applyColorMap(grey, cv2.COLORMAP_INFERNO)
    return Image.fromarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


@register
class Depth(Tool):
    name = "depth"
    description = (
        "Estimate relative depth (how near or far things are) in an image: source is 'image', a video frame "
        "'frame@<seconds>' or an earlier tool image 'obs:<n>'. Returns a colour depth map (bright = near, "
        "dark = far) and, for each of the optional points [x, y] and boxes [x1, y1, x2, y2] (pixels of the "
        "image as you were shown it), a nearness from 0 (farthest in the image) to 1 (nearest)."
    )
    # the first call loads the model
    timeout_s = 120.0

    def __init__(self, model_id: str = DEFAULT_MODEL_ID, device: str | None = None,
                 max_map_pixels: int = MAX_MAP_PIXELS) -> None:
        self.model_id = str(model_id)
        self.device = device or default_device()
        self.max_map_pixels = max_map_pixels
        self._load_error: ToolError | None = None
        self.parameters = {
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "'image' (default), 'frame@<seconds>' or 'obs:<n>'"},
                "points": {
                    "type": "array", "maxItems": MAX_POINTS,
                    "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                    "description": f"up to {MAX_POINTS} points [x, y] in pixels of the view you were shown",
                },
                "boxes": {
                    "type": "array", "maxItems": MAX_BOXES,
                    "items": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4},
                    "description": f"up to {MAX_BOXES} boxes [x1, y1, x2, y2] in pixels of the view you were shown",
                },
            },
            "required": [],
        }

    def load(self) -> tuple[Any, Any]:
        """The shared ``(image_processor, model)``, loaded on first use; ToolError if it cannot be loaded."""
        # A failed load is remembered so that later calls do not each wait on an unreachable hub again.
        if self._load_error is not None:
            raise self._load_error
        try:
            return shared_model((self.model_id, self.device), lambda: load_depth_model(self.model_id, self.device))
        except Exception as exc:
            where = "local folder" if os.path.isdir(self.model_id) else "model"
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            self._load_error = ToolError(
                f"the depth tool cannot load its {where} {self.model_id!r} ({type(exc).__name__}: {reason}). "
                "Without access to the Hugging Face hub, download the checkpoint (by default "
                f"{DEFAULT_MODEL_ID}) elsewhere and give its local folder: Depth(model_id='/path/to/folder') or create_tool('depth', model_id='/path/to/folder')."
            )
            raise self._load_error from None

    def depth_map(self, image: Image.Image) -> tuple[np.ndarray, bool]:
        """The model's raw depth map at the source size (scaled to fit ``max_map_pixels``) and whether
        larger values mean nearer (relative inverse depth) rather than farther (metric depth)."""
        import torch

        processor, model = self.load()
        w, h = map_size(image.width, image.height, self.max_map_pixels)
        inputs = processor(images=image.convert("RGB"), return_tensors="pt").to(self.device)
        with torch.inference_mode():
            outputs = model(**inputs)
        depth = processor.post_process_depth_estimation(outputs, target_sizes=[(h, w)])[0]["predicted_depth"]
        larger_is_nearer = getattr(model.config, "depth_estimation_type", "relative") != "metric"
        return depth.float().cpu().numpy().reshape(h, w), larger_is_nearer

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        source = arguments.get("source", "image")
        image = context.resolve_image(source)
        view_w, view_h = context.view_size(source)
        points = [[float(v) for v in p] for p in arguments.get("points", [])]
        boxes = [[float(v) for v in b] for b in arguments.get("boxes", [])]
        # Check every argument before running the model, so a bad call costs nothing.
        for p in points:
            if not all(math.isfinite(v) for v in p):
                raise ToolError(f"point {p} must hold finite numbers")
            if not (0 <= p[0] <= view_w and 0 <= p[1] <= view_h):
                raise ToolError(f"point {_fmt(p)} lies outside the {view_w}x{view_h} view of {source} "
                                f"(x must be in 0..{view_w}, y in 0..{view_h})")
        for b in boxes:
            if not all(math.isfinite(v) for v in b):
                raise ToolError(f"box {b} must hold finite numbers")
            if b[2] <= b[0] or b[3] <= b[1]:
                raise ToolError(f"box {_fmt(b)} must have x1 < x2 and y1 < y2")
            if b[2] <= 0 or b[3] <= 0 or b[0] >= view_w or b[1] >= view_h:
                raise ToolError(f"box {_fmt(b)} lies outside the {view_w}x{view_h} view of {source}")

        raw, larger_is_nearer = self.depth_map(image)
        nearness = normalise_nearness(raw, larger_is_nearer)
        map_h, map_w = nearness.shape
        sx, sy = map_w / view_w, map_h / view_h

        lines, point_data, box_data = [], [], []
        for p in points:
            col = min(int(p[0] * sx), map_w - 1)
            row = min(int(p[1] * sy), map_h - 1)
            value = float(nearness[row, col])
            point_data.append({"point": p, "nearness": value})
            lines.append(f"point {_fmt(p)}: nearness {value:.3f}")
        for b in boxes:
            # Boxes that stick out of the view are clipped to it (as zoom does); the clipped box is echoed.
            x1, y1, x2, y2 = max(b[0], 0.0), max(b[1], 0.0), min(b[2], float(view_w)), min(b[3], float(view_h))
            c1, r1 = min(int(x1 * sx), map_w - 1), min(int(y1 * sy), map_h - 1)
            c2, r2 = max(math.ceil(x2 * sx), c1 + 1), max(math.ceil(y2 * sy), r1 + 1)
            value = float(np.median(nearness[r1:r2, c1:c2]))
            used = [x1, y1, x2, y2]
            box_data.append({"box": used, "nearness": value})
            clipped = f" (clipped from {_fmt(b)})" if used != b else ""
            lines.append(f"box {_fmt(used)}{clipped}: median nearness {value:.3f}")

        if larger_is_nearer:
            convention = ("The depth model predicts relative inverse depth (larger = nearer), not metres; "
                          "nearness below is that depth normalised over this image: 1 = nearest, 0 = farthest")
        else:
            convention = ("The depth model predicts metric depth (larger = farther); nearness below is that "
                          "depth inverted and normalised over this image: 1 = nearest, 0 = farthest")
        size = f"source {image.width}x{image.height} pixels"
        if (map_w, map_h) != (image.width, image.height):
            size += f", depth map {map_w}x{map_h}"
        text = (f"Depth of {source} ({size}; points and boxes are in pixels of the {view_w}x{view_h} view you "
                f"saw). {convention}. The image is the depth map: bright yellow = near, dark purple = far.")
        if not float(nearness.max()) > 0:
            text += " The predicted depth is flat: the model sees no depth differences in this image."
        if lines:
            text += "\n" + "\n".join(lines)
        data = {"source": source, "source_size": [image.width, image.height], "view_size": [view_w, view_h],
                "map_size": [map_w, map_h], "model_id": self.model_id, "larger_is_nearer": larger_is_nearer,
                "points": point_data, "boxes": box_data}
        return Observation(text=text, images=[colourise(nearness)], image_labels=[f"depth map of {source}"],
                           data=data)
