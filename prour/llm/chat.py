"""Chat rendering and the score-token rule, once for every backend that holds a tokenizer.

The ``hf`` backend, the ``openai`` backend (with a local tokenizer) and the verl rollout adapter
all turn a chat into prompt text and a :class:`~prour.llm.base.ScoreRequest` into token ids here,
so that the same request scores the same tokens whichever of them runs it.

The rule: a chat is rendered by the tokenizer's chat template with the generation prompt (Qwen3's
``enable_thinking`` on or off); a score request's context is its text as is or its messages so
rendered (without tools), its target is its text; context and target are tokenized separately,
without added special tokens, and the scored tokens are exactly the target's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prour.llm.base import ScoreRequest


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    enable_thinking: bool = False,
) -> str:
    """The prompt text of a chat: the tokenizer's chat template with the generation prompt."""
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without any added special tokens (chat templates add their own)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def context_text(tokenizer: Any, request: ScoreRequest) -> str:
    """The text of a score request's context: raw text as is, messages rendered as a chat prompt."""
    if isinstance(request.context, str):
        return request.context
    return render_chat(tokenizer, request.context, None, request.enable_thinking)


def score_ids(tokenizer: Any, request: ScoreRequest) -> tuple[list[int], list[int]]:
    """(context ids, target ids) of a score request, each tokenized on its own."""
    return encode(tokenizer, context_text(tokenizer, request)), encode(tokenizer, request.target)
