"""The record mmagent writes beside a trained checkpoint: ``mmagent.json``.

It says what the policy was trained with — the pixel budget (loading the folder uses it again, since a
model trained at one budget reads images best at that budget), the tools it learned to call, how it was
trained and its scores. A hub id or a plain transformers folder has none: loaders then use their defaults.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mmagent.policy.render import MediaBudget

#: written next to a trained checkpoint: what the policy was trained with (pixel budget, tools)
POLICY_FILE = "mmagent.json"


def saved_policy_record(folder: str | os.PathLike) -> dict[str, Any]:
    """``folder/mmagent.json`` (pixel budget, tools, how it was trained), or {} (a hub id, a plain folder)."""
    path = Path(folder).expanduser() / POLICY_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def saved_media_budget(folder: str | os.PathLike) -> MediaBudget | None:
    """The pixel budget recorded in ``folder/mmagent.json``, or None."""
    record = saved_policy_record(folder)
    return MediaBudget(**record["media_budget"]) if "media_budget" in record else None


def write_policy_record(folder: str | os.PathLike, media_budget: MediaBudget, about: dict[str, Any] | None = None
                        ) -> Path:
    """Write ``folder/mmagent.json``: the pixel budget plus ``about`` (tools, trainer, scores, ...)."""
    path = Path(folder) / POLICY_FILE
    path.write_text(json.dumps({"media_budget": asdict(media_budget), **(about or {})}, indent=2) + "\n")
    return path
