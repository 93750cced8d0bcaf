"""Convert τ-bench (v1) retail training tasks into tau2 retail tasks (the shipped data file).

Usage::

    python -m prour.env.data.convert_tau_bench_v1 PATH/retail_tasks_train.py [OUT.json]

``PATH/retail_tasks_train.py`` is sierra-research/tau-bench's ``tau_bench/envs/retail/
tasks_train.py`` (MIT, see ``LICENSE-tau-bench`` beside this file). It is read as data: the
``TASKS_TRAIN`` list is parsed with :mod:`ast` and its literals evaluated, nothing is executed.

Each v1 task becomes one tau2 :class:`~tau2.data_model.tasks.Task`, validated by tau2's model:

- id ``v1-train-<i>`` (``i``: the task's position in ``TASKS_TRAIN``);
- the v1 instruction, verbatim, as the user scenario's instructions;
- the reference actions, in order, as evaluation actions (all the agent's);
- the v1 outputs as the information the agent must communicate;
- tau2's default reward basis (database state and communicated information), which is what v1
  scored (database hash and outputs).

Every task's reference actions are then replayed on a fresh tau2 retail environment; a task
whose actions tau2's tools refuse (tau2 checks more than v1 did) is left out of ``tasks`` and
listed under ``excluded`` with the refused action and tau2's message. The output is
deterministic: rerunning the converter on the same source reproduces the file byte for byte.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

from prour.files import write_atomic

SOURCE = ("sierra-research/tau-bench, commit 59a200c6d575, tau_bench/envs/retail/tasks_train.py "
          "(MIT license, see LICENSE-tau-bench)")
SPLIT = "v1-train"
OUTPUT = Path(__file__).with_name("tau_bench_v1_retail_train.json")


def read_v1_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The ``TASKS_TRAIN`` list of a v1 tasks file as plain dicts (``Action`` → name, kwargs)."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "TASKS_TRAIN" for t in node.targets):
            return [_call(item, "Task") for item in _elements(node.value, "TASKS_TRAIN")]
    raise ValueError(f"{path}: no TASKS_TRAIN list")


def _elements(node: ast.expr, what: str) -> list[ast.expr]:
    if not isinstance(node, ast.List):
        raise TypeError(f"{what} is not a list literal (line {node.lineno})")
    return node.elts


def _call(node: ast.expr, name: str) -> dict[str, Any]:
    """The keyword arguments of a ``Task(...)`` or ``Action(...)`` call, as literals."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == name and not node.args):
        raise ValueError(f"expected {name}(keyword=...) at line {node.lineno}")
    out = {}
    for keyword in node.keywords:
        if keyword.arg == "actions":
            out["actions"] = [_call(a, "Action") for a in _elements(keyword.value, "actions")]
        else:
            out[keyword.arg] = ast.literal_eval(keyword.value)
    return out


def to_tau2_task(index: int, v1: dict[str, Any]) -> dict[str, Any]:
    """One v1 task as a tau2 task (validated by tau2's model; returned as its JSON form)."""
    from tau2.data_model.tasks import Task

    task_id = f"{SPLIT}-{index}"
    task = {
        "id": task_id,
        "description": {
            "purpose": f"τ-bench v1 retail training task {index} (user {v1['user_id']})",
            "notes": f"Converted from {SOURCE} by prour/env/data/convert_tau_bench_v1.py.",
        },
        "user_scenario": {"instructions": v1["instruction"]},
        "evaluation_criteria": {
            "actions": [{"action_id": f"{task_id}_{j}", "name": action["name"],
                         "arguments": action["kwargs"]}
                        for j, action in enumerate(v1["actions"])],
            "communicate_info": list(v1.get("outputs", [])),
        },
    }
    return Task.model_validate(task).model_dump(mode="json", exclude_none=True)


def refusal(task: dict[str, Any]) -> dict[str, str] | None:
    """The first reference action tau2's retail tools refuse on a fresh environment, if any."""
    from tau2.domains.retail.environment import get_environment

    environment = get_environment()
    for action in task["evaluation_criteria"]["actions"]:
        try:
            environment.make_tool_call(action["name"], **action["arguments"])
        except ValueError as exc:  # tau2's tools refuse with a ValueError naming the reason
            return {"action": action["action_id"], "name": action["name"], "reason": str(exc)}
    return None


def convert(path: str | Path) -> dict[str, Any]:
    """The data file's content: the replayable tasks and the excluded ones with their reasons."""
    from loguru import logger

    logger.disable("tau2")
    tasks, excluded = [], []
    for index, v1 in enumerate(read_v1_tasks(path)):
        task = to_tau2_task(index, v1)
        refused = refusal(task)
        if refused is None:
            tasks.append(task)
        else:
            excluded.append({"id": task["id"], **refused, "task": task})
    return {"source": SOURCE, "split": SPLIT, "converted": len(tasks) + len(excluded),
            "tasks": tasks, "excluded": excluded}


def dumps(data: dict[str, Any]) -> str:
    """The file's text (stable key order and layout, so reruns compare byte for byte)."""
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="τ-bench v1's retail tasks_train.py")
    parser.add_argument("out", nargs="?", default=str(OUTPUT), help=f"default: {OUTPUT.name}")
    args = parser.parse_args(argv)
    data = convert(args.source)
    write_atomic(args.out, dumps(data))
    print(f"{args.out}: {len(data['tasks'])} tasks, {len(data['excluded'])} excluded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
