"""Drawing the toy world: colours, shapes, small labels with balanced ink, scenes, and videos.

Everything here is deterministic given its random generator. Two rules keep the tool-needing tasks
honest, and the tests check both:

* Small text exists only at the finest scale. Glyphs are the 5x7 font (:mod:`mmagent.eval.synth.font`) with
  each font pixel a 4x4 block of 2x2-pixel cells of a lighter and a darker shade of the label's colour in
  a checker, so every block averages exactly to the label's colour and has no tilt either way. An
  antialiased shrink (the policy's view is an 8x bicubic one) averages the blocks away: the view shows a
  plain coloured label whatever it says, while a zoomed crop, enlarged, shows the checkered glyphs
  clearly (a glyph is 20x28 source pixels: about 3x4 vision patches after a 16-view-pixel zoom).
* Video events are placed between the frames the policy samples for its first look, so that look
  cannot contain them (the family generators enforce it; see :mod:`mmagent.eval.synth.families`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

import cv2
import numpy as np

from mmagent.eval.synth.font import render_text

RGB = tuple[int, int, int]

#: saturated colours the questions name (tags, events, screens)
PALETTE: dict[str, RGB] = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (30, 70, 220),
    "yellow": (235, 205, 20),
    "magenta": (205, 35, 205),
    "cyan": (20, 195, 205),
    "orange": (245, 130, 20),
}
WHITE: RGB = (255, 255, 255)
SHAPES = ("circle", "square", "triangle", "cross", "star", "diamond")


def nearest_colour(rgb: Iterable[float], names: Iterable[str] | None = None) -> str:
    """The palette colour closest (Euclidean RGB) to ``rgb``, among ``names`` if given."""
    names = list(names) if names is not None else list(PALETTE)
    v = np.asarray(list(rgb), dtype=float)
    return min(names, key=lambda n: float(np.sum((np.asarray(PALETTE[n], float) - v) ** 2)))


# ----- shapes ----------------------------------------------------------------------------------------
def _star_points(cx: float, cy: float, r: float) -> np.ndarray:
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else r * 0.45
        a = -np.pi / 2 + k * np.pi / 5
        pts.append((cx + rad * np.cos(a), cy + rad * np.sin(a)))
    return np.array(pts)


def shape_mask(shape: str, centre: tuple[float, float], size: float, canvas: tuple[int, int]) -> np.ndarray:
    """A boolean (H, W) mask of a filled ``shape`` of about ``size`` pixels across, centred at ``centre``."""
    h, w = canvas
    mask = np.zeros((h, w), np.uint8)
    cx, cy = centre
    r = size / 2
    if shape == "circle":
        cv2.circle(mask, (round(cx), round(cy)), round(r), 1, -1)
    elif shape == "square":
        cv2.rectangle(mask, (round(cx - r * 0.85), round(cy - r * 0.85)), (round(cx + r * 0.85), round(cy + r * 0.85)),
                      1, -1)
    elif shape == "triangle":
        pts = np.array([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)])
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    elif shape == "cross":
        t = r * 0.35
        cv2.rectangle(mask, (round(cx - r), round(cy - t)), (round(cx + r), round(cy + t)), 1, -1)
        cv2.rectangle(mask, (round(cx - t), round(cy - r)), (round(cx + t), round(cy + r)), 1, -1)
    elif shape == "star":
        cv2.fillPoly(mask, [np.round(_star_points(cx, cy, r * 1.1)).astype(np.int32)], 1)
    elif shape == "diamond":
        pts = np.array([(cx, cy - r), (cx + r * 0.8, cy), (cx, cy + r), (cx - r * 0.8, cy)])
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    else:
        raise ValueError(f"unknown shape {shape!r}; the toy world draws {SHAPES}")
    return mask.astype(bool)


# ----- small labels (tags, signs) ------------------------------------------------------------------------
#: how far a glyph pixel's colour steps above or below its label's colour (each channel)
INK_CONTRAST = 40
#: label colours: every channel at least INK_CONTRAST + 3 grain deviations from 0 and 255, so neither the
#: checker nor the grain ever clips (clipping would shift a label's mean by how much ink it has)
LABEL_PALETTE: dict[str, RGB] = {
    "red": (185, 72, 72),
    "green": (72, 160, 92),
    "blue": (72, 92, 183),
    "yellow": (183, 172, 72),
    "magenta": (178, 72, 178),
    "cyan": (72, 168, 178),
    "orange": (183, 126, 72),
}

#: canvas pixels per font pixel: each font pixel is a 2x2 block of checker cells, whose mean and tilt are zero
FONT_SCALE = 4
#: side of one checker cell (canvas pixels)
CHECKER_CELL = 2


def text_bitmap(text: str) -> np.ndarray:
    """``text`` as the labels draw it: the 5x7 font at :data:`FONT_SCALE` canvas pixels per font pixel."""
    return np.kron(render_text(text), np.ones((FONT_SCALE, FONT_SCALE), bool))


def label_size(max_chars: int, margin: int = 8) -> tuple[int, int]:
    """(width, height) of a label that holds ``max_chars`` characters with ``margin`` pixels around."""
    from mmagent.eval.synth.font import ADVANCE, GLYPH_H

    return (max_chars * ADVANCE - 1) * FONT_SCALE + 2 * margin, GLYPH_H * FONT_SCALE + 2 * margin


def text_offset(text: str, size: tuple[int, int], shift: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """Where the text's top-left lands on a label of ``size``: centred, moved by ``shift`` (in whole checker
    blocks, so the blocks stay aligned), clear of the edges."""
    th, tw = text_bitmap(text).shape
    w, h = size
    f = FONT_SCALE
    ox = min(max(((w - tw) // 2 // f + shift[0]) * f, f), (w - tw - 1) // f * f)
    oy = min(max(((h - th) // 2 // f + shift[1]) * f, f), (h - th - 1) // f * f)
    return ox, oy


def checker_ink(bitmap: np.ndarray, background: RGB, origin: tuple[int, int],
                contrast: int = INK_CONTRAST) -> np.ndarray:
    """A float (h, w, 3) patch: ``background`` where ``bitmap`` is False, and on its ink a pixel checker of
    ``background + contrast`` / ``background - contrast`` in cells of :data:`CHECKER_CELL` pixels whose
    phase follows the canvas position ``origin`` (x, y) of the patch's top-left pixel. Each font pixel of
    ink holds two cells of each shade."""
    h, w = bitmap.shape
    yy, xx = np.mgrid[0:h, 0:w]
    c = CHECKER_CELL
    sign = np.where(((xx + origin[0]) // c + (yy + origin[1]) // c) % 2 == 0, 1.0, -1.0)
    patch = np.empty((h, w, 3), float)
    patch[:] = background
    patch[bitmap] += (sign[bitmap] * contrast)[:, None]
    return patch


#: standard deviation of the label's print grain (grey levels)
GRAIN = 10.0


def draw_label(canvas: np.ndarray, text: str, box: tuple[int, int, int, int], background: RGB,
               rng: np.random.Generator, jitter: int = 1, contrast: int = INK_CONTRAST,
               grain: float = GRAIN) -> tuple[int, int]:
    """Write ``text`` centred (± ``jitter`` px) on a filled ``box`` = (x, y, w, h) of ``canvas``, in place.

    The glyphs are a one-pixel checker of lighter and darker shades of the label's colour (see the module
    docstring), with a faint random grain over the label (a few grey levels: what is left of the text in
    a shrunk view is a grey level or so of rounding, and grain drowns it). Returns the canvas position of
    the text's top-left pixel.
    """
    x, y, w, h = box
    bitmap = text_bitmap(text)
    th, tw = bitmap.shape
    if tw + 2 > w or th + 2 > h:
        raise ValueError(f"label {w}x{h} is too small for {text!r} ({tw}x{th} pixels of text)")
    reach = contrast + 3 * grain
    if any(c - reach < 0 or c + reach > 255 for c in background):
        raise ValueError(f"label colour {background} is within {reach:g} of 0 or 255: its checker would clip")
    shift = (int(rng.integers(-jitter, jitter + 1)), int(rng.integers(-jitter, jitter + 1)))
    ox, oy = text_offset(text, (w, h), shift)
    mask = np.zeros((h, w), bool)
    mask[oy:oy + th, ox:ox + tw] = bitmap
    patch = checker_ink(mask, background, (x, y), contrast) + rng.normal(0.0, grain, (h, w, 1))
    canvas[y:y + h, x:x + w] = np.clip(np.round(patch), 0, 255).astype(np.uint8)
    return x + ox, y + oy


# ----- scenes -----------------------------------------------------------------------------------------
def muted(rng: np.random.Generator, lo: int = 70, hi: int = 170) -> RGB:
    """A dull colour (low saturation) that never reads as one of the palette's."""
    base = int(rng.integers(lo, hi))
    return tuple(int(np.clip(base + rng.integers(-18, 19), 0, 255)) for _ in range(3))  # type: ignore[return-value]


def scene(size: tuple[int, int], rng: np.random.Generator, buildings: int = 7) -> np.ndarray:
    """An (H, W, 3) street-like backdrop in dull colours: sky, ground, buildings with windows."""
    w, h = size
    img = np.empty((h, w, 3), np.uint8)
    horizon = int(h * rng.uniform(0.45, 0.6))
    sky_top, sky_bottom = np.array([120, 150, 175]), np.array([175, 190, 200])
    ramp = np.linspace(0, 1, horizon)[:, None]
    img[:horizon] = (sky_top * (1 - ramp) + sky_bottom * ramp)[:, None, :].astype(np.uint8)
    img[horizon:] = muted(rng, 80, 120)
    for _ in range(buildings):
        bw, bh = int(rng.integers(w // 10, w // 4)), int(rng.integers(h // 8, horizon))
        bx = int(rng.integers(0, w - bw))
        top = horizon - bh
        colour = muted(rng)
        img[top:horizon, bx:bx + bw] = colour
        win = tuple(max(0, c - 35) for c in colour)
        for wy in range(top + 6, horizon - 8, 14):
            for wx in range(bx + 5, bx + bw - 8, 12):
                img[wy:wy + 6, wx:wx + 5] = win
    road_w = w // 3
    cx = int(rng.integers(w // 3, 2 * w // 3))
    pts = np.array([(cx - 6, horizon), (cx + 6, horizon), (cx + road_w, h), (cx - road_w, h)], np.int32)
    cv2.fillPoly(img, [pts], (90, 90, 95))
    return img


# ----- videos -----------------------------------------------------------------------------------------
def write_video(path: str | os.PathLike, frames: int, draw: Callable[[int], np.ndarray], fps: int,
                codec: str = "mp4v") -> Path:
    """Write ``frames`` frames (``draw(k)`` returns frame k as (H, W, 3) RGB) to an MP4."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    first = draw(0)
    h, w = first.shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*codec), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {codec!r} video to {path}")
    try:
        for k in range(frames):
            frame = first if k == 0 else draw(k)
            writer.write(np.ascontiguousarray(frame[:, :, ::-1]))
    finally:
        writer.release()
    return path


def drifting_backdrop(size: int, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    """A dull backdrop whose tint drifts slowly and whose checker pattern scrolls: a video, not a still."""
    a, b = np.array(muted(rng, 90, 150), float), np.array(muted(rng, 90, 150), float)
    period = float(rng.uniform(40, 120))
    yy, xx = np.mgrid[0:size, 0:size]

    def draw(k: int) -> np.ndarray:
        mix = 0.5 + 0.5 * np.sin(2 * np.pi * k / period)
        tint = a * (1 - mix) + b * mix
        checker = (((xx + k) // 14 + yy // 14) % 2)[..., None] * 14.0
        return np.clip(tint + checker, 0, 255).astype(np.uint8)

    return draw
