"""Which loaded trajectories extraction uses: not the errored ones, not those of the calibration
reserve's tasks (training never uses them, prour.data.reserve); each kind counted."""

from __future__ import annotations

from prour.config.data import DataConfig
from prour.data.card import drop_lines
from prour.data.extract_summary import ExtractSummary, usable
from prour.data.reserve import reserve_task_ids, training_task_ids
from prour.env.trajectory import JsonlRecords, Trajectory


def test_reserve_tasks_and_errored_episodes_are_left_out_and_counted() -> None:
    cfg = DataConfig(calibration_reserve=3, reserve_seed=1)
    reserve, training = reserve_task_ids(cfg), training_task_ids(cfg)
    assert len(reserve) == 3 and not set(reserve) & set(training)
    make = lambda task, seed=0, **kw: Trajectory(domain="retail", task_id=task, seed=seed,
                                                 agent="a", user="u", **kw)
    loaded = JsonlRecords([make(reserve[0]), make(training[0]), make(training[0], seed=1),
                           make(training[1], termination="error"), make(reserve[1], seed=2)],
                          skipped=[4])
    loaded.duplicate_keys = {f"retail/{training[0]}/s0/a": 1}
    summary = ExtractSummary()
    kept = usable(loaded, summary, cfg)
    assert [(t.task_id, t.seed) for t in kept] == [(training[0], 0), (training[0], 1)]
    assert summary.trajectories == {"errored": 1, "reserve_task": 2}
    assert summary.invalid_lines == [4] and summary.duplicates == loaded.duplicate_keys
    assert drop_lines(summary.to_dict({}))[0] == (
        f"Dropped trajectories: 1 duplicate record (key retail/{training[0]}/s0/a: 2 records, "
        "the last kept), 1 invalid line (line 4), 1 errored episode, 2 of calibration-reserve "
        "tasks.")
    # without a reserve nothing is left out for it
    assert len(usable(loaded, ExtractSummary(), DataConfig())) == 4
