"""reward.responder_concurrency: a step's responder calls go out side by side, never more at once."""

from __future__ import annotations

import math
import threading
import time

from prour.llm.scripted import ScriptedLLM
from prour.rewards import InfoGainReward, RewardConfig, RewardState
from prour.rollout import StrictUserSimulator
from prour.train.reward import score_groups

LATENCY_S = 0.3  # each strict-user call takes this long, like a remote model's round trip
ASK = "YES [QUESTION]Which switch type do you want?[/QUESTION]"


class SlowUser(ScriptedLLM):
    """A strict-user model whose every call takes LATENCY_S; it counts the calls in flight."""

    def __init__(self) -> None:
        super().__init__(default="Clicky switches, please.")
        self.count_lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    def chat(self, requests):
        with self.count_lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(LATENCY_S)
        with self.count_lock:
            self.in_flight -= 1
        return super().chat(requests)


def states(n: int) -> list[RewardState]:
    return [
        RewardState(mode="clarify", history=[{"role": "user", "content": f"Order {i} please."}],
                    target=f"goal {i}: clicky switches", domain="retail", state_id=f"s{i}")
        for i in range(n)
    ]


def make(concurrency: int) -> tuple[InfoGainReward, SlowUser]:
    user = SlowUser()
    config = RewardConfig(responder_concurrency=concurrency, retry_backoff_s=0)
    return InfoGainReward(ScriptedLLM(), StrictUserSimulator(user, config), None, config), user


def test_local_step_answers_states_side_by_side_within_the_bound():
    n, concurrency = 8, 4
    reward, user = make(concurrency)
    t0 = time.perf_counter()
    out = score_groups(reward, states(n), [[ASK, "NO"]] * n)
    elapsed = time.perf_counter() - t0
    expected = math.ceil(n / concurrency) * LATENCY_S  # 2 rounds of 4 calls
    assert user.most_in_flight == concurrency
    assert expected * 0.95 <= elapsed < 0.5 * n * LATENCY_S  # far below 8 calls one by one
    assert [[s.answer for s in group] for group in out] == [["Clicky switches, please.", None]] * n
    # the same rewards as scoring the states one at a time (with an instant user)
    config = RewardConfig()
    instant = StrictUserSimulator(ScriptedLLM(default="Clicky switches, please."), config)
    alone = InfoGainReward(ScriptedLLM(), instant, None, config)
    assert [[s.reward for s in g] for g in out] == [
        [s.reward for s in alone.score_group(st, [ASK, "NO"])] for st in states(n)
    ]


def test_agent_loop_sessions_share_the_bound():
    """verl's agent loops call score_group from many threads: the shared reward's bound holds."""
    n, concurrency = 6, 2
    reward, user = make(concurrency)
    threads = [threading.Thread(target=reward.score_group, args=(st, [ASK])) for st in states(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert user.most_in_flight == concurrency
    assert elapsed >= math.ceil(n / concurrency) * LATENCY_S * 0.95
