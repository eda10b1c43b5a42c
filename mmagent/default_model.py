"""The embedded default policy: a tiny Qwen2.5-VL trained on the toy world only.

``mmagent run`` and the demo use it when no ``--model`` is given, so that everything works offline
on a fresh machine. It was trained from scratch on CPU by ``python -m mmagent.training.recipes.toy_world``
(SFT on the tool oracle's episodes, then DGRPO) on the toy world's four task families; it knows nothing
of real videos or photos. Its folder's ``mmagent.json`` holds the pixel budget and tools it was trained
with, its scores and the command that reproduces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "toy_policy"

LABEL = ("the built-in tiny model, trained on the toy world only (`mmagent synth` tasks): "
         "expect nonsense on real media, pass --model Qwen/Qwen2.5-VL-7B-Instruct for those")


def default_model_path() -> Path:
    """The embedded model's folder; FileNotFoundError (saying how to rebuild it) if it is not installed."""
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(f"the built-in model is missing from {DEFAULT_MODEL_DIR}; rebuild it with "
                                "`python -m mmagent.training.recipes.toy_world runs/toy --install`, or pass --model")
    return DEFAULT_MODEL_DIR


def default_model_info() -> dict[str, Any]:
    """The embedded model's ``mmagent.json``: media budget, tools, scores, recipe."""
    return json.loads((default_model_path() / "mmagent.json").read_text())
