"""Convert τ-bench (v1) tasks into tau2 tasks: the shipped data files of the ``v1-train`` and
``v1-test`` splits.

Usage::

    python -m prour.env.data.convert_tau_bench_v1 PATH/retail_tasks_train.py [OUT.json]
    python -m prour.env.data.convert_tau_bench_v1 --split v1-test PATH/retail_tasks_test.py
    python -m prour.env.data.convert_tau_bench_v1 --split v1-test --domain airline \
        PATH/airline_tasks_test.py

The sources are sierra-research/tau-bench's ``tau_bench/envs/retail/tasks_train.py`` (the 500
retail training tasks), ``tau_bench/envs/retail/tasks_test.py`` (the 115 retail test tasks) and
``tau_bench/envs/airline/tasks_test.py`` (the 50 airline test tasks), MIT, see
``LICENSE-tau-bench`` beside this file. A source is read as data: its task list
(``TASKS_TRAIN``, ``TASKS_TEST`` or ``TASKS``) is parsed with :mod:`ast` and its literals
evaluated, nothing is executed.

Each v1 task becomes one tau2 :class:`~tau2.data_model.tasks.Task`, validated by tau2's model:

- id ``<split>-<i>`` (``i``: the task's position in the source list);
- the v1 instruction, verbatim, as the user scenario's instructions;
- the reference actions, in order, as evaluation actions (all the agent's);
- the v1 outputs as the information the agent must communicate;
- tau2's default reward basis (database state and communicated information), which is what v1
  scored (database hash and outputs).

Every task's reference actions are then replayed on a fresh tau2 environment of its domain; a
task whose actions tau2's tools refuse is left out of ``tasks`` and listed under ``excluded``
with the first refused action and tau2's message. The output is deterministic: rerunning the
converter on the same source reproduces the file byte for byte. The τ³-bench converter
(:mod:`prour.env.data.convert_tau3_bench`) replays with :func:`refusals` too.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.files import write_atomic

HERE = Path(__file__).parent
COMMIT = "59a200c6d575"  # sierra-research/tau-bench, the commit every v1 source comes from


@dataclass(frozen=True)
class V1Source:
    """One v1 task list and the packaged split it becomes."""

    split: str  # the packaged split (and the id prefix of its tasks)
    domain: str
    kind: str  # "training" or "test", as the task descriptions say
    path: str  # the file in sierra-research/tau-bench
    output: str  # the data file beside this script

    @property
    def source(self) -> str:
        return (f"sierra-research/tau-bench, commit {COMMIT}, {self.path} "
                "(MIT license, see LICENSE-tau-bench)")


SOURCES = {
    ("v1-train", "retail"): V1Source("v1-train", "retail", "training",
                                     "tau_bench/envs/retail/tasks_train.py",
                                     "tau_bench_v1_retail_train.json"),
    ("v1-test", "retail"): V1Source("v1-test", "retail", "test",
                                    "tau_bench/envs/retail/tasks_test.py",
                                    "tau_bench_v1_retail_test.json"),
    ("v1-test", "airline"): V1Source("v1-test", "airline", "test",
                                     "tau_bench/envs/airline/tasks_test.py",
                                     "tau_bench_v1_airline_test.json"),
}
V1_TRAIN = SOURCES["v1-train", "retail"]
# The names the v1-train file was first made with (kept: tests and docs use them).
SOURCE = V1_TRAIN.source
SPLIT = V1_TRAIN.split
OUTPUT = HERE / V1_TRAIN.output
TASK_LISTS = ("TASKS_TRAIN", "TASKS_TEST", "TASKS")  # the list names v1's task files use


def read_v1_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The task list of a v1 tasks file (``TASKS_TRAIN``, ``TASKS_TEST`` or ``TASKS``) as plain
    dicts (``Action`` → name, kwargs)."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id in TASK_LISTS]
            if names:
                return [_call(item, "Task") for item in _elements(node.value, names[0])]
    raise ValueError(f"{path}: no task list ({', '.join(TASK_LISTS)})")


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


def to_tau2_task(index: int, v1: dict[str, Any], source: V1Source = V1_TRAIN) -> dict[str, Any]:
    """One v1 task as a tau2 task (validated by tau2's model; returned as its JSON form)."""
    from tau2.data_model.tasks import Task

    task_id = f"{source.split}-{index}"
    task = {
        "id": task_id,
        "description": {
            "purpose": f"τ-bench v1 {source.domain} {source.kind} task {index} "
                       f"(user {v1['user_id']})",
            "notes": f"Converted from {source.source} by prour/env/data/convert_tau_bench_v1.py.",
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


def refusals(task: dict[str, Any], domain: str = "retail") -> list[dict[str, str]]:
    """Every reference action tau2's tools refuse when the actions are replayed in order on a
    fresh environment of ``domain``, going on past a refusal as tau2's evaluator does when it
    builds the reference database: action id, tool and tau2's message."""
    from prour.env.domains import tau2_environment

    environment = tau2_environment(domain)
    found = []
    for action in task["evaluation_criteria"]["actions"]:
        try:
            environment.make_tool_call(action["name"], **action["arguments"])
        except ValueError as exc:  # tau2's tools refuse with a ValueError naming the reason
            found.append({"action": action["action_id"], "name": action["name"],
                          "reason": str(exc)})
    return found


def refusal(task: dict[str, Any], domain: str = "retail") -> dict[str, str] | None:
    """The first reference action tau2's tools refuse on a fresh environment, if any."""
    return next(iter(refusals(task, domain)), None)


def convert(path: str | Path, source: V1Source = V1_TRAIN) -> dict[str, Any]:
    """The data file's content: the replayable tasks and the excluded ones with their reasons."""
    from loguru import logger

    logger.disable("tau2")
    tasks, excluded = [], []
    for index, v1 in enumerate(read_v1_tasks(path)):
        task = to_tau2_task(index, v1, source)
        refused = refusal(task, source.domain)
        if refused is None:
            tasks.append(task)
        else:
            excluded.append({"id": task["id"], **refused, "task": task})
    return {"source": source.source, "split": source.split,
            "converted": len(tasks) + len(excluded), "tasks": tasks, "excluded": excluded}


def dumps(data: dict[str, Any]) -> str:
    """The file's text (stable key order and layout, so reruns compare byte for byte)."""
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a v1 tasks file (tasks_train.py, tasks_test.py)")
    parser.add_argument("out", nargs="?", help="default: the split's data file beside this script")
    parser.add_argument("--split", default="v1-train", choices=sorted({s for s, _ in SOURCES}))
    parser.add_argument("--domain", default="retail", choices=sorted({d for _, d in SOURCES}))
    args = parser.parse_args(argv)
    if (args.split, args.domain) not in SOURCES:
        parser.error(f"no v1 {args.domain} source for {args.split} (have: "
                     f"{', '.join(f'{s} {d}' for s, d in SOURCES)})")
    source = SOURCES[args.split, args.domain]
    out = args.out or str(HERE / source.output)
    data = convert(args.source, source)
    write_atomic(out, dumps(data))
    print(f"{out}: {len(data['tasks'])} tasks, {len(data['excluded'])} excluded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
