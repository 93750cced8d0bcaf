"""Which tasks of ``data.split`` training may use, and which it never does (the calibration
reserve).

The calibration dev states come from trajectories of tasks that training never sees (paper
A.2.2 fits the thresholds on a development set disjoint from training). The reserve is a seeded
sample of ``data.calibration_reserve`` task ids of ``data.split`` (seed ``data.reserve_seed``):
the same recipe gives the same reserve on every machine. The training tasks are the split's
other tasks, in tau2's order, then the first ``data.max_tasks`` of them.
"""

from __future__ import annotations

import random
from typing import Any

from prour.config.data import DataConfig


def reserve_problem(cfg: DataConfig) -> str | None:
    """Why ``data.calibration_reserve`` cannot be drawn from the split (None: it can). The
    stages raise it (:func:`reserve_task_ids`); ``prour validate`` names it before they start
    (:mod:`prour.recipe_checks`)."""
    from prour.env.domains import split_task_ids

    ids = split_task_ids(cfg.domain, cfg.split)
    if cfg.calibration_reserve > len(ids) - 1:
        return (f"data.calibration_reserve: {cfg.calibration_reserve} tasks asked of the "
                f"{cfg.domain} {cfg.split} split, which holds {len(ids)}; at least one task "
                "must be left for training")
    return None


def reserve_task_ids(cfg: DataConfig) -> list[str]:
    """The reserve's task ids, in the split's order (empty when ``calibration_reserve`` is 0)."""
    from prour.env.domains import split_task_ids

    problem = reserve_problem(cfg)
    if problem:
        raise ValueError(problem)
    ids = split_task_ids(cfg.domain, cfg.split)
    chosen = set(random.Random(cfg.reserve_seed).sample(sorted(ids), cfg.calibration_reserve))
    return [task_id for task_id in ids if task_id in chosen]


def training_task_ids(cfg: DataConfig) -> list[str]:
    """The task ids training uses: the split's tasks outside the reserve, first ``max_tasks``."""
    from prour.env.domains import split_task_ids

    reserve = set(reserve_task_ids(cfg))
    ids = [task_id for task_id in split_task_ids(cfg.domain, cfg.split) if task_id not in reserve]
    return ids[: cfg.max_tasks] if cfg.max_tasks else ids


def data_task_ids(cfg: DataConfig) -> list[str]:
    """The ids of :func:`data_tasks` (no task loaded)."""
    return training_task_ids(cfg) if cfg.tasks == "training" else reserve_task_ids(cfg)


def tasks_problem(cfg: DataConfig) -> str | None:
    """Why the data split leaves ``prour collect`` and ``prour normalize`` no task (None: it
    leaves some); a reserve that cannot be drawn is :func:`reserve_problem`'s to name."""
    if reserve_problem(cfg) or data_task_ids(cfg):
        return None
    if cfg.tasks == "reserve":
        return (f"data.tasks: {cfg.tasks}: no task of the {cfg.domain} {cfg.split} split "
                "(data.calibration_reserve is 0)")
    return f"data.split: the {cfg.domain} {cfg.split} split has no training task"


def data_tasks(cfg: DataConfig) -> list[Any]:
    """The tau2 tasks ``prour collect`` and ``prour normalize`` run on: the training tasks, or
    the reserve when ``data.tasks`` is ``reserve`` (then ``max_tasks`` does not apply)."""
    from prour.env.domains import select_tasks

    problem = tasks_problem(cfg)
    if problem:
        raise ValueError(problem)
    ids = data_task_ids(cfg)
    return select_tasks(cfg.domain, cfg.split, set(ids), key=f"data.tasks ({cfg.tasks})")
