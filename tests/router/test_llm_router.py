"""The prompted LLM router: strict JSON replies, fallback on anything else, counted."""

from __future__ import annotations

import pytest

from prour.config.router import RouterConfig
from prour.llm.scripted import ScriptedLLM
from prour.router import LLMRouter
from prour.router.llm_router import parse_router_reply

MESSAGES = [{"role": "user", "content": "I want to change my order."}]


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("verify", "not_json"),
        ('```json\n{"mode": "act", "rationale": "x"}\n```', "not_json"),
        ('{"mode": "act"}', "wrong_keys"),
        ('{"mode": "act", "rationale": "x", "confidence": 1}', "wrong_keys"),
        ('{"mode": "ask", "rationale": "x"}', "bad_mode"),
        ('{"mode": "act", "rationale": 3}', "bad_rationale"),
        ("[]", "wrong_keys"),
    ],
)
def test_invalid_replies(reply: str, error: str) -> None:
    parsed = parse_router_reply(reply)
    assert isinstance(parsed, str) and parsed.startswith(error)


def test_router_routes_falls_back_and_counts() -> None:
    llm = ScriptedLLM(
        replies=[
            '{"mode": "clarify", "rationale": "which size is theirs to pick"}',
            "<think>lookup needed</think>" + '{"mode": "verify", "rationale": "order status"}',
            "I think act",
            '{"mode": "ask", "rationale": ""}',
        ]
    )
    router = LLMRouter(llm, ["get_order_details"], RouterConfig(llm_router_fallback="verify"))
    decisions = router.decide_many([MESSAGES] * 4)
    assert [d.mode for d in decisions] == ["clarify", "verify", "verify", "verify"]
    assert [d.valid for d in decisions] == [True, True, False, False]
    assert router.invalid == {"not_json": 1, "bad_mode": 1} and router.decisions == 4
    assert llm.calls["chat"] == 1  # one batched call
    prompt = llm.chat_log[0].messages[-1]["content"]
    assert "get_order_details, respond" in prompt and "I want to change my order." in prompt


def test_bad_fallback_is_rejected() -> None:
    with pytest.raises(ValueError, match="llm_router_fallback"):
        LLMRouter(ScriptedLLM(), [], RouterConfig(llm_router_fallback="ask"))
