"""The policy being trained, in process: chat-template prompts, group sampling, token log-probs.

One ``transformers`` model object samples the queries, scores the reward's beliefs (through the
``hf`` backend wrapped around it) and receives the gradient, so all three see the same weights.
Log-probs are taken from ``logits / temperature``, the distribution the samples were drawn from
(as verl's actor does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prour.config.train import RolloutSettings
from prour.llm.base import ChatRequest, Completion, Message, SamplingParams
from prour.train.layout import packed_response_logits, padded_response_logits

logger = logging.getLogger(__name__)


@dataclass
class Rollout:
    """One sampled response to a state's prompt; ``response_ids`` end with the stop token if any."""

    state: int
    prompt_ids: list[int]
    response_ids: list[int]
    completion: Completion

    @property
    def finish_reason(self) -> str:
        return self.completion.finish_reason


@dataclass
class TokenScores:
    """Per-token log-probs and entropies of responses, right-padded: all (B, R)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    mask: torch.Tensor


class Policy:
    """The live model and tokenizer with the recipe's rollout settings and prompt budget.

    Sampling and the reward's belief scoring go through :class:`~prour.llm.hf.HFLLM` wrapped
    around the same model object (``self.llm``); the update uses :meth:`token_scores`.
    """

    def __init__(self, model: Any, tokenizer: Any, settings: RolloutSettings,
                 max_prompt_tokens: int, seed: int):
        from prour.llm.hf import HFLLM

        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.max_prompt_tokens = max_prompt_tokens  # data.max_prompt_tokens
        self.llm = HFLLM.from_model(model, tokenizer, seed=seed)
        self.device = self.llm.device
        self.pad_id = self.llm.pad_id

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the chat prompt exactly as sampling renders it."""
        text = self.llm.render_chat(list(messages), None, self.settings.enable_thinking)
        return self.llm.encode(text)

    def check_prompt(self, messages: Sequence[Message], where: str) -> int:
        """Prompt length in tokens; refuses prompts over ``max_prompt_tokens`` (naming the row)."""
        length = len(self.prompt_ids(messages))
        limit = self.max_prompt_tokens
        if length > limit:
            raise ValueError(
                f"{where}: the prompt has {length} tokens, over "
                f"data.max_prompt_tokens={limit}; re-extract the dataset with this "
                "tokenizer and budget (history is left-truncated there)"
            )
        return length

    @torch.no_grad()
    def sample(
        self, prompts: Sequence[Sequence[Message]], n: int, seeds: Sequence[int]
    ) -> list[list[Rollout]]:
        """``n`` responses per prompt; prompt ``i`` samples from a stream seeded ``seeds[i]``."""
        s = self.settings
        requests = [
            ChatRequest(
                messages=list(messages),
                sampling=SamplingParams(
                    n=n,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=s.top_k,
                    max_tokens=s.max_response_tokens,
                    seed=seed,
                ),
                enable_thinking=s.enable_thinking,
            )
            for messages, seed in zip(prompts, seeds, strict=True)
        ]
        was_training = self.model.training
        self.model.eval()
        try:
            groups = self.llm.chat(requests)
        finally:
            self.model.train(was_training)
        rollouts = []
        for i, (messages, completions) in enumerate(zip(prompts, groups)):
            prompt = self.prompt_ids(messages)
            rollouts.append([Rollout(i, prompt, list(c.token_ids or []), c) for c in completions])
        return rollouts

    def token_scores(
        self, rollouts: Sequence[Rollout], with_entropy: bool = False, *, packed: bool
    ) -> TokenScores:
        """Log-probs (and entropies) of each response token given its prompt; differentiable.

        ``packed``: the samples go through the model as one row without padding (position ids
        restart per sample, so attention stays within each sample); the scores are the same.
        """
        seqs = [r.prompt_ids + r.response_ids for r in rollouts]
        prompts = [len(r.prompt_ids) for r in rollouts]
        forward = packed_response_logits if packed else padded_response_logits
        rows = forward(self.model, seqs, prompts, self.pad_id, self.device)
        targets = [r.response_ids for r in rollouts]
        return response_scores(rows, targets, self.settings.temperature, with_entropy)


def response_scores(
    rows: Sequence[torch.Tensor],
    targets: Sequence[Sequence[int]],
    temperature: float,
    with_entropy: bool,
) -> TokenScores:
    """(B, R) response-token log-probs (and entropies) from each sample's logits (R_i, V)."""
    from prour.train.algorithm import token_entropy

    device = rows[0].device
    width = max(len(t) for t in targets)
    rows_lp, rows_ent = [], []
    mask = torch.zeros((len(rows), width), device=device)
    for row, (logits, target) in enumerate(zip(rows, targets, strict=True)):
        step_logits = logits.float() / temperature
        length = len(target)
        ids = torch.tensor(target, dtype=torch.long, device=device)
        log_probs = torch.log_softmax(step_logits, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
        rows_lp.append(torch.nn.functional.pad(log_probs, (0, width - length)))
        if with_entropy:
            rows_ent.append(
                torch.nn.functional.pad(token_entropy(step_logits), (0, width - length))
            )
        mask[row, :length] = 1
    entropy = torch.stack(rows_ent) if with_entropy else None
    return TokenScores(torch.stack(rows_lp), entropy, mask)
