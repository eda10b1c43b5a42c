"""The data of an episode: the task going in, the turns, the tokens and the result coming out.

A :class:`Trajectory` is what every other part reads: SFT trains on its ``token_ids`` with
``loss_mask`` (1 on tokens the policy generated, 0 on the prompt and on observation tokens), RL scores
it, eval reports and the demo draw it. It round-trips through JSONL; the images tools returned are
written as PNG files in a folder beside the JSONL and referenced by relative path.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator

from PIL import Image

from mmagent.toolbox.base import Observation


@dataclass
class Task:
    """One question about one video and/or image."""

    question: str
    video: str | None = None
    image: str | None = None
    id: str = ""
    task_type: str = "open"  # video_qa | grounding | image_qa | geolocation | open
    options: list[str] | None = None
    answer: Any = None  # ground truth, when known
    metadata: dict[str, Any] = field(default_factory=dict)
    #: the benchmark (a name in mmagent.eval.registry.BENCHMARKS) whose ``score`` judges the answers;
    #: "" for a task of the user's own, which the generic scorer judges
    benchmark: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError("a task needs a non-empty question")
        if self.video is not None:
            self.video = str(self.video)
        if self.image is not None and not isinstance(self.image, str):
            self.image = str(self.image)


@dataclass
class ToolCallRecord:
    name: str
    arguments: dict[str, Any]


@dataclass
class Turn:
    """One turn: the policy's text (role ``assistant``) or a tool's observation (role ``tool``)."""

    role: str  # assistant | tool
    text: str
    tool_call: ToolCallRecord | None = None
    observation: Observation | None = None
    error: str | None = None  # protocol error kind for assistant turns, or "tool_error" / "timeout"
    num_tokens: int = 0
    prefill_tokens: int = 0  # tokens run through the model before this turn's generation (assistant turns)
    seconds: float = 0.0


@dataclass
class Trajectory:
    task: Task
    system_prompt: str = ""
    user_prompt: str = ""
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    stop_reason: str = ""  # answer | max_turns | max_tokens | error
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    #: log-probability of each token under the sampling distribution (0.0 on non-policy tokens)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    visual_tokens: int = 0
    initial_frame_times: list[float] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    #: the episode as one forward's inputs, kept by ``Agent(keep_model_inputs=True)`` so RL trains on what the
    #: rollout encoded instead of encoding it again; in memory only (never saved)
    model_inputs: Any = field(default=None, repr=False, compare=False)

    # ----- views -----------------------------------------------------------------------------------
    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        """The calls the policy made (tool turns repeat the tool's name in ``tool_call`` but are not calls)."""
        return [t.tool_call for t in self.turns if t.role == "assistant" and t.tool_call is not None]

    @property
    def observations(self) -> list[Observation]:
        return [t.observation for t in self.turns if t.observation is not None]

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.prompt_length]

    @property
    def response_ids(self) -> list[int]:
        return self.token_ids[self.prompt_length:]

    @property
    def response_mask(self) -> list[int]:
        """verl's name: 1 on policy tokens, 0 on observation tokens, over the response part only."""
        return self.loss_mask[self.prompt_length:]

    # ----- serialisation ---------------------------------------------------------------------------
    def to_dict(self, image_dir: str | os.PathLike | None = None, relative_to: str | os.PathLike | None = None
                ) -> dict[str, Any]:
        """A JSON-ready dict; observation images are written as PNGs under ``image_dir``."""
        turns = []
        for k, turn in enumerate(self.turns):
            d: dict[str, Any] = {
                "role": turn.role, "text": turn.text, "error": turn.error, "num_tokens": turn.num_tokens,
                "prefill_tokens": turn.prefill_tokens, "seconds": turn.seconds,
                "tool_call": asdict(turn.tool_call) if turn.tool_call else None,
            }
            if turn.observation is not None:
                obs = turn.observation
                paths = []
                if obs.images:
                    if image_dir is None:
                        raise ValueError("this trajectory has images: pass image_dir to save them")
                    folder = Path(image_dir)
                    folder.mkdir(parents=True, exist_ok=True)
                    for j, im in enumerate(obs.images):
                        p = folder / f"turn{k:02d}_img{j:02d}.png"
                        im.save(p)
                        paths.append(os.path.relpath(p, relative_to) if relative_to else str(p))
                d["observation"] = {"text": obs.text, "images": paths, "image_labels": obs.image_labels,
                                    "is_error": obs.is_error, "handles": obs.handles, "data": obs.data}
            turns.append(d)
        plain = replace(self, turns=[], model_inputs=None)  # asdict would deep-copy the tensors
        out = {k: v for k, v in asdict(plain).items() if k not in ("turns", "task", "model_inputs")}
        out["task"] = asdict(self.task)
        out["turns"] = turns
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], base_dir: str | os.PathLike | None = None) -> "Trajectory":
        turns = []
        for t in d["turns"]:
            obs = None
            if t.get("observation") is not None:
                o = t["observation"]
                images = []
                for p in o["images"]:
                    path = Path(base_dir, p) if base_dir and not os.path.isabs(p) else Path(p)
                    with Image.open(path) as im:
                        images.append(im.convert("RGB"))
                obs = Observation(text=o["text"], images=images, image_labels=o["image_labels"],
                                  is_error=o["is_error"], handles=o["handles"], data=o.get("data", {}))
            call = ToolCallRecord(**t["tool_call"]) if t.get("tool_call") else None
            turns.append(Turn(role=t["role"], text=t["text"], tool_call=call, observation=obs, error=t["error"],
                              num_tokens=t["num_tokens"], prefill_tokens=t["prefill_tokens"], seconds=t["seconds"]))
        fields = {k: v for k, v in d.items() if k not in ("turns", "task")}
        return cls(task=Task(**d["task"]), turns=turns, **fields)


def save_jsonl(trajectories: Iterable[Trajectory], path: str | os.PathLike, append: bool = False) -> Path:
    """Write trajectories one per line; images go to ``<path stem>_images/<n>/``. Returns the image folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image_root = path.with_name(path.stem + "_images")
    start = sum(1 for _ in open(path, encoding="utf-8")) if append and path.exists() else 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for n, traj in enumerate(trajectories, start=start):
            d = traj.to_dict(image_dir=image_root / f"{n:06d}", relative_to=path.parent)
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return image_root


def load_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Read trajectories written by :func:`save_jsonl` (images loaded from the folder beside it)."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc})") from None
            try:
                traj = Trajectory.from_dict(d, base_dir=path.parent)
            except (KeyError, TypeError, OSError) as exc:
                raise ValueError(f"{path}:{line_no}: not a trajectory ({type(exc).__name__}: {exc})") from None
            yield traj
