"""Errors as a demo user reads them: one line, naming the user's own file, never a server path.

Uploads reach the server as temporary files (``/tmp/gradio/<hash>/clip.mp4``) and decoders write long,
multi-line reasons; :func:`user_message` turns any such text into one readable line in which every
path is cut to its file name (the name the user uploaded).
"""

from __future__ import annotations

import os
import re
from typing import Iterable

#: an absolute POSIX path (at least one folder deep); group 1 is its last part
_PATH = re.compile(r"(?:/[^\s/:;,()\[\]'\"]+)+/([^\s/:;,()\[\]'\"]+)")
#: the longest message shown; the rest is cut with an ellipsis
MAX_CHARS = 300


def user_message(error: BaseException | str, files: Iterable[str | os.PathLike | None] = ()) -> str:
    """``error`` as one line of at most :data:`MAX_CHARS` characters, with ``files`` and any other absolute
    path shown by file name only."""
    text = str(error).strip().strip("'\"")
    for f in files:
        if f:
            text = text.replace(str(f), os.path.basename(str(f)))
    text = _PATH.sub(r"\1", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1].rstrip() + "…"
