"""Left truncation: whole turns leave oldest first, system stays, tool results stay with calls;
a newest turn over budget keeps its call and a marked head of its results."""

from __future__ import annotations

import pytest

from prour.data.truncate import PolicyTokens, is_excerpt, truncate_history, turn_groups
from prour.rollout.query import query_prompt

SYSTEM = {"role": "system", "content": "policy " * 50}
HISTORY = [
    SYSTEM,
    {"role": "assistant", "content": "w " * 3},  # 3 words
    {"role": "user", "content": "w " * 10},  # 10
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function",
                                                         "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c0", "name": "f", "content": "w " * 20},  # 20
    {"role": "user", "content": "w " * 5},  # 5
]


def words(messages: list[dict]) -> int:
    """A stand-in token count: 4 for the template plus the words of non-system messages."""
    return 4 + sum(len((m.get("content") or "").split()) for m in messages if m["role"] != "system")


def test_turn_groups_keep_tool_results_with_their_call() -> None:
    system, groups = turn_groups(HISTORY)
    assert system == [SYSTEM]
    assert [len(g) for g in groups] == [1, 1, 2, 1]


def test_fits_untouched() -> None:
    out = truncate_history(HISTORY, words, budget=42)  # 4 + 3 + 10 + 20 + 5 = 42
    assert (out.messages, out.truncated, out.dropped, out.tokens) == (HISTORY, False, 0, 42)


@pytest.mark.parametrize(
    ("budget", "kept_from", "tokens"),
    [(41, 2, 39), (39, 2, 39), (38, 3, 29), (29, 3, 29), (28, 5, 9), (9, 5, 9)],
)
def test_drops_oldest_whole_turns(budget: int, kept_from: int, tokens: int) -> None:
    out = truncate_history(HISTORY, words, budget)
    assert out.messages == [SYSTEM] + HISTORY[kept_from:]
    assert out.truncated and out.dropped == kept_from - 1 and out.tokens == tokens


def chars(messages: list[dict]) -> int:
    """A stand-in token count: 10 for the template plus the characters of non-system texts."""
    return 10 + sum(len(m.get("content") or "") for m in messages if m["role"] != "system")


def call(*ids: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]}


def result(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": "f", "content": content}


DIGITS = "0123456789" * 10  # 100 characters
# "[… truncated N characters …]" is 27 characters plus the digits of N


def test_newest_call_and_result_over_budget_keep_the_call_and_a_marked_head() -> None:
    history = [SYSTEM, {"role": "user", "content": "hi"}, call("c0"), result("c0", DIGITS)]
    # whole: 10 + 2 + 100 = 112; newest turn alone: 110 > 70. Head of k characters:
    # 10 + k + 27 + 2 (N = 100 - k has two digits) <= 70  →  k = 31, N = 69
    out = truncate_history(history, chars, budget=70)
    assert out.messages == [SYSTEM, call("c0"),
                            result("c0", DIGITS[:31] + "[… truncated 69 characters …]")]
    assert (out.truncated, out.dropped, out.tokens, out.excerpted) == (True, 1, 70, True)
    assert is_excerpt(out.messages[-1]) and not is_excerpt(history[-1])
    assert history[-1]["content"] == DIGITS  # the input is not modified


def test_parallel_results_share_one_cap_and_short_ones_stay_whole() -> None:
    history = [SYSTEM, call("c1", "c2"), result("c1", DIGITS[:40]), result("c2", "short")]
    # whole: 10 + 40 + 5 = 55 > 50; 10 + k + 29 (N = 40 - k, two digits) + 5 <= 50  →  k = 6
    out = truncate_history(history, chars, budget=50)
    assert out.messages == [SYSTEM, call("c1", "c2"),
                            result("c1", DIGITS[:6] + "[… truncated 34 characters …]"),
                            result("c2", "short")]
    assert (out.dropped, out.tokens) == (0, 50)


def test_newest_text_message_over_budget_keeps_its_head() -> None:
    history = [SYSTEM, call("c0"), result("c0", "ok"), {"role": "user", "content": DIGITS}]
    # 10 + k + 29 <= 50  →  k = 11, N = 89; the older call and result leave together
    out = truncate_history(history, chars, budget=50)
    assert out.messages == [SYSTEM, {"role": "user",
                                     "content": DIGITS[:11] + "[… truncated 89 characters …]"}]
    assert (out.dropped, out.tokens, out.excerpted) == (2, 50, True)


def test_excerpt_below_the_marker_is_an_error() -> None:
    history = [SYSTEM, call("c0"), result("c0", DIGITS)]
    # k = 1: 10 + 1 + 29 = 40 fits 40; k = 0: 10 + 0 + 30 (N = 100) = 40 > 39
    out = truncate_history(history, chars, budget=40)
    assert out.messages[-1]["content"] == "0[… truncated 99 characters …]"
    with pytest.raises(ValueError, match="max_prompt_tokens=39"):
        truncate_history(history, chars, budget=39)


def test_no_budget_separates_a_result_from_its_call() -> None:
    history = [SYSTEM, {"role": "user", "content": "hi there"}, call("a"), result("a", DIGITS),
               {"role": "user", "content": "and?"}, call("b", "c"), result("b", DIGITS[:30]),
               result("c", DIGITS[:70])]
    for budget in range(68, chars(history) + 1):  # 68: both results cut to the marker
        kept = truncate_history(history, chars, budget).messages
        called = [c["id"] for m in kept for c in m.get("tool_calls") or []]
        results = [m["tool_call_id"] for m in kept if m["role"] == "tool"]
        assert results == called, budget  # every kept result follows its kept call, in order


def test_budget_below_the_empty_prompt_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_prompt_tokens=3"):
        truncate_history(HISTORY, words, budget=3)


def test_policy_tokens_budget_with_tiny_tokenizer(tiny_model_dir) -> None:
    tokens = PolicyTokens(tiny_model_dir)
    history = [SYSTEM] + [
        {"role": "user" if i % 2 else "assistant", "content": f"message {i} about order #W{i}"}
        for i in range(60)
    ]
    count = lambda h: tokens.chat(query_prompt("verify", h))
    full = count(history)
    budget = full - 40
    out = truncate_history(history, count, budget)
    assert out.tokens <= budget and out.tokens == count(out.messages)
    assert out.messages[-1] == history[-1] and out.messages[0] == SYSTEM
    longer = [SYSTEM] + history[len(history) - len(out.messages):]  # one more turn than kept
    assert count(longer) > budget
