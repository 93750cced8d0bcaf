"""Completion.from_text: the one way every backend turns generated text into a Completion."""

from __future__ import annotations

from prour.llm.base import Completion, ToolCall
from prour.llm.toolcalls import parse_call

CALL = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'


def test_plain_text_is_all_content():
    c = Completion.from_text("  Your order is on its way.  ")
    assert (c.text, c.content, c.reasoning, c.tool_calls) == (
        "  Your order is on its way.  ",
        "Your order is on its way.",
        None,
        [],
    )
    assert (c.finish_reason, c.prompt_tokens, c.completion_tokens) == ("stop", 0, 0)


def test_think_block_and_tool_calls_are_split_off():
    text = f"<think>\nlook it up\n</think>\n\nLet me check.\n{CALL}"
    c = Completion.from_text(text, "stop")
    assert c.text == text
    assert c.reasoning == "look it up"
    assert c.content == "Let me check."
    assert c.tool_calls == [
        parse_call('\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n', 0)
    ]
    assert (c.tool_calls[0].name, c.tool_calls[0].arguments) == (
        "get_order_details",
        {"order_id": "#W1"},
    )


def test_a_cut_tool_call_is_an_error_not_content():
    c = Completion.from_text('Checking <tool_call>{"name": "get_or', "length")
    assert c.finish_reason == "length"
    assert c.content == "Checking"
    [call] = c.tool_calls
    assert isinstance(call, ToolCall) and call.name == "" and "unclosed" in call.error


def test_text_is_cut_before_the_first_stop_string():
    c = Completion.from_text(
        "YES [QUESTION]Which?[/QUESTION] trailing END more", stop=("END", "[/QUESTION]", "")
    )
    assert c.text == "YES [QUESTION]Which?"
    assert c.content == "YES [QUESTION]Which?"


def test_token_counts_come_from_ids_then_logprobs():
    assert Completion.from_text("a", token_ids=[4, 5, 6]).completion_tokens == 3
    assert Completion.from_text("a", logprobs=[-0.5, -1.0]).completion_tokens == 2
    explicit = Completion.from_text("a b", token_ids=[1], completion_tokens=7, prompt_tokens=9)
    assert (explicit.completion_tokens, explicit.prompt_tokens, explicit.token_ids) == (7, 9, [1])


def test_verl_outputs_map_stop_reasons():
    from prour.train.verl_ext.logic import completion_from_output

    class Decoder:
        eos_token_id = 9

        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens
            return "".join(chr(ord("a") + i) for i in ids)

    # verl reports vLLM's "stop" and "length" both as "completed"; the budget tells them apart
    done = completion_from_output(Decoder(), [0, 1, 2], "completed", 11, 4, [-1.0, -2.0, -3.0])
    full = completion_from_output(Decoder(), [0, 1, 2, 3], "completed", 11, 4)
    ended = completion_from_output(Decoder(), [0, 1, 2, 9], "completed", 11, 4)
    aborted = completion_from_output(Decoder(), [3], "aborted", 11, 4)
    assert (done.text, done.finish_reason, done.completion_tokens, done.prompt_tokens) == (
        "abc",
        "stop",
        3,
        11,
    )
    assert done.logprobs == [-1.0, -2.0, -3.0]
    assert (full.finish_reason, ended.finish_reason) == ("length", "stop")
    assert (aborted.text, aborted.finish_reason, aborted.logprobs) == ("d", "length", None)
