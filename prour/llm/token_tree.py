"""A batch of sequences sharing a prefix, kept as a token tree in one KV-cache row.

Batching prompts that share a long prefix the usual way (one cache row per sequence) copies the
prefix's keys and values into every row and reads every copy again at each decoding step. Here the
whole batch lives in a single cache row: the shared prefix once, then the tokens of every branch,
appended in whatever order they come. An explicit attention mask lets each token see exactly its
ancestors (the prefix, then the earlier tokens of its own branch) and explicit position ids give
it the position it has in its own sequence, so every branch computes what it would compute alone
(up to floating-point summation order). The cost is attention over masked slots of other
branches, which is small while the branches are short next to the prefix.

Works for decoders whose layers are all full attention and whose attention kernel takes a 4-D
additive mask (``sdpa`` and ``eager``); :func:`supports_token_tree` says whether a model does.
"""

from __future__ import annotations

from typing import Any

import torch

# A tree forward carries at most this many new tokens (its mask is that many rows by the cache
# length); longer batches of segments are appended in several forwards.
MAX_TREE_QUERIES = 2048

_MASK_KERNELS = ("sdpa", "eager")


def supports_token_tree(model: Any) -> bool:
    """Whether ``model`` accepts a prepared 4-D mask on full-attention layers only."""
    config = model.config
    layer_types = getattr(config, "layer_types", None)
    return (
        bool(layer_types)
        and set(layer_types) == {"full_attention"}
        and getattr(config, "_attn_implementation", None) in _MASK_KERNELS
    )


def runs_within(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive index ranges [start, end) whose sizes sum to at most ``limit`` (or one item)."""
    runs, start = [], 0
    while start < len(sizes):
        end, total = start + 1, sizes[start]
        while end < len(sizes) and total + sizes[end] <= limit:
            total += sizes[end]
            end += 1
        runs.append((start, end))
        start = end
    return runs


def _pad_columns(visible: torch.Tensor, width: int) -> torch.Tensor:
    """Visibility rows [S, T] widened to [S, width] with slots they cannot see."""
    extra = width - visible.shape[1]
    return visible if extra == 0 else torch.nn.functional.pad(visible, (0, extra), value=False)


class TokenTree:
    """One cache row: a prefix encoded once, then segments that each continue one branch.

    A branch is described by its *visibility row*: a bool vector over the cache slots it may
    attend to. The prefix's row is all True; a segment appended to a branch returns the row of
    the longer branch (the parent's row plus the segment's own slots).
    """

    def __init__(self, model: Any, prefix: list[int]):
        from transformers import DynamicCache

        self.decoder = model.get_decoder()
        self.layer_types = sorted(set(model.config.layer_types))
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = DynamicCache()
        self.length = 0
        if prefix:
            ids = torch.tensor([prefix], device=self.device)
            self.decoder(input_ids=ids, past_key_values=self.cache, use_cache=True)
            self.length = len(prefix)

    def prefix_rows(self, count: int) -> torch.Tensor:
        """``count`` visibility rows [count, T] that see the whole cache (the prefix alone)."""
        return torch.ones((count, self.length), dtype=torch.bool, device=self.device)

    def crop(self, length: int) -> None:
        """Forget every slot after the first ``length`` (segments appended since then)."""
        self.cache.crop(length)
        self.length = length

    def extend(
        self, parents: torch.Tensor, segments: list[list[int]], starts: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append segment s (non-empty) to branch ``parents[s]``, its first token at ``starts[s]``.

        parents [S, T] bool with T <= the cache length. Returns the hidden states of the new
        tokens [sum of lengths, H] in segment order and the visibility rows of the extended
        branches [S, new cache length]. Segments are sent in forwards of at most
        ``MAX_TREE_QUERIES`` tokens (a single longer segment goes alone).
        """
        hidden, rows = [], []
        for start, end in runs_within([len(s) for s in segments], MAX_TREE_QUERIES):
            part_hidden, part_rows = self._append(
                _pad_columns(parents[start:end], self.length),
                segments[start:end],
                starts[start:end],
            )
            hidden.append(part_hidden)
            rows.append(part_rows)
        return torch.cat(hidden), torch.cat([_pad_columns(r, self.length) for r in rows])

    def _append(
        self, parents: torch.Tensor, segments: list[list[int]], starts: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over all ``segments``; ``parents`` [S, T] is as wide as the cache."""
        lengths = torch.tensor([len(s) for s in segments], device=self.device)
        owner = torch.repeat_interleave(torch.arange(len(segments), device=self.device), lengths)
        index = torch.arange(len(owner), device=self.device)
        own = (owner[:, None] == owner[None, :]) & (index[None, :] <= index[:, None])
        visible = torch.cat([parents[owner], own], dim=1)
        offsets = torch.cat([torch.arange(len(s)) + start for s, start in zip(segments, starts)])
        ids = torch.tensor([tok for s in segments for tok in s], device=self.device)
        hidden = self._forward(ids, offsets.to(self.device), visible)
        ends = lengths.cumsum(0) - 1
        return hidden, torch.cat([parents, own[ends]], dim=1)

    def step(
        self, parents: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one token to each branch (a decoding step).

        parents [A, T] bool as wide as the cache, tokens and positions [A] long. Returns the
        hidden states [A, H] and the branches' new visibility rows [A, T + A].
        """
        own = torch.eye(len(tokens), dtype=torch.bool, device=self.device)
        visible = torch.cat([parents, own], dim=1)
        return self._forward(tokens, positions, visible), visible

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor
    ) -> torch.Tensor:
        """Run the decoder on ``ids`` [Q] with visibility [Q, T + Q]; hidden states [Q, H]."""
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(~visible, torch.finfo(self.dtype).min)[None, None]
        out = self.decoder(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask={layer_type: mask for layer_type in self.layer_types},
            past_key_values=self.cache,
            use_cache=True,
        )
        self.length += len(ids)
        return out.last_hidden_state[0]
