"""Left truncation: whole turns leave oldest first, system stays, tool results stay with calls,
the newest user message always stays; when it and what follows are over budget their tool
results keep a marked head, and a state that cannot fit even so is over budget."""

from __future__ import annotations

import pytest

from prour.data.truncate import (
    OverBudget,
    PolicyTokens,
    is_excerpt,
    truncate_history,
    turn_groups,
)
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


def test_newest_user_message_stays_and_its_result_keeps_a_marked_head() -> None:
    history = [SYSTEM, {"role": "user", "content": "hi"}, call("c0"), result("c0", DIGITS)]
    # whole: 10 + 2 + 100 = 112 > 70, and the newest user message opens the history: nothing
    # older to drop. Head of k characters: 10 + 2 + k + 27 + 2 (N = 100 - k, two digits) <= 70
    # →  k = 29, N = 71; the user message and the call stay whole
    out = truncate_history(history, chars, budget=70)
    assert out.messages == [SYSTEM, {"role": "user", "content": "hi"}, call("c0"),
                            result("c0", DIGITS[:29] + "[… truncated 71 characters …]")]
    assert (out.truncated, out.dropped, out.tokens, out.excerpted) == (True, 0, 70, True)
    assert is_excerpt(out.messages[-1]) and not is_excerpt(history[-1])
    assert history[-1]["content"] == DIGITS  # the input is not modified


def test_older_turns_leave_before_the_newest_user_message_and_its_calls() -> None:
    history = [SYSTEM, {"role": "user", "content": "first"}, call("a"), result("a", DIGITS),
               {"role": "user", "content": "second"}, call("b"), result("b", DIGITS[:40]),
               call("c"), result("c", DIGITS[:50])]
    # the anchor (user "second" and the two calls after it): 10 + 6 + 40 + 50 = 106; one more
    # turn (the call "a" and its result) adds 100
    out = truncate_history(history, chars, budget=205)
    assert out.messages == [SYSTEM] + history[4:] and (out.dropped, out.tokens) == (3, 106)
    assert not out.excerpted
    # under 106 the anchor's results share one cap: 10 + 6 + 2 * (k + 29) <= 80 → k = 3
    out = truncate_history(history, chars, budget=80)
    assert out.messages == [SYSTEM, history[4], call("b"),
                            result("b", DIGITS[:3] + "[… truncated 37 characters …]"), call("c"),
                            result("c", DIGITS[:3] + "[… truncated 47 characters …]")]
    assert (out.dropped, out.tokens, out.excerpted) == (3, 80, True)


def test_parallel_results_share_one_cap_and_short_ones_stay_whole() -> None:
    history = [SYSTEM, call("c1", "c2"), result("c1", DIGITS[:40]), result("c2", "short")]
    # whole: 10 + 40 + 5 = 55 > 50; 10 + k + 29 (N = 40 - k, two digits) + 5 <= 50  →  k = 6
    out = truncate_history(history, chars, budget=50)
    assert out.messages == [SYSTEM, call("c1", "c2"),
                            result("c1", DIGITS[:6] + "[… truncated 34 characters …]"),
                            result("c2", "short")]
    assert (out.dropped, out.tokens) == (0, 50)


def test_newest_user_message_over_budget_is_never_cut_the_state_is_over_budget() -> None:
    history = [SYSTEM, call("c0"), result("c0", "ok"), {"role": "user", "content": DIGITS}]
    assert chars(history[3:]) == 110  # the user message alone: no tool result to cut
    assert truncate_history(history, chars, budget=110).messages == [SYSTEM, history[3]]
    with pytest.raises(OverBudget, match="no tool result to cut"):
        truncate_history(history, chars, budget=109)
    # with a result after it: a head of 1 (10 + 100 + 1 + 29) fits 140, the marker alone
    # (10 + 100 + 30) does not fit 139
    history += [call("c1"), result("c1", DIGITS)]
    assert truncate_history(history, chars, budget=140).messages[-1] == result(
        "c1", "0[… truncated 99 characters …]")
    with pytest.raises(OverBudget, match="max_prompt_tokens=139"):
        truncate_history(history, chars, budget=139)


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
    for budget in range(72, chars(history) + 1):  # 72: "and?", both results cut to a marker
        kept = truncate_history(history, chars, budget).messages
        called = [c["id"] for m in kept for c in m.get("tool_calls") or []]
        results = [m["tool_call_id"] for m in kept if m["role"] == "tool"]
        assert results == called, budget  # every kept result follows its kept call, in order
    with pytest.raises(OverBudget):
        truncate_history(history, chars, 71)


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
