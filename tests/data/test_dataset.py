"""Dataset files: the row schema, its check, loading with datasets and verl, and the card."""

from __future__ import annotations

import copy
import functools
import json

import pytest

from prour.data.card import EXTRACT_SUMMARY, card_markdown, percentiles, write_card
from prour.data.dataset import check_dataset, load_split, read_rows, split_path, write_rows
from prour.data.extract_summary import split_keys
from prour.data.schema import Instance, check_row, tool_traffic_hash
from prour.rollout.query import PROMPTS_VERSION, query_prompt

HISTORY = [{"role": "system", "content": "policy"}, {"role": "user", "content": "Hi, order #W1"}]
ACTION = '{"arguments":{"order_id":"#W1"},"tool":"get_order_details"}'
EXCERPTED = [{"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function",
     "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "get_order_details",
     "content": '{"order_id": "#W1", "st[… truncated 812 characters …]'}]


@functools.cache
def initial_hash() -> str:
    """DB hash of retail task 0 before any tool call (the history below calls none)."""
    return tool_traffic_hash("retail", "0", [])


def make_instance(mode: str = "clarify", trajectory: str = "retail/0/s0/t", step: int = 0,
                  prompt_tokens: int = 100, truncated: bool = False,
                  history: list[dict] = HISTORY) -> Instance:
    return Instance(
        mode=mode, domain="retail", task_id="0", trajectory_id=trajectory, step=step,
        history=history, prompt=query_prompt(mode, history),
        target="I want my order #W1 refunded." if mode == "clarify" else ACTION,
        au=0.3, eu=0.2, total=0.5, truncated=truncated, dropped_messages=int(truncated),
        prompt_tokens=prompt_tokens, target_tokens=7, decomposer_calls=3,
        prompts_version=PROMPTS_VERSION, env_history=[], db_hash=initial_hash(),
    )


def test_row_has_the_verl_layout() -> None:
    row = make_instance("verify").to_row(index=4)
    assert row["data_source"] == "prour/retail"
    assert row["reward_model"] == {"style": "rule", "ground_truth": ACTION}
    assert row["prompt"] == query_prompt("verify", HISTORY)
    assert row["extra_info"]["index"] == 4 and row["extra_info"]["mode"] == "verify"
    assert row["extra_info"]["state_id"] == "retail/0/s0/t#0:verify"
    assert json.loads(row["extra_info"]["history"]) == HISTORY
    assert json.loads(row["extra_info"]["env_history"]) == []
    assert check_row(row) == []


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("extra_info", "mode"), "act", "extra_info.mode"),
        (("data_source",), "prour/airline", "does not match domain"),
        (("reward_model", "ground_truth"), "", "non-empty text"),
        (("extra_info", "total"), 0.9, "must equal au + eu"),
        (("extra_info", "history"), "[{oops", "JSON string"),
        (("extra_info", "prompt_tokens"), 0, "prompt_tokens"),
        (("extra_info", "state_id"), "retail/0/s0/t#1:clarify", "state_id"),
        (("extra_info", "db_hash"), "abc", "db_hash"),
        (("extra_info", "env_history"), '[{"role": "user", "content": "hi"}]',
         "only tool calls and tool results"),
        (("extra_info", "history"), json.dumps(EXCERPTED[1:]), "call 'c1' without the call"),
        (("extra_info", "env_history"), json.dumps(EXCERPTED[1:]), "call 'c1' without the call"),
        (("prompt",), [{"role": "assistant", "content": "x"}], "last prompt message"),
    ],
)
def test_schema_check_names_the_problem(path: tuple[str, ...], value, message: str) -> None:
    row = make_instance().to_row(0)
    node = row
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = check_row(row)
    assert errors and any(message in e for e in errors), errors


def test_verify_target_must_be_canonical_action() -> None:
    row = make_instance("verify").to_row(0)
    row["reward_model"]["ground_truth"] = '{"tool": "get_order_details", "arguments": {}}'
    assert check_row(row) == ["a verify ground_truth must be canonical JSON"]
    row["reward_model"]["ground_truth"] = '{"name":"x"}'
    assert "exactly the keys tool and arguments" in check_row(row)[0]


def _write_dataset(tmp_path, train: list[Instance], validation: list[Instance]):
    write_rows([i.to_row(n) for n, i in enumerate(train)], split_path(tmp_path, "train"))
    write_rows([i.to_row(n) for n, i in enumerate(validation)], split_path(tmp_path, "validation"))


def test_parquet_round_trip_through_datasets(tmp_path) -> None:
    train = [make_instance("clarify", step=0), make_instance("verify", step=1)]
    val = [make_instance("verify", trajectory="retail/1/s0/t")]
    _write_dataset(tmp_path, train, val)
    loaded = load_split(split_path(tmp_path, "train"))
    assert len(loaded) == 2 and loaded[1]["reward_model"]["ground_truth"] == ACTION
    assert loaded[0]["prompt"] == query_prompt("clarify", HISTORY)
    assert [dict(r) for r in loaded] == read_rows(split_path(tmp_path, "train"))
    assert check_dataset(tmp_path) == []


def test_check_dataset_finds_a_trajectory_in_both_splits(tmp_path) -> None:
    _write_dataset(tmp_path, [make_instance()], [make_instance(step=3)])
    [error] = check_dataset(tmp_path)
    assert "trajectories in both splits" in error and "retail/0/s0/t" in error


def test_verl_rlhf_dataset_reads_the_files(tmp_path, tiny_model_dir) -> None:
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    _write_dataset(tmp_path, [make_instance(), make_instance("verify", step=1)], [])
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    config = OmegaConf.create({"max_prompt_length": 4096, "filter_overlong_prompts": True,
                               "cache_dir": str(tmp_path / "cache")})
    data = RLHFDataset(str(split_path(tmp_path, "train")), tokenizer, config)
    assert len(data) == 2
    item = data[1]
    assert item["raw_prompt"] == query_prompt("verify", HISTORY)
    assert item["index"] == 1 and item["reward_model"]["ground_truth"] == ACTION


def test_percentiles_hand_computed() -> None:
    stats = percentiles([10, 20, 30, 40, 50])
    # linear interpolation: p50 = 30, p90 = 40 + 0.6 * 10 = 46, p95 = 48, p99 = 49.6
    assert stats == pytest.approx({"p50": 30, "p90": 46, "p95": 48, "p99": 49.6, "mean": 30,
                                   "max": 50})


def test_card_counts_and_files(tmp_path) -> None:
    train = [make_instance("clarify", step=0, prompt_tokens=100, truncated=True),
             make_instance("verify", step=1, prompt_tokens=300, truncated=True,
                           history=EXCERPTED),
             make_instance("verify", trajectory="retail/2/s0/t", prompt_tokens=200)]
    _write_dataset(tmp_path, train, [make_instance("clarify", trajectory="retail/1/s0/t")])
    (tmp_path / EXTRACT_SUMMARY).write_text(json.dumps(
        {"states": 10, "routes": {"act": 6, "clarify": 2, "verify": 2}, "decomposer_calls": 30,
         "decomposer_calls_per_state": 3.0}))
    card, json_path, md_path = write_card(tmp_path)
    train_stats = card["splits"]["train"]
    assert train_stats["by_mode"] == {"clarify": 1, "verify": 2}
    assert train_stats["by_domain_mode"] == {"retail": {"clarify": 1, "verify": 2}}
    assert train_stats["trajectories"] == 2 and train_stats["truncated"] == 2
    assert train_stats["excerpted"] == 1 and card["splits"]["validation"]["excerpted"] == 0
    assert train_stats["prompt_tokens"]["p50"] == 200
    assert card["splits"]["validation"]["rows"] == 1
    assert json.loads(json_path.read_text()) == card
    text = md_path.read_text()
    assert "| retail | 1 | 2 | 3 |" in text and "3.00 per routed state" in text
    assert "Truncated prompts: 2 (66.7%), 2 history messages dropped in all; 1 kept tool " \
        "results after the newest user message only as excerpts." in text
    assert text == card_markdown(copy.deepcopy(card))


def test_split_keys_deterministic_disjoint_and_ratio() -> None:
    keys = [f"t{i}" for i in range(10)]
    first = split_keys(keys, 0.2, seed=7)
    assert first == split_keys(list(reversed(keys)), 0.2, seed=7)  # input order does not matter
    assert sorted(first.values()).count("validation") == 2
    assert split_keys(keys, 0.2, seed=8) != first  # the seed matters
    assert set(split_keys(["a", "b"], 0.1, 0).values()) == {"train", "validation"}
    assert set(split_keys(keys, 0.0, 0).values()) == {"train"}


def test_an_empty_split_is_a_clear_schema_error_not_a_crash(tmp_path):
    """Every state routed to act leaves a split empty; the check names the file and the cause."""
    from prour.data.dataset import SPLITS

    for split in SPLITS:
        write_rows([], split_path(tmp_path, split))
    errors = check_dataset(tmp_path)
    assert len(errors) == 2
    assert all("no rows" in e and "routed to act" in e for e in errors)
