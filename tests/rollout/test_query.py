"""Query-generator output parser (table of hand-written cases + property-based fuzzing) and prompts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prour.rollout import query as q
from prour.rollout.query import clarify_prompt, parse_query, query_prompt, verify_prompt

CASES = [
    # (text, kind, question, reason)
    ("NO", "none", None, None),
    ("  NO \n", "none", None, None),
    (
        "YES [QUESTION]Which order do you want to return?[/QUESTION]",
        "ask",
        "Which order do you want to return?",
        None,
    ),
    ("YES[QUESTION] Which size? [/QUESTION]", "ask", "Which size?", None),
    ("YES\n[QUESTION]\nWhich size?\n[/QUESTION]\n", "ask", "Which size?", None),
    ("<think>The user said two items.</think>NO", "none", None, None),
    (
        "<think>\nneed the color\n</think>\n\nYES [QUESTION]Black or white?[/QUESTION]",
        "ask",
        "Black or white?",
        None,
    ),
    ("<think>\n\n</think>\n\nNO", "none", None, None),
    ("reasoning without the opening tag</think>\nNO", "none", None, None),
    ("<think>I should ask about the color", "invalid", None, q.UNCLOSED_THINK),
    ("<think>Let me decide.</think>", "invalid", None, q.NO_ANSWER),
    ("<think>YES [QUESTION]Which order?[/QUESTION]</think>", "invalid", None, q.NO_ANSWER),
    ("", "invalid", None, q.EMPTY),
    ("   \n", "invalid", None, q.EMPTY),
    ("YES [QUESTION]your question here[/QUESTION]", "invalid", None, q.PLACEHOLDER_QUESTION),
    ("YES [QUESTION]...[/QUESTION]", "invalid", None, q.PLACEHOLDER_QUESTION),
    ("YES [QUESTION]…[/QUESTION]", "invalid", None, q.PLACEHOLDER_QUESTION),
    ("YES [QUESTION]<question>[/QUESTION]", "invalid", None, q.PLACEHOLDER_QUESTION),
    (
        "YES [QUESTION]Your concise and specific clarifying question to the user here[/QUESTION]",
        "invalid",
        None,
        q.PLACEHOLDER_QUESTION,
    ),
    ("YES [QUESTION]   [/QUESTION]", "invalid", None, q.EMPTY_QUESTION),
    ("YES [QUESTION][QUESTION][/QUESTION]", "invalid", None, q.MULTIPLE_QUESTIONS),
    ("YES [QUESTION]a?[/QUESTION] [QUESTION]b?[/QUESTION]", "invalid", None, q.MULTIPLE_QUESTIONS),
    ("YES [QUESTION]Which order is it?", "invalid", None, q.UNCLOSED_QUESTION),
    ("NO YES [QUESTION]Which order?[/QUESTION]", "invalid", None, q.BOTH_DECISIONS),
    ("YES NO", "invalid", None, q.BOTH_DECISIONS),
    ("NO [QUESTION]Which order?[/QUESTION]", "invalid", None, q.BOTH_DECISIONS),
    ("no", "invalid", None, q.WRONG_CASE),
    ("No", "invalid", None, q.WRONG_CASE),
    ("yes [question]Which order?[/question]", "invalid", None, q.WRONG_CASE),
    ("Yes [QUESTION]Which order?[/QUESTION]", "invalid", None, q.WRONG_CASE),
    ("NO.", "invalid", None, q.TEXT_OUTSIDE),
    ("YES", "invalid", None, q.MISSING_QUESTION),
    ("<think>ask it</think>yes.", "invalid", None, q.MISSING_QUESTION),
    ("NO, no question is needed.", "invalid", None, q.TEXT_OUTSIDE),
    ("Sure! YES [QUESTION]Which order?[/QUESTION]", "invalid", None, q.TEXT_OUTSIDE),
    ("YES [QUESTION]Which order?[/QUESTION] Thanks.", "invalid", None, q.TEXT_OUTSIDE),
    ("[QUESTION]Which order?[/QUESTION]", "invalid", None, q.MISSING_DECISION),
    ("I think we should ask about it", "invalid", None, q.MISSING_DECISION),
    ("NO <think>late reasoning</think>", "invalid", None, q.TEXT_OUTSIDE),
    ("<think>a</think><think>b</think>NO", "invalid", None, q.EXTRA_THINK),
    (None, "invalid", None, q.NOT_TEXT),
    (42, "invalid", None, q.NOT_TEXT),
    (b"NO", "invalid", None, q.NOT_TEXT),
]


@pytest.mark.parametrize("text,kind,question,reason", CASES)
def test_parse_table(text, kind, question, reason):
    parsed = parse_query(text)
    assert (parsed.kind, parsed.question, parsed.reason) == (kind, question, reason)


def test_thinking_is_kept_apart_from_the_answer():
    parsed = parse_query(
        "<think>user wants a refund</think>YES [QUESTION]Refund to which card?[/QUESTION]"
    )
    assert parsed.thinking == "user wants a refund"
    assert parsed.question == "Refund to which card?"
    assert parse_query("NO").thinking is None


def test_real_question_mentioning_question_words_is_not_a_placeholder():
    for text in [
        "What is your question about the refund?",
        "Is the question about order #W1?",
        "Do you want it here?",
    ]:
        assert parse_query(f"YES [QUESTION]{text}[/QUESTION]").kind == "ask", text


TOKENS = st.sampled_from(
    [
        "<think>",
        "</think>",
        "YES",
        "NO",
        "yes",
        "no",
        "[QUESTION]",
        "[/QUESTION]",
        " ",
        "\n",
        "Which order?",
        "your question here",
        "...",
        "[",
        "]",
        "<",
        ">",
        "/",
        "\x00",
        "é",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(TOKENS, max_size=12).map("".join)))
def test_parser_never_raises_and_is_consistent(text):
    parsed = parse_query(text)
    assert parsed.kind in ("ask", "none", "invalid")
    if parsed.kind == "ask":
        assert parsed.question and parsed.question == parsed.question.strip()
        assert parsed.reason is None
    else:
        assert parsed.question is None
    assert (parsed.reason is None) == (parsed.kind != "invalid")


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_characters="[]<>", blacklist_categories=("Cs",)),
        max_size=80,
    )
)
def test_any_well_formed_question_round_trips(question):
    parsed = parse_query(f"YES [QUESTION]{question}[/QUESTION]")
    if parsed.kind == "ask":
        assert parsed.question == question.strip()
    else:
        assert parsed.reason in (q.EMPTY_QUESTION, q.PLACEHOLDER_QUESTION)


@given(
    st.one_of(
        st.integers(), st.floats(), st.lists(st.text()), st.dictionaries(st.text(), st.text())
    )
)
def test_non_text_is_invalid(value):
    assert parse_query(value).reason == q.NOT_TEXT


HISTORY = [
    {"role": "system", "content": "POLICY TEXT"},
    {"role": "user", "content": "I want to return my keyboard."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "1",
                "type": "function",
                "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "1",
        "name": "get_order_details",
        "content": '{"status": "delivered"}',
    },
]


@pytest.mark.parametrize("build,mode", [(clarify_prompt, "clarify"), (verify_prompt, "verify")])
def test_prompts_carry_history_and_format_but_not_the_system_policy(build, mode):
    messages = build(HISTORY)
    assert messages == query_prompt(mode, HISTORY)
    assert len(messages) == 1 and messages[0]["role"] == "user"
    text = messages[0]["content"]
    assert "I want to return my keyboard." in text
    assert 'get_order_details({"order_id": "#W1"})' in text
    assert "YES [QUESTION]" in text and "NO" in text and "<think>" in text
    assert "POLICY TEXT" not in text and "{history}" not in text
    assert q.PROMPTS_VERSION


def test_query_prompt_rejects_unknown_mode():
    with pytest.raises(ValueError, match="clarify, verify"):
        query_prompt("act", HISTORY)
