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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from prour.config.train import RolloutSettings, UpdateSettings
from prour.llm.base import ChatRequest, Completion, Message, SamplingParams
from prour.train.layout import LAYOUTS, lm_head_weight, response_logits

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.train import TrainConfig

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

    def sample_states(
        self, prompts: Sequence[Sequence[Message]], n: int, seed: int, first_state: int
    ) -> list[list[Rollout]]:
        """:meth:`sample` with prompt ``i`` drawing from the stream of state ``first_state + i``
        under the run's ``seed`` (a state's samples do not depend on what else is sampled)."""
        from prour.llm.hf import sample_seed

        seeds = [sample_seed(seed, first_state + i) for i in range(len(prompts))]
        return self.sample(prompts, n, seeds)

    def token_scores(
        self, rollouts: Sequence[Rollout], with_entropy: bool = False, *,
        update: UpdateSettings,
    ) -> TokenScores:
        """Log-probs (and entropies) of each response token given its prompt; differentiable.

        ``update`` (the recipe's ``train.update``) picks the layout of the forward (padded,
        packed, packed with an explicit document mask: :mod:`prour.train.layout`) and whether
        the scores come from full logits or :func:`~prour.core.fused_logprob.fused_token_scores`;
        every choice gives the same scores.
        """
        seqs = [r.prompt_ids + r.response_ids for r in rollouts]
        prompts = [len(r.prompt_ids) for r in rollouts]
        rows = LAYOUTS[update.layout](self.model, seqs, prompts, self.pad_id, self.device)
        targets = [r.response_ids for r in rollouts]
        temperature = self.settings.temperature
        if update.log_probs == "fused":
            return fused_response_scores(rows, lm_head_weight(self.model), targets, temperature,
                                         with_entropy, update.log_prob_chunk_tokens)
        return response_scores(response_logits(self.model, rows), targets, temperature,
                               with_entropy)


def policy_weights(recipe: Recipe) -> str:
    """The local folder of ``models.generator``'s weights (the policy the local trainer starts
    from); it must use the ``hf`` backend and have a path."""
    from prour.config import ConfigError
    from prour.llm.weights import local_weights

    model = recipe.models.get("generator")
    if model is None or model.backend != "hf" or not model.path:
        raise ConfigError(
            "models.generator",
            "the local trainer needs the policy with backend 'hf' and a path",
        )
    return local_weights(model.path, recipe.models_dir, "models.generator.path")


def load_policy(path: str | Path, cfg: TrainConfig, recipe: Recipe) -> tuple[Policy, torch.dtype]:
    """The policy at ``path`` in float32 (master weights) on ``train.device``, and the dtype
    its forwards run in (bf16 autocast on a GPU when ``train.dtype`` asks)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prour.llm.hf import resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    compute_dtype = resolve_dtype(cfg.dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device)
    if cfg.gradient_checkpointing and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    policy = Policy(model, tokenizer, cfg.rollout, recipe.data.max_prompt_tokens, seed=recipe.seed)
    logger.info("policy %s on %s (compute %s)", path, device, compute_dtype)
    return policy, compute_dtype


def response_scores(
    rows: Sequence[torch.Tensor],
    targets: Sequence[Sequence[int]],
    temperature: float,
    with_entropy: bool,
) -> TokenScores:
    """(B, R) response-token log-probs (and entropies) from each sample's logits (R_i, V)."""
    from prour.core.policy_gradient import token_entropy

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


def fused_response_scores(
    rows: Sequence[torch.Tensor],
    weight: torch.Tensor,
    targets: Sequence[Sequence[int]],
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
) -> TokenScores:
    """As :func:`response_scores`, from each sample's final hidden states (R_i, H) and the LM
    head's ``weight`` (V, H): the logits of at most ``chunk_tokens`` tokens exist at a time."""
    from prour.core.fused_logprob import fused_token_scores

    device = rows[0].device
    lengths = [len(t) for t in targets]
    ids = torch.tensor([i for t in targets for i in t], dtype=torch.long, device=device)
    log_probs, entropy = fused_token_scores(
        torch.cat(list(rows)), weight, ids, temperature, with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
    )
    return TokenScores(
        padded_split(log_probs, lengths),
        padded_split(entropy, lengths) if entropy is not None else None,
        padded_split(torch.ones(sum(lengths), device=device), lengths),
    )


def padded_split(flat: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """(sum of lengths,) split into rows of ``lengths``, right-padded with zeros: (B, max)."""
    width = max(lengths)
    return torch.stack([torch.nn.functional.pad(row, (0, width - row.shape[0]))
                        for row in torch.split(flat, list(lengths))])
