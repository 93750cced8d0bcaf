"""Left truncation: whole turns leave oldest first, system stays, tool results stay with calls."""

from __future__ import annotations

import pytest

from prour.data.truncate import ELLIPSIS, PolicyTokens, truncate_history, turn_groups
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


def test_last_turn_alone_too_long_is_cut_from_the_left() -> None:
    out = truncate_history(HISTORY, words, budget=7)  # template 4 + 3 words of the last turn
    assert out.messages[0] == SYSTEM and len(out.messages) == 2
    assert out.messages[1]["content"].startswith(ELLIPSIS)
    assert out.tokens == 7 and out.truncated
    assert HISTORY[-1]["content"] == "w " * 5  # the input is not modified


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
