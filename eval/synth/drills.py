"""Drills: fresh, never-repeating practice items that name what the toy world draws.

A real VLM comes to its agent training able to see and to copy: it was pre-trained on billions of
captioned images and documents. A tiny random model has neither, and a few hundred SFT episodes give
its vision one to three supervised tokens each. Drills stand in for that pre-training. Each is one
*round* of a conversation: what a tool (or the first look) shows, then the words an agent would write
about it, drawn with the toy world's own renderers from a fresh random generator every time (never the
evaluation items):

* ``flash`` — one, two, four or eight labelled frames of a video-QA window as ``resample_frames`` returns
  them; one to three frames show a coloured shape (or none do): "The frame at 47.25s shows a red star."
  The short ones teach colour and shape (measured: a single frame teaches colour in about 120 steps, eight
  frames from the start teach nothing in 300); the long ones teach which frame to name.
* ``screen`` — eight labelled frames of a grounding video: the colour of every frame with its time.
* ``tag`` / ``sign`` — a zoom (the real tool) on a tag or a road sign, the box a few pixels off as a
  model's would be: "The zoomed red tag reads 7." / "The green sign reads Tokyo."
* ``where`` — a scene at the first look's size: the zoom box around the named tag or the green sign.
* ``window`` / ``whole`` / ``search`` / ``option`` — language: copy a question's window or length into a
  ``resample_frames`` call, copy a search result's coordinates (fresh cities of the whole gazetteer,
  hemisphere letters to signs) into an answer, pick the option letter that names what was seen (written
  as the oracle's final turn writes it, :func:`mmagent.eval.synth.oracle.choose`: what was seen held
  against each option until one matches).
* ``video_answer`` / ``grounding_turn`` — an episode's later turn whole: the question, the oracle's calls and
  the labelled frames each returned, then its next turn; ``grounding_text`` is ``grounding_turn`` with every
  look returned as words (each frame's colour and time) instead of frames: the boundary decision alone.

Perception rounds also say what each image shows (``meta["images"]``, classes from :func:`image_heads`) for
the vision pre-training (:mod:`mmagent.training.vision_pretrain`), which also draws ``frames`` rounds (eight
frames, each its own shape or none; pictures without words) and ``digit_glyph`` / ``glyph`` rounds
(sixteen lone one-character labels on small crops at a zoom's scale: the characters tags and signs write,
learned where nothing else is in view before they are looked for in whole zooms).

Every answer is written the way the oracle's turns write it (:mod:`mmagent.eval.synth.oracle`), so that
what is drilled here is what the SFT episodes later need.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from mmagent.eval.synth import render
from mmagent.eval.synth.families import (EVENT_COLOURS, LABEL_PALETTE, LETTERS, LEVELS, PALETTE, SIGN_CHARS, SIGN_COLOUR,
                                         SIGN_WORDS, TAG_COLOURS, GroundingTimeline, SynthConfig,
                                         grounding_timeline, _IMAGE_QA_LEVELS, _mcq, city_pool,
                                         geolocation_scene, image_qa_scene, sign_cities)
from mmagent.eval.synth.oracle import (SIGN_ZOOM_SIDE, TAG_ZOOM_SIDE, OracleState, _answer, _call, article, choose,
                                       describe_screens, next_turn, zoom_box)
from mmagent.protocol import ToolCall, parse_turn
from mmagent.eval.synth.render import SHAPES
from mmagent.toolbox.base import Observation
from mmagent.toolbox.zoom import Zoom
from mmagent.toolbox.frames import draw_time, window_times

#: the drills a mix can name (``video_answer`` shows pixels too, inside a whole question-call-frames exchange)
KINDS = ("flash", "screen", "tag", "sign", "where", "window", "whole", "search", "option", "video_answer",
         "grounding_turn", "grounding_text")
#: kinds that show pixels (the perception drills); the rest are text only (the language drills)
PERCEPTION = ("flash", "screen", "tag", "sign", "where", "video_answer", "grounding_turn")


@dataclass
class Round:
    """One round: ``shown`` as a tool observation (labelled images) or as a first look (``view``, an image at
    the first look's size, with ``text`` as the question); then ``answer``, what the policy should write."""

    kind: str
    answer: str
    text: str = ""
    observation: Observation | None = None
    view: Image.Image | None = None
    meta: dict = field(default_factory=dict)
    #: for a round that is an episode's later turn: the agent's call between the question (``text``) and the
    #: ``observation``, shown as the assistant turn it was
    call: str = ""
    #: the exchanges (call, what it returned) before ``call``, for a round that is an episode's third turn or later
    history: list[tuple[str, Observation]] = field(default_factory=list)


#: what each image of a perception round shows, as classes the vision pre-training names
#: (:mod:`mmagent.training.vision_pretrain`): a round's ``meta["images"]`` holds one dict per image,
#: head name -> class
NONE = "none"


def image_heads() -> dict[str, tuple[str, ...]]:
    """Every label head and its classes: a flashed shape's colour and kind (or none), a screen's colour, a
    zoomed tag's character and colour, a zoomed sign's text (the closed list of cities and the sign words), a
    lone character on a glyph crop."""
    return {"colour": (NONE,) + tuple(EVENT_COLOURS), "shape": (NONE,) + tuple(SHAPES), "screen": tuple(PALETTE),
            "digit": tuple(_IMAGE_QA_LEVELS["easy"][1]), "tag_colour": tuple(TAG_COLOURS),
            "sign": tuple(sorted({c["name"].upper() for c in sign_cities()} | set(SIGN_WORDS))),
            "glyph": GLYPH_CHARS}


#: how many frames a ``flash`` round shows (drawn uniformly)
FLASH_FRAMES = (1, 2, 4, 8)


def _tool_times(cfg: SynthConfig, start: float, end: float, frames: int) -> list[float]:
    """The times of the frames ``resample_frames`` returns for [start, end]: each window time's own frame."""
    return [np.floor(t * cfg.fps + 1e-6) / cfg.fps for t in window_times(start, end, frames)]


def _frame_times(rng: np.random.Generator, cfg: SynthConfig, span: tuple[float, float], frames: int | None = None
                 ) -> tuple[float, float, list[float]]:
    """A window of ``span`` seconds somewhere in a video and the frame times ``resample_frames`` returns in it."""
    length = float(rng.uniform(*span))
    start = round(float(rng.uniform(0, 180 - length)), int(rng.integers(0, 3)))
    end = round(start + length, 2)
    times = _tool_times(cfg, start, end, frames or cfg.probe_frames)
    return start, end, times


def _frames_observation(frames: Sequence[np.ndarray], times: Sequence[float], start: float, end: float) -> Observation:
    """Frames as the ``resample_frames`` tool returns them: each stamped with its time, listed in the text."""
    images = []
    for frame, t in zip(frames, times):
        arr = np.ascontiguousarray(frame.copy())
        draw_time(arr, t)
        images.append(Image.fromarray(arr))
    labels = [f"{t:.2f}s" for t in times]
    text = (f"Video clip from {start:.2f} to {end:.2f} seconds: {len(images)} frames at " + ", ".join(labels)
            + " (times are seconds from the start of the video).")
    return Observation(text=text, images=images, image_labels=labels,
                       data={"start": start, "end": end, "timestamps": list(times)})


def _flashed_frames(rng: np.random.Generator, cfg: SynthConfig, times: Sequence[float], none_share: float = 0.0
                    ) -> tuple[list[np.ndarray], set[int], str, str]:
    """Frames of a drifting backdrop at ``times`` with one coloured shape in one to three consecutive of
    them: (frames, indices that show it, shape, colour). With ``none_share`` > 0 that share of the calls
    shows no shape at all (one more draw of ``rng``, made only then)."""
    s = cfg.frame_size
    backdrop = render.drifting_backdrop(s, rng)
    shape, colour = str(rng.choice(SHAPES)), str(rng.choice(EVENT_COLOURS))
    mask = render.shape_mask(shape, (float(rng.uniform(0.4, 0.6) * s), float(rng.uniform(0.4, 0.6) * s)),
                             float(rng.uniform(0.45, 0.5) * s), (s, s))
    n = len(times)
    shown: set[int] = set()
    if none_share == 0 or rng.random() > none_share:
        first = int(rng.integers(n))
        shown = set(range(first, min(n, first + int(rng.integers(1, 4)))))
    frames = []
    for k, t in enumerate(times):
        frame = backdrop(round(t * cfg.fps))
        if k in shown:
            frame[mask] = PALETTE[colour]
        frames.append(frame)
    return frames, shown, shape, colour


def flash(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    start, end, times = _frame_times(rng, cfg, (6, 12), int(rng.choice(FLASH_FRAMES)))
    frames, shown, shape, colour = _flashed_frames(rng, cfg, times, none_share=0.1)
    obs = _frames_observation(frames, times, start, end)
    images = [{"colour": colour, "shape": shape} if k in shown else {"colour": NONE, "shape": NONE}
              for k in range(len(times))]
    if not shown:
        return Round("flash", f"No frame between {start:.2f}s and {end:.2f}s shows a shape.", observation=obs,
                     meta={"images": images})
    t = times[min(shown)]
    return Round("flash", f"The frame at {t:.2f}s shows {article(colour)} {shape}.", observation=obs,
                 meta={"colour": colour, "shape": shape, "time": t, "images": images})


def video_answer(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    """A video-QA episode's last turn on fresh frames: the question with its options (as the family asks it),
    the agent's ``resample_frames`` call on its window, the frames the tool returns (a shape in one to three);
    the answer is the oracle's final turn: what the frame shows, held against each option, the letter.

    Why, beside ``flash`` and ``option``: in an episode the options stand a few hundred tokens (the frames)
    before the answer, not next to it. Measured: a model that scanned the options right in 0.58 of ``option``
    rounds, after SFT, wrote the seen colour in place of the option's ("blue vs A. blue: yes") and chose at chance
    (0.22 on 50 held-out video-QA items); after 400 more steps mostly of these rounds (0.73 exact on fresh
    ones), the same SFT scored 0.68 with tools against 0.20 for its no-tool twin."""
    duration = int(rng.choice([60, 120, 180]))
    w0 = int(rng.integers(1, duration - 14))
    w1 = w0 + int(rng.integers(6, 13))
    times = _tool_times(cfg, float(w0), float(w1), cfg.probe_frames)
    frames, shown, shape, colour = _flashed_frames(rng, cfg, times)
    if rng.random() < 0.5:
        question = f"What colour is the shape that appears between {w0} s and {w1} s?"
        value, (options, letter) = colour, _mcq(rng, colour, EVENT_COLOURS)
    else:
        question = f"Which shape appears between {w0} s and {w1} s?"
        value, (options, letter) = shape, _mcq(rng, shape, SHAPES)
    values = [o.split(". ", 1)[1] for o in options]
    text = f"This is a video with duration {duration:.2f} seconds. {question}\nOptions:\n" + "\n".join(options)
    call = _call(f"The question is about {w0}-{w1} s; my first frames skip that moment. I will look closer.",
                 "resample_frames", {"start": float(w0), "end": float(w1), "num_frames": cfg.probe_frames})
    answer = choose(f"The frame at {times[min(shown)]:.2f}s shows {article(colour)} {shape}.", values, value)
    return Round("video_answer", answer, text=text, call=call,
                 observation=_frames_observation(frames, times, float(w0), float(w1)),
                 meta={"colour": colour, "shape": shape, "letter": letter})


def grounding_exchanges(timeline: GroundingTimeline, cfg: SynthConfig, in_words: bool = False
                        ) -> tuple[list[tuple[str, Observation]], str]:
    """The tool oracle's grounding episode on ``timeline``: each call with the labelled frames
    ``resample_frames`` returns for it, and the last turn (the answer). ``in_words``: each look is returned as
    words instead of frames (:func:`_words_observation`; nothing is drawn), the oracle reading each frame's
    colour off the timeline where it would read it off the pixels: the same turns, in words."""
    state = OracleState(task=timeline.task("drill"))
    exchanges: list[tuple[str, Observation]] = []
    while True:
        text = next_turn(state, cfg, use_tools=True)
        call = parse_turn(text).action
        if not isinstance(call, ToolCall) or len(exchanges) >= 8:
            return exchanges, text
        start, end = float(call.arguments["start"]), float(call.arguments["end"])
        times = _tool_times(cfg, start, end, int(call.arguments["num_frames"]))
        shown = [round(t * cfg.fps) for t in times]
        if in_words:
            colours = [str(timeline.colours[k]) for k in shown]
            obs = _words_observation(times, colours, start, end)
            state.see(obs, [])
            state.frame_colours[len(state.observations) - 1] = colours
        else:
            obs = _frames_observation([timeline.draw(k) for k in shown], times, start, end)
            state.see(obs, obs.images)
        exchanges.append((text, obs))


def _words_observation(times: Sequence[float], colours: Sequence[str], start: float, end: float) -> Observation:
    """A look as words: the tool's own text, then each frame's screen colour with its time label as a grounding
    ``screen`` drill names them (:func:`mmagent.eval.synth.oracle.describe_screens`); no images."""
    text = (f"Video clip from {start:.2f} to {end:.2f} seconds: {len(times)} frames, in words. "
            + describe_screens([(round(t, 2), c) for t, c in zip(times, colours)]))
    return Observation(text=text, data={"start": start, "end": end, "timestamps": list(times)})


def _grounding_round(kind: str, rng: np.random.Generator, cfg: SynthConfig, in_words: bool) -> Round:
    timeline = grounding_timeline(cfg, rng, str(rng.choice(LEVELS)))
    exchanges, text = grounding_exchanges(timeline, cfg, in_words=in_words)
    turns = [c for c, _ in exchanges] + [text]
    k = int(rng.integers(1, len(turns)))
    return Round(kind, turns[k], text=timeline.question, call=exchanges[k - 1][0],
                 observation=exchanges[k - 1][1], history=exchanges[:k - 1],
                 meta={"truth": timeline.truth, "turn": k, "turns": len(turns)})


def grounding_turn(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    """One later turn of a grounding episode on a fresh video: the question, the tool oracle's calls so far
    and the labelled frames each returned, then the oracle's next turn (a closer look at a boundary, or the
    answer), the turn drawn uniformly among the episode's second and later ones.

    The turns are the oracle's own (:func:`mmagent.eval.synth.oracle.next_turn`, shown the frames as the
    ``resample_frames`` tool returns them), so this is a fresh SFT episode's turn, never an evaluation item's.
    Why, beside ``screen`` and ``whole``: a turn names every frame just returned and holds it against the asked
    colour (:func:`mmagent.eval.synth.oracle.scan_screens`), then copies the boundaries' frame times out of those
    words (and the rest of what it knows from the turn before, :func:`mmagent.eval.synth.oracle.grounding_state`)
    with several hundred tokens of earlier frames in between: what ``video_answer`` showed for video QA
    (drilled apart, the pieces did not hold in the episode's own shape)."""
    return _grounding_round("grounding_turn", rng, cfg, in_words=False)


def grounding_text(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    """:func:`grounding_turn` with every look returned as words (each frame's colour and time label) instead of
    frames: the same turn to write, no pixels (1,370 tokens a round on average against 2,000, 40 rounds each).
    What it isolates is the boundary decision, which ``grounding_turn`` left unlearned in 200 steps (README,
    "Grounding"): the frame list is copied from the words, and where the asked colour comes and goes must be
    found in it and carried forward from the turn before."""
    return _grounding_round("grounding_text", rng, cfg, in_words=True)


def frames(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    """Labelled frames for the vision pre-training only (no words): each of eight frames shows its own
    shape (or, one time in seven, none), so every image is an example of what a flash looks like."""
    start, end, times = _frame_times(rng, cfg, (6, 90))
    s = cfg.frame_size
    backdrop = render.drifting_backdrop(s, rng)
    shown, labels = [], []
    for t in times:
        frame = backdrop(round(t * cfg.fps))
        if rng.random() < 1 / 7:
            labels.append({"colour": NONE, "shape": NONE})
        else:
            shape, colour = str(rng.choice(SHAPES)), str(rng.choice(EVENT_COLOURS))
            centre = (float(rng.uniform(0.35, 0.65) * s), float(rng.uniform(0.35, 0.65) * s))
            frame[render.shape_mask(shape, centre, float(rng.uniform(0.42, 0.52) * s), (s, s))] = PALETTE[colour]
            labels.append({"colour": colour, "shape": shape})
        shown.append(frame)
    return Round("frames", "", observation=_frames_observation(shown, times, start, end), meta={"images": labels})


def screen(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    start, end, times = _frame_times(rng, cfg, (2, 90))
    names = list(PALETTE)
    colours, prev = [], None
    k = 0
    while len(colours) < len(times):  # runs of one colour, neighbours differ
        c = str(rng.choice([n for n in names if n != prev]))
        colours += [c] * int(rng.integers(1, 5))
        prev = c
    colours = colours[:len(times)]
    s = cfg.frame_size
    blocker = render.muted(rng, 40, 80)
    frames = []
    for t, c in zip(times, colours):
        frame = np.empty((s, s, 3), np.uint8)
        frame[:] = PALETTE[c]
        x = int((s - 16) * (0.5 + 0.5 * np.sin(round(t * cfg.fps) / 15.0)))
        frame[s - 24:s - 8, x:x + 16] = blocker
        frames.append(frame)
        k += 1
    obs = _frames_observation(frames, times, start, end)
    answer = describe_screens(list(zip(times, colours)))
    return Round("screen", answer, observation=obs,
                 meta={"colours": colours, "images": [{"screen": c} for c in colours]})


def _zoom_round(kind: str, rng: np.random.Generator, cfg: SynthConfig, canvas: np.ndarray,
                box: tuple[int, int, int, int], side: int, answer: str, colour: str, text: str,
                labels: dict[str, str]) -> Round:
    """Zoom (the real tool) on ``box`` of ``canvas``, the box moved by up to 3 view pixels each way."""
    from mmagent.media import EpisodeMedia

    image = Image.fromarray(canvas)
    view = (round(image.width / 8), round(image.height / 8))
    bbox = zoom_box(box, image.size, view, side)
    dx, dy = (int(v) for v in rng.integers(-3, 4, size=2))
    bbox = [bbox[0] + dx, bbox[1] + dy, bbox[2] + dx, bbox[3] + dy]
    media = EpisodeMedia(image=image)
    media.set_view_size("image", view)
    obs = Zoom().run({"bbox": bbox, "source": "image"}, media)
    return Round(kind, answer, observation=obs, meta={"bbox": bbox, "label_box": list(box), "text": text,
                                                      "background": list(LABEL_PALETTE[colour]), "images": [labels]})


def _patch_scene(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    return render.scene(size, rng, buildings=3)


def tag(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    canvas = _patch_scene(rng, (320, 320))
    colour, text = str(rng.choice(TAG_COLOURS)), str(rng.choice(list(_IMAGE_QA_LEVELS["easy"][1])))
    w, h = render.label_size(1)
    x, y = (int(v) // render.CHECKER_CELL * render.CHECKER_CELL for v in rng.integers(100, 320 - 100 - w, size=2))
    render.draw_label(canvas, text, (x, y, w, h), LABEL_PALETTE[colour], rng)
    return _zoom_round("tag", rng, cfg, canvas, (x, y, w, h), TAG_ZOOM_SIDE,
                       f"The zoomed {colour} tag reads {text}.", colour, text, {"digit": text, "tag_colour": colour})


def sign(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    canvas = _patch_scene(rng, (512, 320))
    if rng.random() < 0.8:
        colour, text = SIGN_COLOUR, str(rng.choice([c["name"] for c in sign_cities()])).upper()
    else:
        colour, text = str(rng.choice(TAG_COLOURS)), str(rng.choice(SIGN_WORDS))
    w, h = render.label_size(SIGN_CHARS)
    x = int(rng.integers(80, 512 - 80 - w)) // 2 * 2
    y = int(rng.integers(80, 320 - 80 - h)) // 2 * 2
    render.draw_label(canvas, text, (x, y, w, h), LABEL_PALETTE[colour], rng)
    return _zoom_round("sign", rng, cfg, canvas, (x, y, w, h), SIGN_ZOOM_SIDE,
                       f"The zoomed {colour} sign reads {text.title()}.", colour, text, {"sign": text})


#: side (view pixels) of a glyph crop: 3x3 merged tokens, small enough to draw a thousand a second
GLYPH_SIDE = 84
#: view pixels per source pixel at which a zoom shows a tag: its box (TAG_ZOOM_SIDE first-look pixels, eight
#: source pixels each, padded by the zoom tool) fitted to the observation's 224 pixels (about 1.46)
TAG_VIEW_SCALE = math.sqrt(SynthConfig.observation_pixels) / (TAG_ZOOM_SIDE * 8 * (1 + 2 * Zoom().pad_ratio))
#: scales a ``glyph`` crop is drawn at: around the tag's and a sign's (about 1.15), a little wider
GLYPH_SCALE = (1.0, 1.7)
#: characters a ``glyph`` crop shows: every digit a tag and every letter a sign writes
GLYPH_CHARS = tuple(string.digits + string.ascii_uppercase)


def _glyph_crops(kind: str, rng: np.random.Generator, chars: Sequence[str], scales: tuple[float, float],
                 count: int) -> Round:
    w, h = render.label_size(1)
    images, labels, boxes = [], [], []
    for _ in range(count):
        scale = float(rng.uniform(*scales))
        size = max(round(GLYPH_SIDE / scale), max(w, h) + 2)
        canvas = np.empty((size, size, 3), np.uint8)
        canvas[:] = render.muted(rng)
        c = render.CHECKER_CELL
        x, y = (int(rng.integers(0, size - d + 1)) // c * c for d in (w, h))
        char, colour = str(rng.choice(list(chars))), str(rng.choice(list(LABEL_PALETTE)))
        render.draw_label(canvas, char, (x, y, w, h), LABEL_PALETTE[colour], rng)
        images.append(Image.fromarray(canvas).resize((GLYPH_SIDE, GLYPH_SIDE), Image.BICUBIC))
        labels.append({"glyph": char})
        k = GLYPH_SIDE / size
        boxes.append({"box": [x * k, y * k, (x + w) * k, (y + h) * k], "background": list(LABEL_PALETTE[colour])})
    obs = Observation(text=f"{count} labels, one character each.", images=images,
                      image_labels=[str(k) for k in range(count)])
    return Round(kind, "", observation=obs, meta={"images": labels, "labels": boxes})


def digit_glyph(rng: np.random.Generator, cfg: SynthConfig, count: int = 16) -> Round:
    """Sixteen lone one-digit tags, each on its own small crop at exactly the scale a tag's zoom shows it
    (checker ink, grain): for the vision pre-training only (no words), its first steps.

    Measured (64-wide tower, 64 crops a step, constant rate 1e-3): read from whole 224-px zoom views from the
    start, digits stay at chance after 800 x 32 views; on these crops at scale 1.75 they are read at 0.72
    after 400 steps and 0.99 after 700, at the tag's true 1.46 at 0.63 after 700, and whole zoom views then
    follow (0.35 after 600 steps of 32). All 36 characters at a range of scales (``glyph``) stay at chance
    for 800 steps from a random tower, and climb once the tower has learned digits here first."""
    return _glyph_crops("digit_glyph", rng, string.digits, (TAG_VIEW_SCALE, TAG_VIEW_SCALE), count)


def glyph(rng: np.random.Generator, cfg: SynthConfig, count: int = 16) -> Round:
    """Sixteen lone one-character labels (every digit and letter) on small crops at scales around a tag's
    and a sign's zoom: for the vision pre-training only, after :func:`digit_glyph`."""
    return _glyph_crops("glyph", rng, GLYPH_CHARS, GLYPH_SCALE, count)


def where(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    from mmagent.eval.synth.families import LEVELS, fitted_size

    level = str(rng.choice(LEVELS))
    view = fitted_size(cfg.image_size, cfg.image_size, 28 * 28 * 4, cfg.image_view_pixels)
    if rng.random() < 0.6:
        canvas, _, colours, boxes = image_qa_scene(cfg, rng, level)
        k = int(rng.integers(len(boxes)))
        question = f"Where is the small {colours[k]} tag?"
        bbox = zoom_box(boxes[k], (cfg.image_size, cfg.image_size), view, TAG_ZOOM_SIDE)
        answer = _call(f"The {colours[k]} tag is too small to read. I will zoom in on it.", "zoom",
                       {"bbox": bbox, "source": "image"})
    else:
        name = str(rng.choice([c["name"] for c in sign_cities()])).upper()
        canvas, _, boxes = geolocation_scene(cfg, rng, level, name)
        question = "Where is the green road sign?"
        bbox = zoom_box(boxes[0], (cfg.image_size, cfg.image_size), view, SIGN_ZOOM_SIDE)
        answer = _call("The green road sign is too small to read. I will zoom in on it.", "zoom",
                       {"bbox": bbox, "source": "image"})
    shown = Image.fromarray(canvas).resize(view, Image.BICUBIC)
    return Round("where", answer, text=question, view=shown, meta={"bbox": bbox})


def window(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    w0 = int(rng.integers(1, 170))
    w1 = w0 + int(rng.integers(4, 15))
    question = str(rng.choice([f"What colour is the shape that appears between {w0} s and {w1} s?",
                               f"Which shape appears between {w0} s and {w1} s?"]))
    answer = _call(f"The question is about {w0}-{w1} s; my first frames skip that moment. I will look closer.",
                   "resample_frames", {"start": float(w0), "end": float(w1), "num_frames": cfg.probe_frames})
    return Round("window", answer, text=question)


def whole(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    duration = int(rng.integers(20, 200))
    colour = str(rng.choice(list(PALETTE)))
    question = (f"This video is {duration} s long. When is the whole screen {colour}? Answer with the start and "
                "end times in seconds as [start, end].")
    answer = _call(f"I will look at the whole {duration:g} s video with labelled frames to find the {colour} "
                   "screen.", "resample_frames", {"start": 0.0, "end": float(duration), "num_frames": cfg.probe_frames})
    return Round("whole", answer, text=question)


def search(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    from mmagent.eval.synth.families import _bm25
    from mmagent.eval.synth.oracle import _coords_from_search
    from mmagent.toolbox.web_search import WebSearch

    pool = city_pool()
    city = pool[int(rng.integers(len(pool)))]
    name = city["name"].title()
    obs = WebSearch(backend=_bm25()).run({"query": name}, None)
    found = _coords_from_search(obs, name)
    if found is None:
        return Round("search", _answer("The search found nothing useful, so I guess.", "0.00, 0.00"), observation=obs)
    lat, lon = found
    return Round("search", _answer(f"The search places {name} at {lat:.2f}, {lon:.2f}.", f"{lat:.2f}, {lon:.2f}"),
                 observation=obs)


def option(rng: np.random.Generator, cfg: SynthConfig) -> Round:
    kind = int(rng.integers(3))
    if kind == 2:
        pool, digits = list(_IMAGE_QA_LEVELS["easy"][1]), True
    else:
        pool, digits = list(EVENT_COLOURS if kind == 0 else SHAPES), False
    values = [str(v) for v in rng.choice(pool, size=len(LETTERS), replace=False)]
    k = int(rng.integers(len(LETTERS)))
    options = "\n".join(f"{LETTERS[i]}. {v}" for i, v in enumerate(values))
    if digits:
        colour = str(rng.choice(TAG_COLOURS))
        think = f"The zoomed {colour} tag reads {values[k]}."
        question = f"What character is written on the small {colour} tag?"
    else:
        t = float(rng.integers(4, 720)) / 4
        colour = values[k] if kind == 0 else str(rng.choice(EVENT_COLOURS))
        shape = values[k] if kind == 1 else str(rng.choice(SHAPES))
        think = f"The frame at {t:.2f}s shows {article(colour)} {shape}."
        question = "Which shape appears?" if kind == 1 else "What colour is the shape that appears?"
    return Round("option", choose(think, values, values[k]), text=f"{question}\nOptions:\n{options}\n{think}")


MAKERS: dict[str, Callable[[np.random.Generator, SynthConfig], Round]] = {
    "flash": flash, "screen": screen, "tag": tag, "sign": sign, "where": where, "window": window, "whole": whole,
    "search": search, "option": option, "video_answer": video_answer, "grounding_turn": grounding_turn,
    "grounding_text": grounding_text, "frames": frames, "digit_glyph": digit_glyph, "glyph": glyph}
#: rounds whose every image carries labels (``meta["images"]``): what the vision pre-training draws
LABELLED = ("frames", "flash", "screen", "tag", "sign", "digit_glyph", "glyph")


def make_round(kind: str, rng: np.random.Generator, cfg: SynthConfig | None = None) -> Round:
    """A fresh round of drill ``kind`` (one of :data:`KINDS`, or the vision-only ``frames``, ``digit_glyph`` and ``glyph``) drawn with ``rng``."""
    if kind not in MAKERS:
        raise ValueError(f"unknown drill {kind!r}; choose from {', '.join(KINDS)}")
    return MAKERS[kind](rng, cfg or SynthConfig())
