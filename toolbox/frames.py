"""``resample_frames``: look again at a time window of the episode's video, densely.

The VITAL idea: the policy first sees a few uniformly sampled frames; when the question is about a short
moment it asks for ``num_frames`` frames between ``start`` and ``end`` seconds. Each returned frame has
its timestamp drawn in its corner and listed in the observation text, always in seconds, never as frame
indices. The video reader stays open for the whole episode, so a call decodes only the frames it needs.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
from PIL import Image

from mmagent.toolbox.base import Frame, Observation, Tool, ToolContext, ToolError
from mmagent.toolbox.registry import register


def draw_time(arr: np.ndarray, seconds: float) -> None:
    """Draw ``"{seconds:.2f}s"`` in the top-left corner of an (H, W, 3) RGB array, in place."""
    h = arr.shape[0]
    scale = max(0.3, h / 480.0)
    thickness = max(1, round(scale * 1.5))
    text = f"{seconds:.2f}s"
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
    cv2.rectangle(arr, (0, 0), (tw + 4, th + base + 4), (0, 0, 0), thickness=-1)
    cv2.putText(arr, text, (2, th + 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), thickness, cv2.LINE_AA)


def stamp_time(image: Image.Image, seconds: float) -> Image.Image:
    """Return a copy of ``image`` with ``"{seconds:.2f}s"`` drawn in its top-left corner."""
    arr = np.array(image.convert("RGB"))
    draw_time(arr, seconds)
    return Image.fromarray(arr)


def seconds(t: float) -> str:
    """``t`` as the observation text writes times: ``12.50s``; a huge model-given time stays short (``1e+300s``)."""
    return f"{t:.2f}s" if abs(t) < 1e9 else f"{t:.3g}s"


def window_times(start: float, end: float, num_frames: int) -> list[float]:
    """Centres of ``num_frames`` equal slices of [start, end]: evenly spread, never on the exact ends."""
    step = (end - start) / num_frames
    return [start + (i + 0.5) * step for i in range(num_frames)]


@register
class ResampleFrames(Tool):
    name = "resample_frames"
    description = (
        "Look closer at part of the video: returns num_frames frames evenly spread between start and end "
        "(seconds from the start of the video), each labelled with its timestamp in seconds."
    )
    timeout_s = 30.0

    def __init__(self, max_frames: int = 8, min_span_s: float = 0.1, draw_timestamps: bool = True,
                 max_pixels: int = 640 * 640) -> None:
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        if max_pixels < 28 * 28:
            raise ValueError("max_pixels must be at least 28 * 28")
        self.max_frames = max_frames
        self.max_pixels = max_pixels
        self.min_span_s = min_span_s
        self.draw_timestamps = draw_timestamps
        self.parameters = {
            "type": "object",
            "properties": {
                "start": {"type": "number", "description": "window start, seconds from video start"},
                "end": {"type": "number", "description": "window end, seconds from video start"},
                "num_frames": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": max_frames,
                    "description": f"how many frames to return (1-{max_frames}, default {min(4, max_frames)})",
                },
            },
            "required": ["start", "end"],
        }

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        video = context.video
        if video is None:
            raise ToolError("this episode has no video; resample_frames needs one")
        start, end = float(arguments["start"]), float(arguments["end"])
        num_frames = int(arguments.get("num_frames", min(4, self.max_frames)))
        if not (math.isfinite(start) and math.isfinite(end)):
            raise ToolError("start and end must be finite numbers of seconds")
        duration = video.duration
        notes = []
        if start >= duration:
            raise ToolError(f"start={seconds(start)} is at or past the end of the video ({duration:.2f}s)")
        if end <= 0:
            raise ToolError(f"end={seconds(end)} is at or before the start of the video (0.00s)")
        if start < 0:
            notes.append(f"start {seconds(start)} clamped to 0.00s")
            start = 0.0
        if end > duration:
            notes.append(f"end {seconds(end)} clamped to the video duration {duration:.2f}s")
            end = duration
        if end - start < self.min_span_s:
            raise ToolError(
                f"the window must be at least {self.min_span_s:.2f}s long with start < end "
                f"(got start={start:.2f}s, end={end:.2f}s)"
            )
        frames: list[Frame] = video.frames_at(window_times(start, end, num_frames),
                                              annotate=draw_time if self.draw_timestamps else None)
        images = [_bounded(f.image, self.max_pixels) for f in frames]
        labels = [f"{f.timestamp:.2f}s" for f in frames]
        text = (
            f"Video clip from {start:.2f} to {end:.2f} seconds: {len(frames)} frames at "
            + ", ".join(labels)
            + " (times are seconds from the start of the video)."
        )
        if notes:
            text += " Note: " + "; ".join(notes) + "."
        return Observation(
            text=text, images=images, image_labels=labels,
            data={"start": start, "end": end, "timestamps": [f.timestamp for f in frames]},
        )



def _bounded(image: Image.Image, max_pixels: int) -> Image.Image:
    """Shrink (keeping the aspect ratio) so the image has at most ``max_pixels`` pixels."""
    if image.width * image.height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (image.width * image.height))
    return image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))), Image.BILINEAR)
