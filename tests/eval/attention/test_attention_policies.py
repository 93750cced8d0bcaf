"""Budgets and gates on a tau2-grounded conversation: budget never exceeded, exempt requests
never spend it, blocked drafts redraft or fall back, VoI veto below c, registry errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prour.config.attention import AttentionConfig
from prour.eval.attention import (
    FALLBACK_MESSAGE,
    AttentionGate,
    BudgetExceeded,
    GateAction,
    GateDecision,
    RequestClass,
    RequestClassifier,
    build_policy,
)
from prour.eval.attention.policies import configured_policy
from prour.llm.scripted import ScriptedLLM

LABELS = {
    "verify your identity": ("required", 1),
    "Shall I proceed": ("required", 1),
    "Which order": ("discretionary", 1),
    "bigger bottle": ("discretionary", 1),
    "brightness and the power source": ("discretionary", 2),
    "I found your account": ("answer", 0),
}
DRAFTS = [
    "I found your account, Mei. Let me look at your orders.",
    "Which order holds the items you want to exchange?",
    "For the water bottle, do you want a bigger bottle of the same model?",
    "To verify your identity once more, could you share your zip code?",
    "What brightness and the power source do you prefer for the new lamp?",
    "I will exchange both items. Shall I proceed (yes)?",
]


def run(policy, messages, drafts, redraft_replies=None):
    """Send each draft through the gate; blocked drafts get the next scripted redraft."""
    gate = AttentionGate(policy, max_redrafts=1)
    state = policy.new_state(messages)
    queue = list(redraft_replies or [])
    outcomes = []
    for draft in drafts:
        outcome = gate.submit(draft, state, (lambda note: queue.pop(0)) if queue else None)
        outcomes.append(outcome)
        if outcome.message:
            state.messages += [{"role": "assistant", "content": outcome.message},
                               {"role": "user", "content": "ok"}]
    return state, outcomes


@pytest.mark.parametrize("name, budget", [("no-ask", None), ("budgeted", 0), ("budgeted", 1),
                                          ("budgeted", 2), ("unrestricted", None)])
def test_budget_never_exceeded_and_exempt_always_delivered(retail_task, labelling_llm, name,
                                                           budget):
    classifier = RequestClassifier(labelling_llm(LABELS), retail_task["policy"], 3)
    policy = build_policy(name, classifier, budget=budget)
    state, outcomes = run(policy, retail_task["messages"], DRAFTS)
    limit = {"no-ask": 0, "unrestricted": 3}.get(name, budget)
    delivered_disc = [d for d in state.delivered if d.discretionary]
    assert len(delivered_disc) == state.budget.spent == min(limit, 3)
    # Exempt drafts (answer, identity check, confirmation) always go out and never spend.
    exempt = [d for d in state.delivered if d.label in ("answer", "required") and not d.fallback]
    assert [d.text for d in exempt] == [DRAFTS[0], DRAFTS[3], DRAFTS[5]]
    assert not any(d.spent_budget for d in exempt)
    # Without a redraft, every blocked draft ends in the counted fallback message.
    blocked = 3 - min(limit, 3)
    assert state.fallbacks == blocked == len(state.blocked)
    assert [o.kind for o in outcomes].count("fallback") == blocked
    assert all(o.message == FALLBACK_MESSAGE for o in outcomes if o.kind == "fallback")


def test_blocked_draft_lets_the_agent_continue_or_falls_back(retail_task, labelling_llm):
    classifier = RequestClassifier(labelling_llm(LABELS), "", 3)
    policy = build_policy("budgeted", classifier, budget=1)
    drafts = DRAFTS[1:3] + [DRAFTS[4]]
    # Draft 2 is blocked: the agent continues with a tool call (None). Draft 3 is blocked: the
    # redraft is still a discretionary request, blocked again, so the fallback goes out.
    state, outcomes = run(policy, retail_task["messages"], drafts,
                          redraft_replies=[None, "Which order should I use?"])
    assert [o.kind for o in outcomes] == ["delivered", "continued", "fallback"]
    assert outcomes[1].message is None and state.fallbacks == 1
    assert state.budget.spent == 1 and len(state.blocked) == 3


def test_redraft_that_no_longer_asks_is_delivered(labelling_llm):
    policy = build_policy("no-ask", RequestClassifier(labelling_llm(LABELS), "", 3))
    state = policy.new_state([])
    outcome = AttentionGate(policy, max_redrafts=1).submit(
        DRAFTS[1], state, lambda note: "I found your account and will check your orders now.")
    assert outcome.kind == "redrafted" and outcome.message.startswith("I found your account")
    assert state.budget.spent == 0 and state.fallbacks == 0


@settings(max_examples=60, deadline=None)
@given(labels=st.lists(st.sampled_from(["answer", "required", "discretionary"]), max_size=12),
       budget=st.integers(min_value=0, max_value=4))
def test_budget_invariant_on_random_conversations(labels, budget):
    policy = build_policy("budgeted", RequestClassifier(None, "", 3), budget=budget)
    texts = {"answer": "Your order has shipped.",
             "required": "I will cancel order #W1. Shall I proceed (yes/no)?",
             "discretionary": "Which color do you want?"}
    state, _ = run(policy, [], [texts[label] for label in labels])
    n_disc = labels.count("discretionary")
    assert state.budget.spent == min(budget, n_disc) <= budget
    assert sum(d.discretionary for d in state.delivered) == state.budget.spent
    assert sum(not d.discretionary and not d.fallback for d in state.delivered) == \
        len(labels) - n_disc
    assert state.fallbacks == n_disc - min(budget, n_disc)


def test_a_policy_cannot_overdraw_the_budget():
    class Careless:
        name = "careless"

        def review(self, draft, state):
            return GateDecision(GateAction.DELIVER, draft, "always",
                                RequestClass("discretionary", 1))

        def system_prompt_addendum(self):
            return ""

    policy = build_policy("budgeted", RequestClassifier(None, "", 3), budget=1)
    state = policy.new_state()
    gate = AttentionGate(Careless(), max_redrafts=1)
    gate.submit("Which color?", state)
    with pytest.raises(BudgetExceeded, match="budget of 1"):
        gate.submit("Which size?", state)


def _voi_llm(table: dict[str, object]) -> ScriptedLLM:
    def answer(messages):
        draft = messages[1]["content"].split("[Draft question]\n")[-1]
        for key, voi in table.items():
            if key in draft:
                return voi if isinstance(voi, str) else json.dumps({"voi": voi, "reason": "r"})
        raise AssertionError(draft)

    return ScriptedLLM(rules=[(r"Draft question", answer)])


def test_voi_gate_vetoes_below_its_threshold(retail_task, labelling_llm):
    voi = _voi_llm({"Which order": 0.3, "bigger bottle": 0.8,
                    "brightness": '{"voi": 1.5, "reason": "r"}'})
    classifier = RequestClassifier(labelling_llm(LABELS), "", 3)
    drafts = [DRAFTS[1], DRAFTS[2], DRAFTS[4]]
    for threshold, expected in [(0.5, ["fallback", "delivered", "delivered"]),
                                (0.3, ["delivered", "delivered", "delivered"]),
                                (0.9, ["fallback", "fallback", "delivered"])]:
        policy = build_policy("voi-gate", classifier, voi, threshold=threshold, max_attempts=3)
        state, outcomes = run(policy, retail_task["messages"], drafts)
        assert [o.kind for o in outcomes] == expected, threshold
        assert state.reviews == 3  # every discretionary draft was reviewed
    # An invalid VoI reply (1.5) is retried, then the draft passes, marked failed.
    assert "VoI review failed" in outcomes[2].decisions[0].reason
    assert "voi=1.5 must be a number in [0, 1]" in outcomes[2].decisions[0].reason
    assert "0.30 < c=0.90" in outcomes[0].decisions[0].reason


def test_voi_gate_respects_a_budget_before_reviewing(labelling_llm):
    voi = _voi_llm({"Which order": 0.9, "bigger bottle": 0.9})
    policy = build_policy("voi-gate", RequestClassifier(labelling_llm(LABELS), "", 3), voi,
                          threshold=0.5, budget=1, max_attempts=3)
    state, outcomes = run(policy, [], [DRAFTS[1], DRAFTS[2]])
    assert [o.kind for o in outcomes] == ["delivered", "fallback"]
    assert voi.calls["chat"] == 1 and state.reviews == 1


def test_registry_and_config_errors_name_the_problem():
    classifier = RequestClassifier(None, "", 3)
    with pytest.raises(ValueError, match="Did you mean 'budgeted'"):
        build_policy("budgetd", classifier, budget=1)
    with pytest.raises(ValueError, match="needs a budget N"):
        build_policy("budgeted+mgr", classifier, ScriptedLLM())
    with pytest.raises(ValueError, match="takes no budget"):
        build_policy("unrestricted", classifier, budget=2)
    with pytest.raises(ValueError, match="threshold c"):
        build_policy("voi-gate", classifier, ScriptedLLM())
    with pytest.raises(ValueError, match="pass llm="):
        build_policy("budgeted+review", classifier, budget=1)
    with pytest.raises(ValueError, match="valid: no-ask, unrestricted, frugal"):
        AttentionConfig(policy="mgr")
    with pytest.raises(ValueError, match="needs a budget N"):
        AttentionConfig(policy="budgeted")
    config = AttentionConfig(policy="budgeted+mgr", budget=2, memory_window_tokens=100)
    policy = configured_policy(config, classifier, ScriptedLLM())
    assert policy.name == "budgeted+mgr" and policy.reviewer.memory_tokens == 100
    assert "at most 2" in policy.system_prompt_addendum()
    assert config.weights.avoidability == 1.0


def test_prompt_policies_add_instructions():
    classifier = RequestClassifier(None, "", 3)
    assert "one thing at a time" in build_policy("frugal", classifier).system_prompt_addendum()
    assert "Do not ask" in build_policy("no-ask", classifier).system_prompt_addendum()
    assert build_policy("unrestricted", classifier).system_prompt_addendum() == ""
