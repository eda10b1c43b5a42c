"""A 5x7 pixel font for the toy world's small text (tags, signs).

The toy world writes its details at one source pixel per font pixel on purpose: a glyph is 5x7
pixels, so once the policy's pixel budget shrinks the image four times it is a one-pixel smudge, while
a zoomed crop shows it tens of pixels high. Drawing the glyphs ourselves (rather than with a system
font) makes every rendering identical on every machine and lets the oracle's reader match templates.
"""

from __future__ import annotations

import numpy as np

GLYPH_W, GLYPH_H = 5, 7
#: one column of space between glyphs
ADVANCE = GLYPH_W + 1

_ROWS = {
    "0": ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    "1": ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    "2": ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    "3": ("11111", "00010", "00100", "00010", "00001", "10001", "01110"),
    "4": ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    "5": ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    "6": ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    "7": ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    "8": ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    "9": ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
    "A": ("01110", "10001", "10001", "11111", "10001", "10001", "10001"),
    "B": ("11110", "10001", "10001", "11110", "10001", "10001", "11110"),
    "C": ("01110", "10001", "10000", "10000", "10000", "10001", "01110"),
    "D": ("11100", "10010", "10001", "10001", "10001", "10010", "11100"),
    "E": ("11111", "10000", "10000", "11110", "10000", "10000", "11111"),
    "F": ("11111", "10000", "10000", "11110", "10000", "10000", "10000"),
    "G": ("01110", "10001", "10000", "10111", "10001", "10001", "01111"),
    "H": ("10001", "10001", "10001", "11111", "10001", "10001", "10001"),
    "I": ("01110", "00100", "00100", "00100", "00100", "00100", "01110"),
    "J": ("00111", "00010", "00010", "00010", "00010", "10010", "01100"),
    "K": ("10001", "10010", "10100", "11000", "10100", "10010", "10001"),
    "L": ("10000", "10000", "10000", "10000", "10000", "10000", "11111"),
    "M": ("10001", "11011", "10101", "10101", "10001", "10001", "10001"),
    "N": ("10001", "10001", "11001", "10101", "10011", "10001", "10001"),
    "O": ("01110", "10001", "10001", "10001", "10001", "10001", "01110"),
    "P": ("11110", "10001", "10001", "11110", "10000", "10000", "10000"),
    "Q": ("01110", "10001", "10001", "10001", "10101", "10010", "01101"),
    "R": ("11110", "10001", "10001", "11110", "10100", "10010", "10001"),
    "S": ("01111", "10000", "10000", "01110", "00001", "00001", "11110"),
    "T": ("11111", "00100", "00100", "00100", "00100", "00100", "00100"),
    "U": ("10001", "10001", "10001", "10001", "10001", "10001", "01110"),
    "V": ("10001", "10001", "10001", "10001", "10001", "01010", "00100"),
    "W": ("10001", "10001", "10001", "10101", "10101", "10101", "01010"),
    "X": ("10001", "10001", "01010", "00100", "01010", "10001", "10001"),
    "Y": ("10001", "10001", "10001", "01010", "00100", "00100", "00100"),
    "Z": ("11111", "00001", "00010", "00100", "01000", "10000", "11111"),
    " ": ("00000",) * 7,
}

GLYPHS: dict[str, np.ndarray] = {
    ch: np.array([[c == "1" for c in row] for row in rows], dtype=bool) for ch, rows in _ROWS.items()
}
CHARSET = frozenset(GLYPHS)


def can_write(text: str) -> bool:
    """Whether every character of ``text`` (upper-cased) has a glyph."""
    return bool(text) and all(ch in CHARSET for ch in text.upper())


def text_width(text: str) -> int:
    return len(text) * ADVANCE - 1


def render_text(text: str) -> np.ndarray:
    """A (7, width) boolean bitmap of ``text`` (upper-cased), ink = True."""
    text = text.upper()
    if not can_write(text):
        bad = sorted({ch for ch in text if ch not in CHARSET})
        raise ValueError(f"the toy-world font has no glyph for {bad!r} (it writes A-Z, 0-9 and spaces)")
    out = np.zeros((GLYPH_H, text_width(text)), dtype=bool)
    for k, ch in enumerate(text):
        out[:, k * ADVANCE:k * ADVANCE + GLYPH_W] = GLYPHS[ch]
    return out
