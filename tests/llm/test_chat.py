"""The one score-token rule (prour.llm.chat): by-hand ids, and the same ids from every backend."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from prour.llm.base import ScoreRequest
from prour.llm.chat import render_chat, score_ids

CHAT = [
    {"role": "system", "content": "You are a retail agent."},
    {"role": "user", "content": "Please cancel order #W1234567."},
]
REQUESTS = [
    ScoreRequest(context=CHAT, target="I want to cancel #W1234567.", enable_thinking=False),
    ScoreRequest(context=CHAT, target="NO", enable_thinking=True),
    ScoreRequest(context="Plain text context:", target=" a target"),
]



def _by_hand(tokenizer: Any, request: ScoreRequest) -> tuple[list[int], list[int]]:
    """The rule written out with the tokenizer's own calls."""
    if isinstance(request.context, str):
        text = request.context
    else:
        text = tokenizer.apply_chat_template(
            list(request.context),
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=request.enable_thinking,
        )
    context = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(context), list(tokenizer(request.target, add_special_tokens=False)["input_ids"])


def test_score_ids_tokenize_context_and_target_apart(tiny_tokenizer):
    for request in REQUESTS:
        assert score_ids(tiny_tokenizer, request) == _by_hand(tiny_tokenizer, request)
    # apart, not jointly: "context:" + " a target" need not tokenize as the joined string
    context, target = score_ids(tiny_tokenizer, REQUESTS[2])
    assert tiny_tokenizer.decode(target) == " a target"
    assert tiny_tokenizer.decode(context) == "Plain text context:"


def test_thinking_off_prefills_an_empty_think_block(tiny_tokenizer):
    off = render_chat(tiny_tokenizer, CHAT, enable_thinking=False)
    on = render_chat(tiny_tokenizer, CHAT, enable_thinking=True)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")


def test_tools_go_into_the_system_turn(tiny_tokenizer):
    tool = {"type": "function", "function": {"name": "get_order_details", "parameters": {}}}
    text = render_chat(tiny_tokenizer, CHAT, tools=[tool])
    assert text.index("get_order_details") < text.index("<|im_end|>")
    assert "get_order_details" not in render_chat(tiny_tokenizer, CHAT)


@dataclass
class _Output:
    token_ids: list[int]
    extra_fields: dict[str, Any] = field(default_factory=dict)


def _verl_prompts(tokenizer: Any, requests: list[ScoreRequest]) -> list[list[int]]:
    """The prompt ids the verl rollout adapter sends to its server to score ``requests``."""
    from prour.train.verl_ext.logic import RolloutServerLLM

    sent: list[list[int]] = []

    async def generate(prompt_ids: list[int], sampling: dict[str, Any]) -> _Output:
        sent.append(list(prompt_ids))
        return _Output([0], {"prompt_logprobs": [[0.0]] * len(prompt_ids)})

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        RolloutServerLLM(generate, tokenizer, loop).score(requests)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
    return sent


def test_hf_openai_and_verl_score_the_same_ids(tiny_model_dir, tiny_tokenizer):
    from prour.llm.hf import HFLLM
    from prour.llm.openai import OpenAILLM

    hf = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32")
    openai = OpenAILLM("http://127.0.0.1:9", "tiny", api_key_env="OPENAI_API_KEY",
                       max_concurrency=1, timeout_s=1.0, max_retries=0,
                       tokenizer_path=str(tiny_model_dir))
    try:
        hf_ids = [(hf._context_ids(i, r, {}), hf.encode(r.target)) for i, r in enumerate(REQUESTS)]
        openai_ids = [openai.local_score_ids(r) for r in REQUESTS]
    finally:
        openai.close()
        hf.close()
    expected = [_by_hand(tiny_tokenizer, r) for r in REQUESTS]
    assert hf_ids == expected
    assert openai_ids == expected
    assert _verl_prompts(tiny_tokenizer, REQUESTS) == [c + t for c, t in expected]
