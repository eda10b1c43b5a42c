"""Property-based tests (hypothesis) of the protocol parser and of the clamping of times and boxes.

The properties: ``parse_turn`` never raises and always gives exactly one well-formed action, whatever the text;
calls and answers written by ``format_tool_call`` round-trip; a box or a time window the model gives is either
refused with a ToolError or clamped to something inside the view / the video, and the tools' outputs stay in
bounds. Every test is derandomized (same examples on every run) and has no deadline.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mmagent.media import EpisodeMedia, open_video
from mmagent.protocol import (MAX_JSON_DEPTH, Answer, ProtocolError, ToolCall, format_tool_call, parse_tool_call,
                              parse_turn)
from mmagent.tiny import write_synthetic_video
from mmagent.toolbox import ToolError, create_tool
from mmagent.toolbox.base import clip_view_box
from mmagent.toolbox.search_backends import clean_text
from mmagent.toolbox.zoom import expand_box

TOOLS = ["resample_frames", "zoom", "web_search"]
KINDS = {"malformed", "no_action", "unknown_tool", "truncated"}


def _settings(n: int):
    return settings(derandomize=True, max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


#: how many examples each property runs (the report counts them)
EXAMPLES = {"parse_any_text": 500, "parse_grammar_soup": 500, "call_round_trip": 300, "answer_round_trip": 200,
            "clip_view_box": 500, "expand_box": 400, "zoom": 200, "resample": 150, "index_at": 300,
            "clean_text": 300}

FRAGMENTS = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "<tool_response>",
             "{", "}", "[", "]", ":", ",", '"', "\\", '"name"', '"arguments"', '"parameters"', '"zoom"',
             '"resample_frames"', '"nope"', '"bbox"', "NaN", "Infinity", "-Infinity", "1e999", "-0", "0", "12.5",
             "1" + "0" * 320, "null", "true", "```json", "```", " ", "\n", "\u0000", "\u202e", "'", "é"]
soup = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join)


def _walk(obj, depth=1):
    """Yield (value, depth) for every value in a parsed JSON structure."""
    yield obj, depth
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v, depth + 1)


def _check_turn(text: str, truncated: bool) -> None:
    parsed = parse_turn(text, TOOLS, truncated=truncated)
    assert all(isinstance(t, str) and t == t.strip() for t in parsed.thoughts)
    action = parsed.action
    if isinstance(action, ProtocolError):
        assert action.kind in KINDS and isinstance(action.message, str) and action.message
        closed = "</tool_call>" in text or "</answer>" in text
        assert (action.kind == "truncated") == (truncated and not closed)
    elif isinstance(action, ToolCall):
        assert action.name in TOOLS and isinstance(action.arguments, dict)
        for value, depth in _walk(action.arguments):
            assert depth <= MAX_JSON_DEPTH
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert math.isfinite(float(value))  # every number converts to a finite float
        assert parse_turn(format_tool_call(action.name, action.arguments), TOOLS).action == action
    else:
        assert isinstance(action, Answer) and action.text and action.text == action.text.strip()
        assert "</answer>" not in action.text


@_settings(EXAMPLES["parse_any_text"])
@given(st.text(max_size=300), st.booleans())
def test_parse_turn_never_raises_on_any_text(text, truncated):
    _check_turn(text, truncated)


@_settings(EXAMPLES["parse_grammar_soup"])
@given(soup, st.booleans())
def test_parse_turn_never_raises_on_grammar_soup(text, truncated):
    _check_turn(text, truncated)


# JSON values the model could put in arguments (strings that could not be generated — a close tag stops
# generation, and the last <tool_call> before the close is the one parsed — are left out)
plain_text = st.text(max_size=20).filter(lambda s: "</tool_call>" not in s and "</answer>" not in s
                                         and "<tool_call>" not in s)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10 ** 15, 10 ** 15) | st.floats(allow_nan=False, allow_infinity=False)
    | plain_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(plain_text, inner, max_size=4),
    max_leaves=12)


@_settings(EXAMPLES["call_round_trip"])
@given(st.sampled_from(TOOLS), st.dictionaries(plain_text, json_values, max_size=5), plain_text)
def test_a_formatted_call_parses_back_to_itself(name, arguments, thought):
    text = f"<think>{thought}</think>" + format_tool_call(name, arguments) if "</think>" not in thought else \
        format_tool_call(name, arguments)
    action = parse_turn(text, TOOLS).action
    assert action == ToolCall(name, arguments)
    # and the same call with its arguments sent as a JSON string (some chat formats do)
    as_string = parse_tool_call(json.dumps({"name": name, "arguments": json.dumps(arguments)}), TOOLS)
    assert as_string == ToolCall(name, arguments)


@_settings(EXAMPLES["answer_round_trip"])
@given(plain_text.filter(lambda s: s.strip() and "<answer>" not in s))
def test_an_answer_parses_back_to_its_stripped_text(text):
    assert parse_turn(f"<think>x</think><answer>{text}</answer>", TOOLS).action == Answer(text.strip())


PATHOLOGICAL = {
    "100k open brackets": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "100k nested objects": '<tool_call>{"name": "zoom", "arguments": ' + '{"a": ' * 100_000 + "</tool_call>",
    "deep but closed": '<tool_call>{"name": "zoom", "arguments": {"bbox": ' + "[" * 900 + "]" * 900 + "}}</tool_call>",
    "deep string arguments": '<tool_call>{"name": "zoom", "arguments": "' + "[" * 5000 + '"}</tool_call>',
    "5000-digit integer": '<tool_call>{"name": "zoom", "arguments": {"bbox": [' + "9" * 5000 + "]}}</tool_call>",
    "1 MB string": '<tool_call>{"name": "web_search", "arguments": {"query": "' + "a" * 1_000_000 + '"}}</tool_call>',
    "lone surrogate": '<tool_call>{"name": "web_search", "arguments": {"query": "\\ud800"}}</tool_call>',
    "NUL in the JSON": '<tool_call>{"name": "zoom",\u0000 "arguments": {}}</tool_call>',
    "100k think tags": "<think>" * 100_000 + "<answer>A</answer>",
    "100k open calls": "<tool_call>" * 100_000 + "</tool_call>",
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_parse_turn_survives_what_json_chokes_on(name):
    _check_turn(PATHOLOGICAL[name], truncated=False)


# ----- boxes ---------------------------------------------------------------------------------------------------
coordinate = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1e4, 1e4) | st.integers(-10 ** 6, 10 ** 6)
view = st.tuples(st.integers(1, 5000), st.integers(1, 5000))


@_settings(EXAMPLES["clip_view_box"])
@given(st.tuples(coordinate, coordinate, coordinate, coordinate), view)
def test_a_box_is_refused_or_clipped_into_the_view(box, size):
    w, h = size
    try:
        out = clip_view_box(box, size, "image")
    except ToolError as exc:
        x1, y1, x2, y2 = (float(v) for v in box)
        finite = all(math.isfinite(v) for v in (x1, y1, x2, y2))
        overlaps = finite and x1 < x2 and y1 < y2 and x2 > 0 and y2 > 0 and x1 < w and y1 < h
        assert not overlaps, (box, size, exc)  # refused only when there is nothing to show
        return
    x1, y1, x2, y2 = out
    assert all(math.isfinite(v) for v in out)
    assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
    assert clip_view_box(out, size, "image") == out  # clipping is idempotent


@_settings(EXAMPLES["expand_box"])
@given(view, st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.integers(1, 600),
       st.floats(0, 2))
def test_expand_box_stays_inside_contains_the_box_and_has_its_minimum_size(size, a, b, c, d, min_side, pad):
    w, h = size
    x1, x2 = sorted((a * w, c * w))
    y1, y2 = sorted((b * h, d * h))
    if not (x2 > x1 and y2 > y1):
        return
    ex1, ey1, ex2, ey2 = expand_box((x1, y1, x2, y2), min_side, pad, w, h)
    assert all(isinstance(v, int) for v in (ex1, ey1, ex2, ey2))
    assert 0 <= ex1 < ex2 <= w and 0 <= ey1 < ey2 <= h
    assert ex1 <= x1 and ey1 <= y1 and ex2 >= x2 and ey2 >= y2  # the model's box is all in the crop
    assert ex2 - ex1 >= min(min_side, w) - 1 and ey2 - ey1 >= min(min_side, h) - 1


@pytest.fixture(scope="module")
def zoom_tool():
    return create_tool("zoom")


@_settings(EXAMPLES["zoom"])
@given(st.tuples(st.integers(1, 300), st.integers(1, 300)).filter(lambda s: max(s) <= 200 * min(s)), view,
       st.tuples(coordinate, coordinate, coordinate, coordinate))
def test_zoom_returns_a_crop_inside_the_source_or_a_tool_error(zoom_tool, source_size, view_size, box):
    media = EpisodeMedia(image=Image.new("RGB", source_size, (10, 20, 30)))
    media.set_view_size("image", view_size)
    try:
        obs = zoom_tool({"bbox": list(box)}, media)
    except ToolError:
        return
    sx1, sy1, sx2, sy2 = obs.data["box_source"]
    assert 0 <= sx1 < sx2 <= source_size[0] and 0 <= sy1 < sy2 <= source_size[1]
    vx1, vy1, vx2, vy2 = obs.data["box_view"]
    assert -1 <= vx1 <= vx2 <= view_size[0] + 1 and -1 <= vy1 <= vy2 <= view_size[1] + 1
    (crop,) = obs.images
    assert crop.width >= sx2 - sx1 and crop.height >= sy2 - sy1  # shown at least at its own size
    assert max(crop.size) <= 100 * min(crop.size) + 1


# ----- times ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """3 s at 5 fps, 32x32: small enough to decode a few frames per example."""
    return write_synthetic_video(tmp_path_factory.mktemp("prop-video") / "clip.mp4", seconds=3.0, fps=5, size=(32, 32))


@pytest.fixture(scope="module")
def clip_media(clip):
    media = EpisodeMedia(video=clip)
    yield media
    media.close()


time_value = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-10, 10) | st.integers(-10 ** 9, 10 ** 9)


@_settings(EXAMPLES["resample"])
@given(time_value, time_value, st.integers(1, 8))
def test_a_window_is_refused_or_clamped_into_the_video(clip_media, start, end, num_frames):
    tool = create_tool("resample_frames", draw_timestamps=False)
    video = clip_media.video
    try:
        obs = tool({"start": start, "end": end, "num_frames": num_frames}, clip_media)
    except ToolError as exc:
        message = str(exc)
        assert len(message) < 300 and message.isprintable()
        usable = (math.isfinite(start) and math.isfinite(end) and start < video.duration and end > 0
                  and min(end, video.duration) - max(start, 0) >= tool.min_span_s)
        assert not usable, (start, end, message)
        return
    s, e = obs.data["start"], obs.data["end"]
    assert 0 <= s < e <= video.duration and e - s >= tool.min_span_s
    assert s == max(float(start), 0.0) and e == min(float(end), video.duration)
    stamps = obs.data["timestamps"]
    assert len(stamps) == len(obs.images) == num_frames and stamps == sorted(stamps)
    assert all(s - 1 / video.fps <= t < e and 0 <= t < video.duration for t in stamps)
    assert ("clamped" in obs.text) == (start < 0 or end > video.duration)
    assert len(obs.text) < 600


@pytest.fixture(scope="module", params=["decord", "pyav", "opencv"])
def clip_reader(clip, request):
    reader = open_video(clip, backends=(request.param,))
    yield reader
    reader.close()


@_settings(EXAMPLES["index_at"])
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10 ** 12, 10 ** 12))
def test_every_time_maps_to_a_frame_of_the_video(clip_reader, t):
    i = clip_reader.index_at(t)
    assert isinstance(i, int) and 0 <= i < clip_reader.num_frames
    (frame,) = clip_reader.frames_at([t])
    assert frame.timestamp == i / clip_reader.fps and frame.image.size == (32, 32)


@_settings(EXAMPLES["clean_text"])
@given(st.text(), st.integers(1, 400))
def test_cleaned_result_text_is_one_bounded_line_without_tags(text, limit):
    out = clean_text(text, limit)
    assert len(out) <= limit and "<" not in out and ">" not in out
    assert out == " ".join(out.split()) and not any(c in out for c in "\r\t\x00\x1b\u202e\u2066\ufeff")
    assert clean_text(out, limit) == out
