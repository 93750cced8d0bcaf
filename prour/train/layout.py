"""How the update's samples are laid out for the model: padded or packed rows, token budgets.

Torch only (no recipe or verl imports), so ``benchmarks/gpu_step.py`` times these same functions
on a GPU machine that has no verl. Each layout gives the same per-sample logits; they differ in
the tokens a forward computes (padding) and in how many samples one forward takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def padded_response_logits(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """Per sample, the logits (R_i, V) that predict its response tokens, from a right-padded batch.

    ``seqs[i]`` is prompt + response token ids, ``prompts[i]`` the prompt length.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[row, : len(seq)] = 1
    keep = width - min(prompts) + 1  # logits of response positions only
    logits = model(
        input_ids=ids.to(device),
        attention_mask=attention.to(device),
        use_cache=False,
        logits_to_keep=keep,
    ).logits
    offset = width - keep
    return [
        logits[row, prompt - offset - 1 : len(seq) - offset - 1]
        for row, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True))
    ]


def packed_response_logits(
    model: Any, seqs: Sequence[Sequence[int]], prompts: Sequence[int], pad_id: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """As :func:`padded_response_logits`, from one packed row (1, sum of lengths) and no padding.

    Position ids restart at 0 for each sample and no attention mask is passed: transformers reads
    the restarts as sequence boundaries and masks attention block-diagonally (causal within each
    sample). Only the positions that predict response tokens reach the LM head. ``pad_id`` is
    unused (nothing is padded); it keeps the two layouts interchangeable.
    """
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)[None]
    positions = torch.cat([torch.arange(len(s), dtype=torch.long) for s in seqs])[None]
    keep, lengths, start = [], [], 0
    for seq, prompt in zip(seqs, prompts, strict=True):
        keep.append(torch.arange(start + prompt - 1, start + len(seq) - 1, dtype=torch.long))
        lengths.append(len(seq) - prompt)
        start += len(seq)
    logits = model(
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        use_cache=False,
        logits_to_keep=torch.cat(keep).to(device),
    ).logits
    return list(torch.split(logits[0], lengths))


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
