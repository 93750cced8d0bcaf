"""The scripted test double and the backend registry (CPU, no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prour.config import ModelConfig
from prour.llm import BackendError, ChatRequest, SamplingParams, ScoreRequest
from prour.llm.registry import build_llm
from prour.llm.scripted import (
    ScriptedLLM,
    register_script,
    render_prompt,
    scripted_from_config,
    word_overlap_logprobs,
)

SYSTEM = {"role": "system", "content": "You are the retail agent."}


def _ask(llm: ScriptedLLM, text: str, n: int = 1, **sampling) -> list[str]:
    [completions] = llm.chat(
        [ChatRequest([SYSTEM, {"role": "user", "content": text}], SamplingParams(n=n, **sampling))]
    )
    return [c.text for c in completions]


def test_render_prompt_is_role_prefixed_history_with_system_and_tools():
    messages = [
        SYSTEM,
        {"role": "user", "content": "Cancel #W1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'},
                }
            ],
        },
        {
            "role": "tool",
            "name": "get_order_details",
            "tool_call_id": "c",
            "content": '{"status": "pending"}',
        },
    ]
    assert render_prompt(messages) == (
        "system: You are the retail agent.\n"
        "user: Cancel #W1\n"
        'assistant calls tool: get_order_details({"order_id": "#W1"})\n'
        'tool get_order_details returned: {"status": "pending"}'
    )


def test_first_matching_rule_answers_and_lists_cycle():
    llm = ScriptedLLM(
        rules=[
            (r"system: You are the retail agent\..*user: .*refund", ["A", "B"]),
            (r"refund", "never reached"),
            (r"user: (?i:hello)", lambda messages: f"echo {messages[-1]['content']}"),
        ]
    )
    assert _ask(llm, "I want a refund", n=3) == ["A", "B", "A"]
    assert _ask(llm, "another refund") == ["B"]
    assert _ask(llm, "HELLO there") == ["echo HELLO there"]


def test_queue_then_default_then_error():
    llm = ScriptedLLM(rules=[("special", "rule")], replies=["first", "second"])
    assert _ask(llm, "x", n=2) == ["first", "second"]
    assert _ask(llm, "special") == ["rule"]
    with pytest.raises(BackendError, match="user: no more"):
        _ask(llm, "no more")
    llm.default = "fallback"
    assert _ask(llm, "still nothing") == ["fallback"]


def test_calls_and_requests_are_counted_and_logged():
    llm = ScriptedLLM(default="ok")
    requests = [ChatRequest([{"role": "user", "content": str(i)}]) for i in range(3)]
    llm.chat(requests)
    llm.chat(requests[:1])
    llm.score([ScoreRequest("a", "b")] * 4)
    assert llm.calls == {"chat": 2, "chat_requests": 4, "score": 1, "score_requests": 4}
    assert llm.chat_log == requests + requests[:1]
    assert len(llm.score_log) == 4


def test_replies_are_parsed_like_a_real_backend():
    reply = (
        "<think>\ncheck first\n</think>\n\nLooking it up.\n"
        '<tool_call>\n{"name": "get_order_details", '
        '"arguments": {"order_id": "#W1"}}\n</tool_call>'
    )
    llm = ScriptedLLM(default=reply)
    [[completion]] = llm.chat([ChatRequest([{"role": "user", "content": "x"}])])
    assert completion.reasoning == "check first"
    assert completion.content == "Looking it up."
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [
        ("get_order_details", {"order_id": "#W1"})
    ]
    assert completion.finish_reason == "stop"


def test_stop_strings_cut_the_reply():
    llm = ScriptedLLM(default="Thanks! ###STOP### trailing")
    assert _ask(llm, "x", stop=("###STOP###",)) == ["Thanks! "]


def test_default_score_is_word_overlap():
    llm = ScriptedLLM()
    [hit, empty] = llm.score(
        [ScoreRequest("The user wants a Refund.", "refund, please"), ScoreRequest("c", "")]
    )
    assert hit.token_logprobs[0] == -0.1
    assert -3.0 <= hit.token_logprobs[1] < -2.0
    assert empty.token_logprobs == []
    # deterministic, and a context that mentions the target scores higher
    assert word_overlap_logprobs("x", "please") == word_overlap_logprobs("y", "please")
    assert word_overlap_logprobs("please do", "please")[0] > word_overlap_logprobs("x", "please")[0]


def test_chat_context_is_rendered_for_scoring_and_custom_scorer():
    seen = []
    llm = ScriptedLLM(scorer=lambda context, target: seen.append((context, target)) or [-1.0, -2.0])
    [result] = llm.score([ScoreRequest([{"role": "user", "content": "hi"}], "yo")])
    assert seen == [("user: hi", "yo")]
    assert (result.sum, result.mean, result.n_tokens) == (-3.0, -1.5, 2)


def test_from_file_and_registered_scripts(tmp_path: Path):
    path = tmp_path / "script.yaml"
    path.write_text(
        "rules:\n  - pattern: 'order'\n    reply: ORDER\nreplies: [one]\ndefault: later\n"
    )
    llm = scripted_from_config(str(path))
    assert _ask(llm, "my order") == ["ORDER"]
    assert _ask(llm, "x") == ["one"]
    assert _ask(llm, "x") == ["later"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("rule: []\n")
    with pytest.raises(ValueError, match="unknown script keys"):
        ScriptedLLM.from_file(bad)
    register_script("always-no", lambda: ScriptedLLM(default="NO"))
    assert _ask(scripted_from_config("always-no"), "x") == ["NO"]
    with pytest.raises(ValueError, match="Did you mean 'always-no'"):
        scripted_from_config("always_no")


def test_build_llm_by_name(tmp_path: Path):
    path = tmp_path / "s.json"
    path.write_text('{"default": "hello"}')
    llm = build_llm(ModelConfig(backend="scripted", script=str(path)))
    assert isinstance(llm, ScriptedLLM) and _ask(llm, "x") == ["hello"]
    with pytest.raises(
        ValueError, match=r"unknown backend 'hff'; valid: hf, openai, scripted\. Did you mean 'hf'"
    ):
        build_llm(ModelConfig.model_construct(backend="hff"))
