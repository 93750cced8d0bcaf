"""The ``hf`` backend: a transformers causal LM in this process (CPU or one GPU).

Generation runs our own batched decoding loop (KV cache, finished rows dropped from the batch)
so that every sample draws from its own seeded random stream: a request's samples are the same
whether it runs alone or in a batch. Equal prompts in one call are prefilled once. When the
prompts of a batch are mostly one shared prefix (the decomposer's K·L action prompts, the n
samples of one prompt), the batch is a token tree (:mod:`prour.llm.token_tree`): the prefix is
encoded once, each prompt's rest once, and every sample decodes on its own branch without a copy
of the prompt cache. Otherwise prompts are left-padded into one cache row per sample.

Scoring reuses work on two levels: the token prefix common to all contexts of a call is encoded
once, each distinct context's rest once on top of it, and every target is a branch on its
context. ``Completion.logprobs`` are the model's own log-probs of the chosen tokens (before
temperature, top-k and top-p), as vLLM reports them by default.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from prour import interrupt
from prour.llm import chat as chat_rules
from prour.llm.base import ChatRequest, Completion, SamplingParams, ScoreRequest, ScoreResult
from prour.llm.token_tree import MAX_TREE_QUERIES, TokenTree, runs_within, supports_token_tree

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# Prompts (and scoring contexts) that share at least this many leading tokens are batched as
# one token tree over that prefix, encoded once.
MIN_SHARED_PREFIX = 16


def resolve_device(device: str) -> torch.device:
    """``auto`` → the GPU when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` → bfloat16 on a GPU that supports it, float32 otherwise."""
    if dtype == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def sample_seed(base: int, index: int) -> int:
    """The seed of sample ``index`` of a request seeded with ``base`` (63-bit)."""
    digest = hashlib.blake2b(f"{base}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def filtered_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampling distribution after temperature, top-k and top-p, over tokens sorted by logit.

    logits [R, V]; temperature, top_p [R] float; top_k [R] long (V for no limit).
    Returns (probs [R, V] in sorted order, token ids [R, V] of that order).
    """
    scaled = logits.float() / temperature[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(-1) - probs
    nucleus_cut = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    probs = probs.masked_fill(nucleus_cut, 0.0)
    return probs / probs.sum(-1, keepdim=True), order


def draw_tokens(probs: torch.Tensor, order: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row from ``probs`` with the row's uniform in [0, 1)."""
    cdf = probs.cumsum(-1)
    index = (cdf < uniforms[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)
    return order.gather(1, index[:, None]).squeeze(1)


def _generator(params: SamplingParams, base: int, index: int) -> torch.Generator | None:
    """The random stream of one sample (None when decoding greedily)."""
    return None if params.greedy else torch.Generator().manual_seed(sample_seed(base, index))


# transformers' lazy imports and ``from_pretrained`` are not safe in two threads at once (a
# second thread can find ``AutoModelForCausalLM`` missing, or a model half built on the meta
# device): backends built at the same moment (a checkpoint sweep's generators, built in the eval
# queue's threads) load one after another.
_LOADING = threading.Lock()


@dataclass
class _Row:
    """One sample being generated: its settings, random stream, tokens so far and how it ended."""

    request: int
    prompt: int
    params: SamplingParams
    limit: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    hit_eos: bool = False


class HFLLM:
    """In-process transformers backend; thread-safe (one call at a time holds the model)."""

    name = "hf"

    def __init__(
        self,
        path: str,
        device: str,
        dtype: str,
        seed: int = 0,
        max_model_len: int | None = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        prefix_reuse: bool = True,
    ):
        target = resolve_device(device)
        with _LOADING:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, target))
            model, tokenizer = model.to(target).eval(), AutoTokenizer.from_pretrained(path)
        self._attach(
            model,
            tokenizer,
            seed,
            max_model_len,
            max_batch_size,
            max_batch_tokens,
            prefix_reuse,
        )
        self.path = str(path)
        logger.info(
            "hf backend: %s on %s (%s), max_len %d", path, self.device, self.dtype, self.max_len
        )

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        seed: int = 0,
        max_model_len: int | None = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        prefix_reuse: bool = True,
    ) -> HFLLM:
        """Serve a model object that is already loaded (the policy being trained), without a copy.

        The caller keeps control of the model's train/eval mode and of its weights between calls.
        """
        self = cls.__new__(cls)
        self._attach(
            model, tokenizer, seed, max_model_len, max_batch_size, max_batch_tokens, prefix_reuse
        )
        self.path = str(getattr(model, "name_or_path", "") or "<in-memory model>")
        return self

    def _attach(
        self,
        model: Any,
        tokenizer: Any,
        seed: int,
        max_model_len: int | None,
        max_batch_size: int,
        max_batch_tokens: int,
        prefix_reuse: bool,
    ) -> None:
        """Set up around a loaded model and tokenizer (device and dtype are the model's)."""
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.model, self.tokenizer = model, tokenizer
        self.max_len = max_model_len or int(model.config.max_position_embeddings)
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self.prefix_reuse = prefix_reuse
        self.eos_ids = self._eos_ids()
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        )
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def _eos_ids(self) -> set[int]:
        """Token ids that end a reply: the tokenizer's eos plus generation_config's."""
        ids: set[int] = set()
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(int(i) for i in configured)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        if not ids:
            raise ValueError(
                f"{self.model.name_or_path}: neither tokenizer nor generation_config "
                "names an eos token"
            )
        return ids

    # ---- prompts -------------------------------------------------------------------------

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        enable_thinking: bool,
    ) -> str:
        """The prompt text of a chat (:func:`prour.llm.chat.render_chat` with this tokenizer)."""
        return chat_rules.render_chat(self.tokenizer, messages, tools, enable_thinking)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any added special tokens."""
        return chat_rules.encode(self.tokenizer, text)

    def _encode_once(self, text: str, memo: dict[str, list[int]]) -> list[int]:
        """``encode`` through a per-call memo: equal texts of one call are tokenized once."""
        if text not in memo:
            memo[text] = self.encode(text)
        return memo[text]

    def _context_ids(
        self, index: int, request: ScoreRequest, memo: dict[str, list[int]]
    ) -> list[int]:
        """Token ids of a score request's context (chat contexts end with the generation prompt)."""
        ids = self._encode_once(chat_rules.context_text(self.tokenizer, request), memo)
        if not ids:
            raise ValueError(
                f"score request {index}: the context is empty; the first target token "
                "needs at least one context token"
            )
        return ids

    def _check_length(self, what: str, n_tokens: int, limit: int) -> None:
        """Raise a clear error when a sequence does not fit the model's positions."""
        if n_tokens > limit:
            raise ValueError(
                f"{what} has {n_tokens} tokens but at most {limit} fit the model's "
                f"{self.max_len} positions (max_model_len); shorten the history or raise "
                "max_model_len"
            )

    # ---- generation ----------------------------------------------------------------------

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        """Generate ``n`` completions per request; batched, each sample on its own seeded stream."""
        with self._lock, interrupt.request():  # none starts after a SIGINT/SIGTERM
            prompts, memo = [], {}
            for i, request in enumerate(requests):
                ids = self._encode_once(
                    self.render_chat(request.messages, request.tools, request.enable_thinking), memo
                )
                self._check_length(f"chat request {i}: the prompt", len(ids), self.max_len - 1)
                prompts.append(ids)
            rows = self._make_rows(requests, prompts)
            order = sorted(range(len(requests)), key=lambda i: len(prompts[i]))
            for chunk in self._request_chunks(order, requests):
                distinct: dict[tuple[int, ...], int] = {}
                chunk_rows = [row for i in chunk for row in rows[i]]
                for row in chunk_rows:  # equal prompts (n=1 requests with own seeds) share one
                    row.prompt = distinct.setdefault(tuple(prompts[row.request]), len(distinct))
                self._generate([list(p) for p in distinct], chunk_rows)
            return [
                [self._completion(row, len(prompts[i])) for row in rows[i]]
                for i in range(len(requests))
            ]

    def _make_rows(
        self, requests: Sequence[ChatRequest], prompts: list[list[int]]
    ) -> list[list[_Row]]:
        """One row per sample, seeded from the request's seed (or this backend's stream)."""
        rows = []
        for i, request in enumerate(requests):
            params = request.sampling
            base = params.seed if params.seed is not None else self._rng.getrandbits(62)
            limit = min(params.max_tokens, self.max_len - len(prompts[i]))
            rows.append(
                [_Row(i, 0, params, limit, _generator(params, base, j)) for j in range(params.n)]
            )
        return rows

    def _request_chunks(
        self, order: list[int], requests: Sequence[ChatRequest]
    ) -> Iterator[list[int]]:
        """Consecutive requests whose samples fit ``max_batch_size`` rows (big ones go alone)."""
        chunk: list[int] = []
        size = 0
        for i in order:
            n = requests[i].sampling.n
            if chunk and size + n > self.max_batch_size:
                yield chunk
                chunk, size = [], 0
            chunk.append(i)
            size += n
        if chunk:
            yield chunk

    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids [B, L] and their attention mask."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, seq in enumerate(seqs):
            ids[b, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[b, width - len(seq) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _tree_enabled(self) -> bool:
        """Whether shared prefixes are kept once in a token tree (reuse on, model supports it)."""
        return self.prefix_reuse and supports_token_tree(self.model)

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], rows: list[_Row]) -> None:
        """Decode all ``rows`` to the end; each distinct prompt is prefilled once."""
        state = self._decoding_state(prompts, rows)
        logits, active = state.logits, list(range(len(rows)))
        while True:
            interrupt.check()  # after SIGINT/SIGTERM: end at the next token (nothing keeps it)
            tokens = self._choose(logits, [rows[i] for i in active])
            keep = [k for k, i in enumerate(active) if rows[i].finish is None]
            if not keep:
                return
            active = [active[k] for k in keep]
            logits = state.advance(tokens, keep)

    def _decoding_state(self, prompts: list[list[int]], rows: list[_Row]) -> _Decoding:
        """A token tree when the prompts are mostly one shared prefix, else padded cache rows."""
        shared = self._common_prefix(prompts) if len(prompts) > 1 else len(prompts[0]) - 1
        rests = sum(len(p) - shared for p in prompts)
        if self._tree_enabled() and shared >= MIN_SHARED_PREFIX and rests <= shared:
            return _TreeDecoding(self.model, prompts, rows, shared)
        return _PaddedDecoding(self, prompts, rows)

    def _choose(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Pick each row's next token (argmax or seeded sample), record it and check for the end."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        tokens = logp.argmax(-1)
        sampled = [k for k, row in enumerate(rows) if row.generator is not None]
        if sampled:
            tokens[sampled] = self._sample(logits[sampled], [rows[k] for k in sampled])
        chosen = logp.gather(1, tokens[:, None]).squeeze(1).tolist()
        for row, token, lp in zip(rows, tokens.tolist(), chosen):
            self._accept(row, token, lp)
        return tokens

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Seeded samples for the rows that do not decode greedily."""
        vocab = logits.shape[-1]
        dev = logits.device
        temperature = torch.tensor([r.params.temperature for r in rows], device=dev)
        top_p = torch.tensor([r.params.top_p for r in rows], device=dev)
        top_k = torch.tensor([min(r.params.top_k or vocab, vocab) for r in rows], device=dev)
        uniforms = torch.tensor(
            [torch.rand(1, generator=r.generator).item() for r in rows],
            dtype=torch.float32,
            device=dev,
        )
        probs, order = filtered_probs(logits, temperature, top_k, top_p)
        return draw_tokens(probs, order, uniforms)

    def _accept(self, row: _Row, token: int, logprob: float) -> None:
        """Append a token; end the row on eos, a stop string or its token limit."""
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if token in self.eos_ids:
            row.finish, row.hit_eos = "stop", True
        elif row.params.stop and self._tail_has_stop(row):
            row.finish = "stop"
        elif len(row.tokens) >= row.limit:
            row.finish = "length"

    def _tail_has_stop(self, row: _Row) -> bool:
        """Whether a stop string ends in the last token (only the recent tail is decoded)."""
        longest = max(len(s) for s in row.params.stop)
        tail = self.tokenizer.decode(row.tokens[-(4 * longest + 2) :], skip_special_tokens=True)
        return any(s and s in tail for s in row.params.stop)

    def _completion(self, row: _Row, prompt_tokens: int) -> Completion:
        """Decode a finished row (eos dropped) into a :class:`Completion`."""
        ids = row.tokens[:-1] if row.hit_eos else row.tokens
        return Completion.from_text(
            self.tokenizer.decode(ids, skip_special_tokens=True),
            row.finish or "length",
            stop=row.params.stop,
            prompt_tokens=prompt_tokens,
            token_ids=list(row.tokens),
            logprobs=list(row.logprobs),
        )

    # ---- scoring -------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Per-token log-probs of each target; shared prefixes and contexts are encoded once."""
        with self._lock, interrupt.request():
            pairs, memo = [], {}
            for i, request in enumerate(requests):
                ctx = self._context_ids(i, request, memo)
                tgt = self._encode_once(request.target, memo)
                self._check_length(
                    f"score request {i}: context + target", len(ctx) + len(tgt), self.max_len
                )
                pairs.append((ctx, tgt))
            results = [ScoreResult([]) for _ in requests]
            groups: dict[tuple[int, ...], list[int]] = {}
            for i, (ctx, tgt) in enumerate(pairs):
                if tgt:
                    groups.setdefault(tuple(ctx), []).append(i)
            if not groups:
                return results
            if self._tree_enabled():
                scored = self._score_grouped(pairs, list(groups.values()))
            else:
                scored = self._score_rows(pairs, [i for m in groups.values() for i in m])
            for i, lps in scored.items():
                results[i] = ScoreResult(lps)
            return results

    @staticmethod
    def _common_prefix(contexts: list[list[int]]) -> int:
        """Length of the token prefix shared by all contexts, leaving each at least one own token."""
        if len(contexts) < 2:
            return 0
        limit = min(len(c) for c in contexts) - 1
        return min(len(os.path.commonprefix(contexts)), limit)  # works on any sequences

    def _score_grouped(
        self, pairs: list[tuple[list[int], list[int]]], groups: list[list[int]]
    ) -> dict[int, list[float]]:
        """One token tree when all distinct contexts share a long prefix; otherwise a tree per
        context with several targets and padded rows for the contexts with one."""
        contexts = [pairs[members[0]][0] for members in groups]
        shared = self._common_prefix(contexts) if len(contexts) > 1 else len(contexts[0]) - 1
        if len(contexts) == 1 or shared >= MIN_SHARED_PREFIX:
            return self._score_tree(pairs, groups, shared)
        scored: dict[int, list[float]] = {}
        for members in groups:
            if len(members) > 1:
                own = len(pairs[members[0]][0]) - 1
                scored.update(self._score_tree(pairs, [members], own))
        singles = [members[0] for members in groups if len(members) == 1]
        scored.update(self._score_rows(pairs, singles))
        return scored

    @torch.inference_mode()
    def _score_tree(
        self, pairs: list[tuple[list[int], list[int]]], groups: list[list[int]], shared: int
    ) -> dict[int, list[float]]:
        """Two-level reuse: the prefix common to all contexts once, each context's rest once,
        then the targets of each context as branches on it.

        ``groups`` lists request indices by distinct context. A context with a single target
        carries it in its own segment (one forward, as in a reward group's posteriors). Contexts
        are taken in runs of at most ``MAX_TREE_QUERIES`` tokens and branches likewise; the tree
        is cut back between runs, so no run attends to the slots of another.
        """
        contexts = [pairs[members[0]][0] for members in groups]
        inline = [len(members) == 1 for members in groups]
        segments = [
            ctx[shared:] + (pairs[members[0]][1] if one else [])
            for ctx, members, one in zip(contexts, groups, inline)
        ]
        tree = TokenTree(self.model, contexts[0][:shared])
        scored: dict[int, list[float]] = {}
        for start, end in runs_within([len(s) for s in segments], MAX_TREE_QUERIES):
            tree.crop(shared)
            hidden, visible = tree.extend(
                tree.prefix_rows(end - start), segments[start:end], [shared] * (end - start)
            )
            begin = 0
            last, rows, targets, owners = [], [], [], []
            for g in range(start, end):
                rest_end = begin + len(contexts[g]) - shared  # slot after the context's last token
                last.append(hidden[rest_end - 1])
                if inline[g]:
                    target = pairs[groups[g][0]][1]
                    rows.append(hidden[rest_end - 1 : rest_end - 1 + len(target)])
                    targets.append(target)
                    owners.append(groups[g][0])
                begin += len(segments[g])
            if targets:
                scored.update(zip(owners, self._token_logprobs(torch.cat(rows), targets)))
            items = [(g, i) for g in range(start, end) if not inline[g] for i in groups[g]]
            if items:
                scored.update(
                    self._score_branches(tree, pairs, items, torch.stack(last), visible, start)
                )
        return scored

    def _score_branches(
        self,
        tree: TokenTree,
        pairs: list[tuple[list[int], list[int]]],
        items: list[tuple[int, int]],
        last: torch.Tensor,
        visible: torch.Tensor,
        first: int,
    ) -> dict[int, list[float]]:
        """Score (context g, request i) targets as branches on contexts already in the tree.

        last [G, H]: hidden state of each context's last token; visible [G, T]: its branch row;
        row g - ``first`` belongs to context g.
        """
        base, scored = tree.length, {}
        targets = [pairs[i][1] for _, i in items]
        for start, end in runs_within([len(t) for t in targets], MAX_TREE_QUERIES):
            tree.crop(base)
            run = items[start:end]
            rows = torch.tensor([g - first for g, _ in run], device=visible.device)
            hidden, _ = tree.extend(
                visible[rows], targets[start:end], [len(pairs[i][0]) for _, i in run]
            )
            predicting, offset = [], 0
            for (g, _), target in zip(run, targets[start:end]):
                predicting += [
                    last[g - first : g - first + 1],
                    hidden[offset : offset + len(target) - 1],
                ]
                offset += len(target)
            lps = self._token_logprobs(torch.cat(predicting), targets[start:end])
            scored.update(zip([i for _, i in run], lps))
        return scored

    def _score_rows(
        self, pairs: list[tuple[list[int], list[int]]], indices: list[int]
    ) -> dict[int, list[float]]:
        """Score requests as right-padded full sequences, batched by length (no reuse)."""
        scored: dict[int, list[float]] = {}
        lengths = [len(pairs[i][0]) + len(pairs[i][1]) for i in indices]
        for chunk in self._token_chunks(indices, lengths):
            scored.update(zip(chunk, self._score_full([pairs[i] for i in chunk])))
        return scored

    def _token_chunks(self, items: list[int], lengths: list[int]) -> Iterator[list[int]]:
        """Items sorted by length, batched within ``max_batch_size`` and ``max_batch_tokens``."""
        ranked = sorted(zip(lengths, items))
        chunk: list[int] = []
        width = 0
        for length, item in ranked:
            new_width = max(width, length)
            if chunk and (
                len(chunk) >= self.max_batch_size
                or new_width * (len(chunk) + 1) > self.max_batch_tokens
            ):
                yield chunk
                chunk, new_width = [], length
            chunk.append(item)
            width = new_width
        if chunk:
            yield chunk

    def _token_logprobs(self, rows: torch.Tensor, targets: list[list[int]]) -> list[list[float]]:
        """Log-probs of the targets' tokens from the hidden states predicting them, in order.

        rows [sum of target lengths, H]: row j predicts the j-th token of the concatenated targets.
        """
        logp = torch.log_softmax(self.model.get_output_embeddings()(rows).float(), dim=-1)
        ids = torch.tensor([tok for t in targets for tok in t], device=logp.device)
        flat = logp.gather(1, ids[:, None]).squeeze(1).tolist()
        out, start = [], 0
        for t in targets:
            out.append(flat[start : start + len(t)])
            start += len(t)
        return out

    @torch.inference_mode()
    def _score_full(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """Score (context, target) pairs as right-padded full sequences (no cache)."""
        seqs = [ctx + tgt for ctx, tgt in pairs]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        for b, seq in enumerate(seqs):
            ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        hidden = self.model.get_decoder()(
            input_ids=ids.to(self.device), use_cache=False
        ).last_hidden_state
        rows = torch.cat(
            [
                hidden[b, len(ctx) - 1 : len(ctx) - 1 + len(tgt)]
                for b, (ctx, tgt) in enumerate(pairs)
            ]
        )
        return self._token_logprobs(rows, [tgt for _, tgt in pairs])

    def close(self) -> None:
        """Drop the model and free GPU memory; safe to call twice."""
        with self._lock:
            if getattr(self, "model", None) is not None:
                self.model = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()


class _Decoding(Protocol):
    """Cache state of a batch being decoded: next-token logits of the active rows."""

    logits: torch.Tensor  # [A, V] for the active rows, in row order

    def advance(self, tokens: torch.Tensor, keep: list[int]) -> torch.Tensor:
        """Drop the rows not in ``keep``, feed the kept rows' ``tokens``; their next logits."""
        ...


class _PaddedDecoding:
    """One cache row per sample: prompts left-padded and prefilled once, copied to their rows."""

    def __init__(self, llm: HFLLM, prompts: list[list[int]], rows: list[_Row]):
        from transformers import DynamicCache

        self.model, self.device = llm.model, llm.device
        ids, mask = llm._left_pad(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        select = torch.tensor([row.prompt for row in rows], device=self.device)
        self.cache.batch_select_indices(select)
        self.mask, self.next_pos = mask[select], positions[select, -1] + 1
        self.logits = out.logits[select, -1]

    def advance(self, tokens: torch.Tensor, keep: list[int]) -> torch.Tensor:
        if len(keep) < len(tokens):
            index = torch.tensor(keep, device=self.device)
            self.cache.batch_select_indices(index)
            self.mask, self.next_pos, tokens = self.mask[index], self.next_pos[index], tokens[index]
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(keep), 1))], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.next_pos[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1]


class _TreeDecoding:
    """All samples in one token tree: the shared prefix once, each prompt's rest once, then each
    sample's tokens on its own branch (no per-row copies of the prompt cache)."""

    def __init__(self, model: Any, prompts: list[list[int]], rows: list[_Row], shared: int):
        self.tree = TokenTree(model, prompts[0][:shared])
        self.head = model.get_output_embeddings()
        rests = [p[shared:] for p in prompts]
        hidden, visible = self.tree.extend(
            self.tree.prefix_rows(len(prompts)), rests, [shared] * len(prompts)
        )
        ends = torch.tensor([len(r) for r in rests], device=hidden.device).cumsum(0) - 1
        select = torch.tensor([row.prompt for row in rows], device=hidden.device)
        self.logits = self.head(hidden[ends])[select]
        self.visible = visible[select]
        self.next_pos = torch.tensor(
            [len(prompts[row.prompt]) for row in rows], device=select.device
        )

    def advance(self, tokens: torch.Tensor, keep: list[int]) -> torch.Tensor:
        if len(keep) < len(tokens):
            index = torch.tensor(keep, device=tokens.device)
            self.visible, self.next_pos, tokens = (
                self.visible[index],
                self.next_pos[index],
                tokens[index],
            )
        hidden, self.visible = self.tree.step(self.visible, tokens, self.next_pos)
        self.next_pos = self.next_pos + 1
        return self.head(hidden)
