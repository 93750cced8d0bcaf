"""The training row both ways: extraction's instance → parquet row → the reward's state.

On real tau2 retail train tasks with scripted models (``tests/write_world.py``): every field the
reward uses survives the parquet round trip through pyarrow, ``datasets`` and verl's RLHFDataset,
and the row carries the untruncated tool traffic and the DB hash at the decision, both
recomputed here from the raw trajectory with tau2's own API.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import write_world as world_lib

from prour.config import EnvConfig
from prour.data.dataset import check_dataset, load_split, read_rows, split_path, write_rows
from prour.data.schema import SCHEMA_VERSION, check_row, state_from_row

REWARD_FIELDS = ("mode", "history", "target", "domain", "task_id", "state_id", "env_history",
                 "db_hash")


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    return world_lib.build_world(tmp_path_factory.mktemp("schema"), tiny_model_dir)


def _reward_view(state) -> dict:
    return {name: getattr(state, name) for name in REWARD_FIELDS}


def test_world_has_one_clarify_and_one_truncated_verify_row_per_episode(world) -> None:
    got = sorted((r["extra_info"]["mode"], r["extra_info"]["step"], r["extra_info"]["truncated"])
                 for r in world.rows)
    assert got == [("clarify", world_lib.CLARIFY_STEP, False)] * 2 + \
        [("verify", world_lib.VERIFY_STEP, True)] * 2
    assert all(check_row(r) == [] for r in world.rows)


def test_instance_row_state_round_trip_keeps_every_reward_field(world) -> None:
    """pyarrow (local trainer), datasets (dataset check) and verl's RLHFDataset (agent loop)."""
    by_id = {i.state_id: i for i in world.instances}
    datasets_rows = [dict(r) for s in ("train", "validation")
                     for r in load_split(split_path(world.folder / "dataset", s))]
    assert len(by_id) == len(world.rows) == len(datasets_rows) == 4
    for row in world.rows + datasets_rows:
        state = state_from_row(row)
        instance = by_id[state.state_id]
        assert _reward_view(state) == _reward_view(instance)
        assert state.state_id == (f"{instance.trajectory_id}#{instance.step}:{instance.mode}")


def test_verl_dataset_items_give_the_same_state(world, tiny_model_dir, tmp_path) -> None:
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = split_path(world.folder / "dataset", "train")
    config = OmegaConf.create({"max_prompt_length": 4096, "filter_overlong_prompts": False,
                               "cache_dir": str(tmp_path / "cache")})
    data = RLHFDataset(str(path), AutoTokenizer.from_pretrained(str(tiny_model_dir)), config)
    for item, row in zip(data, read_rows(path), strict=True):
        assert _reward_view(state_from_row(item)) == _reward_view(state_from_row(row))


def test_rows_carry_the_untruncated_tool_traffic_and_its_db_hash(world) -> None:
    """Recomputed from the raw trajectory: all tool messages before the decision, and the DB
    hash after replaying them with tau2's API."""
    for row in world.rows:
        extra = row["extra_info"]
        traj = world_lib.trajectory_of(world, row)
        before = traj.messages[1:world_lib.decision_message(traj, extra["step"])]
        expected = [m for m in before if m.get("tool_calls") or m["role"] == "tool"]
        assert json.loads(extra["env_history"]) == expected
        assert extra["db_hash"] == world_lib.replayed_hash(traj, extra["step"])
    verify = next(r for r in world.rows if r["extra_info"]["mode"] == "verify")
    env_calls = [c["function"]["name"] for m in json.loads(verify["extra_info"]["env_history"])
                 for c in m.get("tool_calls") or []]
    assert env_calls == ["find_user_id_by_name_zip", "return_delivered_order_items",
                         "get_product_details"]


def test_a_version_1_parquet_is_refused_with_the_fix(world, tmp_path, tiny_model_dir) -> None:
    """By the local trainer's reader, the reward's row reader and verl's dataset."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from prour.train.verl_ext.dataset import ProurRLDataset

    old = [json.loads(json.dumps(r)) for r in world.rows[:1]]
    for key in ("state_id", "env_history", "db_hash"):
        del old[0]["extra_info"][key]
    old[0]["extra_info"]["schema_version"] = 1
    path = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist(old), path)
    with pytest.raises(ValueError, match=r"schema_version is 1.*rebuild the dataset with `prour "
                                         r"extract`"):
        read_rows(path)
    with pytest.raises(ValueError, match="rebuild the dataset with `prour extract`"):
        state_from_row(pq.read_table(path).to_pylist()[0])
    assert "schema_version is 1" in check_row(old[0])[0]
    (tmp_path / "old").mkdir()
    for split in ("train", "validation"):
        pq.write_table(pa.Table.from_pylist(old * 3), split_path(tmp_path / "old", split))
    errors = check_dataset(tmp_path / "old")
    assert len(errors) == 2 and all("rebuild the dataset" in e for e in errors)
    config = OmegaConf.create({"max_prompt_length": 4096, "filter_overlong_prompts": False,
                               "cache_dir": str(tmp_path / "cache")})
    with pytest.raises(ValueError, match="rebuild the dataset with `prour extract`"):
        ProurRLDataset(str(path), AutoTokenizer.from_pretrained(str(tiny_model_dir)), config)
    assert SCHEMA_VERSION == 2


def test_writer_and_reader_agree_on_a_rewritten_split(world, tmp_path) -> None:
    path = write_rows(world.rows, tmp_path / "again.parquet")
    assert read_rows(path) == world.rows


def test_a_malformed_call_never_reached_tau2_and_is_not_replayed(tmp_path) -> None:
    """The agent's first call is unreadable (recorded, answered with an error, not executed);
    the tool traffic of a later decision holds only the call that reached the environment."""
    from prour.config.data import DataConfig
    from prour.data.collect import EpisodeFactories, collect_trajectories
    from prour.data.decision_states import decision_hash, decision_states
    from prour.env.agents import LLMAgent
    from prour.env.domains import load_tasks
    from prour.env.users import LLMUser
    from prour.llm.scripted import ScriptedLLM

    find = json.dumps(world_lib.FIND_CALL)
    agent = ScriptedLLM([("returned: yusuf_rossi_9620", world_lib.WRAP_UP),
                         ("malformed tool call", f"<tool_call>{find}</tool_call>")],
                        default='<tool_call>{"name": "find_user_id_by_name_zip", oops}</tool_call>')
    cfg = DataConfig(num_trajectories=1, trial_seeds=[0], concurrency=1, teacher=False)
    factories = EpisodeFactories(lambda: LLMAgent(agent, EnvConfig()),
                                 lambda: LLMUser(world_lib.user_llm(), EnvConfig()),
                                 None, cfg)
    [traj] = collect_trajectories(load_tasks("retail", "train")[:1], factories, cfg,
                                  tmp_path / "traj.jsonl", progress=False, limits=EnvConfig())
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert results[0].startswith("Error: malformed tool call") and len(results) == 2
    state = decision_states(traj, cfg)[2]
    assert [m["role"] for m in state.env_history] == ["assistant", "tool"]
    assert state.env_history[1]["content"] == "yusuf_rossi_9620"
    assert decision_hash(state) == world_lib.tau2_hash([world_lib.FIND_CALL])
