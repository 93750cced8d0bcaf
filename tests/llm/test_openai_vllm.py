"""The ``openai`` backend against a real vLLM CPU server serving the tiny model (one per module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from prour.llm.base import ChatRequest, SamplingParams, ScoreRequest

if TYPE_CHECKING:
    from prour.llm.hf import HFLLM

pytestmark = pytest.mark.vllm

CHAT = [
    {"role": "system", "content": "You are a retail customer-service agent."},
    {"role": "user", "content": "Please cancel order #W1234567, I ordered it by mistake."},
]


@pytest.fixture(scope="module")
def hf_llm(tiny_model_dir: Path) -> Iterator[HFLLM]:
    from prour.llm.hf import HFLLM

    llm = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32")
    yield llm
    llm.close()


def test_n8_sampling_returns_eight_completions(openai_llm) -> None:
    sampling = SamplingParams(n=8, temperature=1.0, max_tokens=12, seed=7)
    (completions,) = openai_llm.chat([ChatRequest(messages=CHAT, sampling=sampling)])
    assert len(completions) == 8
    assert len({c.text for c in completions}) > 1  # eight samples, not one copied
    for c in completions:
        assert 1 <= c.completion_tokens <= 12
        assert c.token_ids is not None and len(c.token_ids) == c.completion_tokens
        assert c.logprobs is not None and len(c.logprobs) == c.completion_tokens
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")


def test_thinking_off_renders_empty_think_block(openai_llm, vllm_server, hf_llm) -> None:
    def server_prompt(enable_thinking: bool) -> list[int]:
        body = {
            "model": "tiny",
            "messages": CHAT,
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": enable_thinking},
        }
        response = httpx.post(
            vllm_server.base_url.removesuffix("/v1") + "/tokenize", json=body, timeout=30
        )
        return response.json()["tokens"]

    tok = hf_llm.tokenizer
    off, on = server_prompt(False), server_prompt(True)
    assert tok.decode(off[len(on) :]) == "<think>\n\n</think>\n\n"
    assert off[: len(on)] == on
    assert off == hf_llm.encode(hf_llm.render_chat(CHAT, None, enable_thinking=False))
    # the chat endpoint receives the switch: its prompt is the thinking-off rendering
    request = ChatRequest(
        messages=CHAT, sampling=SamplingParams(max_tokens=2, seed=0), enable_thinking=False
    )
    (done,) = openai_llm.chat([request])[0]
    assert done.prompt_tokens == len(off)
    thinking = ChatRequest(
        messages=CHAT, sampling=SamplingParams(max_tokens=2, seed=0), enable_thinking=True
    )
    assert openai_llm.chat([thinking])[0][0].prompt_tokens == len(on)


def test_seeded_sampling_is_reproducible(openai_llm) -> None:
    def texts(seed: int) -> list[str]:
        sampling = SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=seed)
        return [c.text for c in openai_llm.chat([ChatRequest(messages=CHAT, sampling=sampling)])[0]]

    first, again, other = texts(123), texts(123), texts(124)
    assert first == again
    assert first != other


def test_greedy_generation_is_deterministic_and_bounded(openai_llm) -> None:
    request = ChatRequest(messages=CHAT, sampling=SamplingParams(temperature=0.0, max_tokens=6))
    one, two = openai_llm.chat([request, request])
    assert one[0].text == two[0].text and one[0].token_ids == two[0].token_ids
    assert one[0].completion_tokens <= 6


def test_scoring_agrees_with_hf_backend(openai_llm, hf_llm) -> None:
    requests = [
        ScoreRequest(context="The customer wants", target=" to cancel order #W1234567."),
        ScoreRequest(
            context=CHAT,
            target='{"tool":"cancel_pending_order","arguments":{"order_id":"#W1234567"}}',
        ),
        ScoreRequest(context=CHAT, target='{"tool":"respond","arguments":{}}'),
        ScoreRequest(
            context=CHAT, target="<think>\nask first\n</think>\n\nNO", enable_thinking=True
        ),
        ScoreRequest(context=CHAT, target=""),
    ]
    served, local = openai_llm.score(requests), hf_llm.score(requests)
    for i, (a, b) in enumerate(zip(served, local)):
        assert a.n_tokens == b.n_tokens, f"request {i}: token counts differ"
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4), f"request {i}"
        assert a.sum == pytest.approx(b.sum, abs=1e-4)
    assert served[-1].n_tokens == 0 and served[1].n_tokens > 5
