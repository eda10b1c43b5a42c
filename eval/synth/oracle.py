"""Oracle agents for the toy world: the calls a perfect agent makes, and what it can do without tools.

:class:`OraclePolicy` is a :class:`~mmagent.policy.base.Policy` that writes its turns from a plan
instead of a model, so an oracle episode runs through the real :class:`~mmagent.agent.Agent`: the real
tools run on the item's media and their real observations come back. It is shown the very views the agent
renders for a model (:mod:`mmagent.policy.render`: same pixel budget, same resizing), and it *reads its
answers out of those views* with :mod:`mmagent.eval.synth.perception` — it knows where to look (the
generator's layout, from the session's task) but never reads the answer from the ground truth. Reading text
means picking, among the item's candidate texts (the options, or the city's name and three same-length
decoys), the one the pixels match. So:

* with tools, a right answer proves the tool's observation carried the information (SFT cold-start
  trajectories are these episodes, with ``<think>`` lines saying what was seen);
* without tools (``use_tools=False``) it answers from the first look alone; the tests check it stays at
  chance on the families whose detail the first look cannot show.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Sequence

from PIL import Image

from mmagent.eval.synth.families import LETTERS, SynthConfig, option_values
from mmagent.eval.synth.perception import (blob_colour, classify_shape, find_shape, frame_colour,
                                           read_label_by_synthesis, read_label_sharp)
from mmagent.policy.base import Generation, Policy, Session
from mmagent.policy.render import MediaBudget, View
from mmagent.protocol import format_tool_call
from mmagent.toolbox.base import Observation
from mmagent.trajectory import Task

#: the toolbox the toy world's tasks need
SYNTH_TOOLS = ("resample_frames", "zoom", "web_search")
#: stop refining a grounding boundary once it is bracketed this tightly (seconds)
BOUNDARY_TOLERANCE_S = 1.5
#: pixels of the view added around a label when zooming on it
ZOOM_MARGIN = 1


@dataclass
class OracleState:
    """What an oracle episode has seen: the first look and every observation since, as shown."""

    task: Task
    first_frames: list[tuple[float, Image.Image]] = field(default_factory=list)
    first_image: Image.Image | None = None
    #: (width, height) of the item's image before it was fitted into the first look
    source_size: tuple[int, int] | None = None
    observations: list[Observation] = field(default_factory=list)
    shown: list[list[Image.Image]] = field(default_factory=list)  # each observation's images as fitted


@dataclass
class OracleSession(Session):
    state: OracleState | None = None


class OraclePolicy(Policy):
    """Writes each turn from the item's plan; ``use_tools=False`` answers from the first look only."""

    thread_safe_start = True

    def __init__(self, config: SynthConfig | None = None, use_tools: bool = True,
                 media_budget: MediaBudget | None = None) -> None:
        self.config = config or SynthConfig()
        self.media_budget = media_budget or self.config.media_budget()
        self.use_tools = use_tools

    def start(self, view: View, seed: int = 0, task: Task | None = None) -> OracleSession:
        if task is None:
            raise ValueError("the oracle plays a toy-world task: start it with the episode's task")
        state = OracleState(task=task)
        for part in view.parts:
            if part.video is not None:
                state.first_frames = list(zip(part.video.times, part.video.frames))
            elif part.image is not None:
                state.first_image, state.source_size = part.image, part.source_size
        return OracleSession(seed=seed, task=task, state=state)

    def generate(self, sessions: Sequence[OracleSession], max_new_tokens: int) -> list[Generation]:
        return [Generation(text=next_turn(s.state, self.config, self.use_tools), token_ids=[], logprobs=[],
                           truncated=False, prefill_tokens=0) for s in sessions]

    def observe(self, session: OracleSession, view: View) -> int:
        session.state.observations.append(view.observation)
        session.state.shown.append(view.images)
        return 0


# ----- the plans ------------------------------------------------------------------------------------
def next_turn(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    family = state.task.task_type
    plan = {"video_qa": _video_qa, "grounding": _grounding, "image_qa": _image_qa, "geolocation": _geolocation}
    if family not in plan:
        raise ValueError(f"no oracle plan for task type {family!r}")
    return plan[family](state, cfg, use_tools)


def _answer(think: str, answer: str) -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


def _call(think: str, name: str, arguments: dict) -> str:
    return f"<think>{think}</think>\n" + format_tool_call(name, arguments)


def _guess(task: Task) -> str:
    """A fixed pseudo-random option letter per task: what guessing looks like."""
    return LETTERS[zlib.crc32(task.id.encode()) % len(task.options or LETTERS)]


def _read_event(task: Task, frames: Sequence[tuple[float, Image.Image]]) -> tuple[str, float] | None:
    """The option value the frames show (the largest flash among them) and its time, or None."""
    best = None
    for t, im in frames:
        mask = find_shape(im)
        if mask is not None and (best is None or mask.sum() > best[2].sum()):
            best = (t, im, mask)
    if best is None:
        return None
    t, im, mask = best
    values = option_values(task)
    value = blob_colour(im, mask, values) if task.metadata["asks"] == "colour" else classify_shape(mask, values)
    return value, t


def _video_qa(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    task = state.task
    w0, w1 = task.metadata["window"]
    values = option_values(task)
    if not use_tools or state.observations:
        if state.observations:
            obs = state.observations[-1]
            frames = list(zip(obs.data.get("timestamps", []), state.shown[-1]))
        else:
            frames = [(t, im) for t, im in state.first_frames if w0 <= t <= w1]
        seen = _read_event(task, frames)
        if seen is None:
            return _answer(f"I see nothing between {w0} s and {w1} s, so I guess.", _guess(task))
        value, t = seen
        thing = "colour" if task.metadata["asks"] == "colour" else "shape"
        return _answer(f"The frame at {t:.2f}s shows the {thing}: {value}.", LETTERS[values.index(value)])
    return _call(f"The question is about {w0}-{w1} s; my first frames skip that moment. I will look closer.",
                 "resample_frames", {"start": float(w0), "end": float(w1), "num_frames": cfg.probe_frames})


def _grounding_brackets(samples: list[tuple[float, bool]], fps: float, duration: float
                        ) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Where the segment's start and end can lie given frames seen at times with (is target colour).

    A frame shown at time t is frame k = round(t * fps) covering [k / fps, (k + 1) / fps).
    """
    hits = sorted(round(t * fps) for t, on in samples if on)
    if not hits:
        return None
    misses = sorted(round(t * fps) for t, on in samples if not on)
    first, last = hits[0], hits[-1]
    before = [k for k in misses if k < first]
    after = [k for k in misses if k > last]
    start = ((before[-1] + 1) / fps if before else 0.0, first / fps)
    end = ((last + 1) / fps, after[0] / fps if after else duration)
    return start, end


def _grounding(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    task = state.task
    colour = task.metadata["colour"]
    names = task.metadata["colours"]
    duration = float(task.metadata["duration"])
    samples = [(t, frame_colour(im, names) == colour) for t, im in state.first_frames]
    for obs, shown in zip(state.observations, state.shown):
        samples += [(t, frame_colour(im, names) == colour) for t, im in zip(obs.data.get("timestamps", []), shown)]
    brackets = _grounding_brackets(samples, cfg.fps, duration)
    if brackets is None:
        return _answer(f"I never see a {colour} screen, so I guess the whole video.", f"[0.0, {duration:.1f}]")
    (s_lo, s_hi), (e_lo, e_hi) = brackets
    if use_tools:
        for (lo, hi), which in (((s_lo, s_hi), "starts"), ((e_lo, e_hi), "ends")):
            if hi - lo > BOUNDARY_TOLERANCE_S:
                return _call(f"The screen turns {colour} somewhere between {lo:.2f}s and {hi:.2f}s where it "
                             f"{which}; I will look closer there.", "resample_frames",
                             {"start": round(lo, 2), "end": round(hi, 2), "num_frames": cfg.probe_frames})
    s, e = (s_lo + s_hi) / 2, (e_lo + e_hi) / 2
    return _answer(f"The screen is {colour} from about {s:.1f}s to {e:.1f}s.", f"[{s:.1f}, {e:.1f}]")


def _view_box(state: OracleState, box: Sequence[int]) -> list[int]:
    """The label's box in the pixels of the view the policy saw, with a margin."""
    src_w, src_h = state.source_size
    vw, vh = state.first_image.size
    x, y, w, h = box
    return [max(0, math.floor(x * vw / src_w) - ZOOM_MARGIN), max(0, math.floor(y * vh / src_h) - ZOOM_MARGIN),
            min(vw, math.ceil((x + w) * vw / src_w) + ZOOM_MARGIN), min(vh, math.ceil((y + h) * vh / src_h) + ZOOM_MARGIN)]


def _read_zoomed_label(state: OracleState, label: dict) -> str | None:
    """Read the label from the last zoom observation (as shown to the policy), or None if it is not there."""
    for obs, shown in zip(reversed(state.observations), reversed(state.shown)):
        if "box_source" not in obs.data or not shown:
            continue
        bx1, by1, bx2, by2 = obs.data["box_source"]
        im = shown[0]
        sx, sy = im.width / (bx2 - bx1), im.height / (by2 - by1)
        x, y, w, h = label["box"]
        if x < bx1 or y < by1 or x + w > bx2 or y + h > by2:
            return None
        box = ((x - bx1) * sx, (y - by1) * sy, (x + w - bx1) * sx, (y + h - by1) * sy)
        text, _ = read_label_sharp(im, box, (w, h), label["candidates"], tuple(label["background"]))
        return text
    return None


def _read_label_in_first_look(state: OracleState, label: dict) -> str:
    text, _ = read_label_by_synthesis(state.first_image, None, tuple(label["box"]), label["candidates"],
                                      tuple(label["background"]))
    return text


def _image_qa(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    task = state.task
    label = task.metadata["label"]
    values = option_values(task)
    if not use_tools:
        text = _read_label_in_first_look(state, label)
        return _answer(f"The {label['colour']} tag is tiny; it looks most like {text}.", LETTERS[values.index(text)])
    if not state.observations:
        return _call(f"The {label['colour']} tag is too small to read. I will zoom in on it.", "zoom",
                     {"bbox": _view_box(state, label["box"]), "source": "image"})
    text = _read_zoomed_label(state, label)
    if text is None:
        return _answer("The zoom missed the tag, so I guess.", _guess(task))
    return _answer(f"The zoomed {label['colour']} tag reads {text}.", LETTERS[values.index(text)])


_COORDS = re.compile(r"at (\d+(?:\.\d+)?) ([NS]) (\d+(?:\.\d+)?) ([EW])")


def _coords_from_search(obs: Observation, name: str) -> tuple[float, float] | None:
    results = obs.data.get("results", [])
    ordered = [r for r in results if r["title"].split(",")[0].strip().upper() == name.upper()] + list(results)
    for r in ordered:
        if m := _COORDS.search(r.get("snippet", "")):
            lat = float(m.group(1)) * (1 if m.group(2) == "N" else -1)
            lon = float(m.group(3)) * (1 if m.group(4) == "E" else -1)
            return lat, lon
    return None


def _geolocation(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    task = state.task
    label = task.metadata["label"]
    if not use_tools:
        text = _read_label_in_first_look(state, label)
        lat, lon = label["candidate_coords"][label["candidates"].index(text)]
        return _answer(f"The sign is too small to read; it may say {text.title()}.", f"{lat:.2f}, {lon:.2f}")
    searches = [o for o in state.observations if "results" in o.data]
    if searches:
        name = searches[-1].data.get("query", "")
        found = _coords_from_search(searches[-1], name)
        if found is None:
            return _answer("The search found nothing useful, so I guess.", "0.00, 0.00")
        lat, lon = found
        return _answer(f"The search places {name.title()} at {lat:.2f}, {lon:.2f}.", f"{lat:.2f}, {lon:.2f}")
    if state.observations:
        text = _read_zoomed_label(state, label)
        if text is None:
            return _answer("The zoom missed the sign, so I guess.", "0.00, 0.00")
        return _call(f"The green sign reads {text.title()}. I will search for where that is.", "web_search",
                     {"query": text.title()})
    return _call("The green road sign is too small to read. I will zoom in on it.", "zoom",
                 {"bbox": _view_box(state, label["box"]), "source": "image"})
