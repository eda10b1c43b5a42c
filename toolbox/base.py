"""The tool contract: what a tool is, what it receives and what it returns.

A tool is a small object with a name, a description, a JSON schema for its arguments and a
``run(arguments, context)`` method that returns an :class:`Observation`. Tools never see file paths or
URLs chosen by the model: they reach media only through the :class:`ToolContext` that the agent hands
them, which resolves the episode's handles (``video``, ``image``, ``frame@12.5``, ``obs:3``).

This module knows nothing about the agent or the policy (dependencies point agent -> toolbox).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import jsonschema
import numpy as np
from PIL import Image


class ToolError(Exception):
    """A failure the model should read: bad arguments, an out-of-range time, a missing handle.

    The agent turns it into an error observation; the episode goes on.
    """


@dataclass
class Frame:
    """One decoded video frame and the time (seconds from video start) it was shown at."""

    image: Image.Image
    timestamp: float


@dataclass
class Observation:
    """What a tool returns: text for the model plus zero or more images.

    ``image_labels`` holds one short label per image (e.g. ``"12.50s"`` or a crop box) that the
    policy writes next to the image so the model can refer to it; ``handles`` are filled in by the
    agent with the ``obs:N`` name each image can be addressed by in later calls.
    """

    text: str
    images: list[Image.Image] = field(default_factory=list)
    image_labels: list[str] = field(default_factory=list)
    is_error: bool = False
    handles: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.image_labels and len(self.image_labels) != len(self.images):
            raise ValueError("image_labels must have one label per image")

    @classmethod
    def error(cls, message: str) -> "Observation":
        return cls(text=f"Error: {message}", is_error=True)


@runtime_checkable
class VideoSource(Protocol):
    """A seekable video, opened once per episode (implemented by ``mmagent.media.VideoReader``)."""

    @property
    def duration(self) -> float: ...

    @property
    def fps(self) -> float: ...

    def frames_at(self, timestamps: Sequence[float],
                  annotate: Callable[[np.ndarray, float], None] | None = None) -> list[Frame]:
        """Frames at ``timestamps`` (seconds); ``annotate(rgb, t)`` may draw on each one first, in place."""
        ...


class ToolContext(Protocol):
    """The episode's media as tools may see them (implemented by ``mmagent.media.EpisodeMedia``)."""

    @property
    def video(self) -> VideoSource | None: ...

    def resolve_image(self, handle: str) -> Image.Image:
        """Return the image behind ``handle`` at its original resolution; raise ToolError if unknown."""
        ...

    def view_size(self, handle: str) -> tuple[int, int]:
        """(width, height) of the image as the model was shown it (boxes are in these pixels)."""
        ...


class Tool(abc.ABC):
    """Base class of every tool. Subclasses set ``name``, ``description``, ``parameters`` and ``run``."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    #: seconds a single call may take before the agent reports a timeout to the model
    timeout_s: float = 30.0

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema shown to the model in the system prompt."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Check ``arguments`` against the JSON schema; raise ToolError with a readable message."""
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}")
        try:
            error = jsonschema.exceptions.best_match(self._validator().iter_errors(arguments))
        except jsonschema.exceptions.SchemaError as exc:  # a bug in the tool, not in the call
            raise TypeError(f"tool {self.name} has an invalid parameters schema: {exc.message}") from None
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolError(f"invalid arguments for {self.name}: {where}: {error.message}")
        return arguments

    def _validator(self) -> Any:
        # Checking the schema itself costs more than validating a call: do it once per schema.
        cached = self.__dict__.get("_validator_cache")
        if cached is None or cached[0] is not self.parameters:
            schema = {"additionalProperties": False, **self.parameters}
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            cached = (self.parameters, cls(schema))
            self.__dict__["_validator_cache"] = cached
        return cached[1]

    def __call__(self, arguments: Any, context: ToolContext) -> Observation:
        return self.run(self.validate(arguments), context)

    @abc.abstractmethod
    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        """Do the work on validated arguments."""


def clip_view_box(box: Sequence[float], view_size: tuple[int, int], source: str, name: str = "box"
                  ) -> tuple[float, float, float, float]:
    """Check a model-given [x1, y1, x2, y2] in view pixels and clip it to the view; ToolError if unusable."""
    x1, y1, x2, y2 = (float(v) for v in box)
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise ToolError(f"{name} values must be finite numbers")
    if x2 <= x1 or y2 <= y1:
        raise ToolError(f"{name} must have x1 < x2 and y1 < y2, got {[x1, y1, x2, y2]}")
    view_w, view_h = view_size
    cx1, cy1, cx2, cy2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(view_w)), min(y2, float(view_h))
    if cx2 <= cx1 or cy2 <= cy1:
        raise ToolError(f"{name} {[x1, y1, x2, y2]} lies outside the {view_w}x{view_h} view of {source}")
    return cx1, cy1, cx2, cy2
