"""Pass@1, pass^k, per-domain averages, paired run comparison and step split on hand examples."""

from __future__ import annotations

import pytest

from prour.eval.metrics import (
    AVERAGE,
    compare_runs,
    domain_pass_at_1,
    is_success,
    pass_at_1,
    pass_hat_k,
    reward_matrix,
    step_split,
)

# Successes per task over seeds 0, 1, 2: t1 → 2 (1, 0, 1), t2 → 0, t3 → 3 (0.9999999 counts),
# t4 → 1 (a partial 0.5 does not count).
RUN = {
    "t1": {0: 1.0, 1: 0.0, 2: 1.0},
    "t2": {0: 0.0, 1: 0.0, 2: 0.0},
    "t3": {0: 1.0, 1: 1.0, 2: 0.9999999},
    "t4": {0: 0.5, 1: 1.0, 2: 0.0},
}


def test_success_threshold():
    assert is_success(1.0) and is_success(1 - 1e-7)
    assert not is_success(1 - 1e-5) and not is_success(0.5)


def test_pass_at_1_is_the_mean_over_seeds_of_the_success_fraction():
    # seed 0: t1, t3 → 2/4; seed 1: t3, t4 → 2/4; seed 2: t1, t3 → 2/4.
    assert pass_at_1(RUN) == pytest.approx(0.5)
    assert pass_at_1({"a": {0: 1.0, 1: 0.0}, "b": {0: 1.0, 1: 1.0}}) == pytest.approx(0.75)


def test_pass_hat_k_is_the_mean_of_c_choose_k_over_n_choose_k():
    # c = 2, 0, 3, 1 with n = 3.
    assert pass_hat_k(RUN, 1) == pytest.approx((2 / 3 + 0 + 1 + 1 / 3) / 4)
    assert pass_hat_k(RUN, 2) == pytest.approx((1 / 3 + 0 + 1 + 0) / 4)
    assert pass_hat_k(RUN, 3) == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="k <= n_trials = 3"):
        pass_hat_k(RUN, 4)


def test_missing_episodes_are_named():
    with pytest.raises(ValueError, match="task 't2' seed 1"):
        reward_matrix({"t1": {0: 1.0, 1: 1.0}, "t2": {0: 0.0}})


def test_domain_average_is_unweighted_over_domains():
    by_domain = {"retail": {"r1": {0: 1.0}, "r2": {0: 0.0}},
                 "airline": {"a1": {0: 1.0}, "a2": {0: 1.0}, "a3": {0: 1.0}, "a4": {0: 0.0}}}
    out = domain_pass_at_1(by_domain, n_boot=500)
    assert out["retail"].estimate == pytest.approx(0.5)
    assert out["airline"].estimate == pytest.approx(0.75)
    assert out[AVERAGE].estimate == pytest.approx(0.625)  # not the pooled 4/6


def test_compare_runs_pairs_tasks_and_seeds():
    a = {"retail": RUN}
    b = {"retail": {t: {s: 0.0 for s in seeds} for t, seeds in RUN.items()}}
    out = compare_runs(a, b, n_boot=2000)
    assert out["retail"].estimate == pytest.approx(0.5)
    assert out[AVERAGE].estimate == pytest.approx(0.5)
    shifted = {"retail": {**RUN, "t5": {0: 1.0, 1: 1.0, 2: 1.0}}}
    with pytest.raises(ValueError, match="only in b: \\['t5'\\]"):
        compare_runs(a, shifted)


def test_compare_runs_average_is_stratified_by_domain():
    """The averaged difference is the unweighted mean of the domains' differences, and its
    bootstrap resamples tasks within each domain. Retail: one task, a solves it and b does not
    (difference 1); airline: three tasks both solve (difference 0). Stratified: 0.5, and every
    draw is 0.5 (each domain's tasks are resampled among themselves), so the interval is the
    point. Tasks pooled across domains would give 1/4 and draws from 0 to 1."""
    a = {"retail": {"r1": {0: 1.0}}, "airline": {f"a{i}": {0: 1.0} for i in range(3)}}
    b = {"retail": {"r1": {0: 0.0}}, "airline": {f"a{i}": {0: 1.0} for i in range(3)}}
    average = compare_runs(a, b, n_boot=400)[AVERAGE]
    assert average.estimate == pytest.approx(0.5)
    assert (average.low, average.high) == pytest.approx((0.5, 0.5))


def test_step_split_counts_act_clarify_verify_per_episode():
    split = step_split([["act", "clarify", "act", "verify"], ["act", "act"]])
    assert (split.act, split.clarify, split.verify) == (2.0, 0.5, 0.5)
    assert split.total == pytest.approx(3.0)
    with pytest.raises(ValueError, match="episode 1: unknown step label 'ask'"):
        step_split([["act"], ["ask"]])


def test_a_confirmation_counts_as_clarify_in_the_paper_split():
    from prour.eval.agent import step_labels
    from prour.eval.metrics import paper_split

    split = step_split([["act", "confirm", "act"], ["confirm", "verify", "act"]])
    assert (split.act, split.clarify, split.verify) == (1.5, 1.0, 0.5)
    assert paper_split(["confirm", "clarify", "verify", "act"]) == {"act": 1, "clarify": 2,
                                                                    "verify": 1}
    assert step_labels({"turn": "confirm"}) == ["confirm"]
    with pytest.raises(ValueError, match="tagged 'ask'; valid turn tags: act, clarify, confirm"):
        step_labels({"turn": "ask"})
