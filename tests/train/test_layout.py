"""prour.train.layout (CPU, the tiny Qwen3): the packed_exact layout's document mask keeps
attention inside each sample, so its log-probs equal the padded layout's; the same comparison
fails with a planted mask that lets later samples see earlier ones; the mask has the same
pattern in each attention implementation's form (FlexAttention included); and verl's
padding-free forward with fused log-probs (``use_remove_padding`` + ``use_fused_kernels``) is
exact on sdpa, with no flash-attn."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from prour.train.layout import (
    LAYOUTS,
    document_mask,
    packed_rows_hidden,
    response_logits,
    sample_ids,
)
from prour.train.policy import response_scores

# (prompt, response) tokens per sample: mixed, with a one-token response.
LENGTHS = [(5, 7), (11, 3), (8, 12), (2, 1)]
TEMPERATURE = 0.8
CPU = torch.device("cpu")


def _model(model_dir: Path, attn: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation=attn).eval()
    assert model.config._attn_implementation == attn
    return model


def _batch(vocab: int) -> tuple[list[list[int]], list[int], list[list[int]]]:
    gen = torch.Generator().manual_seed(11)
    seqs = [torch.randint(5, vocab, (p + r,), generator=gen).tolist() for p, r in LENGTHS]
    prompts = [p for p, _ in LENGTHS]
    return seqs, prompts, [s[p:] for s, p in zip(seqs, prompts)]


def _scores(model, rows, targets):
    with torch.no_grad():
        return response_scores(response_logits(model, rows), targets, TEMPERATURE, True)


def assert_same_scores(model, rows, reference_rows, targets) -> None:
    """Log-probs and entropies of every response token agree with the reference layout's."""
    got, want = _scores(model, rows, targets), _scores(model, reference_rows, targets)
    torch.testing.assert_close(got.log_probs, want.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.entropy, want.entropy, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_exact_equals_padded_and_a_planted_leak_fails(tiny_model_dir: Path,
                                                             attn: str) -> None:
    model = _model(tiny_model_dir, attn)
    seqs, prompts, targets = _batch(model.config.vocab_size)
    with torch.no_grad():
        padded = LAYOUTS["padded"](model, seqs, prompts, 0, CPU)
        exact = LAYOUTS["packed_exact"](model, seqs, prompts, 0, CPU)
        # Planted leak: every token of the row in one "sample", so each sample attends to the
        # samples packed before it (positions still restart, as a mask-blind kernel would see).
        one_sample = torch.zeros(sum(len(s) for s in seqs), dtype=torch.long)
        leaky = packed_rows_hidden(model, seqs, prompts, CPU,
                                   attention_mask=document_mask(model, one_sample, CPU))
    assert_same_scores(model, exact, padded, targets)
    with pytest.raises(AssertionError):
        assert_same_scores(model, leaky, padded, targets)
    # The first sample has nothing before it to see: the leak shows from the second on.
    assert_same_scores(model, leaky[:1], padded[:1], targets[:1])


def test_position_id_packing_leaks_where_the_document_mask_does_not(tiny_model_dir: Path) -> None:
    """The ``packed`` layout relies on transformers reading the position-id restarts, which it
    does only without a cache: the same row run with ``use_cache`` (as a caller that forgets
    ``use_cache=False`` would) attends across samples; the explicit mask is honoured either way."""
    model = _model(tiny_model_dir, "sdpa")
    seqs, prompts, targets = _batch(model.config.vocab_size)
    ids = torch.tensor([t for s in seqs for t in s])[None]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    mask = document_mask(model, sample_ids([len(s) for s in seqs]), CPU)

    def rows(hidden: torch.Tensor) -> list[torch.Tensor]:
        out, start = [], 0
        for seq, prompt in zip(seqs, prompts):
            out.append(hidden[0, start + prompt - 1 : start + len(seq) - 1])
            start += len(seq)
        return out

    decoder = model.get_decoder()
    with torch.no_grad():
        padded = LAYOUTS["padded"](model, seqs, prompts, 0, CPU)
        implicit = decoder(input_ids=ids, position_ids=positions, use_cache=True).last_hidden_state
        explicit = decoder(input_ids=ids, position_ids=positions, attention_mask=mask,
                           use_cache=True).last_hidden_state
    assert_same_scores(model, rows(explicit), padded, targets)
    with pytest.raises(AssertionError):
        assert_same_scores(model, rows(implicit), padded, targets)


def test_document_mask_forms_share_one_pattern(tiny_model_dir: Path) -> None:
    """Lengths 3, 1, 2: the boolean (sdpa), additive (eager) and FlexAttention forms all allow
    exactly the causal pairs inside each sample; flex_attention with the BlockMask equals sdpa
    with the boolean mask on random queries, keys and values."""
    documents = sample_ids([3, 1, 2])
    assert documents.tolist() == [0, 0, 0, 1, 2, 2]
    allowed = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ], dtype=torch.bool)
    model = _model(tiny_model_dir, "sdpa")
    boolean = document_mask(model, documents, CPU)
    assert boolean.shape == (1, 1, 6, 6) and boolean.dtype == torch.bool
    assert torch.equal(boolean[0, 0], allowed)
    model.config._attn_implementation = "eager"
    additive = document_mask(model, documents, CPU)[0, 0]
    assert torch.equal(additive == 0, allowed) and bool((additive[~allowed] < -1e30).all())
    model.config._attn_implementation = "flex_attention"
    block = document_mask(model, documents, CPU)
    q, k = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    zero = torch.zeros((), dtype=torch.long)
    assert torch.equal(block.mask_mod(zero, zero, q, k), allowed)
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(2)
    query, key, value = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention: the reference, not a kernel
        flex = flex_attention(query, key, value, block_mask=block)
    sdpa = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=boolean)
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=1e-5)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2"):
        document_mask(model, documents, CPU)


@pytest.mark.parametrize("remove_padding", [True, False])
def test_verl_padding_free_fused_forward_is_exact_on_sdpa(tiny_model_dir: Path,
                                                          remove_padding: bool) -> None:
    """verl 0.9.1's fused forward (``forward_with_torch_backend``, what ``use_fused_kernels``
    with backend torch patches in), called as its FSDP engine calls it: with
    ``use_remove_padding`` one packed row, position ids restarting, no mask, labels rolled over
    the row; without, right-padded rows and a 2-D mask. Both give prour's padded scores on sdpa
    (transformers masks the packed row from the restarts; no flash-attn is installed)."""
    from verl.models.transformers.dense_common import forward_with_torch_backend

    model = _model(tiny_model_dir, "sdpa")
    seqs, prompts, targets = _batch(model.config.vocab_size)
    with torch.no_grad():
        want = _scores(model, LAYOUTS["padded"](model, seqs, prompts, 0, CPU), targets)
        if remove_padding:
            ids = torch.tensor([t for s in seqs for t in s])[None]
            positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
            out = forward_with_torch_backend(
                model, input_ids=ids, position_ids=positions, attention_mask=None,
                temperature=TEMPERATURE, shift_labels=torch.roll(ids, -1, dims=1),
                return_dict=True, use_cache=False,
            )
            starts = [sum(len(s) for s in seqs[:i]) for i in range(len(seqs))]
            pick = [(0, start) for start in starts]
        else:
            width = max(len(s) for s in seqs)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            out = forward_with_torch_backend(
                model, input_ids=ids, attention_mask=mask, temperature=TEMPERATURE,
                return_dict=True, use_cache=False,
            )
            pick = [(row, 0) for row in range(len(seqs))]
    assert not hasattr(out, "logits") or out.logits is None  # no full logits were returned
    for i, ((row, start), seq, prompt) in enumerate(zip(pick, seqs, prompts)):
        span = slice(start + prompt - 1, start + len(seq) - 1)
        n = len(seq) - prompt
        torch.testing.assert_close(out.log_probs[row, span], want.log_probs[i, :n],
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.entropy[row, span], want.entropy[i, :n],
                                   rtol=1e-5, atol=1e-5)
