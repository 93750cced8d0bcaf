"""Extraction hashes each trajectory's environment incrementally, with the per-row answers.

On the scripted world of :mod:`recompute_world` (real tau2 tasks: retail 30, airline 39 with
reservation writes), :func:`prour.data.decision_states.decision_hashes` replays each trajectory's tool
traffic once and hashes the environment at every decision; each hash must equal a fresh replay of
that decision's traffic alone (:func:`prour.data.schema.tool_traffic_hash`, the per-row way), and
an edited tool result must stop it with the per-row error, naming the first decision that saw it.
"""

from __future__ import annotations

import copy

import pytest
import recompute_world as world

from prour.config.data import DataConfig
from prour.data.collect import load_trajectories
from prour.data.decision_states import decision_hashes, decision_states
from prour.data.schema import tool_traffic_hash

CFG = DataConfig(max_decisions=16)


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hashes")
    world.collect(folder)
    return load_trajectories(folder / "traj.jsonl", "error")


def fresh_hashes(states) -> list[str]:
    return [tool_traffic_hash(s.domain, s.task_id, s.env_history) for s in states]


@pytest.fixture(scope="module")
def states(trajectories):
    return [s for t in trajectories for s in decision_states(t, CFG)]


@pytest.fixture(scope="module")
def fresh(states) -> list[str]:
    """Each decision's hash from a fresh replay of its traffic alone (the slow, per-row way),
    computed once for the module: a state's fresh hash depends on nothing else."""
    return fresh_hashes(states)


def test_incremental_hashes_equal_a_fresh_replay_per_decision(states, fresh) -> None:
    assert {s.domain for s in states} == {"retail", "airline"}
    hashes = decision_hashes(states)
    assert hashes == fresh
    airline = [h for s, h in zip(states, hashes) if s.domain == "airline"]
    assert len(set(airline)) > 1  # writes between decisions: the hashes are not all alike
    traffic = [len(s.env_history) for s in states if s.domain == "airline"]
    assert traffic == sorted(traffic) and traffic[-1] > traffic[0]


def test_repeated_and_out_of_order_traffic_gives_the_fresh_hashes(states, fresh) -> None:
    """Equal traffic keeps its hash (a reply after a user turn); shorter traffic starts afresh."""
    every = list(range(len(states)))
    repeated = [i for i in every for _ in range(2)]
    # the last decisions backwards (each shorter than the one before: six fresh replays), then
    # every fifth decision forwards (within a trajectory longer, across one shorter)
    shuffled = every[::-1][:6] + every[::5]
    for order in (repeated, shuffled):
        assert decision_hashes([states[i] for i in order]) == [fresh[i] for i in order]


def test_an_edited_tool_result_names_the_first_decision_that_saw_it(trajectories) -> None:
    traj = copy.deepcopy(next(t for t in trajectories if t.domain == "airline"))
    index = [i for i, m in enumerate(traj.messages) if m["role"] == "tool"][2]
    traj.messages[index]["content"] = '{"edited": true}'
    states = decision_states(traj, CFG)
    first = next(s for s in states if traj.messages[index] in s.env_history)
    assert first.step > 0
    with pytest.raises(ValueError) as fresh:
        tool_traffic_hash(first.domain, first.task_id, first.env_history)
    expected = f"trajectory {first.trajectory_id} decision {first.step}: {fresh.value}"
    with pytest.raises(ValueError) as incremental:
        decision_hashes(states)
    assert str(incremental.value) == expected
    assert "gave a different result than the history records" in expected
