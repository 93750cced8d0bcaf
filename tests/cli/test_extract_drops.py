"""``prour extract`` says what it drops, on the terminal and in the dataset card (issue 24).

Real episodes on tau2 retail task 30 (scripted world of ``recompute_world``: oracle user, scripted
teacher and decomposer), two trials (seeds 0 and 1) by an oracle agent that makes one WRITE the
reference does not hold (an address change right after the first lookup), so every later verify
state is off the reference path. The file then gets a duplicate of the first record (same key), an
errored record, and an invalid line. Every count is recomputed here from the raw JSON lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import recompute_world as world
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.data.collect import EpisodeFactories, collect_trajectories
from prour.data.normalize import normalize_tasks
from prour.env.agents import OracleAgent
from prour.env.domains import get_task, load_tasks
from prour.env.prompts import prompts_hash
from prour.llm.scripted import ScriptedLLM, register_script

TASK = "30"
EXTRA_WRITE = {"name": "modify_user_address", "arguments": {
    "user_id": "olivia_lopez_3865", "address1": "1 Test Street", "address2": "", "city": "Austin",
    "state": "TX", "country": "USA", "zip": "78701"}}
OTHER_HASH = "0123456789abcdef"


def straying_agent() -> OracleAgent:
    from tau2.data_model.tasks import Action

    reference = list(get_task("retail", TASK).evaluation_criteria.actions)
    extra = Action(action_id="extra-write", requestor="assistant", **EXTRA_WRITE)
    return OracleAgent(reference[:1] + [extra] + reference[1:])


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> Path:
    """The two trials and the goal, collected once (a fresh copy per test below)."""
    folder = tmp_path_factory.mktemp("extract-drops")
    tasks = [t for t in load_tasks("retail", "train") if t.id == TASK]
    cfg = DataConfig(num_trajectories=2, trial_seeds=[0, 1], concurrency=1)
    teacher = ScriptedLLM(rules=[(r"Conversation so far", world.teacher_reply)])
    factories = EpisodeFactories(straying_agent, world.AnsweringUser, teacher, cfg)
    collect_trajectories(tasks, factories, cfg, folder / "traj.jsonl", progress=False,
                         limits=EnvConfig())
    normalize_tasks(tasks, "retail", world.data_scripts.normalizer_llm(), folder / "goals.jsonl",
                    "scripted:normalizer", cfg)
    return folder


def recipe_in(folder: Path, episodes: Path, tiny_model_dir: Path, lines: list[str]) -> Path:
    (folder / "traj.jsonl").write_text("".join(lines))
    (folder / "goals.jsonl").write_text((episodes / "goals.jsonl").read_text())
    register_script("extract-drops-decomposer", world.decomposer_llm)
    recipe = {
        "name": "extract-drops", "run_dir": str(folder / "run"),
        "models": {"decomposer": {"backend": "scripted", "script": "extract-drops-decomposer"}},
        "data": {"trajectories": str(folder / "traj.jsonl"), "goals": str(folder / "goals.jsonl"),
                 "decisions": str(folder / "decisions.jsonl"),
                 "dataset_dir": str(folder / "dataset"), "tokenizer": str(tiny_model_dir),
                 "verify_target": "reference", "on_bad_line": "skip", "concurrency": 1,
                 "split_by": "trajectory", "val_ratio": 0.5},  # one trial on each side
        "router": {"tau_au": world.THRESHOLDS[0], "tau_eu": world.THRESHOLDS[1]},
        # one task, two trials split by trajectory: a deliberate breach of the protocol's
        # train/validation rule, so that both sides hold a trial
        "protocol": {"on_breach": "warn"},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def extract(recipe: Path):
    return CliRunner().invoke(app, ["extract", "--recipe", str(recipe), "--no-progress"],
                              catch_exceptions=False)


def off_reference_verify_states(record: dict) -> int:
    """Verify states (the world's route: tool results seen ≡ 0 mod 3) among the first 16
    decisions that come after the extra write: a WRITE no reference action matches takes the
    trajectory off the reference path (data.verify_target: reference; gold drops them too)."""
    by_index = {s["message_index"]: s for s in record["steps"]}
    decisions = [i for i in sorted(by_index) if by_index[i]["kind"] in (
        "agent_message", "agent_tool_call") and not by_index[i].get("initial") and not (
        by_index[i].get("meta") or {}).get("greeting") and "teacher_query" not in (
        by_index[i].get("meta") or {})][:16]
    write_at = next(i for i, m in enumerate(record["messages"]) if any(
        c["function"]["name"] == EXTRA_WRITE["name"] for c in m.get("tool_calls") or []))
    seen = lambda j: sum(1 for i in range(j) if by_index.get(i, {}).get("kind") == "tool_result"
                         and by_index[i].get("requestor") != "user")
    return sum(1 for j in decisions if j > write_at and seen(j) % 3 == 0)


def test_extract_prints_and_cards_every_drop(episodes, tmp_path, tiny_model_dir) -> None:
    lines = (episodes / "traj.jsonl").read_text().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    assert sorted(r["seed"] for r in records) == [0, 1]  # two trials of one task
    errored = {**records[1], "seed": 7, "termination": "error", "errors": ["boom"]}
    stale = {**records[0], "reward": 0.5}  # same key as record 0: a duplicate, dropped
    lines = [json.dumps(stale) + "\n", *lines, json.dumps(errored) + "\n", "{not json\n"]
    result = extract(recipe_in(tmp_path, episodes, tiny_model_dir, lines))
    assert result.exit_code == 0, result.output

    off = sum(map(off_reference_verify_states, records))
    assert off >= 2  # the write is early: several verify states of each trial are off the path
    card = json.loads((tmp_path / "dataset" / "card.json").read_text())["extraction"]
    key = "retail/30/s0/teacher-collect"
    assert card["duplicates"] == {key: 1} and card["invalid_lines"] == [len(lines)]
    assert card["trajectories"]["errored"] == 1
    # both trials kept (the seed is in the key), one on each side
    assert (card["trajectories"]["train"], card["trajectories"]["validation"]) == (1, 1)
    assert card["dropped"]["verify_off_reference"] == off
    assert card["prompts_hashes"] == {prompts_hash(): 3}  # errored record included
    printed = (f"Dropped trajectories: 1 duplicate record (key {key}: 2 records, the last kept), "
               f"1 invalid line (line {len(lines)}), 1 errored episode.")
    states = ", ".join(f"{n} {why}" for why, n in sorted(card["dropped"].items()))
    assert f"{off} verify_off_reference" in states
    for line in (printed, f"Dropped states: {states}."):
        assert line in result.output
    markdown = (tmp_path / "dataset" / "card.md").read_text()
    assert printed in markdown and f"Dropped states: {states}." in markdown
    assert "warning: the trajectories were collected" not in result.output  # one prompt set
    rows = [json.loads(r["extra_info"]["history"]) for r in _rows(tmp_path / "dataset")]
    assert rows and all(any(m["role"] == "user" for m in h) for h in rows)


def _rows(dataset: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for split in ("train", "validation")
            for r in pq.read_table(dataset / f"{split}.parquet").to_pylist()]


def test_extract_warns_when_trajectories_hold_two_prompt_hashes(episodes, tmp_path,
                                                                tiny_model_dir) -> None:
    lines = (episodes / "traj.jsonl").read_text().splitlines(keepends=True)
    other = {**json.loads(lines[1]), "prompts_hash": OTHER_HASH}
    legacy = json.loads(lines[0])
    legacy.pop("prompts_hash")  # a file written before trajectories recorded it
    result = extract(recipe_in(tmp_path, episodes, tiny_model_dir,
                               [json.dumps(legacy) + "\n", json.dumps(other) + "\n"]))
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines()
               if line.startswith("warning:") and "prompt" in line]
    assert len(warning) == 1, result.output
    assert "2 different agent/user prompt sets" in warning[0]
    assert f"1 with prompts_hash {OTHER_HASH}" in warning[0] and "1 with unknown" in warning[0]
    assert f"this code's is prompts_hash {prompts_hash()}" in warning[0]
    card = json.loads((tmp_path / "dataset" / "card.json").read_text())["extraction"]
    assert card["prompts_hashes"] == {OTHER_HASH: 1, "unknown": 1}
