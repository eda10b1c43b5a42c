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

from mmagent.eval.synth.families import EVENT_COLOURS, LETTERS, SynthConfig, option_values
from mmagent.eval.synth.render import SHAPES
from mmagent.eval.synth.perception import (blob_colour, classify_shape, find_shape, frame_colour,
                                           read_label_by_synthesis, read_label_sharp)
from mmagent.policy.base import Generation, Policy, Session
from mmagent.policy.render import MediaBudget, View
from mmagent.protocol import format_tool_call
from mmagent.toolbox.base import Observation
from mmagent.trajectory import Task

#: the toolbox the toy world's tasks need
SYNTH_TOOLS = ("resample_frames", "zoom", "web_search")
#: view pixels of the oracle's zoom box around a tag (a tag is about 5x6 view pixels: +-5 pixels of slack)
TAG_ZOOM_SIDE = 16
#: least height of the zoom box around a sign (the sign is about 29x6 view pixels)
SIGN_ZOOM_SIDE = 12
#: a grounding boundary is refined until the frames bracket it this tightly (seconds)
BOUNDARY_TOLERANCE_S = 0.3


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
    #: the colour read off each frame of observation k, read once (every later turn looks at them all again)
    frame_colours: dict[int, list[str]] = field(default_factory=dict)

    def see(self, observation: Observation, images: list[Image.Image]) -> None:
        """Record what a tool returned: its observation and its images as the policy was shown them."""
        self.observations.append(observation)
        self.shown.append(images)


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
        session.state.see(view.observation, view.images)
        return 0


# ----- the plans ------------------------------------------------------------------------------------
def next_turn(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    family = state.task.task_type
    plan = {"video_qa": _video_qa, "grounding": _grounding, "image_qa": _image_qa, "geolocation": _geolocation}
    if family not in plan:
        raise ValueError(f"no oracle plan for task type {family!r}")
    return plan[family](state, cfg, use_tools)


def article(word: str) -> str:
    """``word`` with its indefinite article: "a red", "an orange"."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _answer(think: str, answer: str) -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


def choose(think: str, values: Sequence[str], value: str) -> str:
    """The final turn of a multiple-choice item: ``think``, then ``value`` held against each option in turn
    until one matches ("cyan vs A. red: no. cyan vs B. cyan: yes."), then that option's letter.

    Why the comparison is written out: a tiny model has to find the letter of the option that names what it
    saw. Answered directly after the think, that lookup stayed at chance (0.25) for 1,200 drill steps
    (128-wide 4-layer model, 16 rounds a step); written as this scan, where each decision compares two words
    a few tokens apart and the letter is the last one written, it was right on 0.78 of fresh rounds after 800."""
    k = list(values).index(value)
    scan = " ".join(f"{value} vs {LETTERS[i]}. {values[i]}: {'yes' if i == k else 'no'}." for i in range(k + 1))
    return _answer(f"{think} {scan}", LETTERS[k])


def _call(think: str, name: str, arguments: dict) -> str:
    return f"<think>{think}</think>\n" + format_tool_call(name, arguments)


def _guess(task: Task) -> str:
    """A fixed pseudo-random option letter per task: what guessing looks like."""
    return LETTERS[zlib.crc32(task.id.encode()) % len(task.options or LETTERS)]


def _read_event(task: Task, frames: Sequence[tuple[float, Image.Image]]) -> tuple[tuple[str, str], float] | None:
    """((colour, shape), time) of the largest flash among the frames, or None; the asked attribute is read
    among the options' values."""
    best = None
    for t, im in frames:
        mask = find_shape(im)
        if mask is not None and (best is None or mask.sum() > best[2].sum()):
            best = (t, im, mask)
    if best is None:
        return None
    t, im, mask = best
    values = option_values(task)
    asks_colour = task.metadata["asks"] == "colour"
    colour = blob_colour(im, mask, values if asks_colour else EVENT_COLOURS)
    shape = classify_shape(mask, SHAPES if asks_colour else values)
    return (colour, shape), t


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
        (colour, shape), t = seen
        value = colour if task.metadata["asks"] == "colour" else shape
        return choose(f"The frame at {t:.2f}s shows {article(colour)} {shape}.", values, value)
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


def _screens(state: OracleState, index: int) -> list[tuple[float, str]]:
    """(time, screen colour) of each frame of observation ``index``, as its label writes the time."""
    if index not in state.frame_colours:
        state.frame_colours[index] = [frame_colour(im, state.task.metadata["colours"]) for im in state.shown[index]]
    times = state.observations[index].data.get("timestamps", [])
    return [(round(t, 2), seen) for t, seen in zip(times, state.frame_colours[index])]


def _hits(state: OracleState, index: int, colour: str) -> list[tuple[float, bool]]:
    """(time, shows ``colour``) of each frame of observation ``index``."""
    return [(t, seen == colour) for t, seen in _screens(state, index)]


def describe_screens(frames: Sequence[tuple[float, str]]) -> str:
    """Every frame's screen colour with its time label, in order: "The screen is red at 3.75s, cyan at 11.25s."

    The ``screen`` drill writes it (naming each frame is what a vision tower pre-trained on screens does) and
    a look in words (``grounding_text``) shows it; a grounding think writes each entry held against the asked
    colour instead (:func:`scan_screens`)."""
    return "The screen is " + ", ".join(f"{c} at {t:.2f}s" for t, c in frames) + "."


def scan_screens(frames: Sequence[tuple[float, str]], colour: str, clip: tuple[float, float],
                 start: tuple[float, float], end: tuple[float, float]) -> str:
    """Every frame of a look named and held against the asked colour, each boundary written where it shows:
    "red at 22.50s vs cyan: no, cyan at 37.50s vs cyan: yes (starts between 22.50s and 37.50s), ...".

    ``clip`` is the look's window; ``start`` = (last frame before the colour, first frame of it) and ``end`` =
    (last frame of it, first frame after it) over every look so far (the video's ends where no frame is
    known). A boundary is written in this look when both its times lie in the window, at its later frame if
    this look shows it, else at its earlier one (the window's end is a frame of an earlier look).

    Why this form: a tiny model given the list and the asked colour did not learn where the colour comes and
    goes (the question's colour stands far from each entry; marking each entry "yes" or "no" without the
    colour beside it was not learned either), but holding each entry against the colour written next to it,
    as :func:`choose` does for the option letter, was (README, "Grounding")."""
    times = [t for t, _ in frames]

    def shown(t: float) -> int | None:
        return next((k for k, u in enumerate(times) if abs(u - t) < 1e-6), None)

    marks: dict[int, list[str]] = {}
    for word, (a, b) in (("starts", start), ("ends", end)):
        if a < clip[0] - 1e-6 or b > clip[1] + 1e-6:
            continue
        k = shown(b)
        if k is None:
            k = shown(a)
        if k is not None:
            marks.setdefault(k, []).append(f" ({word} between {a:.2f}s and {b:.2f}s)")
    return ", ".join(f"{c} at {t:.2f}s vs {colour}: {'yes' if c == colour else 'no'}" + "".join(marks.get(k, []))
                     for k, (t, c) in enumerate(frames)) + "."


def _grounding(state: OracleState, cfg: SynthConfig, use_tools: bool) -> str:
    """With tools: look at the whole video with labelled frames, then between the last frame before the colour
    and the first frame of it until they are at most :data:`BOUNDARY_TOLERANCE_S` apart, the same at the end,
    and answer from the first frame of the colour to the first frame after it. Every number the plan writes
    is a frame time a tool printed (copying, not arithmetic: a tiny policy can learn it).

    Every think after the first look first names each frame just returned, held against the asked colour,
    with a boundary written where the colour comes or goes (:func:`scan_screens`), then states both
    boundaries as known so far (:func:`grounding_state`), so each number is copied from the observation just
    returned or from the same place in the turn before, never from an observation several turns back: the
    answer's start is found in the third look but written in the sixth turn. A closer look
    asks for no more frames than its window holds (:func:`closer_frames`)."""
    task = state.task
    colour = task.metadata["colour"]
    duration = float(task.metadata["duration"])
    if not use_tools:
        names = task.metadata["colours"]
        brackets = _grounding_brackets([(t, frame_colour(im, names) == colour) for t, im in state.first_frames],
                                       cfg.fps, duration)
        if brackets is None:
            return _answer(f"I never see a {colour} screen, so I guess the whole video.", f"[0.0, {duration:.1f}]")
        (s_lo, s_hi), (e_lo, e_hi) = brackets
        s, e = (s_lo + s_hi) / 2, (e_lo + e_hi) / 2
        return _answer(f"The screen is {colour} from about {s:.1f}s to {e:.1f}s.", f"[{s:.1f}, {e:.1f}]")
    if not state.observations:
        return _call(f"I will look at the whole {duration:g} s video with labelled frames to find the {colour} "
                     "screen.", "resample_frames", {"start": 0.0, "end": duration, "num_frames": cfg.probe_frames})
    samples = [s for k in range(len(state.observations)) for s in _hits(state, k, colour)]
    hits = sorted(t for t, on in samples if on)
    if not hits:
        return _answer(f"I never see a {colour} screen, so I guess the whole video.", f"[0.0, {duration:.1f}]")
    first, last = hits[0], hits[-1]
    before = max((t for t, on in samples if not on and t < first), default=0.0)
    after = min((t for t, on in samples if not on and t > last), default=duration)
    look = state.observations[-1].data
    clip = (float(look.get("start", 0.0)), float(look.get("end", duration)))
    known = scan_screens(_screens(state, len(state.observations) - 1), colour, clip, (before, first),
                         (last, after)) + " " + grounding_state(colour, (before, first), (last, after))
    if first - before > BOUNDARY_TOLERANCE_S:
        return _call(f"{known} I look closer at the start.", "resample_frames",
                     {"start": before, "end": first, "num_frames": closer_frames(before, first, cfg)})
    if after - last > BOUNDARY_TOLERANCE_S:
        return _call(f"{known} I look closer at the end.", "resample_frames",
                     {"start": last, "end": after, "num_frames": closer_frames(last, after, cfg)})
    return _answer(known, f"[{first:.2f}, {after:.2f}]")


def closer_frames(start: float, end: float, cfg: SynthConfig) -> int:
    """Frames to ask for in a closer look at [start, end]: :attr:`SynthConfig.probe_frames`, or one per video
    frame when the window holds fewer, so no two frames returned are the same frame with the same label (a
    look of eight over one second returned each of four frames twice, and a policy that names each frame in
    turn lost its place among the repeated labels)."""
    return max(1, min(cfg.probe_frames, round((end - start) * cfg.fps)))


def grounding_state(colour: str, start: tuple[float, float], end: tuple[float, float]) -> str:
    """What a grounding episode knows of both boundaries: ``start`` = (last frame before the colour, first
    frame of it), ``end`` = (last frame of it, first frame after it); a boundary bracketed within
    :data:`BOUNDARY_TOLERANCE_S` is written as the one time the answer takes (the first frame of the colour,
    the first frame after it)."""
    (before, first), (last, after) = start, end
    head = (f"starts at {first:.2f}s" if first - before <= BOUNDARY_TOLERANCE_S
            else f"starts between {before:.2f}s and {first:.2f}s")
    tail = (f"is gone at {after:.2f}s" if after - last <= BOUNDARY_TOLERANCE_S
            else f"ends between {last:.2f}s and {after:.2f}s")
    return f"The {colour} screen {head} and {tail}."


def zoom_box(box: Sequence[int], source_size: tuple[int, int], view_size: tuple[int, int], side: int) -> list[int]:
    """The zoom box (view pixels) for a label at ``box`` = (x, y, w, h) of the source: at least ``side`` pixels
    each way and the label's size plus 4, centred on the label (so a box a few pixels off still holds the
    whole label: the zoom tolerates it)."""
    (src_w, src_h), (vw, vh) = source_size, view_size
    x, y, w, h = box
    cx, cy = (x + w / 2) * vw / src_w, (y + h / 2) * vh / src_h
    bw, bh = max(side, math.ceil(w * vw / src_w) + 4), max(side, math.ceil(h * vh / src_h) + 4)
    x1 = min(max(0, round(cx - bw / 2)), vw - bw)
    y1 = min(max(0, round(cy - bh / 2)), vh - bh)
    return [x1, y1, x1 + bw, y1 + bh]


def _view_box(state: OracleState, box: Sequence[int], side: int) -> list[int]:
    return zoom_box(box, state.source_size, state.first_image.size, side)


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
        return choose(f"The {label['colour']} tag is tiny; it looks most like {text}.", values, text)
    if not state.observations:
        return _call(f"The {label['colour']} tag is too small to read. I will zoom in on it.", "zoom",
                     {"bbox": _view_box(state, label["box"], TAG_ZOOM_SIDE), "source": "image"})
    text = _read_zoomed_label(state, label)
    if text is None:
        return _answer("The zoom missed the tag, so I guess.", _guess(task))
    return choose(f"The zoomed {label['colour']} tag reads {text}.", values, text)


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
        return _call(f"The zoomed green sign reads {text.title()}. I will search for where that is.", "web_search",
                     {"query": text.title()})
    return _call("The green road sign is too small to read. I will zoom in on it.", "zoom",
                 {"bbox": _view_box(state, label["box"], SIGN_ZOOM_SIDE), "source": "image"})
