"""The tool-call grammar: parse_turn / parse_tool_call never raise and always yield exactly one action."""

from __future__ import annotations

import json

import pytest

from mmagent.protocol import (
    Answer,
    ProtocolError,
    ToolCall,
    describe_media,
    format_tool_call,
    parse_tool_call,
    parse_turn,
    render_system_prompt,
)
from mmagent.toolbox import create_tool

TOOLS = ["resample_frames", "zoom"]


# ----- parse_turn: actions -------------------------------------------------------------------------
def test_valid_call_with_thought():
    text = ('<think>I should look at 10-20 s.</think>'
            '<tool_call>{"name": "resample_frames", "arguments": {"start": 10, "end": 20}}</tool_call>')
    turn = parse_turn(text, TOOLS)
    assert turn.thoughts == ["I should look at 10-20 s."]
    assert turn.action == ToolCall("resample_frames", {"start": 10, "end": 20})


def test_answer_is_stripped():
    turn = parse_turn("<think>It is red.</think><answer>  B \n</answer>", TOOLS)
    assert turn.action == Answer("B")
    assert turn.thoughts == ["It is red."]


def test_multiple_thoughts_are_collected_and_stripped_in_order():
    text = "<think> one </think>chatter<think>\ntwo\n</think><answer>A</answer>"
    assert parse_turn(text).thoughts == ["one", "two"]


def test_turn_without_thoughts_has_empty_list():
    assert parse_turn("<answer>A</answer>").thoughts == []


def test_code_fenced_json_inside_call():
    body = '```json\n{"name": "zoom", "arguments": {"bbox": [0, 0, 5, 5]}}\n```'
    turn = parse_turn(f"<tool_call>{body}</tool_call>", TOOLS)
    assert turn.action == ToolCall("zoom", {"bbox": [0, 0, 5, 5]})


def test_code_fence_without_language_tag():
    assert parse_tool_call('```{"name": "zoom", "arguments": {}}```') == ToolCall("zoom", {})


def test_arguments_given_as_json_string():
    body = json.dumps({"name": "resample_frames", "arguments": json.dumps({"start": 1.5, "end": 2})})
    assert parse_tool_call(body, TOOLS) == ToolCall("resample_frames", {"start": 1.5, "end": 2})


def test_empty_string_arguments_mean_no_arguments():
    assert parse_tool_call('{"name": "zoom", "arguments": "  "}') == ToolCall("zoom", {})


def test_missing_arguments_default_to_empty_and_parameters_alias_is_accepted():
    assert parse_tool_call('{"name": "zoom"}') == ToolCall("zoom", {})
    assert parse_tool_call('{"name": "zoom", "parameters": {"bbox": [1, 2, 3, 4]}}') == \
        ToolCall("zoom", {"bbox": [1, 2, 3, 4]})


def test_arguments_string_that_is_not_json():
    err = parse_tool_call('{"name": "zoom", "arguments": "{bbox: 1"}')
    assert isinstance(err, ProtocolError) and err.kind == "malformed"
    assert '"arguments" of zoom is a string that is not valid JSON' in err.message


def test_arguments_that_are_not_an_object():
    err = parse_tool_call('{"name": "zoom", "arguments": [1, 2]}')
    assert isinstance(err, ProtocolError) and err.kind == "malformed"
    assert err.message == '"arguments" of zoom must be a JSON object'


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_rejected(constant):
    err = parse_tool_call('{"name": "resample_frames", "arguments": {"start": %s, "end": 2}}' % constant)
    assert isinstance(err, ProtocolError) and err.kind == "malformed"
    assert "not valid JSON" in err.message and constant in err.message


def test_nan_inside_string_arguments_is_rejected():
    err = parse_tool_call(json.dumps({"name": "zoom", "arguments": '{"bbox": [NaN, 0, 1, 1]}'}))
    assert isinstance(err, ProtocolError) and "NaN is not valid JSON" in err.message


def test_invalid_json_message_shows_the_expected_shape():
    turn = parse_turn("<tool_call>{not json</tool_call>", TOOLS)
    assert isinstance(turn.action, ProtocolError) and turn.action.kind == "malformed"
    assert turn.action.message.startswith("the tool call is not valid JSON")
    assert '<tool_call>{"name": "...", "arguments": {...}}</tool_call>' in turn.action.message


@pytest.mark.parametrize("body", ['[1, 2]', '"zoom"', '3', 'null'])
def test_non_object_json(body):
    err = parse_tool_call(body)
    assert isinstance(err, ProtocolError) and err.kind == "malformed"
    assert "must be a JSON object" in err.message


@pytest.mark.parametrize("body", ['{"arguments": {}}', '{"name": "", "arguments": {}}', '{"name": 3}'])
def test_missing_or_bad_name(body):
    err = parse_tool_call(body)
    assert err == ProtocolError('the tool call has no "name" string', "malformed")


def test_unknown_tool_lists_available_tools():
    turn = parse_turn('<tool_call>{"name": "crop", "arguments": {}}</tool_call>', TOOLS)
    assert turn.action == ProtocolError("unknown tool 'crop'; available tools: resample_frames, zoom", "unknown_tool")


def test_without_tool_names_any_name_is_accepted():
    assert parse_turn('<tool_call>{"name": "crop", "arguments": {}}</tool_call>').action == ToolCall("crop", {})


def test_unclosed_tool_call_is_malformed():
    turn = parse_turn('<think>hm</think><tool_call>{"name": "zoom", "arguments": {}}', TOOLS)
    assert turn.thoughts == ["hm"]
    assert turn.action == ProtocolError("a <tool_call> was opened but never closed with </tool_call>", "malformed")


def test_truncated_turn_without_closing_tag():
    turn = parse_turn('<think>long...', TOOLS, truncated=True)
    assert isinstance(turn.action, ProtocolError) and turn.action.kind == "truncated"
    assert "ran out of tokens" in turn.action.message


def test_truncated_wins_over_unclosed_call():
    turn = parse_turn('<tool_call>{"name": "zoom"', TOOLS, truncated=True)
    assert turn.action.kind == "truncated"


def test_truncated_flag_ignored_when_an_action_closed():
    turn = parse_turn("<answer>A</answer>", TOOLS, truncated=True)
    assert turn.action == Answer("A")


@pytest.mark.parametrize("text", ["", "I think it is B.", "<think>only thinking</think>"])
def test_no_action(text):
    action = parse_turn(text, TOOLS).action
    assert isinstance(action, ProtocolError) and action.kind == "no_action"
    assert "<tool_call>{...}</tool_call>" in action.message and "<answer>...</answer>" in action.message


def test_call_then_answer_first_closed_wins():
    text = '<tool_call>{"name": "zoom", "arguments": {"bbox": [0, 0, 1, 1]}}</tool_call><answer>A</answer>'
    assert parse_turn(text, TOOLS).action == ToolCall("zoom", {"bbox": [0, 0, 1, 1]})


def test_answer_then_call_first_closed_wins():
    text = '<answer>C</answer><tool_call>{"name": "zoom", "arguments": {}}</tool_call>'
    assert parse_turn(text, TOOLS).action == Answer("C")


def test_only_the_last_open_tag_before_the_close_counts():
    text = '<tool_call>garbage <tool_call>{"name": "zoom", "arguments": {}}</tool_call>'
    assert parse_turn(text, TOOLS).action == ToolCall("zoom", {})


@pytest.mark.parametrize("text", ["<answer></answer>", "<answer>   \n</answer>"])
def test_empty_answer_is_malformed(text):
    assert parse_turn(text).action == ProtocolError("the answer is empty", "malformed")


def test_close_tags_without_open_tags():
    assert parse_turn('{"name": "zoom"}</tool_call>').action == \
        ProtocolError("</tool_call> without an opening <tool_call>")
    assert parse_turn("B</answer>").action == ProtocolError("</answer> without an opening <answer>")


@pytest.mark.parametrize("text", ["<tool_call>\x00{</tool_call>", "<tool_call></tool_call>",
                                  "<tool_call>```\n```</tool_call>", "<answer></tool_call>"])
def test_odd_call_bodies_give_errors_not_exceptions(text):
    assert isinstance(parse_turn(text, TOOLS).action, ProtocolError)


# ----- format_tool_call / system prompt -----------------------------------------------------------
@pytest.mark.parametrize("name,args", [
    ("resample_frames", {"start": 1.25, "end": 3.5, "num_frames": 4}),
    ("zoom", {"bbox": [0, 0, 10.5, 20], "source": "frame@1.5"}),
    ("zoom", {"source": "obs:1", "note": "ünïcødé ✓"}),
    ("resample_frames", {}),
])
def test_format_tool_call_round_trips(name, args):
    text = format_tool_call(name, args)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    turn = parse_turn("<think>t</think>" + text, TOOLS)
    assert turn.action == ToolCall(name, args)
    assert turn.action.to_json() == {"name": name, "arguments": args}


def test_format_tool_call_keeps_unicode_unescaped():
    assert "ü" in format_tool_call("zoom", {"s": "ü"})


def test_system_prompt_contains_every_schema_verbatim():
    schemas = [create_tool("resample_frames").schema(), create_tool("zoom").schema()]
    prompt = render_system_prompt(schemas)
    lines = prompt.splitlines()
    start, end = lines.index("<tools>"), lines.index("</tools>")
    assert [json.loads(line) for line in lines[start + 1:end]] == schemas
    for s in schemas:
        assert json.dumps(s, ensure_ascii=False) in prompt
    assert schemas[0]["function"]["name"] == "resample_frames"
    assert schemas[0]["function"]["parameters"]["required"] == ["start", "end"]
    assert "<think></think>" in prompt and "<answer></answer>" in prompt and "<tool_response>" in prompt


def test_system_prompt_default_and_custom_preamble():
    schema = create_tool("resample_frames").schema()
    assert render_system_prompt([schema]).startswith("You are a visual assistant that thinks with tools.")
    custom = render_system_prompt([schema], preamble="Be brief.")
    assert custom.splitlines()[0] == "Be brief." and "visual assistant" not in custom


def test_describe_media():
    assert describe_media(12.345) == "This is a video with duration 12.35 seconds."
    assert describe_media(image_size=(448, 336)) == \
        "This is an image shown to you at 448x336 pixels (handle 'image')."
    assert describe_media(float("inf")) == "" and describe_media() == ""
    both = describe_media(4.0, (28, 56))
    assert both.startswith("This is a video with duration 4.00 seconds. This is an image shown to you at 28x56")


def test_overflowing_numbers_are_refused():
    from mmagent.protocol import parse_tool_call

    action = parse_tool_call('{"name": "zoom", "arguments": {"bbox": [0, 0, 1e999, 1]}}')
    assert isinstance(action, ProtocolError) and "out of range" in action.message
