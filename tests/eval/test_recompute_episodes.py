"""Every eval method driven turn by turn on real tau2 tasks, recomputed from the run's files alone
(issue 17: the evaluation half of the recomputation suites).

One run (module fixture) evaluates every method of ``prour.eval.methods.METHODS`` but the
baselines (they have their own end-to-end tests in ``tests/eval/baselines``) on retail 33
and airline 32 (seed 0) in the planned world of ``eval_world``: the agent replays the task's
reference actions, the decomposer and the LLM router route decision d as ``PLAN[domain][d]``,
the generator asks, the verifier answers from a read tool, the user answers questions and stops
on the closing message. The turn cap is ``CAP`` steps, so the asking methods are cut on retail.

The expectations come from :func:`planned_episode`, a simulation of the plan written here (which
decisions ask, which verify, which turns tau2 counts and where the cap falls); the recomputation
reads ``episodes.jsonl`` / ``results.jsonl`` / ``report.json`` as plain JSON and re-scores each
transcript with tau2's own evaluators. None of prour's turn labels, step counter, scorer, message
conversion or metrics are called.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

import pytest
from eval_world import (
    CLARIFY_Q,
    GREETING,
    NOTE,
    TAU_AU,
    TAU_EU,
    counted_steps,
    expected_uncertainty,
    planned_llms,
    talk,
)
from typer.testing import CliRunner

from prour.build import Builder
from prour.cli.main import app
from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.config.router import RouterConfig
from prour.eval.harness import Evaluation
from prour.eval.methods import METHODS as ALL_METHODS

TASKS = {"retail": "33", "airline": "32"}  # 6 and 5 reference actions, DB + COMMUNICATE
PLAN = {"retail": ["clarify", "act", "verify", "act", "clarify", "verify"],
        "airline": ["verify", "clarify", "act", "verify"]}
CAP = 18  # retail with both questions needs 19 steps: cut; without them 15; airline 13 to 15
ENABLED = {"base": (), "oracle": (), "prour": ("clarify", "verify"),
           "llm-router": ("clarify", "verify"), "clarify-only": ("clarify",),
           "verify-only": ("verify",)}
DECOMPOSER_METHODS = ("prour", "clarify-only", "verify-only")
METHODS = [name for name in ALL_METHODS if ALL_METHODS.get(name).baseline is None]
STOP = "###STOP###"
N_BOOT = 200


# ---- the plan, simulated --------------------------------------------------------------------


@dataclass
class Planned:
    """What the plan gives one episode: its decisions' routes and turns, tau2 steps, the end."""

    routes: list[str] = field(default_factory=list)  # the router's choice per decision
    turns: list[str] = field(default_factory=list)  # clarify / verify (then act) / act
    events: list[tuple[str, bool]] = field(default_factory=list)  # (speaker, goes to the env)
    user_messages: int = 0
    termination: str = "user_stop"


def planned_episode(method: str, domain: str, cap: int = CAP) -> Planned:
    """The episode the plan makes of ``method`` on ``domain``'s task (module docstring)."""
    from prour.env.domains import get_task

    criteria = get_task(domain, TASKS[domain]).evaluation_criteria
    n_actions = sum(1 for a in criteria.actions if a.requestor == "assistant")
    out, calls = Planned(), 0
    events = [("user", False)]  # the opening
    while True:
        index = len(out.turns)
        route = PLAN[domain][index] if index < len(PLAN[domain]) else "act"
        out.routes.append(route)
        turn = route if route in ENABLED[method] else "act"
        out.turns.append(turn)
        if turn == "clarify":
            events += [("agent", False), ("user", False)]
        elif calls < n_actions:
            events += [("agent", True), ("env", False)]
            calls += 1
        else:
            events += [("agent", False), ("user", False)]  # closing, the user's stop
            break
    if method in ("base", "oracle"):  # no router: no decisions recorded
        out.routes = []
    return _capped(out, events, cap)


def _capped(out: Planned, events: list[tuple[str, bool]], cap: int) -> Planned:
    """Cut the events as tau2's Orchestrator does: after a step not bound for the environment,
    ``cap`` steps end the episode."""
    for count, (speaker, to_env) in enumerate(events, start=1):
        out.events.append((speaker, to_env))
        if not to_env and count >= cap:
            out.termination = "max_steps"
            break
    agent_turns = sum(1 for speaker, _ in out.events if speaker == "agent")
    out.turns, out.routes = out.turns[:agent_turns], out.routes[:agent_turns]
    out.user_messages = sum(1 for speaker, _ in out.events if speaker == "user")
    return out


def planned_counts(planned: Planned) -> dict[str, int]:
    """Act / Clarify / Verify turns by the paper's definition: a verify decision is a verify and
    an act turn."""
    return {"act": sum(t != "clarify" for t in planned.turns),
            "clarify": planned.turns.count("clarify"), "verify": planned.turns.count("verify")}


def planned_calls(method: str, planned: Planned) -> dict[str, int]:
    """Model calls by ``role.kind`` the plan implies (K = 2 goals and 2 × 2 actions in two chat
    calls and one scoring call per decomposer decision; the verifier calls a tool, then answers)."""
    if method == "oracle":
        return {}
    decisions = len(planned.turns)
    asked = sum(t != "act" for t in planned.turns)
    calls = {"agent.chat": sum(t != "clarify" for t in planned.turns),
             "user.chat": planned.user_messages, "generator.chat": asked,
             "verifier.chat": 2 * planned.turns.count("verify")}
    if method in DECOMPOSER_METHODS:
        calls |= {"decomposer.chat": 2 * decisions, "decomposer.score": decisions}
    if method == "llm-router":
        calls["router.chat"] = decisions
    return {key: n for key, n in sorted(calls.items()) if n}


# ---- recomputation from a stored episode -----------------------------------------------------


def agent_turns(messages: list[dict]) -> list[str]:
    """clarify / verify / act per agent decision, read from the transcript: the question the
    generator writes is a clarify turn, a decision right after a verification note verified."""
    out, noted = [], False
    for message in messages:
        if message["role"] != "assistant" or message.get("content") == GREETING:
            continue
        text = message.get("content") or ""
        if text.startswith(NOTE):
            noted = True
            continue
        out.append("clarify" if text == CLARIFY_Q else "verify" if noted else "act")
        noted = False
    return out


def ending(messages: list[dict], cap: int = CAP) -> str:
    """How the transcript ended under ``cap``: tau2 checks the cap after every step that does not
    go to the environment (a user stop included), the stop tokens end it too."""
    steps, said = 0, talk(messages)
    for i, message in enumerate(said):
        if message["role"] != "tool" or i == 0 or said[i - 1]["role"] != "tool":
            steps += 1
        to_env = bool(message.get("tool_calls")) or (
            message["role"] == "tool" and i + 1 < len(said) and said[i + 1]["role"] == "tool")
        if not to_env and steps >= cap:
            assert i == len(said) - 1, f"the episode ran past the cap at message {i}"
            return "max_steps"
    assert STOP in (said[-1].get("content") or ""), "an uncut episode ends on the user's stop"
    return "user_stop"


def tau2_reward(domain: str, task_id: str, messages: list[dict], termination: str) -> float:
    """The episode re-scored by tau2's evaluators, combined over the task's basis as tau2's
    ``evaluate_simulation`` does (which imports an LLM client prour does not install)."""
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    from prour.env.domains import get_task

    if termination not in ("user_stop", "agent_stop"):
        return 0.0
    task = get_task(domain, task_id)
    trajectory = tau2_messages(messages)
    basis = {kind.value for kind in task.evaluation_criteria.reward_basis}
    reward = 1.0
    if basis & {"DB", "ENV_ASSERTION"}:
        environment = import_module(f"tau2.domains.{domain}.environment").get_environment
        reward *= EnvironmentEvaluator.calculate_reward(environment, task, trajectory).reward
    if "ACTION" in basis:
        reward *= ActionEvaluator.calculate_reward(task=task, full_trajectory=trajectory).reward
    if "COMMUNICATE" in basis:
        reward *= CommunicateEvaluator.calculate_reward(task=task,
                                                        full_trajectory=trajectory).reward
    return reward


def tau2_messages(messages: list[dict]) -> list:
    """The transcript as tau2 messages (OpenAI-format tool calls carry JSON arguments)."""
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    out = []
    for message in talk(messages):
        content = message.get("content") or None
        if message["role"] == "tool":
            out.append(ToolMessage(id=message["tool_call_id"], role="tool", content=content,
                                   requestor="assistant"))
        elif message["role"] == "user":
            out.append(UserMessage(role="user", content=content))
        else:
            calls = [ToolCall(id=c["id"], name=c["function"]["name"], requestor="assistant",
                              arguments=json.loads(c["function"]["arguments"]))
                     for c in message.get("tool_calls") or []]
            out.append(AssistantMessage(role="assistant", content=content,
                                        tool_calls=calls or None))
    return out


# ---- the run ---------------------------------------------------------------------------------


@dataclass
class Run:
    lines: dict[tuple[str, str], dict]  # (method, domain) -> result line
    episodes: dict[tuple[str, str], dict]  # (method, domain) -> stored episode
    report: dict
    markdown: str


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("recompute-eval")
    cfg = EvalConfig(methods=list(METHODS), seeds=[0], domains=list(TASKS),
                     tasks=[f"{d}:{t}" for d, t in TASKS.items()], concurrency=1, judge=False)
    router = RouterConfig(n_interpretations=2, n_actions=2, tau_au=TAU_AU, tau_eu=TAU_EU,
                          tool_detail="brief")
    recipe = Recipe(name="recompute-eval", env={"max_steps": CAP}, eval=cfg, router=router,
                    train={"rollout": {"max_response_tokens": 64}})
    builder = Builder(recipe, planned_llms(TASKS, PLAN))
    Evaluation(recipe, folder / "run", progress=False, builder=builder).run()
    shown = CliRunner().invoke(app, ["report", str(folder / "run"), "--out",
                                     str(folder / "report"), "--n-boot", str(N_BOOT)])
    assert shown.exit_code == 0, shown.output
    lines = {(x["method"], x["domain"]): x for x in _jsonl(folder / "run" / "results.jsonl")}
    episodes = {(x["agent"], x["domain"]): x for x in _jsonl(folder / "run" / "episodes.jsonl")}
    return Run(lines, episodes, json.loads((folder / "report" / "report.json").read_text()),
               (folder / "report" / "report.md").read_text())


CELLS = [(method, domain) for method in METHODS for domain in TASKS]


def test_the_run_holds_one_episode_per_method_and_domain(run):
    assert sorted(ENABLED) == sorted(METHODS)  # a new method needs its routes planned here
    assert sorted(run.lines) == sorted(run.episodes) == sorted(CELLS)
    assert all(line["seed"] == 0 and line["task_id"] == TASKS[line["domain"]]
               for line in run.lines.values())


@pytest.mark.parametrize("method, domain", CELLS)
def test_turns_steps_and_ending_recomputed_from_the_transcript(run, method, domain):
    line, messages = run.lines[method, domain], run.episodes[method, domain]["messages"]
    planned = planned_episode(method, domain)
    turns = agent_turns(messages)
    recounted = {"act": sum(t != "clarify" for t in turns), "clarify": turns.count("clarify"),
                 "verify": turns.count("verify")}
    assert turns == planned.turns  # which decisions asked, which verified
    assert line["steps"] == recounted == planned_counts(planned)
    assert line["tau2_steps"] == counted_steps(messages) == len(planned.events)
    assert line["termination"] == ending(messages) == planned.termination
    users = [m for m in talk(messages) if m["role"] == "user"]
    assert len(users) == planned.user_messages


@pytest.mark.parametrize("method, domain", CELLS)
def test_the_stored_reward_is_tau2s(run, method, domain):
    line, episode = run.lines[method, domain], run.episodes[method, domain]
    rescored = tau2_reward(domain, TASKS[domain], episode["messages"], ending(episode["messages"]))
    expected = 0.0 if planned_episode(method, domain).termination == "max_steps" else 1.0
    assert episode["reward"] == line["reward"] == rescored == expected
    assert line["success"] == (rescored == 1.0)


def test_the_rescoring_fails_a_transcript_without_its_write(run):
    # control: the re-scorer is no constant; dropping retail 33's address change fails the DB check
    messages = run.episodes["base", "retail"]["messages"]
    [write] = [i for i, m in enumerate(messages) if any(
        c["function"]["name"] == "modify_user_address" for c in m.get("tool_calls") or [])]
    assert messages[write + 1]["role"] == "tool"
    kept = messages[:write] + messages[write + 2:]
    assert tau2_reward("retail", TASKS["retail"], kept, "user_stop") == 0.0
    assert tau2_reward("retail", TASKS["retail"], messages, "user_stop") == 1.0


@pytest.mark.parametrize("method, domain", CELLS)
def test_routes_and_uncertainty_follow_the_plan(run, method, domain):
    planned = planned_episode(method, domain)
    decisions = run.lines[method, domain]["decisions"]
    assert [d["route"] for d in decisions] == planned.routes
    assert [d["step"] for d in decisions] == list(range(len(planned.routes)))
    for decision in decisions:
        if method in DECOMPOSER_METHODS:
            au, eu = expected_uncertainty(decision["route"])
            assert math.isclose(decision["au"], au, abs_tol=1e-9)
            assert math.isclose(decision["eu"], eu, abs_tol=1e-9)
        else:  # the LLM router names a mode, no uncertainty
            assert decision["au"] is None and decision["eu"] is None


@pytest.mark.parametrize("method, domain", CELLS)
def test_model_calls_per_decision(run, method, domain):
    line = run.lines[method, domain]
    expected = planned_calls(method, planned_episode(method, domain))
    assert line["model_calls"] == expected
    assert line["model_calls_total"] == sum(expected.values())
    if method in DECOMPOSER_METHODS:  # one goal call, one action call, one scoring pass
        decisions = len(agent_turns(run.episodes[method, domain]["messages"]))
        assert (line["model_calls"]["decomposer.chat"], line["model_calls"]["decomposer.score"]) \
            == (2 * decisions, decisions)


def _domain_mean(lines: list[dict], value) -> float:
    means = [sum(value(x) for x in lines if x["domain"] == d)
             / sum(1 for x in lines if x["domain"] == d) for d in TASKS]
    return sum(means) / len(means)


def test_report_aggregates_equal_a_recomputation_from_results(run):
    systems = {s["label"]: s for s in run.report["systems"]}
    assert sorted(systems) == sorted(METHODS)
    for method in METHODS:
        lines = [x for (m, _), x in run.lines.items() if m == method]
        system = systems[method]
        solved = {d: [float(x["reward"] >= 1.0 - 1e-6) for x in lines if x["domain"] == d]
                  for d in TASKS}  # one task per domain, seeds [0]: Pass@1 is the mean
        planned = {d: [0.0 if planned_episode(method, d).termination == "max_steps" else 1.0]
                   for d in TASKS}
        assert solved == planned
        for domain, values in solved.items():
            assert system["pass_at_1"][domain]["estimate"] == sum(values) / len(values)
        average = sum(sum(v) / len(v) for v in solved.values()) / len(solved)
        assert system["pass_at_1"]["average"]["estimate"] == pytest.approx(average, abs=1e-12)
        assert system["cut"] == sum(x["termination"] == "max_steps" for x in lines) \
            == sum(planned_episode(method, d).termination == "max_steps" for d in TASKS)
        assert system["episodes"] == len(lines) == len(TASKS)
        for kind in ("act", "clarify", "verify"):
            assert system["steps"][kind] == pytest.approx(
                _domain_mean(lines, lambda x, k=kind: x["steps"][k]), abs=1e-12)
        assert system["model_calls"] == pytest.approx(
            _domain_mean(lines, lambda x: x["model_calls_total"]), abs=1e-12)


def test_the_printed_report_shows_the_cut_episodes(run):
    section = run.markdown.split("## Pass@1 (%) and interaction cost")[1].split("\n## ")[0]
    rows = [[c.strip() for c in row.strip("|").split("|")]
            for row in section.splitlines() if row.startswith("| ")]
    header, body = rows[0], rows[2:]
    shown = {row[0]: int(row[header.index("Cut")]) for row in body}
    expected = {method: sum(planned_episode(method, d).termination == "max_steps" for d in TASKS)
                for method in METHODS}
    assert shown == expected
    assert expected == {"base": 0, "prour": 1, "clarify-only": 1, "verify-only": 0,
                        "llm-router": 1, "oracle": 0}
