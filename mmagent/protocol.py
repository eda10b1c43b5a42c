"""The tool-call grammar shared by the prompt, the parser, the rewards and the data.

A policy turn is free text with tags::

    <think>reasoning</think>
    <tool_call>{"name": "resample_frames", "arguments": {"start": 10, "end": 20}}</tool_call>

or, to finish, ``<answer>B</answer>``. Generation stops right after ``</tool_call>`` or ``</answer>``
(the stop string is kept). :func:`parse_turn` turns a turn's text into exactly one action — a
:class:`ToolCall`, an :class:`Answer` or a :class:`ProtocolError` whose message is written for the
model to read and correct itself — and never raises on model output.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
#: generation of a turn stops as soon as one of these appears (it is kept in the text)
STOP_STRINGS = (CALL_CLOSE, ANSWER_CLOSE)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class Answer:
    text: str


@dataclass
class ProtocolError:
    """The turn could not be understood; ``message`` is shown to the model as an error observation."""

    message: str
    kind: str = "malformed"  # malformed | no_action | unknown_tool | truncated


Action = Union[ToolCall, Answer, ProtocolError]


@dataclass
class ParsedTurn:
    thoughts: list[str] = field(default_factory=list)
    action: Action = field(default_factory=lambda: ProtocolError("empty turn", "no_action"))


def _reject_constants(token: str) -> float:
    raise ValueError(f"{token} is not valid JSON")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"{token} is out of range")
    return value


def _finite_int(token: str) -> int:
    if len(token.lstrip("-")) > 308:  # no float can hold it: every tool would fail converting it
        raise ValueError(f"{token[:12]}... ({len(token)} digits) is out of range")
    return int(token)


#: JSON nested deeper than this is refused (tool arguments need three levels; json.loads recurses)
MAX_JSON_DEPTH = 32


def _depth(obj: Any) -> int:
    deepest, stack = 0, [(obj, 1)]
    while stack and deepest <= MAX_JSON_DEPTH:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _loads_strict(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, overflowing numbers such as 1e999 and deep nesting."""
    try:
        obj = json.loads(text, parse_constant=_reject_constants, parse_float=_finite_float, parse_int=_finite_int)
    except RecursionError:
        raise ValueError(f"it is nested more than {MAX_JSON_DEPTH} levels deep") from None
    if _depth(obj) > MAX_JSON_DEPTH:
        raise ValueError(f"it is nested more than {MAX_JSON_DEPTH} levels deep")
    return obj


def parse_tool_call(body: str, tool_names: Sequence[str] | None = None) -> ToolCall | ProtocolError:
    """Parse the JSON between ``<tool_call>`` and ``</tool_call>``."""
    body = body.strip()
    # Some models wrap the JSON in a Markdown code fence.
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, flags=re.S)
    if fence:
        body = fence.group(1)
    try:
        obj = _loads_strict(body)
    except ValueError as exc:
        return ProtocolError(f"the tool call is not valid JSON ({exc}); write "
                             '<tool_call>{"name": "...", "arguments": {...}}</tool_call>')
    if not isinstance(obj, dict):
        return ProtocolError("the tool call must be a JSON object with \"name\" and \"arguments\"")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ProtocolError('the tool call has no "name" string')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some chat formats send arguments as a JSON string
        try:
            args = _loads_strict(args) if args.strip() else {}
        except ValueError as exc:
            return ProtocolError(f'"arguments" of {name} is a string that is not valid JSON ({exc})')
    if not isinstance(args, dict):
        return ProtocolError(f'"arguments" of {name} must be a JSON object')
    if tool_names is not None and name not in tool_names:
        return ProtocolError(f"unknown tool {name!r}; available tools: {', '.join(tool_names)}", "unknown_tool")
    return ToolCall(name=name, arguments=args)


def _thoughts(text: str) -> list[str]:
    """What ``re.findall(r"<think>(.*?)</think>", text, re.S)`` finds, stripped, in linear time (the regex is
    quadratic in the number of unclosed ``<think>`` tags, which a degenerate turn can be full of)."""
    found, pos = [], 0
    while (start := text.find(THINK_OPEN, pos)) >= 0:
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end < 0:
            break
        found.append(text[start + len(THINK_OPEN):end].strip())
        pos = end + len(THINK_CLOSE)
    return found


def parse_turn(text: str, tool_names: Sequence[str] | None = None, truncated: bool = False) -> ParsedTurn:
    """Parse one policy turn into its thoughts and a single action.

    Whichever of ``</tool_call>`` and ``</answer>`` closes first decides the action (generation stops
    there, so normally only one is present). ``truncated`` says the turn hit its token limit.
    """
    thoughts = _thoughts(text)
    call_end, answer_end = text.find(CALL_CLOSE), text.find(ANSWER_CLOSE)
    ends = [(pos, kind) for pos, kind in ((call_end, "call"), (answer_end, "answer")) if pos >= 0]
    if not ends:
        if truncated:
            return ParsedTurn(thoughts, ProtocolError(
                "your turn ran out of tokens before </tool_call> or </answer>; be shorter", "truncated"))
        if CALL_OPEN in text:
            return ParsedTurn(thoughts, ProtocolError("a <tool_call> was opened but never closed with </tool_call>"))
        return ParsedTurn(thoughts, ProtocolError(
            "no action found: call a tool with <tool_call>{...}</tool_call> or finish with <answer>...</answer>",
            "no_action"))
    pos, kind = min(ends)
    if kind == "call":
        start = text.rfind(CALL_OPEN, 0, pos)
        if start < 0:
            return ParsedTurn(thoughts, ProtocolError("</tool_call> without an opening <tool_call>"))
        return ParsedTurn(thoughts, parse_tool_call(text[start + len(CALL_OPEN):pos], tool_names))
    start = text.rfind(ANSWER_OPEN, 0, pos)
    if start < 0:
        return ParsedTurn(thoughts, ProtocolError("</answer> without an opening <answer>"))
    answer = text[start + len(ANSWER_OPEN):pos].strip()
    if not answer:
        return ParsedTurn(thoughts, ProtocolError("the answer is empty", "malformed"))
    return ParsedTurn(thoughts, Answer(answer))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of a call, as oracle trajectories and tests write it."""
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CALL_CLOSE}"


def render_system_prompt(tool_schemas: Sequence[dict[str, Any]], preamble: str | None = None) -> str:
    """The system prompt: rules of the grammar plus the tools' JSON schemas (Hermes/Qwen style)."""
    preamble = preamble or ("You are a visual assistant that thinks with tools. You can look again at the "
                            "video or image through the tools below before answering.")
    lines = [preamble, "", "# Tools", "", "You are provided with function signatures within <tools></tools> XML tags:",
             "<tools>"]
    lines += [json.dumps(s, ensure_ascii=False) for s in tool_schemas]
    lines += ["</tools>", "",
              "In each turn, first reason inside <think></think>. Then either call ONE tool with a JSON object "
              "inside <tool_call></tool_call>:",
              '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>',
              "or give your final answer inside <answer></answer>. Tool results come back inside "
              "<tool_response></tool_response>. Times are seconds from the start of the video; boxes are "
              "[x1, y1, x2, y2] in pixels of the image as you were shown it."]
    return "\n".join(lines)


def describe_media(duration_s: float | None = None, image_size: tuple[int, int] | None = None) -> str:
    """The sentence that opens the user turn and tells the model what media it has and their handles."""
    parts = []
    if duration_s is not None and math.isfinite(duration_s):
        parts.append(f"This is a video with duration {duration_s:.2f} seconds.")
    if image_size is not None:
        parts.append(f"This is an image shown to you at {image_size[0]}x{image_size[1]} pixels (handle 'image').")
    return " ".join(parts)
