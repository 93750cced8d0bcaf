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


# ---- v1's test tasks: the packaged ``v1-test`` split (retail and airline) --------------------

# tau2's refusals of v1's retail test tasks, by excluded task (its position in TASKS_TEST).
V1_TEST_REFUSALS = {
    "User not found": {35, 36, 37, 38, 39, 54, 55, 67, 68},
    "Product not found": {2, 3, 4, 21},
    "Order not found": {46, 47},
    "Payment method should be the original payment method": {12, 13},
    "Non-delivered order cannot be exchanged": {64},
    "Insufficient gift card balance to pay for the price difference": {106},
}


def test_v1_test_holds_96_of_115_retail_and_50_of_50_airline_tasks() -> None:
    for domain, converted, kept in (("retail", 115, 96), ("airline", 50, 50)):
        data = packaged_split(domain, "v1-test")
        assert (data["converted"], len(data["tasks"]), len(data["excluded"])) == (
            converted, kept, converted - kept)
        assert len(load_tasks(domain, "v1-test")) == split_sizes(domain)["v1-test"] == kept
        ids = [t["id"] for t in data["tasks"]] + [e["id"] for e in data["excluded"]]
        assert sorted(ids, key=lambda i: int(i.rsplit("-", 1)[1])) == [
            f"v1-test-{i}" for i in range(converted)]
        assert f"tau_bench/envs/{domain}/tasks_test.py" in data["source"]
    excluded = excluded_tasks("retail", "v1-test")
    assert {e["reason"] for e in excluded} == set(V1_TEST_REFUSALS)
    for reason, positions in V1_TEST_REFUSALS.items():
        assert {e["id"] for e in excluded if e["reason"] == reason} == {
            f"v1-test-{i}" for i in positions}
    for entry in excluded:
        Task.model_validate(entry["task"])
        with pytest.raises(ValueError, match="unknown task id"):
            get_task("retail", entry["id"])
    assert task_split("airline", "v1-test-0") == "v1-test"
    with pytest.raises(ValueError, match="split"):
        load_tasks("telecom", "v1-test")


def test_the_first_v1_test_tasks_map_the_v1_fields() -> None:
    """v1's first retail and airline test tasks, read off the sources by hand."""
    retail = get_task("retail", "v1-test-0")
    assert retail.user_scenario.instructions.startswith(
        "You are Yusuf Rossi in 19122. You received your order #W2378156 and wish to exchange")
    assert [a.name for a in retail.evaluation_criteria.actions] == [
        "find_user_id_by_name_zip", "get_order_details", "get_product_details",
        "get_product_details", "exchange_delivered_order_items"]
    assert retail.evaluation_criteria.actions[-1].arguments == {
        "order_id": "#W2378156", "item_ids": ["1151293680", "4983901480"],
        "new_item_ids": ["7706410293", "7747408585"], "payment_method_id": "credit_card_9513926"}
    assert "τ-bench v1 retail test task 0 (user yusuf_rossi_9620)" == retail.description.purpose
    airline = get_task("airline", "v1-test-0")
    assert airline.user_scenario.instructions.startswith(
        "Your user id is mia_li_3668. You want to fly from New York to Seattle on May 20")
    [book] = airline.evaluation_criteria.actions
    assert (book.name, book.requestor) == ("book_reservation", "assistant")
    assert book.arguments["payment_methods"] == [
        {"payment_id": "certificate_7504069", "amount": 250},
        {"payment_id": "credit_card_4421486", "amount": 5}]
    assert airline.evaluation_criteria.communicate_info == []
    assert get_task("airline", "v1-test-2").evaluation_criteria.communicate_info == ["23553"]


def test_v1_test_against_tau2_base_and_v1_train() -> None:
    """104 of v1's 115 retail test tasks (excluded ones included) have the reference actions of
    a task of tau2's retail ``base``, its corrected copy of them; 39 of 50 airline. None has a
    v1 training task's (the protocol guard compares the two splits by id and by content)."""
    for domain, same in (("retail", 104), ("airline", 39)):
        data = packaged_split(domain, "v1-test")
        ours = [Task.model_validate(t) for t in [*data["tasks"],
                                                 *(e["task"] for e in data["excluded"])]]
        base = {_actions(t) for t in load_tasks(domain, "base")}
        assert sum(_actions(t) in base for t in ours) == same
    train = {_actions(t) for t in load_tasks("retail", "v1-train")}
    assert not {_actions(t) for t in load_tasks("retail", "v1-test")} & train


def test_a_sample_of_v1_test_replays_as_the_file_says() -> None:
    """Every excluded task is refused as listed (19 replays) and a few kept ones replay."""
    for entry in excluded_tasks("retail", "v1-test"):
        assert converter.refusal(entry["task"]) == {k: entry[k] for k in ("action", "name",
                                                                         "reason")}
    for domain in ("retail", "airline"):
        for task in packaged_split(domain, "v1-test")["tasks"][::25]:
            assert converter.refusal(task, domain) is None


@pytest.mark.slow
@pytest.mark.full  # 146 replays on fresh tau2 environments (about a minute)
def test_every_kept_v1_test_task_replays() -> None:
    for domain in ("retail", "airline"):
        assert [t["id"] for t in packaged_split(domain, "v1-test")["tasks"]
                if converter.refusals(t, domain)] == []


@pytest.mark.slow
@pytest.mark.full  # the converter on 165 tasks rebuilt as v1 source files
def test_the_converter_reproduces_the_v1_test_files(tmp_path: Path) -> None:
    """v1 source files written back from the shipped tasks (instruction, actions, outputs, user
    id), converted again: the same files byte for byte."""
    for domain in ("retail", "airline"):
        data = packaged_split(domain, "v1-test")
        tasks = sorted([*data["tasks"], *(e["task"] for e in data["excluded"])],
                       key=lambda t: int(t["id"].rsplit("-", 1)[1]))
        source = tmp_path / f"{domain}_tasks_test.py"
        source.write_text("TASKS_TEST = [\n" + "".join(_v1_literal(t) for t in tasks) + "]\n")
        out = tmp_path / f"{domain}.json"
        args = ["--split", "v1-test", "--domain", domain, str(source), str(out)]
        assert converter.main(args) == 0
        assert out.read_text() == (converter.HERE / converter.SOURCES["v1-test", domain]
                                   .output).read_text()


def _v1_literal(task: dict[str, Any]) -> str:
    """A converted task as the ``Task(...)`` call of a v1 tasks file."""
    user = task["description"]["purpose"].rsplit("(user ", 1)[1].rstrip(")")
    criteria = task["evaluation_criteria"]
    actions = ", ".join(f"Action(name={a['name']!r}, kwargs={a['arguments']!r})"
                        for a in criteria["actions"])
    return (f"    Task(user_id={user!r}, instruction={task['user_scenario']['instructions']!r}, "
            f"actions=[{actions}], outputs={criteria['communicate_info']!r}),\n")
