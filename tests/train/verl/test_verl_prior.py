"""The agent loops of one worker share one prior per state per training step."""

from __future__ import annotations

import threading
import time

from prour.llm.scripted import ScriptedLLM


class SlowScorer(ScriptedLLM):
    """Scores slowly, so concurrent sessions overlap while the first prior is in flight."""

    def score(self, requests):
        time.sleep(0.05)
        return super().score(requests)


def test_concurrent_sessions_score_a_state_prior_once_per_step():
    from train_helpers import instance_rows

    from prour.data.schema import state_from_row
    from prour.train.verl_ext.agent_loop import StepPriorReward

    policy = SlowScorer()
    reward = StepPriorReward(policy, strict_user=None, verifier_factory=None)
    states = [state_from_row(row) for row in instance_rows(2)]
    reward.at_step(1)
    priors: list[float] = []

    def session(state) -> None:
        priors.append((state.state_id, reward.prior(state).sum))

    threads = [threading.Thread(target=session, args=(s,)) for s in states for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert policy.calls["score_requests"] == 2  # one per state, not one per session
    assert len(set(priors)) == 2
    reward.at_step(1)  # same step: still cached
    reward.prior(states[0])
    assert policy.calls["score_requests"] == 2
    reward.at_step(2)  # the policy changed: scored again, once
    reward.prior(states[0])
    reward.prior(states[0])
    assert policy.calls["score_requests"] == 3
