"""``segment``: cut out the object under a box and/or a few clicked points with a promptable segmenter.

The prompt is given in the pixels of the view the model was shown (like ``zoom``): a box
``[x1, y1, x2, y2]`` and/or up to ``max_points`` points ``[x, y]`` with labels (1 = on the object,
0 = not on it). It is mapped back to the source's own pixels and run through SAM (``SamModel`` +
``SamProcessor`` from transformers, ``facebook/sam-vit-base`` unless another hub id or local folder is
given). SAM proposes three masks; the one with the highest predicted IoU is kept, brought back to the
source resolution and shown overlaid on the source. The text reports the mask's area and its bounding
box in view pixels, so the model can ``zoom`` into it next.

The model is loaded on first use, once per process and (model id, device), and shared by every tool
instance through :func:`mmagent.toolbox.model_cache.shared_model`; importing this module does not import torch.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageFilter

from mmagent.toolbox.base import Observation, Tool, ToolContext, ToolError, clip_view_box
from mmagent.toolbox.model_cache import default_device, shared_model
from mmagent.toolbox.registry import register

DEFAULT_MODEL_ID = "facebook/sam-vit-base"
MASK_COLOUR = (30, 144, 255)
CONTOUR_COLOUR = (255, 255, 0)
MASK_ALPHA = 0.5
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def view_to_source(coords: Sequence[float], view_size: tuple[int, int],
                   source_size: tuple[int, int]) -> list[float]:
    """Scale flat ``[x, y, x, y, ...]`` coordinates from view pixels to source pixels (sizes are (w, h))."""
    sx, sy = source_size[0] / view_size[0], source_size[1] / view_size[1]
    return [float(v) * (sx if i % 2 == 0 else sy) for i, v in enumerate(coords)]


def mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """Tight ``(x1, y1, x2, y2)`` box of a boolean (H, W) mask, exclusive at x2/y2; ``None`` if empty."""
    ys = np.flatnonzero(mask.any(axis=1))
    xs = np.flatnonzero(mask.any(axis=0))
    if ys.size == 0:
        return None
    return int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1


def source_box_to_view(box: Sequence[int], view_size: tuple[int, int],
                       source_size: tuple[int, int]) -> list[int]:
    """Map a source-pixel box to the smallest whole-pixel view box that covers it, kept inside the view."""
    sx, sy = source_size[0] / view_size[0], source_size[1] / view_size[1]
    x1, y1, x2, y2 = box
    return [max(0, math.floor(x1 / sx)), max(0, math.floor(y1 / sy)),
            min(view_size[0], math.ceil(x2 / sx)), min(view_size[1], math.ceil(y2 / sy))]


def overlay_mask(image: Image.Image, mask: np.ndarray, max_pixels: int) -> Image.Image:
    """``image`` with ``mask`` tinted and outlined, scaled down to at most ``max_pixels`` pixels."""
    image = image.convert("RGB")
    w, h = image.size
    mask_im = Image.fromarray(mask.astype(np.uint8) * 255)
    if w * h > max_pixels:
        scale = math.sqrt(max_pixels / (w * h))
        size = (max(1, int(w * scale)), max(1, int(h * scale)))
        image = image.resize(size, Image.Resampling.BILINEAR)
        mask_im = mask_im.resize(size, Image.Resampling.NEAREST)
    arr = np.asarray(image).astype(np.float32)
    m = np.asarray(mask_im) > 0
    arr[m] = (1 - MASK_ALPHA) * arr[m] + MASK_ALPHA * np.array(MASK_COLOUR, np.float32)
    k = 3 if max(image.size) < 640 else 5
    # A band straddling the mask's edge: dilated minus eroded.
    band = (np.asarray(mask_im.filter(ImageFilter.MaxFilter(k))) > 0) & ~(
        np.asarray(mask_im.filter(ImageFilter.MinFilter(k))) > 0)
    arr[band] = CONTOUR_COLOUR
    return Image.fromarray(arr.round().astype(np.uint8))


def load_sam(model_id: str, device: str) -> tuple[Any, Any]:
    """Load ``(SamModel, SamProcessor)`` from a hub id or a local folder, in eval mode on ``device``."""
    from transformers import SamModel, SamProcessor

    model = SamModel.from_pretrained(model_id).to(device).eval()
    processor = SamProcessor.from_pretrained(model_id)
    return model, processor


def _is_missing_folder(model_id: str) -> bool:
    """True when ``model_id`` is meant as a local folder (it is no hub id) and there is none."""
    return not os.path.isdir(model_id) and _HUB_ID.match(model_id) is None


def _fmt_percent(p: float) -> str:
    return f"{p:.1f}%" if p >= 1 or p == 0 else f"{p:.2g}%"


@register
class Segment(Tool):
    name = "segment"
    description = (
        "Segment one object: give a box [x1, y1, x2, y2] around it and/or points [[x, y], ...] on it (labels: "
        "1 = on the object, 0 = not on it), in pixels of the image as you were shown it; source is 'image', a "
        "video frame 'frame@<seconds>' or an earlier tool image 'obs:<n>'. Returns the image with the mask "
        "overlaid, the mask's area and its bounding box."
    )
    # The first call also loads the model.
    timeout_s = 120.0

    def __init__(self, model_id: str = DEFAULT_MODEL_ID, device: str | None = None, max_points: int = 8,
                 mask_threshold: float = 0.0, max_output_pixels: int = 1024 * 1024) -> None:
        if max_points < 1:
            raise ValueError("max_points must be >= 1")
        self.model_id = os.path.expanduser(str(model_id))
        self.device = device
        self.max_points = max_points
        self.mask_threshold = mask_threshold
        self.max_output_pixels = max_output_pixels
        self._load_error: str | None = None
        number = {"type": "number"}
        self.parameters = {
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "'image' (default), 'frame@<seconds>' or 'obs:<n>'"},
                "box": {"type": "array", "items": number, "minItems": 4, "maxItems": 4,
                        "description": "[x1, y1, x2, y2] around the object, in pixels of the view you were shown"},
                "points": {"type": "array", "minItems": 1, "maxItems": max_points,
                           "items": {"type": "array", "items": number, "minItems": 2, "maxItems": 2},
                           "description": f"up to {max_points} points [x, y] in pixels of the view you were shown"},
                "labels": {"type": "array", "items": {"type": "integer", "enum": [0, 1]}, "maxItems": max_points,
                           "description": "one per point: 1 = on the object (default), 0 = not on it"},
            },
            "required": [],
        }

    def model(self) -> tuple[Any, Any]:
        """The shared ``(SamModel, SamProcessor)``, loaded on first use; ToolError if it cannot be loaded."""
        if self._load_error is not None:
            # Retrying an unreachable hub costs minutes of HTTP retries on every call.
            raise ToolError(self._load_error)
        device = self.device or default_device()
        if _is_missing_folder(self.model_id):
            self._load_error = (f"the segmentation model folder {self.model_id!r} does not exist; pass "
                                "Segment(model_id=...) a hub id or a local folder saved with save_pretrained")
            raise ToolError(self._load_error)
        try:
            return shared_model((self.model_id, device), lambda: load_sam(self.model_id, device))
        except Exception as exc:
            self._load_error = (
                f"could not load the segmentation model {self.model_id!r} ({type(exc).__name__}: "
                f"{(str(exc).splitlines() or [''])[0][:300]}); if the hub is unreachable, download it "
                "elsewhere and pass Segment(model_id='/path/to/folder') a local folder holding its config.json, "
                "weights and processor_config.json")
            raise ToolError(self._load_error) from None

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        source = arguments.get("source", "image")
        box, points, labels = arguments.get("box"), arguments.get("points"), arguments.get("labels")
        if labels is not None and points is None:
            raise ToolError("labels were given without points")
        if box is None and points is None:
            raise ToolError("segment needs a prompt: a box [x1, y1, x2, y2] and/or points [[x, y], ...]")
        if points is not None and labels is not None and len(labels) != len(points):
            raise ToolError(f"labels must have one entry per point: got {len(labels)} labels for {len(points)} points")
        image = context.resolve_image(source)
        view_w, view_h = context.view_size(source)
        src_size = (image.width, image.height)

        box_src = None
        if box is not None:
            cx1, cy1, cx2, cy2 = clip_view_box(box, (view_w, view_h), source)
            box_src = view_to_source([cx1, cy1, cx2, cy2], (view_w, view_h), src_size)
        points_src = None
        if points is not None:
            points_src = []
            for x, y in points:
                x, y = float(x), float(y)
                if not (math.isfinite(x) and math.isfinite(y)):
                    raise ToolError("point coordinates must be finite numbers")
                if not (0 <= x <= view_w and 0 <= y <= view_h):
                    raise ToolError(f"point {[x, y]} lies outside the {view_w}x{view_h} view of {source}")
                points_src.append(view_to_source([x, y], (view_w, view_h), src_size))
            labels = [int(v) for v in labels] if labels is not None else [1] * len(points)

        mask, iou = self._predict(image, box_src, points_src, labels)
        return self._observe(source, image, mask, iou, (view_w, view_h), box, points, labels)

    def _predict(self, image: Image.Image, box: list[float] | None, points: list[list[float]] | None,
                 labels: list[int] | None) -> tuple[np.ndarray, float]:
        """The best of SAM's three masks for the prompt (source pixels) as an (H, W) bool array, and its IoU."""
        import torch

        model, processor = self.model()
        inputs = processor(images=image.convert("RGB"),
                           input_boxes=[[box]] if box is not None else None,
                           input_points=[[points]] if points is not None else None,
                           input_labels=[[labels]] if points is not None else None,
                           return_tensors="pt")
        # Only the pixels take the model's dtype: prompt coordinates stay as the processor made them.
        feed = {k: inputs[k].to(model.device) for k in ("input_boxes", "input_points", "input_labels") if k in inputs}
        feed["pixel_values"] = inputs["pixel_values"].to(model.device, model.dtype)
        with torch.inference_mode():
            out = model(**feed, multimask_output=True)
        scores = out.iou_scores[0, 0].float().cpu()
        best = int(torch.argmax(scores))
        masks = processor.post_process_masks(out.pred_masks.float().cpu(), inputs["original_sizes"],
                                             inputs["reshaped_input_sizes"], mask_threshold=self.mask_threshold)
        return masks[0][0, best].numpy().astype(bool), float(scores[best])

    def _observe(self, source: str, image: Image.Image, mask: np.ndarray, iou: float, view: tuple[int, int],
                 box: Any, points: Any, labels: Any) -> Observation:
        view_w, view_h = view
        prompt = " and ".join(p for p in (
            f"box {[round(float(v), 1) for v in box]}" if box is not None else "",
            f"{len(points)} point(s) {[[round(float(v), 1) for v in p] for p in points]} labels {labels}"
            if points is not None else "") if p)
        area = int(mask.sum())
        total = image.width * image.height
        data: dict[str, Any] = {"source": source, "area_px": area, "area_fraction": area / total, "iou": iou,
                                "model_id": self.model_id}
        bbox_src = mask_bbox(mask)
        head = f"Segmented {source} from {prompt} (pixels of the {view_w}x{view_h} view you saw)"
        if bbox_src is None:
            data.update(bbox_view=None, bbox_source=None)
            return Observation(text=f"{head}: the mask is empty, no object was found for this prompt (predicted "
                                    f"IoU {iou:.2f}). Try a tighter box or points on the object.", data=data)
        bbox_view = source_box_to_view(bbox_src, view, (image.width, image.height))
        data.update(bbox_view=bbox_view, bbox_source=list(bbox_src))
        text = (f"{head}: mask of {area} pixels ({_fmt_percent(100 * area / total)} of the "
                f"{image.width}x{image.height} source), bounding box {bbox_view} in pixels of the view of {source} "
                f"you saw; predicted IoU {iou:.2f} (the best of 3 candidate masks). The image shows the mask in "
                "blue with a yellow outline.")
        return Observation(text=text, images=[overlay_mask(image, mask, self.max_output_pixels)],
                           image_labels=[f"segment {bbox_view} of {source}"], data=data)
