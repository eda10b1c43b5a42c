"""``zoom``: crop a region of an image the model saw and show it larger.

The box is ``[x1, y1, x2, y2]`` in the pixels of the view the model was shown (which the policy may have
resized); it is mapped back to the source's own pixels, clamped to the image, padded a little, grown to
a minimum size, and the crop is upscaled so its detail survives the policy's pixel budget.
"""

from __future__ import annotations

import math
from typing import Any

from PIL import Image

from mmagent.toolbox.base import Observation, Tool, ToolContext, ToolError, clip_view_box
from mmagent.toolbox.registry import register

MAX_ASPECT_RATIO = 100.0


def expand_box(box: tuple[float, float, float, float], min_side: float, pad: float,
               width: int, height: int) -> tuple[int, int, int, int]:
    """Pad ``box`` by ``pad`` of its size, grow each side to ``min_side``, and keep it inside the image."""
    x1, y1, x2, y2 = box
    bw, bh = x2 - x1, y2 - y1
    x1, x2 = x1 - pad * bw, x2 + pad * bw
    y1, y2 = y1 - pad * bh, y2 + pad * bh
    sides = []
    for lo, hi, limit in ((x1, x2, width), (y1, y2, height)):
        side = min(max(hi - lo, min_side), limit)
        centre = (lo + hi) / 2
        lo = min(max(centre - side / 2, 0.0), limit - side)
        sides.append((lo, lo + side))
    (x1, x2), (y1, y2) = sides
    return math.floor(x1), math.floor(y1), math.ceil(x2), math.ceil(y2)


@register
class Zoom(Tool):
    name = "zoom"
    description = (
        "Zoom into a region: bbox [x1, y1, x2, y2] in pixels of the image as you were shown it; source is "
        "'image', a video frame 'frame@<seconds>' or an earlier tool image 'obs:<n>'. Returns the crop enlarged."
    )
    timeout_s = 10.0

    def __init__(self, min_side_px: int = 28, pad_ratio: float = 0.1, output_pixels: int = 448 * 448) -> None:
        self.min_side_px = min_side_px
        self.pad_ratio = pad_ratio
        self.output_pixels = output_pixels
        self.parameters = {
            "type": "object",
            "properties": {
                "bbox": {
                    "type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                    "description": "[x1, y1, x2, y2] in pixels of the view you were shown",
                },
                "source": {"type": "string", "description": "'image' (default), 'frame@<seconds>' or 'obs:<n>'"},
            },
            "required": ["bbox"],
        }

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        source = arguments.get("source", "image")
        image = context.resolve_image(source)
        view_w, view_h = context.view_size(source)
        cx1, cy1, cx2, cy2 = clip_view_box(arguments["bbox"], (view_w, view_h), source, name="bbox")
        sx, sy = image.width / view_w, image.height / view_h
        box = expand_box((cx1 * sx, cy1 * sy, cx2 * sx, cy2 * sy), self.min_side_px, self.pad_ratio,
                         image.width, image.height)
        bw, bh = box[2] - box[0], box[3] - box[1]
        if max(bw, bh) / max(1, min(bw, bh)) > MAX_ASPECT_RATIO:
            raise ToolError(f"the crop is too thin (aspect ratio over {MAX_ASPECT_RATIO:.0f}); use a squarer box")
        crop = image.crop(box)
        scale = math.sqrt(self.output_pixels / (bw * bh))
        if scale > 1:
            crop = crop.resize((max(1, round(bw * scale)), max(1, round(bh * scale))), Image.Resampling.BICUBIC)
        shown = [round(box[0] / sx), round(box[1] / sy), round(box[2] / sx), round(box[3] / sy)]
        text = (f"Zoomed into {source} box {shown} (pixels of the {view_w}x{view_h} view you saw; "
                f"{list(box)} in the source's own {image.width}x{image.height} pixels).")
        return Observation(text=text, images=[crop], image_labels=[f"zoom {shown} of {source}"],
                           data={"source": source, "box_view": shown, "box_source": list(box)})
