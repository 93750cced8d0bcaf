"""train.overlap one_step on the verl backend, in verl's own trainer code on CPU (the rehearsal
harness): the next step's sessions roll out while a step updates, every update is handed samples
at most train.max_staleness updates old, no weight sync lands under a running session; with
overlap off the step stays synchronous (samples of the weights being updated)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import open_dict
from test_verl_harness import (  # noqa: F401 (the module fixtures)
    process_group,
    ray_tq,
    scripted_responders,
)

pytestmark = pytest.mark.verl_harness

STATES, N, KEEP, STEPS = 4, 4, 2, 3
SETS = [f"train.states_per_step={STATES}", f"train.rollout.n={N}", f"train.rollout.keep={KEEP}"]
ASK = "YES [QUESTION]Which colour do you want?[/QUESTION]"


def _run(model_dir: Path, run_dir: Path, sets: list[str]):
    """``STEPS`` verl steps with the update on the stand-in ranks; the harness after them."""
    from train_helpers import instance_rows

    from prour.data.dataset import write_rows
    from prour.train.verl_ext.rehearsal import Harness, compose

    write_rows(instance_rows(4 * STATES), run_dir / "data/dataset/train.parquet")
    write_rows(instance_rows(2), run_dir / "data/dataset/validation.parquet")
    config, _ = compose(model_dir, run_dir, SETS + sets)
    with open_dict(config):
        config.trainer.v1.sampler.sampler_kwargs.poll_interval = 0.02
    harness = Harness(config, model_dir, lambda _text: ASK, update_s=0.2)
    harness.server.generate_s = 0.05
    try:
        for _ in range(STEPS):
            harness.step()
    finally:
        harness.close()
    return harness


def _staleness(harness) -> list[list[int]]:
    """Per update (global step g, weights of step g - 1): how many updates old each handed
    sample's weights were."""
    versions = harness.trainer.actor_rollout_wg.versions
    return [[g - 1 - v for v in handed] for g, handed in enumerate(versions, start=1)]


def _whole_states(harness) -> bool:
    """Every optimizer mini-batch, on every rank, is a share of one and the same state."""
    ranks = harness.trainer.actor_rollout_wg.mini_batches
    return all(
        len({uid for rank in ranks for uid in rank[j]}) == 1 for j in range(len(ranks[0]))
    )


def test_one_step_updates_use_samples_at_most_max_staleness_old(
    ray_tq, scripted_responders, process_group, tiny_model_dir, tmp_path  # noqa: F811
):
    from prour.train.verl_backend import ONE_STEP_TRAINER_MODE

    harness = _run(tiny_model_dir, tmp_path, ["train.overlap=one_step", "train.max_staleness=1"])
    assert harness.config.trainer.v1.trainer_mode == ONE_STEP_TRAINER_MODE
    assert harness.config.trainer.v1.sampler.max_off_policy_threshold == 2  # verl counts spans
    staleness = _staleness(harness)
    assert [len(s) for s in staleness] == [STATES * KEEP] * STEPS
    assert all(0 <= s <= 1 for step in staleness for s in step)  # train.max_staleness
    # step 1 trains on the initial weights' first finished groups; after it, every update uses
    # the batch that rolled out during the previous update: one update old
    assert staleness[0] == [0] * (STATES * KEEP)
    assert staleness[1:] == [[1] * (STATES * KEEP)] * (STEPS - 1)
    # the warm-up batch and one per step were submitted ahead; nothing was aborted, and every
    # weight sync waited until no session was rolling out (none straddles two weights)
    assert harness.submitted == [STATES] * (STEPS + 1)
    sync = harness.trainer.checkpoint_manager
    assert sync.syncs == [(g, 0) for g in range(1, STEPS + 1)] and sync.aborts == 0
    assert _whole_states(harness)


def test_overlap_off_stays_synchronous(
    ray_tq, scripted_responders, process_group, tiny_model_dir, tmp_path  # noqa: F811
):
    harness = _run(tiny_model_dir, tmp_path, [])
    assert harness.config.trainer.v1.trainer_mode == "prour_state_ordered"
    assert _staleness(harness) == [[0] * (STATES * KEEP)] * STEPS
    assert harness.submitted == [STATES] * STEPS
    assert harness.trainer.checkpoint_manager.syncs == [(g, 0) for g in range(1, STEPS + 1)]
    assert _whole_states(harness)
