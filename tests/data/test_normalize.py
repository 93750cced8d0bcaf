"""Goal normalization: the value check (hand-listed values), the cache, the prompt's content."""

from __future__ import annotations

import json

import pytest

from prour.config.data import DataConfig
from prour.data.normalize import (
    GOAL_PROMPT_VERSION,
    concrete_values,
    goal_prompt,
    instruction_sha,
    load_goals,
    missing_values,
    normalize_tasks,
    task_instruction,
)
from prour.env.domains import load_tasks
from prour.llm.scripted import ScriptedLLM

INSTRUCTION = (
    'You are Ben Ortiz, cheerful. For #W77 ship to {"address1": "9 Elm Road", "zip": "30301"} '
    "(same as #W1234567). Email ben.o@x.com, pay $1,204.50 for 2 items 1234567890, user "
    "ben_ortiz_4121, reservation EUJUY6 on 2024-05-01, phone 555-123-2002, Suite 641."
)


def test_concrete_values_lists_every_value_once_in_order() -> None:
    found = [(v.kind, v.text) for v in concrete_values(INSTRUCTION)]
    assert found == [
        ("order_id", "#W77"),
        ("address", "9 Elm Road"),
        ("zip", "30301"),
        ("order_id", "#W1234567"),
        ("email", "ben.o@x.com"),
        ("number", "$1,204.50"),
        ("number", "2"),
        ("item_id", "1234567890"),
        ("user_id", "ben_ortiz_4121"),
        ("code", "EUJUY6"),
        ("date", "2024-05-01"),
        ("phone", "555-123-2002"),
        ("address", "Suite 641"),
    ]


def test_missing_values_flags_exactly_the_lost_ones() -> None:
    goal = (
        "My name is Ben Ortiz. For order W77 ship to address1 9 Elm Road and zip 30301, the same "
        "as #W1234567. My email is BEN.O@x.com; I pay 1204.5 dollars for two items 1234567890 as "
        "user ben_ortiz_4121 on 2024-05-01."
    )
    # "#W77" survives as "W77" (ids ignore '#'), $1,204.50 as 1204.5 (numbers compare by value);
    # "2" became "two", and the reservation, phone and suite are gone.
    assert [v.text for v in missing_values(INSTRUCTION, goal)] == [
        "2", "EUJUY6", "555-123-2002", "Suite 641"]


def test_missing_values_on_real_retail_instruction() -> None:
    task = load_tasks("retail", "train")[0]
    text = str(task.user_scenario.instructions)
    assert [(v.kind, v.text) for v in concrete_values(text)] == [
        ("order_id", "#W2378156"), ("zip", "19122")]
    good = "I am Yusuf Rossi, zip code 19122, and I want to exchange items of order #W2378156."
    assert missing_values(text, good) == []
    assert [v.text for v in missing_values(text, "I am Yusuf Rossi.")] == ["#W2378156", "19122"]


def test_goal_prompt_carries_the_instruction_once() -> None:
    [message] = goal_prompt("  You are Ann. Refund #W1.  ")
    assert message["role"] == "user"
    assert message["content"].count("You are Ann. Refund #W1.") == 1
    assert message["content"].rstrip().endswith("Rewritten:")


def _echo_normalizer() -> ScriptedLLM:
    """Rewrites 'You are X' as 'My name is X' and keeps the rest: a faithful normalizer."""

    def reply(messages: list[dict]) -> str:
        text = messages[-1]["content"].rsplit("Instructions:", 1)[1].rsplit("Rewritten:", 1)[0]
        return "Rewritten: " + text.replace("You are", "My name is").strip()

    return ScriptedLLM(rules=[(r"Rewritten:", reply)])


def test_normalize_tasks_caches_by_instruction_hash(tmp_path) -> None:
    tasks = load_tasks("retail", "train")[:3]
    path = tmp_path / "goals.jsonl"
    llm = _echo_normalizer()
    goals = normalize_tasks(tasks, "retail", llm, path, "scripted:echo", DataConfig(),
                            batch_size=2)
    assert [g.task_id for g in goals] == [t.id for t in tasks]
    assert llm.calls["chat_requests"] == 3 and llm.calls["chat"] == 2  # batches of 2 and 1
    for goal, task in zip(goals, tasks):
        assert goal.sha256 == instruction_sha(task_instruction(task))
        assert not goal.goal.startswith("Rewritten")
        assert goal.missing == [] and goal.prompt_version == GOAL_PROMPT_VERSION

    again = normalize_tasks(tasks, "retail", llm, path, "scripted:echo", DataConfig())
    assert llm.calls["chat_requests"] == 3  # all three came from the cache
    assert [g.goal for g in again] == [g.goal for g in goals]
    assert len(path.read_text().splitlines()) == 3

    normalize_tasks(tasks[:1], "retail", llm, path, "scripted:other", DataConfig())
    assert llm.calls["chat_requests"] == 4  # another model: not reused


def test_normalize_flags_lost_values(tmp_path) -> None:
    task = load_tasks("retail", "train")[0]
    llm = ScriptedLLM(default="I want to exchange two items.")
    [goal] = normalize_tasks([task], "retail", llm, tmp_path / "g.jsonl", "m", DataConfig())
    assert goal.flagged
    assert [m["text"] for m in goal.missing] == ["#W2378156", "19122"]
    stored = load_goals(tmp_path / "g.jsonl", "error")
    assert stored[("retail", task.id)].missing == goal.missing


def test_corrupt_goal_line_is_reported_with_file_and_line(tmp_path) -> None:
    task = load_tasks("retail", "train")[0]
    path = tmp_path / "g.jsonl"
    normalize_tasks([task], "retail", ScriptedLLM(default="I am Yusuf Rossi."), path, "m",
                    DataConfig())
    with open(path, "a") as handle:
        handle.write('{"domain": "retail", "task_id": "broken"\n')
    with pytest.raises(ValueError, match=rf"{path.name}:2"):
        load_goals(path, on_bad_line="error")
    assert list(load_goals(path, on_bad_line="skip")) == [("retail", task.id)]
    json.loads(path.read_text().splitlines()[0])  # the good line is untouched
