"""How the update's samples are laid out for the model: padded or packed rows, token budgets.

Torch only (no recipe or verl imports), so ``benchmarks/gpu_step.py`` times these same functions
on a GPU machine that has no verl. A layout gives, per sample, the final hidden states (R_i, H)
at the positions that predict its response tokens; :func:`response_logits` turns them into
logits (R_i, V) through the LM head, and :func:`prour.core.fused_logprob.fused_token_scores`
into log-probs and entropies without full-vocabulary logits. Layouts differ in the tokens a
forward computes (padding) and in how many samples one forward takes, never in the values:

- ``padded``: right-padded rows with an attention mask;
- ``packed``: one row, position ids restarting per sample and no mask; transformers reads the
  restarts as sample boundaries and masks attention block-diagonally;
- ``packed_exact``: the same row with the block-diagonal causal mask built here from the sample
  lengths (:func:`document_mask`), so no sample can attend to another whatever the attention
  implementation infers from position ids (with ``flex_attention`` a BlockMask that skips the
  cross-sample blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# A layout: (model, seqs, prompt lengths, pad id, device) -> per-sample hidden states (R_i, H).
Layout = Callable[[Any, Sequence[Sequence[int]], Sequence[int], int, torch.device],
                  list[torch.Tensor]]


def decoder_hidden(model: Any, **inputs: Any) -> torch.Tensor:
    """The final hidden states (B, L, H) of a causal LM's decoder (after its last norm): what
    its LM head reads. ``inputs``: ``input_ids``, ``attention_mask``, ``position_ids``."""
    return model.get_decoder()(**inputs, use_cache=False).last_hidden_state


def lm_head_weight(model: Any) -> torch.Tensor:
    """The LM head's weight (V, H), refusing heads that are more than ``hidden @ W^T``."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("the fused log-probs need an LM head without bias; this one has a bias")
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError("the fused log-probs do not apply final_logit_softcapping")
    return head.weight


def response_logits(model: Any, rows: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The LM head on each sample's hidden states: logits (R_i, V) per sample."""
    head = model.get_output_embeddings()
    return [head(row) for row in rows]


def padded_response_hidden(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """Per sample, the hidden states (R_i, H) that predict its response tokens, from a
    right-padded batch. ``seqs[i]`` is prompt + response token ids, ``prompts[i]`` the prompt
    length."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[row, : len(seq)] = 1
    hidden = decoder_hidden(model, input_ids=ids.to(device), attention_mask=attention.to(device))
    return [
        hidden[row, prompt - 1 : len(seq) - 1]
        for row, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True))
    ]


def packed_rows_hidden(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], device: torch.device,
    attention_mask: Any = None,
) -> list[torch.Tensor]:
    """As :func:`padded_response_hidden`, from one packed row (1, sum of lengths) with position
    ids restarting at 0 per sample and ``attention_mask`` passed as it is (None: transformers
    derives the mask from the position ids)."""
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)[None]
    positions = torch.cat([torch.arange(len(s), dtype=torch.long) for s in seqs])[None]
    hidden = decoder_hidden(model, input_ids=ids.to(device), position_ids=positions.to(device),
                            attention_mask=attention_mask)[0]
    rows, start = [], 0
    for seq, prompt in zip(seqs, prompts, strict=True):
        rows.append(hidden[start + prompt - 1 : start + len(seq) - 1])
        start += len(seq)
    return rows


def packed_response_hidden(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """The ``packed`` layout: no mask is passed; transformers reads the restarts of the position
    ids as sequence boundaries and masks attention block-diagonally (causal within each
    sample). ``pad_id`` is unused (nothing is padded); it keeps the layouts interchangeable."""
    return packed_rows_hidden(model, seqs, prompts, device)


def packed_exact_response_hidden(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """The ``packed_exact`` layout: the packed row with :func:`document_mask` of the samples'
    lengths, so attention stays within each sample by construction. ``pad_id`` is unused."""
    mask = document_mask(model, sample_ids([len(s) for s in seqs]), device)
    return packed_rows_hidden(model, seqs, prompts, device, attention_mask=mask)


def sample_ids(lengths: Sequence[int]) -> torch.Tensor:
    """(sum of lengths,) the index of the sample each token of a packed row belongs to."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths)))


def document_mask(model: Any, documents: torch.Tensor, device: torch.device) -> Any:
    """The block-diagonal causal mask of a packed row whose token ``i`` belongs to sample
    ``documents[i]``: query ``q`` sees key ``k`` iff ``k <= q`` and both are in one sample. In the
    form the model's attention implementation takes (transformers passes a 4-D mask or a
    BlockMask through unchanged): a (1, 1, N, N) boolean mask for ``sdpa``, an additive float
    mask for ``eager``, a FlexAttention ``BlockMask`` for ``flex_attention``."""
    implementation = model.config._attn_implementation
    documents = documents.to(device)
    n = documents.shape[0]
    if implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        def same_sample_causal(b: Any, h: Any, q: Any, k: Any) -> Any:
            return (documents[q] == documents[k]) & (k <= q)

        return create_block_mask(same_sample_causal, None, None, n, n, device=device)
    positions = torch.arange(n, device=device)
    allowed = (documents[:, None] == documents[None, :]) & (positions[None, :] <= positions[:, None])
    if implementation == "sdpa":
        return allowed[None, None]
    if implementation == "eager":
        blocked = torch.zeros((n, n), dtype=torch.float32, device=device)
        return blocked.masked_fill_(~allowed, torch.finfo(torch.float32).min)[None, None]
    raise ValueError(
        f"the packed_exact layout builds masks for sdpa, eager and flex_attention attention; this "
        f"model uses {implementation!r}"
    )


LAYOUTS: dict[str, Layout] = {
    "padded": padded_response_hidden,
    "packed": packed_response_hidden,
    "packed_exact": packed_exact_response_hidden,
}


def padded_response_logits(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """Per sample, the logits (R_i, V) that predict its response tokens (``padded`` layout)."""
    return response_logits(model, padded_response_hidden(model, seqs, prompts, pad_id, device))


def packed_response_logits(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """As :func:`padded_response_logits`, from the ``packed`` layout."""
    return response_logits(model, packed_response_hidden(model, seqs, prompts, pad_id, device))


def token_micro_batches(lengths: Sequence[int], budget: int, packed: bool) -> list[list[int]]:
    """Consecutive positions of ``lengths`` (tokens per sample) grouped so that each group's
    forward computes at most ``budget`` tokens: their sum when packed, rows x longest when padded.
    A sample longer than the budget forms a group alone. Order is kept, so the mini-batch and
    its token-mean loss are unchanged; only the accumulation is regrouped."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, length in enumerate(lengths):
        widest = max(longest, length)
        cost = (sum(lengths[i] for i in current) + length) if packed else widest * (len(current) + 1)
        if current and cost > budget:
            groups.append(current)
            current, widest = [], length
        current.append(index)
        longest = widest
    if current:
        groups.append(current)
    return groups
