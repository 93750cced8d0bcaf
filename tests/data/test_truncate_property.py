"""Property of truncation over many real-shaped histories and budgets: every kept row holds the
newest user message of its history, verbatim, and fits; the states that cannot fit are the ones
whose newest user message and what follows it exceed the budget even with every tool result after
it cut to the marker, and they are dropped (counted here as extraction counts them).

Histories look like tau2 retail conversations: a greeting, user turns, the agent's tool calls
with JSON results (some of several thousand characters: orders with many items), text replies,
and a decision after the newest user message and 0 to 3 calls. Budgets run from the template's
own size (the prompt around an empty history) up to 2,000 tokens, counted with the tiny policy
tokenizer the tests build. The checks below recompute each property from the history itself.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from prour.data.truncate import EXCERPT_MARK, OverBudget, PolicyTokens, truncate_history
from prour.rollout.query import query_prompt

WORDS = ("order", "item", "exchange", "return", "address", "refund", "pending", "delivered",
         "shirt", "lamp", "please", "card", "gift", "zip", "my", "the", "want", "to", "a")


def text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def order_json(rng: random.Random) -> str:
    """A tool result shaped like tau2's get_order_details: ids first, then a list of items."""
    items = [{"name": rng.choice(WORDS), "product_id": str(rng.randrange(10**9)),
              "item_id": str(rng.randrange(10**9)), "price": round(rng.uniform(5, 900), 2),
              "options": {"color": rng.choice(WORDS), "size": rng.choice("SML")}}
             for _ in range(rng.choice((1, 2, 4, 12, 40)))]
    return json.dumps({"order_id": f"#W{rng.randrange(10**7)}", "user_id": "yusuf_rossi_9620",
                       "status": rng.choice(("pending", "delivered")), "items": items})


def history_of(rng: random.Random) -> list[dict]:
    """A conversation ending right before an agent decision that follows a user message."""
    calls = iter(range(10**6))
    messages: list[dict] = [{"role": "assistant", "content": "Hi! How can I help you today?"}]

    def agent_calls(n: int) -> None:
        for _ in range(n):
            ids = [f"c{next(calls)}" for _ in range(rng.choice((1, 1, 2)))]
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": i, "type": "function", "function": {
                    "name": "get_order_details", "arguments": json.dumps({"order_id": "#W1"})}}
                for i in ids]})
            messages.extend({"role": "tool", "tool_call_id": i, "name": "get_order_details",
                             "content": order_json(rng)} for i in ids)

    for _ in range(rng.randint(0, 9)):  # earlier exchanges
        messages.append({"role": "user", "content": text(rng, 3, 60)})
        agent_calls(rng.randint(0, 3))
        messages.append({"role": "assistant", "content": text(rng, 3, 40)})
    messages.append({"role": "user", "content": text(rng, 1, rng.choice((20, 200)))})
    agent_calls(rng.randint(0, 3))
    return messages


def newest_user(history: list[dict]) -> int:
    return max(i for i, m in enumerate(history) if m["role"] == "user")


def marked(content: str) -> bool:
    """Whether ``content`` is a head of some text followed by the marker."""
    head, _, tail = content.rpartition("[… truncated ")
    return bool(head or content.startswith("[… truncated ")) and tail.endswith(" characters …]")


@pytest.fixture(scope="module")
def tokens(tiny_model_dir) -> PolicyTokens:
    return PolicyTokens(tiny_model_dir)


def check_kept(history: list[dict], kept: list[dict], count, budget: int) -> None:
    u = newest_user(history)
    assert history[u] in kept, "the newest user message is not kept verbatim"
    assert count(kept) <= budget
    start = kept.index(history[u])
    anchor = history[u:]
    assert len(kept) - start == len(anchor) and kept[:start] == history[u - start:u]
    for mine, row in zip(anchor, kept[start:]):  # after the user message: only results cut
        if row != mine:
            assert mine["role"] == "tool" and marked(row["content"])
            head = row["content"][: row["content"].rindex("[… truncated ")]
            assert mine["content"].startswith(head) and row["content"] == head + \
                EXCERPT_MARK.format(n=len(mine["content"]) - len(head))
    excerpted = kept[start:] != anchor
    if excerpted:  # only when the older turns are all gone and the anchor alone is over
        assert start == 0 and count(anchor) > budget
    elif start < u:  # maximal: the turn before the kept ones does not fit too
        turn = max(i for i in range(u - start) if history[i]["role"] != "tool")
        assert count(history[turn:]) > budget
    called = set()
    for m in kept:  # no tool result without its call
        called |= {c["id"] for c in m.get("tool_calls") or []}
        assert m["role"] != "tool" or m["tool_call_id"] in called


def check_dropped(history: list[dict], count, budget: int) -> None:
    """A dropped state cannot fit: its anchor with every tool result cut to the bare marker
    (or, with no result to cut, as it is) is still over budget."""
    anchor = history[newest_user(history):]
    bare = [{**m, "content": EXCERPT_MARK.format(n=len(m["content"]))}
            if m["role"] == "tool" and m["content"] else m for m in anchor]
    assert count(bare) > budget


def test_every_kept_row_holds_the_newest_user_message(tokens: PolicyTokens) -> None:
    rng = random.Random(24)
    seen: Counter[str] = Counter()
    for case in range(24):
        history = history_of(rng)
        mode = ("verify", "clarify")[case % 2]
        count = lambda h, mode=mode: tokens.chat(query_prompt(mode, h))
        floor = count([])  # the template's own size
        for budget in sorted({floor, 2000, *(rng.randint(floor, 2000) for _ in range(4))}):
            try:
                out = truncate_history(history, count, budget)
            except OverBudget:
                check_dropped(history, count, budget)
                seen["over_budget"] += 1
                continue
            check_kept(history, out.messages, count, budget)
            assert out.tokens == count(out.messages)
            seen["excerpted" if out.excerpted else "truncated" if out.truncated else "whole"] += 1
    # the cases cover every outcome, drops included (counted as extraction counts them)
    assert min(seen[k] for k in ("whole", "truncated", "excerpted", "over_budget")) >= 5, seen
