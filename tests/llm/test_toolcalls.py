"""Tool-call and think-block parsing (pure text, CPU)."""

from __future__ import annotations

import json

import pytest

from prour.llm.toolcalls import parse_call, parse_tool_calls, split_thinking, to_openai_tool_calls

GOOD = (
    '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}\n'
    "</tool_call>"
)


def test_one_good_call_and_surrounding_content():
    content, calls = parse_tool_calls("Let me look that up.\n" + GOOD)
    assert content == "Let me look that up."
    assert len(calls) == 1
    call = calls[0]
    assert (call.name, call.arguments, call.error) == (
        "get_order_details",
        {"order_id": "#W1234567"},
        None,
    )
    assert call.id.startswith("call_0_")


def test_several_calls_keep_order_and_get_distinct_ids():
    second = '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 3"}}</tool_call>'
    content, calls = parse_tool_calls(GOOD + "\n" + second)
    assert content == ""
    assert [c.name for c in calls] == ["get_order_details", "calculate"]
    assert calls[1].arguments == {"expression": "2 + 3"}
    assert calls[0].id != calls[1].id
    # ids are a function of position and text: parsing again gives the same ids
    assert [c.id for c in parse_tool_calls(GOOD + "\n" + second)[1]] == [c.id for c in calls]


@pytest.mark.parametrize(
    "body, name, error_part",
    [
        (
            '{"name": "cancel_pending_order", "arguments": {"order_id": "#W1"',
            "cancel_pending_order",
            "not valid JSON",
        ),
        ('{"arguments": {"order_id": "#W1"}}', "", 'no "name"'),
        ('{"name": "", "arguments": {}}', "", 'no "name"'),
        ('{"name": 7, "arguments": {}}', "", 'no "name"'),
        (
            '{"name": "calculate", "arguments": [1, 2]}',
            "calculate",
            "must be a JSON object, got list",
        ),
        (
            '{"name": "calculate", "arguments": "2 + 3"}',
            "calculate",
            "must be a JSON object, got str",
        ),
        ('["calculate", {}]', "", "must be a JSON object, got list"),
        ("", "", "not valid JSON"),
    ],
)
def test_malformed_blocks_are_reported_not_raised(body, name, error_part):
    content, calls = parse_tool_calls(f"before <tool_call>{body}</tool_call> after")
    assert content == "before  after"
    assert len(calls) == 1
    assert calls[0].name == name
    assert calls[0].arguments == {}
    assert error_part in calls[0].error
    assert calls[0].raw == body


def test_unclosed_tag_is_a_malformed_call_and_leaves_prior_calls_intact():
    text = GOOD + '\nand now <tool_call>{"name": "cancel_pending_order", "arguments": {"order_'
    content, calls = parse_tool_calls(text)
    assert content == "and now"
    assert [c.error is None for c in calls] == [True, False]
    assert calls[1].name == "cancel_pending_order"
    assert "unclosed" in calls[1].error


def test_arguments_as_json_string_or_missing_are_accepted():
    assert parse_call('{"name": "f", "arguments": "{\\"a\\": 1}"}').arguments == {"a": 1}
    missing = parse_call('{"name": "list_all_airports"}')
    assert (missing.arguments, missing.error) == ({}, None)


def test_text_without_calls_is_returned_whole():
    assert parse_tool_calls("  Your order is on its way.  ") == ("Your order is on its way.", [])


@pytest.mark.parametrize(
    "text, reasoning, rest",
    [
        (
            "<think>\nfirst check the order\n</think>\n\nYES [QUESTION]Which order?[/QUESTION]",
            "first check the order",
            "YES [QUESTION]Which order?[/QUESTION]",
        ),
        ("<think>\n\n</think>\n\nNO", "", "NO"),
        (
            "reasoning whose opening tag was in the prompt</think>answer",
            "reasoning whose opening tag was in the prompt",
            "answer",
        ),
        (
            "<think>never closed because the budget ran out",
            "never closed because the budget ran out",
            "",
        ),
        ("plain answer", None, "plain answer"),
    ],
)
def test_split_thinking(text, reasoning, rest):
    assert split_thinking(text) == (reasoning, rest)


def test_to_openai_tool_calls_round_trips_arguments():
    _, calls = parse_tool_calls(GOOD)
    [message_call] = to_openai_tool_calls(calls)
    assert message_call["type"] == "function"
    assert message_call["id"] == calls[0].id
    assert message_call["function"]["name"] == "get_order_details"
    assert json.loads(message_call["function"]["arguments"]) == {"order_id": "#W1234567"}
