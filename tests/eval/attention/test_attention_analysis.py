"""Method tables, equal-cost mixtures, Holm, plots and the human burden study on hand examples."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from plot_check import read_plot

from prour.eval.attention.analysis import (
    ConversationRecord,
    PlotPoint,
    annotation_agreement,
    attention_paths,
    average_over_domains,
    efficiency_interval,
    equal_cost_comparison,
    equal_cost_mixture,
    export_annotation_pairs,
    method_name,
    method_rows,
    plot_reward_attention,
)

Q_BUNDLED = {"discretionary": True, "atomic_questions": 2, "reading_effort": 10, "value": 8}
Q_SINGLE = {"discretionary": True, "atomic_questions": 1, "reading_effort": 0, "value": 10}
Q_EXEMPT = {"discretionary": False, "atomic_questions": 1, "reading_effort": 4, "value": 5}
TRANSCRIPT = [{"role": "user", "content": "I need help."},
              {"role": "assistant", "content": "Which order?"}]


def record(method, task, reward, requests, domain="retail", seed=0, fallback=False):
    return ConversationRecord(method, "m", domain, task, seed, reward, requests, fallback,
                              TRANSCRIPT)


def test_method_rows_by_hand():
    records = [
        record("no-ask", "t1", 1.0, []), record("no-ask", "t2", 0.0, [Q_EXEMPT]),
        record("budgeted@1", "t1", 1.0, [Q_BUNDLED]),                 # full cost 1.7
        record("budgeted@1", "t2", 1.0, [Q_SINGLE, Q_EXEMPT], fallback=True),  # full cost 1.0
    ]
    rows = {r.method: r for r in method_rows(records, "full", lam=0.03)}
    budgeted, no_ask = rows["budgeted@1"], rows["no-ask"]
    assert (no_ask.reward, no_ask.cost, no_ask.requests) == (0.5, 0.0, 0.0)
    assert math.isnan(no_ask.value) and math.isnan(no_ask.efficiency)
    assert budgeted.reward == 1.0 and budgeted.cost == pytest.approx(1.35)
    assert budgeted.value == pytest.approx(9.0)
    assert budgeted.utility == pytest.approx(1.0 - 0.03 * 1.35)
    assert (budgeted.requests, budgeted.atomic_questions) == (1.0, 1.5)
    assert budgeted.bundled_share == 0.5 and budgeted.fallback_rate == 0.5
    assert budgeted.efficiency == pytest.approx((1.0 - 0.5) / 1.35)
    exempt = method_rows(records, "full+exempt", 0.03)[0]
    assert exempt.cost == pytest.approx((1.7 + 1.0 + 1.7) / 2)

    airline = [record("budgeted@1", "a1", 0.0, [Q_SINGLE], domain="airline")]
    rows = method_rows(records + airline, "full", 0.03)
    averaged = {r.method: r for r in average_over_domains(rows)}
    assert averaged["budgeted@1"].reward == pytest.approx((1.0 + 0.0) / 2)
    assert averaged["budgeted@1"].cost == pytest.approx((1.35 + 1.0) / 2)
    assert averaged["budgeted@1"].conversations == 3


def test_equal_cost_mixture_weights_by_hand():
    # w·1 + (1 − w)·2 = 1.25 → w = 0.75; R = 0.75·0.5 + 0.25·0.7 = 0.55
    mix = equal_cost_mixture(1.25, 1.0, 2.0, 0.5, 0.7)
    assert mix.inside and mix.weight == pytest.approx(0.75)
    assert mix.reward == pytest.approx(0.55)
    assert equal_cost_mixture(2.0, 1.0, 2.0, 0.5, 0.7).weight == pytest.approx(0.0)
    assert equal_cost_mixture(1.0, 1.0, 2.0, 0.5, 0.7).reward == pytest.approx(0.5)
    outside = equal_cost_mixture(2.5, 1.0, 2.0, 0.5, 0.7)
    assert not outside.inside and math.isnan(outside.weight) and "outside [1, 2]" in outside.note
    tie = equal_cost_mixture(1.0, 1.0, 1.0, 0.5, 0.7)
    assert tie.inside and tie.reward == 0.5


def test_equal_cost_comparison_by_hand():
    costs = ([1.0, 1.0, 2.0, 1.0], [1.0] * 4, [2.0] * 4)          # means 1.25, 1, 2 → w = 0.75
    rewards = ([1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0])
    result = equal_cost_comparison(costs, rewards, n_boot=2000)
    assert result.mixture.weight == pytest.approx(0.75)
    assert result.mixture.reward == pytest.approx(0.5625)
    # per-task matched rewards 1, 0.25, 0, 1 → differences 0, −0.25, 1, 0
    assert result.delta.estimate == pytest.approx(0.1875)
    assert -0.25 <= result.delta.low <= result.delta.high <= 1.0
    far = equal_cost_comparison(([3.0] * 4, [1.0] * 4, [2.0] * 4), rewards)
    assert far.delta is None and not far.mixture.inside


def test_efficiency_interval_by_hand():
    # (mean R − mean R0) / mean A = (0.75 − 0.25) / 2 = 0.25
    result = efficiency_interval([1, 1, 0, 1], [0, 1, 0, 0], [2, 2, 0, 4], n_boot=2000)
    assert result.estimate == pytest.approx(0.25)
    assert result.low <= 0.25 <= result.high
    assert result.n_boot < 2000  # draws of only the zero-cost task were dropped


def test_efficiency_interval_with_domains_as_strata():
    # retail: R 1, 1; R0 0, 0; A 2, 2.  airline: R 1, 0; R0 1, 0; A 1, 3.
    # domain-averaged means: R (1 + 0.5)/2 = 0.75, R0 (0 + 0.5)/2 = 0.25, A (2 + 2)/2 = 2
    result = efficiency_interval([1, 1, 1, 0], [0, 0, 1, 0], [2, 2, 1, 3], n_boot=4000,
                                 strata=["retail", "retail", "airline", "airline"])
    assert result.estimate == pytest.approx(0.25)
    # retail never varies (gain 1, cost 2); airline's resample takes gain 0 and cost 1, 2 or 3
    # (mean of two of {1, 3}): efficiency (1 + 0)/2 / ((2 + c)/2) with c ∈ {1, 2, 3}
    assert result.low == pytest.approx(1 / 5) and result.high == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="strata has 1 labels for 4 tasks"):
        efficiency_interval([1, 1, 1, 0], [0, 0, 1, 0], [2, 2, 1, 3], strata=["retail"])


def test_paths_and_plot(tmp_path):
    records = [record("no-ask", "t1", 0.2, []), record(method_name("budgeted", 1), "t1", 0.5,
                                                         [Q_SINGLE]),
               record("budgeted@2", "t1", 0.6, [Q_SINGLE, Q_BUNDLED]),
               record("unrestricted", "t1", 0.7, [Q_SINGLE, Q_BUNDLED, Q_BUNDLED]),
               record("frugal", "t1", 0.65, [Q_SINGLE])]
    rows = method_rows(records, "full", 0.03)
    paths = attention_paths(rows)
    assert [p.label for p in paths["m"]] == ["no-ask", "budgeted@1", "budgeted@2", "unrestricted"]
    assert [p.cost for p in paths["m"]] == pytest.approx([0.0, 1.0, 2.7, 4.4])
    frugal = {"m": [PlotPoint("frugal", r.cost, r.reward) for r in rows if r.method == "frugal"]}
    out = plot_reward_attention(paths, tmp_path / "plots" / "ra.png", extras=frugal)
    sidecar = read_plot(out)
    assert sidecar["series"]["m"]["x"] == pytest.approx([0.0, 1.0, 2.7, 4.4])
    assert sidecar["series"]["m"]["y"] == pytest.approx([0.2, 0.5, 0.6, 0.7])
    assert sidecar["series"]["frugal (m)"] == {"x": [pytest.approx(1.0)], "y": [0.65]}
    [axes] = sidecar["axes"]  # 8 % of the span on each side; cost clipped at 0
    assert axes["xlim"] == [0.0, pytest.approx(4.4 + 0.08 * 4.4)]
    assert axes["ylim"] == pytest.approx([0.2 - 0.04, 0.7 + 0.04])


def test_export_pairs_with_equal_question_counts(tmp_path):
    records = [record("budgeted@1", "t1", 1.0, [Q_BUNDLED, Q_EXEMPT]),       # 1 disc, cost 1.7
               record("budgeted+mgr@1", "t1", 1.0, [Q_SINGLE]),            # 1 disc, cost 1.0
               record("unrestricted", "t1", 1.0, [Q_SINGLE, Q_BUNDLED]),   # 2 disc
               record("budgeted@1", "t2", 1.0, [Q_SINGLE]),                # other task
               record("no-ask", "t1", 1.0, [])]                            # no questions
    shown_path, key_path = export_annotation_pairs(records, tmp_path, n_pairs=10, seed=0,
                                                       accounting="full")
    shown = [json.loads(line) for line in shown_path.read_text().splitlines()]
    keys = [json.loads(line) for line in key_path.read_text().splitlines()]
    assert len(shown) == len(keys) == 1
    assert "cost" not in json.dumps(shown[0]) and shown[0]["conversation_a"].startswith("user:")
    key = keys[0]
    assert sorted([key["cost_a"], key["cost_b"]]) == pytest.approx([1.0, 1.7])
    higher_method = key["a"][0] if key["higher"] == "a" else key["b"][0]
    assert higher_method == "budgeted@1"
    records[1].transcript = None
    with pytest.raises(ValueError, match="no transcript"):
        export_annotation_pairs(records, tmp_path, accounting="full")


def test_annotation_agreement_with_a_pair_bootstrap():
    keys = [{"pair_id": "p1", "higher": "a"}, {"pair_id": "p2", "higher": "b"},
            {"pair_id": "p3", "higher": "b"}]
    answers = [{"pair_id": "p1", "choice": "a"}, {"pair_id": "p1", "choice": "a"},
               {"pair_id": "p2", "choice": "a"}, {"pair_id": "p2", "choice": "same"},
               {"pair_id": "p3", "choice": "b"}]
    result = annotation_agreement(keys, answers, n_boot=100_000, seed=0, ci=0.80)
    assert result.interval.estimate == pytest.approx(3 / 4)
    assert (result.answers, result.ties, result.pairs) == (4, 1, 3)
    hits, totals = np.array([2, 0, 1]), np.array([2, 1, 1])
    ratios = sorted(hits[list(i)].sum() / totals[list(i)].sum()
                    for i in itertools.product(range(3), repeat=3))
    cdf = np.arange(1, 28) / 27
    assert result.interval.low == pytest.approx(ratios[int(np.searchsorted(cdf, 0.1))])
    assert result.interval.high == pytest.approx(ratios[int(np.searchsorted(cdf, 0.9))])
    with pytest.raises(ValueError, match="unknown pair_id 'p9'"):
        annotation_agreement(keys, [{"pair_id": "p9", "choice": "a"}])
    with pytest.raises(ValueError, match="choice 'A' must be"):
        annotation_agreement(keys, [{"pair_id": "p1", "choice": "A"}])
