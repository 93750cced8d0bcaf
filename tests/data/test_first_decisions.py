"""Extraction keeps each trajectory's *first* ``data.max_decisions`` agent decisions (paper
A.2.1: the first 16), counted after the greeting: a hand-built episode of 20 agent replies, each
answered by the user, gives the states of replies 1-16, each with the history it was decided on.
(A slice that kept the last 16 gives replies 5-20 and fails here.)"""

from __future__ import annotations

from prour.config.data import DataConfig
from prour.data.decision_states import decision_states
from prour.env.trajectory import StepRecord, Trajectory

REPLIES = 20


def _episode() -> Trajectory:
    messages = [{"role": "system", "content": "policy"},
                {"role": "assistant", "content": "Hi! How can I help you today?"}]
    steps = [StepRecord(kind="agent_message", message_index=1, meta={"greeting": True})]
    for n in range(1, REPLIES + 1):
        messages.append({"role": "user", "content": f"user turn {n}"})
        steps.append(StepRecord(kind="user_message", message_index=len(messages) - 1))
        messages.append({"role": "assistant", "content": f"agent reply {n}"})
        steps.append(StepRecord(kind="agent_message", message_index=len(messages) - 1))
    return Trajectory(domain="retail", task_id="5", agent="a", user="u", messages=messages,
                      steps=steps, termination="user_stop", reward=1.0)


def test_the_first_sixteen_decisions_are_kept() -> None:
    traj = _episode()
    states = decision_states(traj, DataConfig(max_decisions=16))
    assert [s.step for s in states] == list(range(16))
    # state t decides reply t + 1: its history ends with user turn t + 1, and reply t + 1 is
    # not in it (written out: the first state saw the greeting and the first user turn only)
    assert [m["content"] for m in states[0].history] == ["Hi! How can I help you today?",
                                                         "user turn 1"]
    for t, state in enumerate(states):
        assert state.history[-1]["content"] == f"user turn {t + 1}"
        assert len(state.history) == 2 * (t + 1)
    assert all(s.is_reply for s in states)


def test_fewer_decisions_than_the_cap_are_all_kept() -> None:
    states = decision_states(_episode(), DataConfig(max_decisions=64))
    assert len(states) == REPLIES
    assert states[-1].history[-1]["content"] == f"user turn {REPLIES}"
