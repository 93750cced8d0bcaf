"""The attention protocol wired into real tau2 episodes (scripted models, retail tasks).

The scripted agent first asks for the user's id (a policy-required request), then asks
discretionary questions until the gate stops it; the checks are per episode: the interruption
budget is never exceeded, exempt requests never spend it, blocked drafts are redrafted or replaced
by the fallback message, the proactive agent's clarify questions are gated too, and the judge's
scores and the costs reach the result line.
"""

from __future__ import annotations

import json

import pytest
from eval_world import (
    CLARIFY_Q,
    GATE_REPLY,
    JUDGED_EFFORT,
    JUDGEMENT,
    TAU_AU,
    TAU_EU,
    judge_llm,
    scripted_llms,
)

from prour.build import Builder
from prour.config import Recipe
from prour.config.attention import AttentionConfig
from prour.config.eval import EvalConfig
from prour.config.router import RouterConfig
from prour.env.trajectory import read_trajectories
from prour.eval.attention.agent import budget_respected, delivered_messages
from prour.eval.attention.budget import FALLBACK_MESSAGE
from prour.eval.harness import EPISODES_FILE, Evaluation
from prour.llm.scripted import ScriptedLLM

Message = dict
IDENTITY = "To verify your identity, please provide your user id."
QUESTIONS = ["Could you tell me which item you mean?",
             "Could you tell me the color and the size you want?",
             "Could you tell me when you ordered it?"]
CLOSING = "Thank you. Your request is complete."
TASKS = ["65"]


def _asked(messages: list[Message]) -> int:
    """Agent questions already delivered in the dialogue (the greeting excluded)."""
    return sum(1 for m in messages if m.get("role") == "assistant" and m.get("content")
               and m["content"] in [IDENTITY, *QUESTIONS])


def asking_agent(stubborn: bool = False) -> ScriptedLLM:
    """Identity request, then discretionary questions; after a gate note it stops asking
    (``stubborn``: it asks again)."""

    def reply(messages: list[Message]) -> str:
        if "[Draft question]" in str(messages[-1].get("content")):  # self-review (MGR)
            return json.dumps({"decision": "approve", "question": "", "reason": "needed"})
        asked = _asked(messages)
        if messages[-1].get("role") == "system" and len(messages) > 1 and not stubborn:
            return GATE_REPLY
        if asked == 0:
            return IDENTITY
        if asked <= len(QUESTIONS):
            return QUESTIONS[asked - 1]
        return CLOSING

    return ScriptedLLM(rules=[(r".", reply)])


def answering_user() -> ScriptedLLM:
    def reply(messages: list[Message]) -> str:
        said = messages[-1].get("content") or ""
        if "complete" in said or "contact us again" in said:
            return "###STOP###"
        return "I am not sure." if "?" in said or "please" in said else "I need help."

    return ScriptedLLM(rules=[(r".", reply)])


def _evaluate(tmp_path, policies: list[str], methods: list[str], llms: dict,
              **attention: object) -> tuple[list[dict], list]:
    cfg = EvalConfig(methods=methods, seeds=[0], domains=["retail"], tasks=TASKS,
                     concurrency=2, classifier="heuristic",
                     attention=AttentionConfig(**attention), attention_policies=policies)
    router = RouterConfig(n_interpretations=2, n_actions=2, tau_au=TAU_AU, tau_eu=TAU_EU,
                          tool_detail="brief")
    recipe = Recipe(name="attention-test", env={"max_steps": 24}, eval=cfg, router=router,
                    train={"rollout": {"max_response_tokens": 64}})
    evaluation = Evaluation(recipe, tmp_path, progress=False, builder=Builder(recipe, llms))
    results = evaluation.run()
    return results, list(read_trajectories(tmp_path / EPISODES_FILE))


def _limit(variant: str) -> int | None:
    return {"no-ask": 0, "unrestricted": None}.get(variant, int(variant.split("@")[-1])
                                                    if "@" in variant else None)


@pytest.fixture(scope="module")
def budgeted_runs(tmp_path_factory) -> tuple[list[dict], list]:
    llms = {"agent": asking_agent(), "user": answering_user(), "judge": judge_llm()}
    return _evaluate(tmp_path_factory.mktemp("budgets"),
                     ["no-ask", "budgeted@1", "budgeted@2", "budgeted+mgr@1", "unrestricted"],
                     ["base"], llms)


def test_budget_is_never_exceeded(budgeted_runs) -> None:
    results, trajectories = budgeted_runs
    assert len(results) == 5 * len(TASKS)
    for traj in trajectories:
        variant = traj.agent.split("/")[1]
        assert budget_respected(traj)
        delivered = delivered_messages(traj)
        discretionary = [d for d in delivered if d.discretionary]
        limit = _limit(variant)
        asked = [m["content"] for m in traj.messages if m.get("content") in QUESTIONS]
        assert len(asked) == len(discretionary)
        if limit is None:
            assert len(discretionary) == len(QUESTIONS)
        else:
            assert len(discretionary) == limit  # the agent always wants more than N
        assert all(d.spent_budget for d in discretionary)


def test_exempt_requests_never_spend_budget(budgeted_runs) -> None:
    _, trajectories = budgeted_runs
    for traj in trajectories:
        spent_before = 0
        for step in traj.steps:
            record = step.meta.get("attention")
            if not record:
                continue
            if record.get("delivered") and record["label"] != "discretionary":
                assert not record["spent_budget"]
                assert record["budget_spent"] == spent_before
            spent_before = record["budget_spent"]
        identity = [d for d in delivered_messages(traj) if d.text == IDENTITY]
        assert len(identity) == 1 and identity[0].label == "required"  # delivered even at N = 0


def test_blocked_drafts_are_redrafted_and_recorded(budgeted_runs) -> None:
    _, trajectories = budgeted_runs
    traj = next(t for t in trajectories if t.agent == "base/budgeted@1")
    records = [s.meta["attention"] for s in traj.steps if s.meta.get("attention")]
    blocked = [r for r in records if "block" in r["actions"]]
    assert len(blocked) == 1 and blocked[0]["outcome"] == "redrafted"
    assert blocked[0]["draft"] == QUESTIONS[1]
    notes = [traj.messages[s.message_index] for s in traj.steps if s.kind == "agent_note"]
    assert len(notes) == 1 and notes[0]["role"] == "system"
    assert traj.messages[-2]["content"] == GATE_REPLY


def test_result_lines_carry_judged_costs(budgeted_runs) -> None:
    results, _ = budgeted_runs
    value = JUDGEMENT["value"]
    per_request = 1 + JUDGED_EFFORT / 20 + (1 - value / 10)
    for line in results:
        block = line["attention"]
        disc = block["discretionary"]
        required = sum(1 for r in block["requests"] if not r["discretionary"])
        assert required == 1 and block["spent"] == disc
        assert all(r["reading_effort"] == JUDGED_EFFORT and r["value"] == value
                   for r in block["requests"])
        assert block["costs"]["messages"] == pytest.approx(disc)
        atomic = sum(r["atomic_questions"] for r in block["requests"] if r["discretionary"])
        assert block["costs"]["atomic"] == pytest.approx(atomic)
        assert block["costs"]["full"] == pytest.approx(per_request * disc)
        assert block["costs"]["full+exempt"] == pytest.approx(per_request * (disc + required))
        assert block["utility"] == pytest.approx(line["score"] - 0.03 * block["cost"])
        assert block["value"] == (value if disc else None)


def test_fallback_when_the_agent_cannot_continue_without_asking(tmp_path) -> None:
    llms = {"agent": asking_agent(stubborn=True), "user": answering_user(), "judge": judge_llm()}
    results, trajectories = _evaluate(tmp_path, ["no-ask"], ["base"], llms)
    for line, traj in zip(results, trajectories):
        assert FALLBACK_MESSAGE in [m.get("content") for m in traj.messages]
        assert line["attention"]["fallbacks"] == 1 and line["attention"]["discretionary"] == 0
        assert line["attention"]["spent"] == 0


def test_clarify_questions_of_the_proactive_agent_are_gated(tmp_path) -> None:
    llms = scripted_llms()
    results, trajectories = _evaluate(tmp_path, ["no-ask", "budgeted@1"], ["prour"], llms)
    by_variant = {t.agent: t for t in trajectories if t.task_id == "65"}
    silent = by_variant["prour/no-ask"]
    first = next(s for s in silent.steps if s.meta.get("route"))
    assert first.meta["route"] == "clarify" and first.meta["turn"] == "act"
    assert first.meta["attention"]["actions"] == ["block", "deliver"]
    assert first.meta["attention"]["draft"] == CLARIFY_Q
    assert CLARIFY_Q not in [m.get("content") for m in silent.messages]
    allowed = by_variant["prour/budgeted@1"]
    assert [d.text for d in delivered_messages(allowed) if d.discretionary] == [CLARIFY_Q]
    assert all(budget_respected(t) for t in trajectories)
    assert all(line["attention"]["spent"] <= (0 if "no-ask" in line["key"][3] else 1)
               for line in results)
