"""The in-process ``hf`` backend on the tiny model (CPU, float32)."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch

from prour.config import ModelConfig
from prour.llm import ChatRequest, SamplingParams, ScoreRequest
from prour.llm.hf import HFLLM, _Row, draw_tokens, filtered_probs
from prour.llm.registry import build_llm

CHAT = [
    {"role": "system", "content": "You are a retail agent."},
    {"role": "user", "content": "Please cancel order #W1234567, it was a mistake."},
]
OTHER = [{"role": "user", "content": "hi"}]
TARGETS = [
    "I will cancel it now.",
    "NO",
    "YES [QUESTION]Which order do you mean?[/QUESTION]",
    '{"tool": "cancel_pending_order", "arguments": {"order_id": "#W1234567"}}',
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one intra-op thread avoids spin-waiting when other jobs share the 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> HFLLM:
    return HFLLM(str(tiny_model_dir), device="cpu", dtype="float32", seed=0)


def _by_hand(llm: HFLLM, context_ids: list[int], target: str) -> list[float]:
    """log_softmax of one plain forward pass over context + target, gathered at the target ids."""
    target_ids = llm.tokenizer(target, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = llm.model(torch.tensor([context_ids + target_ids])).logits[0]
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(context_ids) - 1 + j, t].item() for j, t in enumerate(target_ids)]


def _close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def _greedy(llm: HFLLM, messages, max_tokens: int = 12, **extra) -> ChatRequest:
    return ChatRequest(messages, SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra))


def test_scores_equal_a_hand_computation(llm: HFLLM):
    prompt = llm.tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    chat_ids = llm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    text_ids = llm.tokenizer("Order status:", add_special_tokens=False)["input_ids"]
    [chat_result, text_result] = llm.score(
        [ScoreRequest(CHAT, TARGETS[0]), ScoreRequest("Order status:", " pending")]
    )
    assert _close(chat_result.token_logprobs, _by_hand(llm, chat_ids, TARGETS[0]))
    assert _close(text_result.token_logprobs, _by_hand(llm, text_ids, " pending"))
    assert math.isclose(chat_result.sum, sum(chat_result.token_logprobs))
    assert all(lp < 0 for lp in chat_result.token_logprobs)


def test_thinking_flag_changes_the_scored_context(llm: HFLLM):
    off, on = llm.score([ScoreRequest(CHAT, "NO"), ScoreRequest(CHAT, "NO", enable_thinking=True)])
    prompt_on = llm.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    on_ids = llm.tokenizer(prompt_on, add_special_tokens=False)["input_ids"]
    assert _close(on.token_logprobs, _by_hand(llm, on_ids, "NO"))
    assert not _close(off.token_logprobs, on.token_logprobs)


def test_batched_equals_single_and_reuse_equals_recompute(llm: HFLLM):
    requests = [ScoreRequest(CHAT, t) for t in TARGETS] + [
        ScoreRequest(OTHER, t) for t in TARGETS[:2]
    ]
    requests += [ScoreRequest("a lone text context", " and its target"), ScoreRequest(CHAT, "")]
    batched = llm.score(requests)
    singles = [llm.score([r])[0] for r in requests]
    try:
        llm.prefix_reuse, llm.max_batch_size = False, 2
        recomputed = llm.score(requests)
        llm.prefix_reuse = True
        chunked = llm.score(requests)  # padded rows (the lone context) in chunks of two
    finally:
        llm.prefix_reuse, llm.max_batch_size = True, 32
    assert batched[-1].token_logprobs == []
    for a, b, c, d in zip(batched, singles, recomputed, chunked):
        assert _close(a.token_logprobs, b.token_logprobs)
        assert _close(a.token_logprobs, c.token_logprobs)
        assert _close(a.token_logprobs, d.token_logprobs)


def test_greedy_is_deterministic_and_batch_equals_single(llm: HFLLM):
    longer = CHAT + [
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Thanks, and the refund?"},
    ]
    requests = [_greedy(llm, CHAT), _greedy(llm, OTHER, max_tokens=7), _greedy(llm, longer)]
    first = llm.chat(requests)
    again = llm.chat(requests)
    alone = [llm.chat([r])[0] for r in requests]
    texts = [[c.text for c in group] for group in first]
    assert texts == [[c.text for c in group] for group in again]
    assert texts == [[c.text for c in group] for group in alone]
    for group, request in zip(first, requests):
        [completion] = group
        assert completion.token_ids == alone[requests.index(request)][0].token_ids
        assert completion.finish_reason in ("stop", "length")
        assert completion.prompt_tokens > 0


def test_greedy_tokens_are_the_argmax_of_a_plain_forward(llm: HFLLM):
    [[completion]] = llm.chat([_greedy(llm, OTHER, max_tokens=5)])
    prompt = llm.tokenizer.apply_chat_template(
        OTHER, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    ids = llm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for token, logprob in zip(completion.token_ids, completion.logprobs):
        with torch.no_grad():
            logp = torch.log_softmax(llm.model(torch.tensor([ids])).logits[0, -1], dim=-1)
        assert token == int(logp.argmax())
        assert abs(logprob - logp[token].item()) < 1e-5
        ids.append(token)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(llm: HFLLM):
    def sample(n: int, seed: int | None) -> ChatRequest:
        return ChatRequest(
            CHAT,
            SamplingParams(n=n, temperature=1.0, top_p=0.95, top_k=50, max_tokens=10, seed=seed),
        )

    four = llm.chat([sample(4, 7)])[0]
    assert len(four) == 4
    assert len({tuple(c.token_ids) for c in four}) > 1  # the samples are not copies of each other
    with_company = llm.chat([_greedy(llm, OTHER), sample(2, 7), sample(3, 8)])
    assert [c.token_ids for c in with_company[1]] == [c.token_ids for c in four[:2]]
    assert [c.token_ids for c in llm.chat([sample(4, 7)])[0]] == [c.token_ids for c in four]
    assert [c.token_ids for c in with_company[2]] != [c.token_ids for c in four[:3]]


def test_unseeded_sampling_follows_the_backend_seed(tiny_model_dir: Path, llm: HFLLM):
    request = ChatRequest(OTHER, SamplingParams(n=2, temperature=1.0, max_tokens=8))
    twin = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32", seed=123)
    other = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32", seed=123)
    assert [c.token_ids for c in twin.chat([request])[0]] == [
        c.token_ids for c in other.chat([request])[0]
    ]


def test_length_and_stop_strings(llm: HFLLM):
    [[long]] = llm.chat([_greedy(llm, CHAT, max_tokens=30)])
    assert long.finish_reason == "length" and long.completion_tokens == 30
    stop = long.text[12:15]
    [[cut]] = llm.chat([_greedy(llm, CHAT, max_tokens=30, stop=(stop,))])
    assert cut.finish_reason == "stop"
    assert cut.text == long.text[: long.text.index(stop)]
    assert cut.completion_tokens < 30


def test_eos_ends_the_reply_and_is_not_in_the_text(llm: HFLLM):
    [[free]] = llm.chat([_greedy(llm, OTHER, max_tokens=6)])
    saved = llm.eos_ids
    llm.eos_ids = saved | {free.token_ids[2]}
    try:
        [[ended]] = llm.chat([_greedy(llm, OTHER, max_tokens=6)])
    finally:
        llm.eos_ids = saved
    stop_at = free.token_ids.index(free.token_ids[2])
    assert ended.finish_reason == "stop"
    assert ended.token_ids == free.token_ids[: stop_at + 1]
    assert ended.text == llm.tokenizer.decode(free.token_ids[:stop_at], skip_special_tokens=True)


def test_completion_splits_thinking_and_tool_calls(llm: HFLLM):
    text = (
        "<think>\nlook it up\n</think>\n\nOne moment.\n"
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    )
    ids = llm.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
    row = _Row(
        0,
        0,
        SamplingParams(),
        100,
        None,
        tokens=ids,
        logprobs=[0.0] * len(ids),
        finish="stop",
        hit_eos=True,
    )
    completion = llm._completion(row, prompt_tokens=3)
    assert completion.text == text
    assert completion.reasoning == "look it up"
    assert completion.content == "One moment."
    assert [(c.name, c.arguments, c.error) for c in completion.tool_calls] == [
        ("get_order_details", {"order_id": "#W1"}, None)
    ]


def test_too_long_context_is_a_clear_error(tiny_model_dir: Path):
    short = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=40)
    long_history = [{"role": "user", "content": "word " * 60}]
    with pytest.raises(
        ValueError, match=r"chat request 0: the prompt has \d+ tokens .*max_model_len"
    ):
        short.chat([ChatRequest(long_history)])
    with pytest.raises(ValueError, match=r"score request 0: context \+ target has \d+ tokens"):
        short.score([ScoreRequest("hello", "word " * 60)])
    with pytest.raises(ValueError, match="score request 0: the context is empty"):
        short.score([ScoreRequest("", "x")])
    # the generation is cut at the last position, not allowed to run past it
    [[completion]] = short.chat([ChatRequest(OTHER, SamplingParams(temperature=0, max_tokens=100))])
    used = completion.prompt_tokens + completion.completion_tokens
    assert used == 40 if completion.finish_reason == "length" else used < 40


def test_threads_share_one_backend(llm: HFLLM):
    request = _greedy(llm, CHAT, max_tokens=8)
    expected = llm.chat([request])[0][0].text
    seen: list[str] = []

    def work() -> None:
        seen.append(llm.chat([request])[0][0].text)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [expected] * 3


def test_filtered_probs_by_hand():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]] * 4))
    temperature = torch.tensor([1.0, 1.0, 1.0, 2.0])
    top_k = torch.tensor([3, 3, 1, 3])
    top_p = torch.tensor([1.0, 0.7, 1.0, 1.0])
    probs, order = filtered_probs(logits, temperature, top_k, top_p)
    assert order[0].tolist() == [1, 2, 0]
    assert torch.allclose(probs[0], torch.tensor([0.5, 0.3, 0.2]))
    assert torch.allclose(probs[1], torch.tensor([0.625, 0.375, 0.0]))  # 0.5 + 0.3 reaches 0.7
    assert torch.allclose(probs[2], torch.tensor([1.0, 0.0, 0.0]))
    root = torch.tensor([0.5, 0.3, 0.2]).sqrt()
    assert torch.allclose(probs[3], root / root.sum())
    drawn = draw_tokens(
        probs[:1].expand(3, -1), order[:1].expand(3, -1), torch.tensor([0.1, 0.6, 0.95])
    )
    assert drawn.tolist() == [1, 2, 0]


def test_build_llm_makes_an_hf_backend(tiny_model_dir: Path):
    llm = build_llm(
        ModelConfig(
            backend="hf", path=str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=512
        )
    )
    assert isinstance(llm, HFLLM) and llm.max_len == 512 and llm.dtype == torch.float32
    llm.close()
    llm.close()


def test_contexts_sharing_a_prefix_score_like_a_plain_forward(llm: HFLLM):
    """The reward's posterior group: one long history, each context ending in its own Q/A turn."""
    history = "user: I want to return the water bottle from order #W1234567 please. " * 4
    contexts = [history + f"agent asks: question {k}? user answers: answer {k}." for k in range(3)]
    target = " My goal: return the bottle."
    results = llm.score([ScoreRequest(c, target) for c in contexts])
    ids = [llm.tokenizer(c, add_special_tokens=False)["input_ids"] for c in contexts]
    assert llm._common_prefix(ids) >= 16  # the shared-prefix path is the one exercised here
    for context_ids, result in zip(ids, results):
        assert _close(result.token_logprobs, _by_hand(llm, context_ids, target))


def _tree_states(llm: HFLLM, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record which decoding state (token tree or padded rows) each generated chunk used."""
    used: list[str] = []
    original = llm._decoding_state

    def spy(prompts, rows):
        state = original(prompts, rows)
        used.append(type(state).__name__)
        return state

    monkeypatch.setattr(llm, "_decoding_state", spy)
    return used


SHARED_HISTORY = (
    "user: I want to exchange the water bottle and the desk lamp from order #W1234567. "
    "agent: Sure, the order was delivered last week, so both items can be exchanged. " * 3
)
READINGS = ["I want a bigger bottle.", "I want a dimmer lamp.", "I want my money back instead."]


def test_scoring_reuses_one_prefix_and_each_context_for_its_targets(
    llm: HFLLM, monkeypatch: pytest.MonkeyPatch
):
    """Two-level reuse: the decomposer's case (one long prefix, K contexts, C targets each)."""
    contexts = [[{"role": "user", "content": SHARED_HISTORY + "Goal: " + g}] for g in READINGS]
    requests = [ScoreRequest(c, t) for c in contexts for t in TARGETS]
    requests.insert(2, ScoreRequest(contexts[1], ""))  # an empty target, between the others
    lone = [{"role": "user", "content": SHARED_HISTORY + "Goal: I want to stop the order."}]
    requests.append(ScoreRequest(lone, TARGETS[3]))  # one target: scored inline with its context
    ids = [
        llm.tokenizer(llm.render_chat(c, None, False), add_special_tokens=False)["input_ids"]
        for c in contexts
    ]
    assert llm._common_prefix(ids) >= 16
    full_rows = []
    monkeypatch.setattr(llm, "_score_full", lambda pairs: full_rows.append(pairs) or [])
    results = llm.score(requests)
    assert full_rows == []  # everything went through the token tree
    assert results[2].token_logprobs == []
    scored = results[:2] + results[3:-1]
    lone_ids = llm.tokenizer(llm.render_chat(lone, None, False), add_special_tokens=False)
    assert _close(results[-1].token_logprobs, _by_hand(llm, lone_ids["input_ids"], TARGETS[3]))
    for k, context_ids in enumerate(ids):
        for j, target in enumerate(TARGETS):
            expected = _by_hand(llm, context_ids, target)
            assert _close(scored[k * len(TARGETS) + j].token_logprobs, expected)
    # runs of a few tokens: contexts and targets in several forwards, the tree cut back between
    monkeypatch.setattr("prour.llm.hf.MAX_TREE_QUERIES", 12)
    for a, b in zip(llm.score(requests), results):
        assert _close(a.token_logprobs, b.token_logprobs)


def test_one_token_context_and_unrelated_contexts_score_like_a_plain_forward(llm: HFLLM):
    one = llm.tokenizer("Order", add_special_tokens=False)["input_ids"]
    assert len(one) == 1
    requests = [ScoreRequest("Order", " pending"), ScoreRequest("Order", " shipped")]
    requests += [ScoreRequest(OTHER, "NO"), ScoreRequest("a lone text context", " and more")]
    results = llm.score(requests)
    assert _close(results[0].token_logprobs, _by_hand(llm, one, " pending"))
    assert _close(results[1].token_logprobs, _by_hand(llm, one, " shipped"))
    lone = llm.tokenizer("a lone text context", add_special_tokens=False)["input_ids"]
    assert _close(results[3].token_logprobs, _by_hand(llm, lone, " and more"))


def test_prompts_sharing_a_long_prefix_generate_what_each_generates_alone(
    llm: HFLLM, monkeypatch: pytest.MonkeyPatch
):
    chats = [[{"role": "user", "content": SHARED_HISTORY + "Goal: " + g}] for g in READINGS]
    sampled = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_tokens=12, seed=11)
    requests = [ChatRequest(c, sampled) for c in chats] + [_greedy(llm, chats[0], 12)]
    requests.append(ChatRequest(chats[2], SamplingParams(temperature=0.7, max_tokens=6, seed=5)))
    used = _tree_states(llm, monkeypatch)
    together = llm.chat(requests)
    assert used == ["_TreeDecoding"]
    alone = [llm.chat([r])[0] for r in requests]
    try:
        llm.prefix_reuse = False  # the padded layout: one cache row per sample
        padded = llm.chat(requests)
    finally:
        llm.prefix_reuse = True
    assert used[-1] == "_PaddedDecoding"
    for group, single, plain in zip(together, alone, padded):
        assert [c.token_ids for c in group] == [c.token_ids for c in single]
        assert [c.token_ids for c in group] == [c.token_ids for c in plain]
        for a, b in zip(group, plain):
            assert _close(a.logprobs, b.logprobs, tol=1e-4)
            assert a.finish_reason == b.finish_reason and a.text == b.text
    assert len({tuple(c.token_ids) for c in together[0]}) > 1


def test_equal_prompts_with_own_seeds_sample_like_rows_of_one_request(llm: HFLLM):
    """n=1 requests with seeds s, s+1, ... are prefilled once and each keeps its own stream."""
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=40 + j) for j in range(4)]
    batch = llm.chat([ChatRequest(CHAT, p) for p in params])
    for p, [completion] in zip(params, batch):
        [[alone]] = llm.chat([ChatRequest(CHAT, p)])
        assert completion.token_ids == alone.token_ids
    assert len({tuple(c.token_ids) for [c] in batch}) > 1


def test_models_loaded_in_several_threads_at_once_all_load(tiny_model_dir):
    """A checkpoint sweep's episodes build their generators in the queue's threads, each from its
    own checkpoint: in a fresh interpreter (transformers not imported yet), four threads build an
    hf backend at the same moment and every one loads."""
    import subprocess
    import sys

    probe = (
        "import sys, threading\n"
        "from prour.llm.hf import HFLLM\n"
        "errors, start = [], threading.Barrier(4)\n"
        "def load():\n"
        "    start.wait()\n"
        "    try:\n"
        "        HFLLM(sys.argv[1], 'cpu', 'float32')\n"
        "    except Exception as exc:\n"
        "        errors.append(repr(exc)[:200])\n"
        "threads = [threading.Thread(target=load) for _ in range(4)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(errors)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(tiny_model_dir)], capture_output=True,
                         text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout[-2000:]
