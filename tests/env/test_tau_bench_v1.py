"""τ-bench v1's retail training tasks as the packaged ``v1-train`` split: the count, the mapping
from the v1 source, the converter's reproducibility, the excluded tasks and their reasons, no
overlap with tau2's retail ``base`` split, and the oracle's replay scoring 1.0 through the eval
harness (20 tasks here, every task in a slow test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tau2.data_model.tasks import Task

from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.env.data import convert_tau_bench_v1 as converter
from prour.env.domains import (
    excluded_tasks,
    get_task,
    load_tasks,
    packaged_split,
    split_sizes,
    task_split,
)
from prour.eval.harness import Evaluation

# The shared checkout (../shared beside the repository, in CI too) holds the v1 source file.
SOURCE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "tau-bench-v1" \
    / "retail_tasks_train.py"
SHARED_SOURCE = Path("/work/shared/data/tau-bench-v1/retail_tasks_train.py")
V1_SOURCE = next((p for p in (SOURCE, SHARED_SOURCE) if p.is_file()), None)
needs_source = pytest.mark.skipif(V1_SOURCE is None, reason="τ-bench v1 source file not present")

# tau2's refusals measured on the v1 training tasks (shared/data/tau-bench-v1/README.md).
TAU2_REFUSALS = {"The new item id should be different from the old item id",
                 "Insufficient gift card balance to pay for the order",
                 "Insufficient gift card balance to pay for the new item",
                 "Insufficient gift card balance to pay for the price difference"}


def test_the_split_holds_457_of_500_tasks_and_lists_the_other_43() -> None:
    data = packaged_split("retail", "v1-train")
    tasks = load_tasks("retail", "v1-train")
    assert len(tasks) == split_sizes("retail")["v1-train"] == 457
    assert data["converted"] == 500 and len(excluded_tasks("retail", "v1-train")) == 43
    ids = [t.id for t in tasks] + [e["id"] for e in data["excluded"]]
    assert sorted(ids, key=lambda i: int(i.rsplit("-", 1)[1])) == [f"v1-train-{i}"
                                                                   for i in range(500)]
    assert {e["reason"] for e in data["excluded"]} <= TAU2_REFUSALS
    for entry in data["excluded"]:
        Task.model_validate(entry["task"])
        with pytest.raises(ValueError, match="unknown task id"):
            get_task("retail", entry["id"])
    assert task_split("retail", "v1-train-0") == "v1-train"
    with pytest.raises(ValueError, match="split"):
        load_tasks("airline", "v1-train")


def test_the_first_task_maps_the_v1_fields() -> None:
    """v1's first training task, read off the source by hand."""
    task = get_task("retail", "v1-train-0")
    assert task.user_scenario.instructions == (
        "Your name is Omar Anderson and your zip code is 19031. You are logical, independent, "
        "relaxing, polite. Return #W6067464 via credit_card_4190576: Electric Kettle; Wall Clock; ")
    [action] = task.evaluation_criteria.actions
    assert (action.name, action.requestor) == ("return_delivered_order_items", "assistant")
    assert action.arguments == {"order_id": "#W6067464", "item_ids": ["9624127908", "8917609800"],
                                "payment_method_id": "credit_card_4190576"}
    assert task.evaluation_criteria.communicate_info == []
    assert "omar_anderson_3203" in task.description.purpose


@needs_source
def test_the_converter_reproduces_every_task_and_each_refusal() -> None:
    """All 500 conversions equal the shipped tasks; the 43 excluded are refused, as listed
    (the byte-for-byte rerun, with 500 replays, is the slow test below)."""
    data = packaged_split("retail", "v1-train")
    shipped = {t["id"]: t for t in data["tasks"]}
    shipped.update({e["id"]: e["task"] for e in data["excluded"]})
    converted = [converter.to_tau2_task(i, v1)
                 for i, v1 in enumerate(converter.read_v1_tasks(V1_SOURCE))]
    assert converted == [shipped[f"v1-train-{i}"] for i in range(500)]
    for entry in data["excluded"]:
        assert converter.refusal(entry["task"]) == {k: entry[k] for k in ("action", "name",
                                                                         "reason")}


@pytest.mark.slow
@pytest.mark.full  # 500 replays on fresh tau2 retail environments (~1 min of CPU)
@needs_source
def test_rerunning_the_converter_reproduces_the_shipped_file(tmp_path: Path) -> None:
    out = tmp_path / "v1.json"
    assert converter.main([str(V1_SOURCE), str(out)]) == 0
    assert out.read_text() == converter.OUTPUT.read_text()


def _actions(task: Task) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, json.dumps(a.arguments, sort_keys=True))
                 for a in task.evaluation_criteria.actions or [])


def test_no_task_overlaps_tau2_retail_base() -> None:
    """No v1 training task has the reference actions of a base task. Their writes alone match
    once: v1-train-418 and base 69 both cancel #W2417020, from different instructions."""
    from prour.env.environment import tool_types

    writes = {name for name, kind in tool_types("retail").items() if kind == "write"}
    base = load_tasks("retail", "base")
    ours = load_tasks("retail", "v1-train")
    assert not {_actions(t) for t in ours} & {_actions(t) for t in base}

    def only_writes(task: Task) -> tuple[tuple[str, str], ...]:
        return tuple(a for a in _actions(task) if a[0] in writes)

    same_writes = [(a.id, b.id) for a in ours for b in base if only_writes(a) == only_writes(b)]
    assert same_writes == [("v1-train-418", "69")]
    assert str(get_task("retail", "69").user_scenario) != str(
        get_task("retail", "v1-train-418").user_scenario)


# ---- the oracle replays them through the eval harness ----------------------------------------


def _oracle_through_harness(tmp_path: Path, tasks: list[str] | None) -> list[dict[str, Any]]:
    cfg = EvalConfig(methods=["oracle"], seeds=[0], domains=["retail"], split="v1-train",
                     tasks=tasks, concurrency=2)
    evaluation = Evaluation(Recipe(name="v1-oracle", env={"max_steps": 200}, eval=cfg), tmp_path,
                            progress=False)
    return evaluation.run()


def _unsolved(results: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["task_id"], r["reward"], r["termination"], r["errors"]) for r in results
            if r["reward"] != 1.0 or r["termination"] != "user_stop" or r["errors"]]


def test_the_oracle_scores_one_on_20_tasks_spread_over_the_split(tmp_path: Path) -> None:
    ids = [t.id for t in load_tasks("retail", "v1-train")][::23][:20]
    results = _oracle_through_harness(tmp_path, [f"retail:{i}" for i in ids])
    assert sorted(r["task_id"] for r in results) == sorted(ids)
    assert _unsolved(results) == []


@pytest.mark.slow
@pytest.mark.full  # 457 episodes, ~1-2 s of CPU each
def test_the_oracle_scores_one_on_every_task(tmp_path: Path) -> None:
    results = _oracle_through_harness(tmp_path, None)
    assert len(results) == 457
    assert _unsolved(results) == []
