"""The tiny local Qwen3: determinism, reuse, tokenizer and the Qwen3-style chat template (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from prour.demo.tiny import (
    MARKER_FILE,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    build_tiny_model,
    default_tiny_dir,
    default_tiny_path,
)
from prour.llm.toolcalls import parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look up an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]



def _render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_same_seed_gives_identical_files(tiny_model_dir: Path, tmp_path: Path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    base, same = (
        load_file(tiny_model_dir / "model.safetensors"),
        load_file(again / "model.safetensors"),
    )
    assert base.keys() == same.keys()
    assert all(base[k].equal(same[k]) for k in base)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert (tiny_model_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_rebuild_reuses_same_args_and_replaces_other_seed(tmp_path: Path):
    folder = build_tiny_model(tmp_path / "m", seed=3, num_layers=1)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    weights, vocab = (
        load_file(folder / "model.safetensors"),
        (folder / "tokenizer.json").read_bytes(),
    )
    assert build_tiny_model(folder, seed=3, num_layers=1) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_model(folder, seed=4, num_layers=1)
    assert json.loads((folder / MARKER_FILE).read_text())["seed"] == 4
    rebuilt = load_file(folder / "model.safetensors")
    assert not weights["model.embed_tokens.weight"].equal(rebuilt["model.embed_tokens.weight"])
    assert (
        folder / "tokenizer.json"
    ).read_bytes() == vocab  # the tokenizer does not depend on the seed


def test_refuses_to_overwrite_a_foreign_folder(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=MARKER_FILE):
        build_tiny_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_default_dir_is_cached_under_prour_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PROUR_CACHE", str(tmp_path))
    first = default_tiny_dir(seed=0, num_layers=1)
    assert first == default_tiny_path(seed=0, num_layers=1)
    assert first.parent == tmp_path and first.name.startswith("tiny-")
    assert json.loads((first / MARKER_FILE).read_text())["num_layers"] == 1
    assert default_tiny_dir(seed=0, num_layers=1) == first
    assert default_tiny_path(seed=1, num_layers=1) != first


def test_config_shape(tiny_model_dir: Path, tiny_tokenizer):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    ) == (128, 2, 4, 2, 32)
    assert config["vocab_size"] == len(tiny_tokenizer)
    assert 2500 <= len(tiny_tokenizer) <= 3100


def test_control_tokens_are_single_and_only_tags_survive_decoding(tiny_tokenizer):
    for token in SPECIAL_TOKENS + TAG_TOKENS:
        assert len(tiny_tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    assert (tiny_tokenizer.eos_token, tiny_tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    text = "<think>\nok\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|><|endoftext|>"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert (
        tiny_tokenizer.decode(ids, skip_special_tokens=True)
        == "<think>\nok\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    )
    assert tiny_tokenizer.decode(ids) == text


def test_any_text_round_trips(tiny_tokenizer):
    text = "Émile's order #W7654321 → refund $12.50 to gift_card_8855 (ok?) 你好"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text


def test_generation_prompt_thinking_off_and_on(tiny_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    head = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    off = _render(tiny_tokenizer, messages, add_generation_prompt=True, enable_thinking=False)
    assert off == head + "<think>\n\n</think>\n\n"
    on = _render(tiny_tokenizer, messages, add_generation_prompt=True, enable_thinking=True)
    assert on == head
    assert _render(tiny_tokenizer, messages, add_generation_prompt=True) == head
    assert _render(tiny_tokenizer, messages) == head.removesuffix("<|im_start|>assistant\n")


def test_tools_calls_and_results(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "Policy."},
        {"role": "user", "content": "Where is #W1?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": {"order_id": "#W1"}},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id": "#W2"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": '{"status": "pending"}'},
        {"role": "tool", "tool_call_id": "b", "content": "Error: order not found"},
    ]
    text = _render(
        tiny_tokenizer, messages, tools=TOOLS, add_generation_prompt=True, enable_thinking=False
    )
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nPolicy.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in system
    assert "<tool_call></tool_call>" in system
    assert rest == (
        "<|im_start|>user\nWhere is #W1?<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "get_order_details", "arguments": '
        '{"order_id": "#W1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_order_details", "arguments": '
        '{"order_id": "#W2"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"status": "pending"}\n</tool_response>\n'
        "<tool_response>\nError: order not found\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # what the template writes for a call is what the parser reads back
    turn = rest.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = parse_tool_calls(turn)
    assert content == "Checking."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_order_details", {"order_id": "#W1"}),
        ("get_order_details", {"order_id": "#W2"}),
    ]


def test_tools_without_system_message(tiny_tokenizer):
    text = _render(tiny_tokenizer, [{"role": "user", "content": "x"}], tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n")


def test_reasoning_kept_only_after_the_last_user_turn(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "<think>old</think>\n\nanswer A"},
        {"role": "user", "content": "B"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "new thought",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}],
        },
        {"role": "tool", "content": "42"},
    ]
    text = _render(tiny_tokenizer, messages)
    assert "<|im_start|>assistant\nanswer A<|im_end|>" in text
    assert "old" not in text
    assert (
        '<|im_start|>assistant\n<think>\nnew thought\n</think>\n\n<tool_call>\n{"name": "f", '
        '"arguments": {}}\n</tool_call><|im_end|>'
    ) in text
