"""Supervised training of the warm start: examples to token rows, and the reply-only loss.

Each example keeps the tail of its prompt (rendered and tokenized by :mod:`prour.llm.chat`, as
the backends do) followed by its reply; several examples are packed into one row, and the loss
falls on reply tokens only.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from prour.demo.corpus import Corpus, SFTExample
from prour.llm.base import Message
from prour.llm.chat import encode, render_chat

logger = logging.getLogger(__name__)

# Share of training sequences drawn from each kind of example (renormalized over the kinds the
# corpus has). The query generator and the decomposer's actions get the most: the pipeline parses
# them strictly.
KIND_WEIGHTS: dict[str, float] = {
    "action": 0.45,
    "goal": 0.07,
    "score": 0.03,
    "query_clarify": 0.10,
    "query_verify": 0.10,
    "strict_user": 0.05,
    "normalize": 0.03,
    "belief_clarify": 0.02,
    "belief_verify": 0.02,
    "annotate": 0.03,
    "agent": 0.03,
    "user": 0.02,
    "verifier": 0.03,
}


def reply_text(tokenizer: Any, reply: Message) -> str:
    """The reply as the chat template writes an assistant turn, up to its end-of-turn token."""
    stub = [{"role": "user", "content": "."}]
    bare = tokenizer.apply_chat_template(stub, tokenize=False)
    opener = tokenizer.apply_chat_template(stub, tokenize=False, add_generation_prompt=True)
    opener = opener[len(bare) :]
    text = tokenizer.apply_chat_template([*stub, reply], tokenize=False)
    return text[text.rindex(opener) + len(opener) :].rstrip("\n")


def encode_example(tokenizer: Any, example: SFTExample, max_tokens: int) -> tuple[list[int], int]:
    """Token ids of prompt + reply (prompt left-truncated to fit ``max_tokens``), reply length.

    Prompt and reply are tokenized separately, as the backends do when they score a target.
    """
    prompt = render_chat(tokenizer, example.messages, example.tools, example.enable_thinking)
    target = encode(tokenizer, reply_text(tokenizer, example.reply))[: max_tokens // 2]
    budget = max_tokens - len(target)
    # Only the prompt's tail survives truncation: tokenize a generous slice of characters.
    context = encode(tokenizer, prompt[-budget * 8 :])[-budget:]
    return context + target, len(target)


Row = list[tuple[list[int], int]]
"""One packed training row: (token ids, reply length) of each example, in order."""


class RowPacker:
    """Packs examples, drawn by :data:`KIND_WEIGHTS`, into rows of up to ``row_tokens`` tokens.

    Each example keeps only its prompt's tail (``example_tokens`` with its reply), but a row holds
    several of them back to back, so every reply is written with a long stretch of earlier text in
    view, as at inference, where prompts run to thousands of tokens. Training on short sequences
    alone teaches attention that breaks down on long prompts.
    """

    def __init__(
        self, corpus: Corpus, tokenizer: Any, example_tokens: int, row_tokens: int, seed: int
    ):
        self.corpus, self.tokenizer = corpus, tokenizer
        self.example_tokens, self.row_tokens = example_tokens, row_tokens
        self.kinds = [k for k in KIND_WEIGHTS if corpus.examples.get(k)]
        if not self.kinds:
            raise ValueError("the warm-start corpus is empty: no task gave any example")
        self.weights = [KIND_WEIGHTS[k] for k in self.kinds]
        self.rng = random.Random(f"warmstart-rows:{seed}")
        self.encoded: dict[tuple[str, int], tuple[list[int], int]] = {}
        self.used: Counter[str] = Counter()

    def _encode(self, pick: tuple[str, int]) -> tuple[list[int], int]:
        """Token ids and reply length of example ``pick`` = (kind, index), encoded once."""
        if pick not in self.encoded:
            example = self.corpus.examples[pick[0]][pick[1]]
            self.encoded[pick] = encode_example(self.tokenizer, example, self.example_tokens)
        return self.encoded[pick]

    def row(self) -> Row:
        """Examples until the next one would not fit (at least one)."""
        items: Row = []
        size = 0
        while True:
            kind = self.rng.choices(self.kinds, weights=self.weights)[0]
            item = self._encode((kind, self.rng.randrange(len(self.corpus.examples[kind]))))
            if items and size + len(item[0]) > self.row_tokens:
                return items
            items.append(item)
            self.used[kind] += 1
            size += len(item[0])

    def batches(self, steps: int, rows_per_step: int) -> list[list[Row]]:
        """``steps`` batches of ``rows_per_step`` packed rows."""
        return [[self.row() for _ in range(rows_per_step)] for _ in range(steps)]


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch threads (None: leave the setting alone), restored afterwards."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def batch_tensors(rows: Sequence[Row], pad_id: int) -> tuple[Any, Any]:
    """Right-padded ids [B, L] and labels [B, L] (-100 except on reply tokens).

    Padding sits after every real token, so causal attention never lets a real token see it and
    no attention mask is needed (the fast causal kernel runs).
    """
    import torch

    flat = [[t for ids, _ in row for t in ids] for row in rows]
    width = max(len(ids) for ids in flat)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(flat[b])] = torch.tensor(flat[b])
        end = 0
        for seq, n_target in row:
            end += len(seq)
            labels[b, end - n_target : end] = torch.tensor(seq[len(seq) - n_target :])
    return ids, labels


def reply_loss(model: Any, ids: Any, labels: Any) -> Any:
    """Mean cross-entropy over reply tokens; the LM head runs only where a reply token is next."""
    import torch.nn.functional as F

    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    targets = labels[:, 1:]
    scored = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][scored])
    return F.cross_entropy(logits.float(), targets[scored])


def _lr_factor(step: int, steps: int) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10% of the peak."""
    import math

    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train_replies(
    model: Any, batches: Sequence[Sequence[Row]], pad_id: int, lr: float, seed: int
) -> list[float]:
    """AdamW over the planned batches (loss on reply tokens only); the loss of every step."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, len(batches)))
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step, batch in enumerate(batches):
            loss = reply_loss(model, *batch_tensors(batch, pad_id))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if step % 50 == 0 or step == len(batches) - 1:
                logger.info("warm start step %d/%d: loss %.3f", step + 1, len(batches), losses[-1])
    model.eval()
    return losses


def loss_summary(losses: Sequence[float]) -> dict[str, float]:
    """Mean loss over the first and the last tenth of the steps, and the step count."""
    if not losses:
        return {"steps": 0}
    tenth = max(1, len(losses) // 10)
    return {
        "steps": len(losses),
        "first_mean": round(sum(losses[:tenth]) / tenth, 4),
        "last_mean": round(sum(losses[-tenth:]) / tenth, 4),
        "min": round(min(losses), 4),
    }
