"""The proactive agent on real tau2 tasks with scripted models (CPU, seconds).

Routes come from the real decomposer: the scripted world (eval_world.py) makes its goal readings
and candidate scores such that AU/EU, computed by prour's own maths, cross the thresholds in a
known order; the expected AU/EU are computed by hand in ``expected_uncertainty``.
"""

from __future__ import annotations

import math

import pytest
from eval_world import (
    CLARIFY_ANSWER,
    CLARIFY_Q,
    SOLVABLE,
    TAU_AU,
    TAU_EU,
    VERIFY_Q,
    expected_uncertainty,
    generator_llm,
    scripted_llms,
)

from prour.build import Builder
from prour.config import EnvConfig, Recipe
from prour.config.router import RouterConfig
from prour.env.domains import get_task
from prour.env.runner import run_episode
from prour.env.scoring import to_tau2_messages
from prour.env.trajectory import Trajectory, user_view
from prour.eval.agent import (
    EVIDENCE_PREFIX,
    ProactiveAgent,
    QueryGenerator,
    RouteChoice,
    turn_labels,
)
from prour.eval.kit import MethodKit
from prour.router.routing import DecomposerBudget

RETAIL_OK = SOLVABLE["retail"][1]
SHORT_GENERATOR = Recipe(name="agent-test", train={"rollout": {"max_response_tokens": 64}})


def _kit(**router: object) -> tuple[MethodKit, dict]:
    llms = scripted_llms()
    cfg = RouterConfig(n_interpretations=2, n_actions=2, tau_au=TAU_AU, tau_eu=TAU_EU,
                       tool_detail="brief", **router)
    recipe = SHORT_GENERATOR.model_copy(update={"router": cfg})
    return MethodKit(Builder(recipe, llms)), llms


def _run(kit: MethodKit, method: str, domain: str = "retail", task: str = RETAIL_OK,
         seed: int = 0) -> Trajectory:
    agent = kit.agent_factory(method, domain, None)()
    user = kit.user_factory(method)()
    return run_episode(domain, get_task(domain, task), agent, user, seed=seed,
                       limits=EnvConfig(max_steps=16))


def _agent_steps(traj: Trajectory) -> list:
    return [s for s in traj.steps if s.kind in ("agent_message", "agent_tool_call")
            and not s.meta.get("greeting")]


@pytest.fixture(scope="module")
def prour_episode() -> Trajectory:
    kit, _ = _kit()
    return _run(kit, "prour")


def test_prour_routes_clarify_then_verify_then_act(prour_episode: Trajectory) -> None:
    traj = prour_episode
    assert traj.termination == "user_stop" and traj.reward == 1.0
    assert turn_labels(traj) == ["clarify", "verify", "act", "act", "act"]
    routes = [s.meta["route"] for s in _agent_steps(traj)]
    assert routes == ["clarify", "verify", "act", "act"]
    for step, state in zip(_agent_steps(traj), ("clarify", "verify", "act")):
        au, eu = expected_uncertainty(state)
        decision = step.meta["decision"]
        assert decision["au"] == pytest.approx(au, abs=1e-9)
        assert decision["eu"] == pytest.approx(eu, abs=1e-9)
        assert decision["total"] == pytest.approx(au + eu, abs=1e-9)
    assert expected_uncertainty("clarify")[0] >= TAU_AU > expected_uncertainty("verify")[0]
    assert expected_uncertainty("verify")[1] >= TAU_EU


def test_clarify_question_reaches_the_user_and_the_answer_comes_back(
        prour_episode: Trajectory) -> None:
    traj = prour_episode
    ask = next(s for s in _agent_steps(traj) if s.meta.get("turn") == "clarify")
    assert traj.messages[ask.message_index] == {"role": "assistant", "content": CLARIFY_Q}
    assert ask.meta["query"] == {"mode": "clarify", "kind": "ask", "question": CLARIFY_Q,
                                 "reason": None}
    reply = traj.steps[traj.steps.index(ask) + 1]
    assert reply.kind == "user_message"
    assert traj.messages[reply.message_index]["content"] == CLARIFY_ANSWER
    seen_by_user = user_view(traj.messages, traj.steps)
    assert {"role": "assistant", "content": CLARIFY_Q} in seen_by_user


def test_verification_evidence_is_for_the_agent_only(prour_episode: Trajectory) -> None:
    traj = prour_episode
    notes = [s for s in traj.steps if s.kind == "agent_note"]
    assert len(notes) == 1
    note = traj.messages[notes[0].message_index]["content"]
    assert note.startswith(EVIDENCE_PREFIX) and VERIFY_Q in note
    verified = next(s for s in _agent_steps(traj) if "verify" in s.meta)
    record = verified.meta["verify"]
    assert record["grounded"] and record["tools"] == ["list_all_product_types"]
    assert record["answer"] in note
    assert not any(EVIDENCE_PREFIX in (m.get("content") or "")
                   for m in user_view(traj.messages, traj.steps))
    assert not any(EVIDENCE_PREFIX in (m.content or "") for m in to_tau2_messages(traj))


def test_model_calls_are_recorded_per_step(prour_episode: Trajectory) -> None:
    first = _agent_steps(prour_episode)[0]
    # one decision: goals (1 chat) + actions (1 batched chat) + 1 batched score; then the generator
    assert first.meta["model_calls"] == {"decomposer.chat": 2, "decomposer.score": 1,
                                         "generator.chat": 1}
    verified = _agent_steps(prour_episode)[1]
    assert verified.meta["model_calls"]["verifier.chat"] == 2  # one tool round + the answer
    assert verified.meta["model_calls"]["agent.chat"] == 1
    users = [s for s in prour_episode.steps if s.kind == "user_message"]
    assert all(s.meta["model_calls"] == {"user.chat": 1} for s in users)


@pytest.mark.parametrize(("method", "labels"), [
    ("clarify-only", ["clarify", "act", "act", "act"]),
    ("verify-only", ["act", "verify", "act"]),
    ("llm-router", ["clarify", "verify", "act", "act", "act"]),
    ("base", ["act", "act", "act"]),
])
def test_methods_use_only_their_branches(method: str, labels: list[str]) -> None:
    kit, _ = _kit()
    traj = _run(kit, method)
    assert traj.termination == "user_stop"
    assert turn_labels(traj) == labels
    disabled = [s for s in _agent_steps(traj) if s.meta.get("disabled")]
    if method == "clarify-only":
        assert disabled and all(s.meta["route"] == "verify" for s in disabled)
    if method == "verify-only":
        assert disabled and all(s.meta["route"] == "clarify" for s in disabled)
    if method == "llm-router":
        assert all(s.meta["decision"]["router"] == "llm" for s in _agent_steps(traj))


@pytest.mark.parametrize(("reply", "kind"), [("NO", "none"), ("yes [question]x", "invalid"),
                                              ("<think>unfinished", "invalid")])
def test_generator_no_or_invalid_falls_back_to_act(reply: str, kind: str) -> None:
    kit, llms = _kit()
    llms["generator"] = generator_llm(clarify=reply, verify=reply)
    kit = MethodKit(Builder(kit.builder.recipe, llms))
    traj = _run(kit, "prour")
    assert set(turn_labels(traj)) == {"act"}
    first = _agent_steps(traj)[0]
    assert first.meta["route"] == "clarify" and first.meta["query"]["kind"] == kind
    assert not any(s.kind == "agent_note" for s in traj.steps)


class CountingRouter:
    """Always routes clarify; counts how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def choose(self, messages: list, seed: int) -> RouteChoice:
        self.calls += 1
        return RouteChoice("clarify", {"router": "test", "route": "clarify"})


@pytest.mark.parametrize(("every_n", "budget", "expected"), [(2, None, [0, 2, 4]),
                                                             (1, 2, [0, 1])])
def test_decomposer_budget_and_frequency(every_n: int, budget: int | None,
                                         expected: list[int]) -> None:
    kit, llms = _kit()
    router = CountingRouter()
    generator = QueryGenerator(llms["generator"], temperature=0.0, max_tokens=64,
                               enable_thinking=True)
    task_agent = kit.builder.task_agent()
    agent = ProactiveAgent(task_agent, router, generator, routes=("act", "clarify"),
                           new_budget=lambda: DecomposerBudget(budget, every_n))
    user = kit.user_factory("base")()
    traj = run_episode("retail", get_task("retail", RETAIL_OK), agent, user,
                       limits=EnvConfig(max_steps=12))
    steps = _agent_steps(traj)
    routed = [i for i, s in enumerate(steps) if not s.meta["decision"].get("skipped")]
    asked = [i for i, s in enumerate(steps) if s.meta["turn"] == "clarify"]
    assert routed == [i for i in expected if i < len(steps)]
    assert router.calls == len(routed) and asked == routed
    assert all(s.meta["route"] == "act" for i, s in enumerate(steps) if i not in routed)


def test_verifier_rebuilds_the_state_without_the_runner_hook() -> None:
    """Without ``bind_environment`` the verifier replays the agent's view on a fresh env."""
    kit, _ = _kit()
    agent = kit.agent_factory("verify-only", "retail", None)()
    assert hasattr(agent, "bind_environment")
    agent.bind_environment = None  # type: ignore[assignment]  # as if the runner had no hook
    traj = run_episode("retail", get_task("retail", RETAIL_OK), agent,
                       kit.user_factory("verify-only")(), limits=EnvConfig(max_steps=16))
    record = next(s.meta["verify"] for s in _agent_steps(traj) if "verify" in s.meta)
    assert record["grounded"] and not record["failed"]
    assert math.isclose(traj.reward, 1.0)


@pytest.mark.parametrize(("eval_temperature", "expected"), [(0.0, 0.0), (None, 0.6)])
def test_the_generator_decodes_as_in_training_but_for_its_temperature(
        eval_temperature: float | None, expected: float) -> None:
    """Length and thinking are train.rollout's; eval.generator_temperature None is training's."""
    recipe = Recipe(name="decoding", router={"tau_au": TAU_AU, "tau_eu": TAU_EU},
                    train={"rollout": {"temperature": 0.6, "max_response_tokens": 77,
                                       "enable_thinking": False}},
                    eval={"generator_temperature": eval_temperature})
    agent = MethodKit(Builder(recipe, scripted_llms())).agent_factory("clarify-only", "retail",
                                                                      None)()
    generator = agent.inner.generator
    assert (generator.temperature, generator.max_tokens, generator.enable_thinking) == (
        expected, 77, False)
