"""The ``hf`` backend: a transformers causal LM in this process (CPU or one GPU).

Generation runs our own batched decoding loop (left-padded prefill, KV cache, finished rows
dropped from the batch) so that every sample draws from its own seeded random stream: a
request's samples are the same whether it runs alone or in a batch. Scoring groups requests by
context, encodes each shared context once and scores all of its targets as one right-padded
batch continuing from the cached prefix. ``Completion.logprobs`` are the model's own log-probs of
the chosen tokens (before temperature, top-k and top-p), as vLLM reports them by default.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from prour.llm.base import ChatRequest, Completion, SamplingParams, ScoreRequest, ScoreResult
from prour.llm.toolcalls import parse_tool_calls, split_thinking

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# Contexts that share at least this many leading tokens are scored on one cached prefix.
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
        device: str = "auto",
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        prefix_reuse: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        target = resolve_device(device)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, target))
        self._attach(
            model.to(target).eval(),
            AutoTokenizer.from_pretrained(path),
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
        """The prompt text of a chat: the tokenizer's chat template with the generation prompt."""
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any added special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _context_ids(self, index: int, request: ScoreRequest) -> list[int]:
        """Token ids of a score request's context (chat contexts end with the generation prompt)."""
        if isinstance(request.context, str):
            ids = self.encode(request.context)
        else:
            ids = self.encode(self.render_chat(request.context, None, request.enable_thinking))
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
        with self._lock:
            prompts = []
            for i, request in enumerate(requests):
                ids = self.encode(
                    self.render_chat(request.messages, request.tools, request.enable_thinking)
                )
                self._check_length(f"chat request {i}: the prompt", len(ids), self.max_len - 1)
                prompts.append(ids)
            rows = self._make_rows(requests, prompts)
            order = sorted(range(len(requests)), key=lambda i: len(prompts[i]))
            for chunk in self._request_chunks(order, requests):
                chunk_rows = [row for i in chunk for row in rows[i]]
                for row in chunk_rows:
                    row.prompt = chunk.index(row.request)
                self._generate([prompts[i] for i in chunk], chunk_rows)
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

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], rows: list[_Row]) -> None:
        """Decode all ``rows`` to the end; each prompt is prefilled once and shared by its rows."""
        from transformers import DynamicCache

        ids, mask = self._left_pad(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        select = torch.tensor([row.prompt for row in rows], device=self.device)
        cache.batch_select_indices(select)
        mask, logits, next_pos = mask[select], out.logits[select, -1], positions[select, -1] + 1
        active = list(range(len(rows)))
        while True:
            tokens = self._choose(logits, [rows[i] for i in active])
            keep = [k for k, i in enumerate(active) if rows[i].finish is None]
            if not keep:
                return
            if len(keep) < len(active):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
                active = [active[k] for k in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits, next_pos = out.logits[:, -1], next_pos + 1

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
        """Decode a finished row and split it into reasoning, content and tool calls."""
        ids = row.tokens[:-1] if row.hit_eos else row.tokens
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in row.params.stop if s and s in text]
        if cuts:
            text = text[: min(cuts)]
        reasoning, rest = split_thinking(text)
        content, calls = parse_tool_calls(rest)
        return Completion(
            text=text,
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=row.finish or "length",
            prompt_tokens=prompt_tokens,
            completion_tokens=len(row.tokens),
            token_ids=list(row.tokens),
            logprobs=list(row.logprobs),
        )

    # ---- scoring -------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Per-token log-probs of each target; a context shared by requests is encoded once."""
        with self._lock:
            pairs = []
            for i, request in enumerate(requests):
                ctx, tgt = self._context_ids(i, request), self.encode(request.target)
                self._check_length(
                    f"score request {i}: context + target", len(ctx) + len(tgt), self.max_len
                )
                pairs.append((ctx, tgt))
            results: list[ScoreResult | None] = [None] * len(requests)
            groups: dict[tuple[int, ...], list[int]] = {}
            for i, (ctx, tgt) in enumerate(pairs):
                if not tgt:
                    results[i] = ScoreResult([])
                elif self.prefix_reuse:
                    groups.setdefault(tuple(ctx), []).append(i)
                else:
                    groups[(i,) + tuple(ctx)] = [i]
            singles = [members[0] for members in groups.values() if len(members) == 1]
            shared = self._common_prefix([pairs[i][0] for i in singles]) if self.prefix_reuse else 0
            if len(singles) > 1 and shared >= MIN_SHARED_PREFIX:
                scored = self._score_common_prefix(shared, [pairs[i] for i in singles])
                for i, lps in zip(singles, scored):
                    results[i] = ScoreResult(lps)
                singles = []
            for chunk in self._token_chunks(
                singles, [len(pairs[i][0]) + len(pairs[i][1]) for i in singles]
            ):
                for i, lps in zip(chunk, self._score_full([pairs[i] for i in chunk])):
                    results[i] = ScoreResult(lps)
            for members in (m for m in groups.values() if len(m) > 1):
                targets = [pairs[i][1] for i in members]
                for i, lps in zip(members, self._score_shared(pairs[members[0]][0], targets)):
                    results[i] = ScoreResult(lps)
            return [r for r in results if r is not None]

    @staticmethod
    def _common_prefix(contexts: list[list[int]]) -> int:
        """Length of the token prefix shared by all contexts, leaving each at least one own token."""
        if len(contexts) < 2:
            return 0
        limit = min(len(c) for c in contexts) - 1
        first = contexts[0]
        n = 0
        while n < limit and all(c[n] == first[n] for c in contexts[1:]):
            n += 1
        return n

    @torch.inference_mode()
    def _score_common_prefix(
        self, shared: int, pairs: list[tuple[list[int], list[int]]]
    ) -> list[list[float]]:
        """Encode the contexts' shared prefix once; score each (rest of context + target) on it.

        This is the group case of the reward (one history, different question/answer turns).
        """
        from transformers import DynamicCache

        decoder = self.model.get_decoder()
        cache = DynamicCache()
        decoder(
            input_ids=torch.tensor([pairs[0][0][:shared]], device=self.device),
            past_key_values=cache,
            use_cache=True,
        )
        prefix = [(layer.keys, layer.values) for layer in cache.layers]
        rests = [(ctx[shared:], tgt) for ctx, tgt in pairs]
        out: dict[int, list[float]] = {}
        lengths = [shared + len(r) + len(t) for r, t in rests]
        for chunk in self._token_chunks(list(range(len(rests))), lengths):
            scored = self._score_suffixes(decoder, prefix, shared, [rests[j] for j in chunk])
            out.update(zip(chunk, scored))
        return [out[j] for j in range(len(rests))]

    def _score_suffixes(
        self,
        decoder: Any,
        prefix: list[tuple[torch.Tensor, torch.Tensor]],
        offset: int,
        items: list[tuple[list[int], list[int]]],
    ) -> list[list[float]]:
        """(rest, target) rows right-padded on a copy of the cached prefix; rest is non-empty."""
        from transformers import DynamicCache

        size = len(items)
        seqs = [rest + tgt for rest, tgt in items]
        width = max(len(s) for s in seqs)
        cache = DynamicCache(
            [(k.expand(size, -1, -1, -1), v.expand(size, -1, -1, -1)) for k, v in prefix]
        )
        ids = torch.full((size, width), self.pad_id, dtype=torch.long)
        for b, seq in enumerate(seqs):
            ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        positions = torch.arange(offset, offset + width, device=self.device)[None, :].expand(
            size, -1
        )
        hidden = decoder(
            input_ids=ids.to(self.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        span = max(len(tgt) for _, tgt in items)
        predicting = torch.stack(
            [
                torch.nn.functional.pad(
                    hidden[b, len(rest) - 1 : len(rest) - 1 + len(tgt)],
                    (0, 0, 0, span - len(tgt)),
                )
                for b, (rest, tgt) in enumerate(items)
            ]
        )
        return self._target_logprobs(predicting, [tgt for _, tgt in items])

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

    def _target_logprobs(self, hidden: torch.Tensor, targets: list[list[int]]) -> list[list[float]]:
        """Log-probs of each target from the hidden states predicting its tokens (one lm_head call).

        hidden [B, T, H] where hidden[b, j] predicts targets[b][j].
        """
        rows = torch.cat([hidden[b, : len(t)] for b, t in enumerate(targets)])
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
        span = max(len(tgt) for _, tgt in pairs)
        predicting = torch.stack(
            [
                torch.nn.functional.pad(
                    hidden[b, len(ctx) - 1 : len(ctx) - 1 + len(tgt)], (0, 0, 0, span - len(tgt))
                )
                for b, (ctx, tgt) in enumerate(pairs)
            ]
        )
        return self._target_logprobs(predicting, [tgt for _, tgt in pairs])

    @torch.inference_mode()
    def _score_shared(self, context: list[int], targets: list[list[int]]) -> list[list[float]]:
        """Encode ``context`` once, then score its targets in batches continuing its KV cache."""
        from transformers import DynamicCache

        decoder = self.model.get_decoder()
        cache = DynamicCache()
        ctx = torch.tensor([context], device=self.device)
        last = decoder(input_ids=ctx, past_key_values=cache, use_cache=True).last_hidden_state[
            :, -1
        ]
        prefix = [(layer.keys, layer.values) for layer in cache.layers]
        out: list[list[float]] = []
        lengths = [len(context) + len(t) for t in targets]
        for chunk in self._token_chunks(list(range(len(targets))), lengths):
            out_chunk = self._score_continuations(
                decoder, prefix, last, len(context), [targets[j] for j in chunk]
            )
            out.extend(zip(chunk, out_chunk))
        return [lps for _, lps in sorted(out, key=lambda pair: pair[0])]

    def _score_continuations(
        self,
        decoder: Any,
        prefix: list[tuple[torch.Tensor, torch.Tensor]],
        last: torch.Tensor,
        offset: int,
        targets: list[list[int]],
    ) -> list[list[float]]:
        """Targets as a right-padded batch on a copy of the cached prefix, expanded per row."""
        from transformers import DynamicCache

        size, width = len(targets), max(len(t) for t in targets)
        cache = DynamicCache(
            [(k.expand(size, -1, -1, -1), v.expand(size, -1, -1, -1)) for k, v in prefix]
        )
        ids = torch.full((size, width), self.pad_id, dtype=torch.long)
        for b, tgt in enumerate(targets):
            ids[b, : len(tgt)] = torch.tensor(tgt, dtype=torch.long)
        positions = torch.arange(offset, offset + width, device=self.device)[None, :].expand(
            size, -1
        )
        hidden = decoder(
            input_ids=ids.to(self.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        predicting = torch.cat([last.expand(size, -1)[:, None, :], hidden[:, :-1]], dim=1)
        return self._target_logprobs(predicting, targets)

    def close(self) -> None:
        """Drop the model and free GPU memory; safe to call twice."""
        with self._lock:
            if getattr(self, "model", None) is not None:
                self.model = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
