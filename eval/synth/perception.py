"""The oracles' eyes: read colours, shapes and small labels from the images an episode shows.

These readers are how the toy world proves where the information is. The tool oracle answers only
from what the tools returned (read here); the no-tool oracle answers only from the first view (read
here too, with the strongest reader we can build: :func:`read_label_by_synthesis` redraws the label
under every hypothesis, shrinks it exactly as the policy's view was made and keeps the closest). If
that reader stays at chance, the first view carries no usable trace of the answer.
"""

from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np
from PIL import Image

from mmagent.eval.synth.render import (INK_CONTRAST, RGB, checker_ink, nearest_colour, shape_mask, text_bitmap,
                               text_offset)

Box = tuple[float, float, float, float]


def _rgb(image: Image.Image | np.ndarray) -> np.ndarray:
    return np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)


# ----- colours and shapes ---------------------------------------------------------------------------
def frame_colour(image: Image.Image | np.ndarray, names: Sequence[str] | None = None) -> str:
    """The palette colour filling most of a frame (median pixel)."""
    arr = _rgb(image).reshape(-1, 3)
    return nearest_colour(np.median(arr, axis=0), names)


def saturated_mask(image: Image.Image | np.ndarray, min_saturation: float = 0.55, min_value: float = 0.3) -> np.ndarray:
    """Pixels of saturated colour: the toy world's events and tags (backdrops are dull)."""
    hsv = cv2.cvtColor(np.ascontiguousarray(_rgb(image)), cv2.COLOR_RGB2HSV)
    return (hsv[..., 1] >= min_saturation * 255) & (hsv[..., 2] >= min_value * 255)


def find_shape(image: Image.Image | np.ndarray, min_area: int = 40) -> np.ndarray | None:
    """The mask of the largest saturated blob, or None if there is none."""
    mask = saturated_mask(image).astype(np.uint8)
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    if count <= 1:
        return None
    best = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    if stats[best, cv2.CC_STAT_AREA] < min_area:
        return None
    return labels == best


def classify_shape(mask: np.ndarray, candidates: Sequence[str]) -> str:
    """The candidate shape whose rendering overlaps ``mask`` best (IoU over a few sizes)."""
    ys, xs = np.nonzero(mask)
    centre = ((xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2)
    extent = max(xs.max() - xs.min(), ys.max() - ys.min()) + 1
    best, best_iou = candidates[0], -1.0
    for shape in candidates:
        for size in np.linspace(extent * 0.8, extent * 1.3, 11):
            m = shape_mask(shape, centre, size, mask.shape)
            iou = (m & mask).sum() / max(1, (m | mask).sum())
            if iou > best_iou:
                best, best_iou = shape, float(iou)
    return best


def blob_colour(image: Image.Image | np.ndarray, mask: np.ndarray, names: Sequence[str] | None = None) -> str:
    return nearest_colour(np.median(_rgb(image)[mask], axis=0), names)


# ----- small labels ---------------------------------------------------------------------------------
def label_patch(text: str, size: tuple[int, int], offset: tuple[int, int], background: RGB,
                origin: tuple[int, int]) -> np.ndarray:
    """A float (h, w, 3) label with ``text`` at ``offset``, drawn as the generator draws it at ``origin``."""
    w, h = size
    bitmap = text_bitmap(text)
    th, tw = bitmap.shape
    mask = np.zeros((h, w), bool)
    mask[offset[1]:offset[1] + th, offset[0]:offset[0] + tw] = bitmap
    return checker_ink(mask, background, origin)


def _offsets(text: str, size: tuple[int, int], jitter: int) -> list[tuple[int, int]]:
    return sorted({text_offset(text, size, (dx, dy)) for dx in range(-jitter, jitter + 1)
                   for dy in range(-jitter, jitter + 1)})


def read_label_sharp(image: Image.Image | np.ndarray, box: Box, size: tuple[int, int], candidates: Sequence[str],
                     background: RGB, jitter: int = 1) -> tuple[str, list[float]]:
    """Read a label where the image shows it large: sample it back onto its own pixel grid and match.

    ``box`` is where the label's (w, h) grid lies in ``image`` (pixels, float). Returns the best
    candidate and every candidate's score (share of the label's pixels agreeing with its rendering).
    """
    arr = _rgb(image).astype(np.float32)
    w, h = size
    x1, y1, x2, y2 = box
    u = x1 + (np.arange(w) + 0.5) * (x2 - x1) / w - 0.5
    v = y1 + (np.arange(h) + 0.5) * (y2 - y1) / h - 0.5
    mx, my = np.meshgrid(u.astype(np.float32), v.astype(np.float32))
    grid = cv2.remap(arr, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    # Ink is a checker of lighter and darker shades: far from the label's colour either way.
    step = np.sqrt(np.sum((grid - np.asarray(background, np.float32)) ** 2, axis=-1))
    seen = step > INK_CONTRAST * np.sqrt(3) * 0.45  # enlarging softens the checker a little
    scores = []
    for text in candidates:
        bitmap = text_bitmap(text)
        th, tw = bitmap.shape
        best = 0.0
        for ox, oy in _offsets(text, size, jitter):
            want = np.zeros((h, w), bool)
            want[oy:oy + th, ox:ox + tw] = bitmap
            best = max(best, float((seen == want).mean()))
        scores.append(best)
    return candidates[int(np.argmax(scores))], scores


def read_label_by_synthesis(view: Image.Image | np.ndarray, source: np.ndarray | None,
                            label_box: tuple[int, int, int, int], candidates: Sequence[str], background: RGB,
                            jitter: int = 1, source_size: tuple[int, int] | None = None) -> tuple[str, list[float]]:
    """Read a label in a shrunk view the strongest way we know: redraw it under each hypothesis and compare.

    ``label_box`` = (x, y, w, h) is the label's place in the full-resolution image. For each candidate
    text and text position the label is redrawn into the neighbourhood, shrunk exactly as the view was
    (bicubic, same scale) and compared with the view; the smallest squared error wins. The
    neighbourhood is ``source`` (the full-resolution image, label excluded: an *ideal observer* who
    knows the whole scene but the text) or, with ``source=None``, the view itself enlarged back to
    ``source_size`` (what an observer given only the view can know). Returns the winner and the errors.
    """
    view = _rgb(view)
    vh, vw = view.shape[:2]
    sw, sh = (source.shape[1], source.shape[0]) if source is not None else source_size or (vw * 8, vh * 8)
    sx, sy = sw / vw, sh / vh
    x, y, w, h = label_box
    # A window of whole view pixels around the label, with context the bicubic filter reaches (2 view px).
    vx1, vy1 = max(0, int(x // sx) - 1), max(0, int(y // sy) - 1)
    vx2, vy2 = min(vw, int(np.ceil((x + w) / sx)) + 1), min(vh, int(np.ceil((y + h) / sy)) + 1)
    cx1, cy1, cx2, cy2 = max(0, vx1 - 3), max(0, vy1 - 3), min(vw, vx2 + 3), min(vh, vy2 + 3)
    if source is not None:
        src_win = source[round(cy1 * sy):round(cy2 * sy), round(cx1 * sx):round(cx2 * sx)].astype(float)
    else:
        src_win = np.asarray(Image.fromarray(view[cy1:cy2, cx1:cx2]).resize(
            (round((cx2 - cx1) * sx), round((cy2 - cy1) * sy)), Image.Resampling.BICUBIC), float)
    observed = view[vy1:vy2, vx1:vx2].astype(float)
    lx, ly = x - round(cx1 * sx), y - round(cy1 * sy)
    errors = []
    for text in candidates:
        best = np.inf
        for off in _offsets(text, (w, h), jitter):
            win = src_win.copy()
            win[ly:ly + h, lx:lx + w] = label_patch(text, (w, h), off, background, (x, y))
            small = np.asarray(Image.fromarray(np.clip(np.round(win), 0, 255).astype(np.uint8)).resize(
                (cx2 - cx1, cy2 - cy1), Image.Resampling.BICUBIC), float)
            best = min(best, float(np.sum((small[vy1 - cy1:vy2 - cy1, vx1 - cx1:vx2 - cx1] - observed) ** 2)))
        errors.append(best)
    return candidates[int(np.argmin(errors))], errors
