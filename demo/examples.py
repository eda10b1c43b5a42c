"""The demo's bundled examples: a few toy-world items, generated on the spot (nothing is downloaded).

They come from the held-out test world (seed :data:`EXAMPLE_WORLD_SEED`, the seed the built-in model
is scored on, never trained on), one item per family, so a user can click one and watch the built-in
model call its tools on the kind of media it was trained for. The toy world writes MPEG-4 Part 2 video,
which browsers do not play, so each example video is re-encoded to near-lossless H.264 (PyAV's libx264)
for the page's player; the agent reads that same file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mmagent.demo.display import transcode_h264
from mmagent.eval.benchmarks import synth

EXAMPLE_WORLD_SEED = 1
EXAMPLE_FAMILIES = ("video_qa", "grounding", "image_qa", "geolocation")


@dataclass(frozen=True)
class Example:
    video: str | None
    image: str | None
    question: str
    options: str  # one per line, as the options box takes them
    family: str

    def row(self) -> list[str | None]:
        """The values of the demo's (video, image, question, options) inputs."""
        return [self.video, self.image, self.question, self.options]


def toy_examples(folder: str | Path, families: Sequence[str] = EXAMPLE_FAMILIES) -> list[Example]:
    """Build one toy-world item per family in ``folder`` (a few seconds) and return them."""
    tasks = synth.build(Path(folder), per_family=1, seed=EXAMPLE_WORLD_SEED, families=list(families), progress=False)
    return [Example(video=browser_playable(t.video) if t.video else None, image=t.image, question=t.question,
                    options="\n".join(t.options or []), family=t.task_type) for t in tasks]


def browser_playable(path: str, crf: int = 10) -> str:
    """Re-encode ``path`` as H.264 (yuv420p) beside it, as ``<stem>.h264.mp4``; return the new path."""
    src = Path(path)
    dst = src.with_name(src.stem + ".h264.mp4")
    transcode_h264(src, dst, crf=crf, preset="medium")
    return str(dst)
