"""Warm start of the tiny model (CPU): the synthetic corpus, the reply-only loss, determinism and
reuse of the built folder, and that a short warm start teaches the formats the pipeline parses."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from prour.demo.corpus import Corpus, build_corpus
from prour.demo.examples import domain_context
from prour.demo.state_examples import query_examples
from prour.demo.targets import query_target
from prour.demo.training import (
    KIND_WEIGHTS,
    RowPacker,
    batch_tensors,
    encode_example,
    reply_loss,
    reply_text,
)
from prour.demo.transcripts import DecisionPoint, corpus_task_ids, first_person, replay
from prour.demo.warmstart import MARKER_FILE, warm_start

DOMAINS = ("retail", "airline", "telecom")


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    """A small corpus: one train task per domain."""
    return build_corpus(DOMAINS, "train", seed=0, tasks_per_domain=1)



def _catalog(domain: str):
    from prour.env.environment import tool_schemas
    from prour.router.candidates import ToolCatalog

    return ToolCatalog(tool_schemas(domain))


# ---------------------------------------------------------------- corpus


def test_first_person_rewrites_the_instruction():
    text = "You received your order #W1 and you want to return it. You are Ann; they told you so."
    assert first_person(text) == (
        "I received my order #W1 and I want to return it. I am Ann; they told me so."
    )


def test_corpus_reads_train_tasks_only(corpus: Corpus):
    from prour.env.domains import split_task_ids

    for domain in DOMAINS:
        assert set(corpus.tasks[domain]) <= set(split_task_ids(domain, "train"))
        assert not set(corpus.tasks[domain]) & set(split_task_ids(domain, "test"))
    with pytest.raises(ValueError, match="train split"):
        corpus_task_ids("retail", "test")
    with pytest.raises(ValueError, match="train split"):
        warm_start("unused", "unused", split="base")


def test_corpus_has_every_kind_and_labels_its_tasks(corpus: Corpus):
    assert set(corpus.examples) == set(KIND_WEIGHTS)
    for examples in corpus.examples.values():
        for example in examples:
            assert [example.task_id] == corpus.tasks[example.domain]


def test_candidate_action_targets_validate_against_the_domain_schemas(corpus: Corpus):
    from prour.router.candidates import parse_action

    for kind in ("action", "score", "belief_verify"):
        for example in corpus.examples[kind]:
            parsed = parse_action(example.reply["content"], _catalog(example.domain))
            assert parsed.valid, (kind, example.reply["content"], parsed.reason, parsed.detail)


def test_query_targets_parse_as_ask_or_none(corpus: Corpus):
    from prour.rollout.query import parse_query

    kinds = [
        parse_query(e.reply["content"]).kind
        for k in ("query_clarify", "query_verify")
        for e in corpus.examples[k]
    ]
    assert "invalid" not in kinds
    assert 0.2 <= kinds.count("ask") / len(kinds) <= 0.8


def _point(message: dict, user_action=None) -> DecisionPoint:
    return DecisionPoint("retail", "0", [], {}, message, None, 0, user_action)


def _call(name: str, arguments: dict) -> dict:
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.mark.parametrize(
    ("message", "user_action", "clarify", "verify"),
    [
        (_call("get_order_details", {"order_id": "#W1"}), None, "none", "ask"),
        (
            _call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}),
            None,
            "ask",
            "none",
        ),
        ({"role": "assistant", "content": "Done."}, None, "none", "none"),
        ({"role": "assistant", "content": "Please reboot."}, ("reboot_device", {}), "ask", "none"),
    ],
)
def test_query_target_asks_before_reads_writes_and_device_actions(
    message, user_action, clarify, verify
):
    from prour.env.environment import tool_types
    from prour.rollout.query import parse_query

    kinds = {**tool_types("retail"), **tool_types("telecom")}
    point = _point(message, user_action)
    for mode, expected in (("clarify", clarify), ("verify", verify)):
        for think in (False, True):
            target = query_target(mode, point, kinds, random.Random(0), think)
            parsed = parse_query(target)
            assert parsed.kind == expected, target
            assert (parsed.thinking is not None) == think


def test_verifier_answers_cite_the_tool_result(corpus: Corpus):
    from prour.rollout.grounding import ToolEvidence, grounding

    answers = [e for e in corpus.examples["verifier"] if not e.reply.get("tool_calls")]
    assert answers
    for example in answers:
        result = example.messages[-1]
        assert result["role"] == "tool"
        evidence = [ToolEvidence(result["name"], result["content"])]
        assert grounding(example.reply["content"], evidence, "") == "tool"


def test_normalized_goals_keep_every_concrete_value(corpus: Corpus):
    from prour.data.normalize import missing_values, task_values_text
    from prour.env.domains import get_task

    for example in corpus.examples["normalize"]:
        task = get_task(example.domain, example.task_id)
        assert missing_values(task_values_text(task), example.reply["content"]) == []


def test_policy_side_prompts_never_show_the_instruction(corpus: Corpus):
    from prour.env.domains import get_task

    for kind in ("query_clarify", "query_verify", "goal", "action", "score", "annotate"):
        for example in corpus.examples[kind]:
            task = get_task(example.domain, example.task_id)
            instruction = task.user_scenario.instructions.reason_for_call.strip()
            assert instruction not in json.dumps(example.messages, ensure_ascii=False)


def test_agent_targets_are_the_oracle_tool_calls(corpus: Corpus, tiny_tokenizer):
    from prour.llm.toolcalls import parse_tool_calls

    calls = [e for e in corpus.examples["agent"] if e.reply.get("tool_calls")]
    assert calls
    for example in calls:
        text = reply_text(tiny_tokenizer, example.reply)
        assert text.endswith("<|im_end|>")
        _, parsed = parse_tool_calls(text.removesuffix("<|im_end|>"))
        fn = example.reply["tool_calls"][0]["function"]
        assert [(c.name, c.arguments) for c in parsed] == [
            (fn["name"], json.loads(fn["arguments"]))
        ]


def test_corpus_is_deterministic_from_the_seed(corpus: Corpus):
    again = build_corpus(("telecom",), "train", seed=0, tasks_per_domain=1)
    first = [e for k in again.examples for e in corpus.examples[k] if e.domain == "telecom"]
    second = [e for k in again.examples for e in again.examples[k]]
    assert first == second


def test_task_choice_follows_the_seed():
    from prour.env.domains import split_task_ids

    picks = {seed: corpus_task_ids("retail", "train", seed, 3) for seed in range(4)}
    train = split_task_ids("retail", "train")
    for ids in picks.values():
        assert len(ids) == 3 and ids == [t for t in train if t in ids]  # tau2's order
    assert corpus_task_ids("retail", "train", 0, 3) == picks[0]
    assert len({tuple(ids) for ids in picks.values()}) > 1
    assert corpus_task_ids("retail", "train", 0, None) == train


# ---------------------------------------------------------------- tokens and loss


def test_encoded_example_ends_with_the_reply(corpus: Corpus, tiny_tokenizer):
    example = corpus.examples["query_verify"][0]
    ids, n_reply = encode_example(tiny_tokenizer, example, 96)
    assert len(ids) == 96
    reply = tiny_tokenizer.decode(ids[-n_reply:])
    assert reply == reply_text(tiny_tokenizer, example.reply)
    assert reply.endswith("<|im_end|>")
    prompt = tiny_tokenizer.apply_chat_template(
        example.messages,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=example.enable_thinking,
    )
    assert (
        tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"][-(96 - n_reply) :]
        == ids[:-n_reply]
    )


def test_reply_loss_matches_the_full_model_loss(tiny_model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32")
    rows = [[([5, 6, 7, 8], 2), ([9, 10, 11], 1)], [([12, 13, 14, 15, 16], 3)]]
    ids, labels = batch_tensors(rows, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 0, 0]]
    assert labels.tolist() == [
        [-100, -100, 7, 8, -100, -100, 11],
        [-100, -100, 14, 15, 16, -100, -100],
    ]
    with torch.no_grad():
        expected = model(input_ids=ids, labels=labels).loss
        assert torch.allclose(reply_loss(model, ids, labels), expected, atol=1e-5)


def test_row_packer_fills_rows_and_follows_the_kind_weights(corpus: Corpus, tiny_tokenizer):
    packer = RowPacker(corpus, tiny_tokenizer, example_tokens=64, row_tokens=512, seed=0)
    rows = [packer.row() for _ in range(40)]
    assert all(sum(len(ids) for ids, _ in row) <= 512 for row in rows)
    assert all(len(row) >= 8 for row in rows)
    total = sum(packer.used.values())
    assert packer.used["action"] / total > 2 * packer.used["query_verify"] / total


def test_row_packer_refuses_an_empty_corpus(tiny_tokenizer):
    with pytest.raises(ValueError, match="corpus is empty"):
        RowPacker(Corpus(), tiny_tokenizer, example_tokens=64, row_tokens=512, seed=0)


# ---------------------------------------------------------------- the built folder


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def _small_warm_start(
    base: Path, out: Path, seed: int = 0, steps: int = 3, row_tokens: int = 256
) -> Path:
    """The warm start on one telecom task, in seconds."""
    return warm_start(
        base,
        out,
        steps=steps,
        seed=seed,
        domains=("telecom",),
        tasks_per_domain=1,
        row_tokens=row_tokens,
        example_tokens=128,
    )


def _marker(folder: Path) -> dict:
    return json.loads((folder / MARKER_FILE).read_text())


def test_warm_start_is_deterministic_reused_and_loadable(tiny_model_dir: Path, tmp_path: Path):
    from prour.llm.base import ChatRequest, SamplingParams
    from prour.llm.hf import HFLLM

    first = _small_warm_start(tiny_model_dir, tmp_path / "a")
    second = _small_warm_start(tiny_model_dir, tmp_path / "b")
    assert _weights(first) == _weights(second)
    assert _weights(first) != _weights(tiny_model_dir)
    info = _marker(first)
    assert info["args"]["steps"] == 3 and len(info["stats"]["loss_curve"]) == 3
    assert not (first / "prour_tiny.json").exists()

    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert _small_warm_start(tiny_model_dir, tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp

    other = _small_warm_start(tiny_model_dir, tmp_path / "c", seed=1)
    assert _weights(other) != _weights(first)

    llm = HFLLM(str(first), device="cpu", dtype="float32")
    request = ChatRequest(
        [{"role": "user", "content": "hi"}], SamplingParams(temperature=0.0, max_tokens=4)
    )
    assert llm.chat([request])[0][0].completion_tokens >= 1


def test_warm_start_rebuilds_a_folder_built_with_other_arguments(
    tiny_model_dir: Path, tmp_path: Path
):
    first = _small_warm_start(tiny_model_dir, tmp_path / "a", steps=2)
    before = _weights(first)
    again = _small_warm_start(tiny_model_dir, tmp_path / "a", steps=3)
    assert again == first and _marker(again)["args"]["steps"] == 3
    assert _weights(again) != before
    assert [p.name for p in tmp_path.iterdir()] == ["a"]  # no staging folder left behind


def test_warm_start_refuses_a_foreign_folder(tiny_model_dir: Path, tmp_path: Path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="prour_warmstart.json"):
        _small_warm_start(tiny_model_dir, tmp_path / "x")
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["notes.txt"]


def _held_out_loss(folder: Path, rows) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    with torch.no_grad():
        return float(reply_loss(model, *rows))


def test_a_short_warm_start_teaches_the_query_format(
    tiny_model_dir: Path, tmp_path: Path, tiny_tokenizer
):
    """Query-generator replies of a train task the corpus did not use score far better after it."""
    warm = _small_warm_start(tiny_model_dir, tmp_path / "w", steps=100, row_tokens=512)
    curve = _marker(warm)["stats"]["loss"]
    assert curve["last_mean"] < 0.5 * curve["first_mean"]

    used = corpus_task_ids("telecom", "train", 0, 1)
    held = next(t for t in corpus_task_ids("telecom", "train", 0, None) if t not in used)
    _, _, points = replay("telecom", held)
    ctx = domain_context("telecom", points)
    examples = [e for p in points[:3] for e in query_examples(p, ctx, random.Random(0))]
    rows = batch_tensors(
        [[encode_example(tiny_tokenizer, e, 256)] for e in examples], tiny_tokenizer.pad_token_id
    )
    assert _held_out_loss(warm, rows) < 0.5 * _held_out_loss(tiny_model_dir, rows)
