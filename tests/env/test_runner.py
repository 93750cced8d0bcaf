"""The episode runner: bad tool calls become observations, the agent never sees the instruction,
telecom user tools stay on the user's side, failures are recorded, runs resume from JSONL."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from prour.config import EnvConfig
from prour.env.agents import AgentTurn, LLMAgent, OracleAgent, TaskView, build_agent
from prour.env.domains import get_task, load_tasks
from prour.env.prompts import greeting
from prour.env.runner import EpisodeJob, run_episode, run_episodes
from prour.env.trajectory import read_trajectories
from prour.env.users import LLMUser, OracleUser, ScriptedUser, build_user, flip_roles
from prour.llm.base import BackendError
from prour.llm.scripted import ScriptedLLM


def _observations(traj) -> list[str]:
    return [traj.messages[s.message_index]["content"] for s in traj.steps_of("tool_result")]


def test_bad_tool_calls_become_observations_and_the_episode_goes_on() -> None:
    replies = [
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": </tool_call>',
        '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_order_details", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_order_details", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W6390527"}}</tool_call>',
        "Your order is on its way.",
    ]
    agent = LLMAgent(ScriptedLLM(replies=replies), EnvConfig())
    user = ScriptedUser(["Where is my order #W6390527?", "###STOP###"])
    traj = run_episode("retail", get_task("retail", "5"), agent, user, limits=EnvConfig())
    observations = _observations(traj)
    assert observations[0].startswith("Error: malformed tool call: tool call is not valid JSON")
    assert observations[1] == "Error: Tool 'no_such_tool' not found."
    assert "missing 1 required positional argument: 'order_id'" in observations[2]
    assert observations[3].startswith("Error: malformed tool call:")
    assert json.loads(observations[4])["order_id"] == "#W6390527"
    results = traj.steps_of("tool_result")
    assert [s.executed for s in results] == [False, True, True, False, True]
    assert [s.is_error for s in results] == [True, True, True, True, False]
    assert traj.termination == "user_stop"
    assert traj.errors == []  # tau2's replay of the executed calls matched the recorded ones
    assert traj.reward == 0.0  # the task wanted a return, none was made
    last_agent = traj.messages[traj.steps_of("agent_message")[-1].message_index]
    assert last_agent["content"] == "Your order is on its way."


def test_too_many_tool_errors_end_the_episode() -> None:
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    agent = LLMAgent(ScriptedLLM(default=bad), EnvConfig())
    traj = run_episode("retail", get_task("retail", "5"), agent, ScriptedUser(["hi"]),
                       limits=EnvConfig(max_errors=3))
    assert traj.termination == "too_many_errors"
    assert len(traj.steps_of("tool_result")) == 3
    assert traj.reward == 0.0


CANARY = "CANARY-7f3a9 the secret instruction"


def test_the_agent_never_sees_the_instruction() -> None:
    task = get_task("retail", "5")
    instructions = task.user_scenario.instructions
    instructions.task_instructions += " " + CANARY
    instructions.reason_for_call += " " + CANARY
    task.user_scenario.persona = CANARY
    agent_llm = ScriptedLLM(
        replies=[
            '<tool_call>{"name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}</tool_call>',
            "Anything else?",
            "Goodbye.",
        ]
    )
    user_llm = ScriptedLLM(
        replies=["I want to return something.", "Yes, one more thing.", "###STOP###"]
    )
    env = EnvConfig()
    traj = run_episode("retail", task, LLMAgent(agent_llm, env), LLMUser(user_llm, env), limits=env)
    assert traj.termination == "user_stop"
    agent_inputs = [json.dumps([list(r.messages), r.tools]) for r in agent_llm.chat_log]
    assert len(agent_inputs) == 3
    assert all(CANARY not in text for text in agent_inputs)
    user_inputs = [json.dumps(list(r.messages)) for r in user_llm.chat_log]
    assert all(CANARY in text for text in user_inputs)  # the check can fail: the user does see it
    assert CANARY not in json.dumps(traj.messages)  # the user only paraphrases via its replies


class _Recorder:
    """Wraps an agent and keeps every message list it is given."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.model_name = inner, inner.name, None
        self.seen: list[list[dict]] = []

    def reset(self, domain: str, view: TaskView) -> str | None:
        assert not hasattr(view, "user_scenario") and not hasattr(view, "evaluation_criteria")
        return self.inner.reset(domain, view)

    def act(self, messages: list[dict], tools: list[dict]) -> AgentTurn:
        self.seen.append([dict(m) for m in messages])
        return self.inner.act(messages, tools)


def test_telecom_user_tools_stay_on_the_user_side() -> None:
    task = load_tasks("telecom", "test")[0]
    agent = _Recorder(OracleAgent())
    traj = run_episode("telecom", task, agent, OracleUser(), limits=EnvConfig(max_steps=200))
    assert traj.reward == 1.0
    user_calls = traj.steps_of("user_tool_call")
    assert len(user_calls) == sum(a.requestor == "user" for a in task.evaluation_criteria.actions)
    user_results = {s.tool_call_id for s in traj.steps_of("tool_result") if s.requestor == "user"}
    assert user_results
    for messages in agent.seen:
        assert all(m.get("tool_call_id") not in user_results for m in messages)
        assert all(not (m["role"] == "user" and m.get("tool_calls")) for m in messages)
    assert agent.seen[0][0]["role"] == "system"
    assert agent.seen[0][1] == {"role": "assistant", "content": greeting()}


def test_agent_notes_and_step_meta_are_recorded() -> None:
    class Noting:
        name, model_name = "noting", None

        def reset(self, domain: str, view: TaskView) -> str:
            return "system"

        def act(self, messages: list[dict], tools: list[dict]) -> AgentTurn:
            if any(m.get("content") == "evidence" for m in messages):
                return AgentTurn(content="###STOP###", meta={"route": "act"})
            return AgentTurn(
                content="Which order?",
                meta={"route": "clarify"},
                extra_messages=[{"role": "system", "content": "evidence"}],
            )

    seen_by_user: list[list[dict]] = []

    def reply(messages: list[dict]) -> str:
        seen_by_user.append(messages)
        return "order #1"

    traj = run_episode("retail", get_task("retail", "5"), Noting(), ScriptedUser(reply),
                       limits=EnvConfig())
    assert traj.termination == "agent_stop"
    assert [s.meta.get("route") for s in traj.steps_of("agent_message")] == [None, "clarify", "act"]
    assert len(traj.steps_of("agent_note")) == 1
    assert all(m.get("content") != "evidence" for ms in seen_by_user for m in ms)


def test_a_backend_failure_is_recorded_not_raised() -> None:
    class Broken:
        name = "scripted"

        def chat(self, requests):
            raise BackendError("server returned 500 three times")

    traj = run_episode("retail", get_task("retail", "5"), LLMAgent(Broken(), EnvConfig()),
                       ScriptedUser(["hi"]), limits=EnvConfig())
    assert traj.termination == "error"
    assert traj.reward is None
    assert "BackendError: server returned 500 three times" in traj.errors[0]


def test_step_records_carry_timings() -> None:
    traj = run_episode(
        "retail", get_task("retail", "5"), OracleAgent(), OracleUser(),
        limits=EnvConfig(max_steps=200)
    )
    starts = [s.started_s for s in traj.steps]
    assert starts == sorted(starts) and all(s.seconds >= 0 for s in traj.steps)
    assert traj.seconds >= starts[-1] > 0
    assert traj.split == "test" and traj.prompts_version
    assert [s.message_index for s in traj.steps] == list(range(1, len(traj.messages)))


def test_flip_roles_for_the_simulated_user() -> None:
    view = [
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "help"},
        {
            "role": "user",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "name": "t", "content": "ok"},
    ]
    flipped = flip_roles(view)
    assert [m["role"] for m in flipped] == ["user", "assistant", "assistant", "tool"]
    assert flipped[2]["tool_calls"][0]["id"] == "c"


def test_registries_suggest_names() -> None:
    with pytest.raises(
        ValueError, match="unknown agent 'oracel'; valid: llm, oracle. Did you mean 'oracle'"
    ):
        build_agent("oracel")
    with pytest.raises(ValueError, match="Did you mean 'scripted'"):
        build_user("scriptd")
    assert build_user("scripted", replies=["x"]).name == "scripted"


def _jobs(task_ids: list[str], built: list[str], seed: int = 0) -> list[EpisodeJob]:
    def make_agent(task_id: str):
        def build():
            built.append(task_id)
            return OracleAgent()

        return build

    return [
        EpisodeJob("retail", get_task("retail", t), "oracle", make_agent(t), OracleUser, seed=seed)
        for t in task_ids
    ]


def test_run_episodes_appends_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    built: list[str] = []
    first = run_episodes(
        _jobs(["5", "9", "12"], built), concurrency=3, out_path=out, progress=False,
        limits=EnvConfig(max_steps=200), retry_errors=False
    )
    assert [t.task_id for t in first] == ["5", "9", "12"]
    assert [t.reward for t in first] == [1.0, 1.0, 1.0]
    assert len(out.read_text().splitlines()) == 3
    again = run_episodes(
        _jobs(["5", "9", "12", "16"], built),
        concurrency=3,
        out_path=out,
        progress=False, limits=EnvConfig(max_steps=200), retry_errors=False
    )
    assert sorted(built) == ["12", "16", "5", "9"]  # only the new job ran the second time
    assert [t.task_id for t in again] == ["5", "9", "12", "16"]
    assert sorted(t.task_id for t in read_trajectories(out)) == ["12", "16", "5", "9"]


def test_one_failing_episode_does_not_stop_the_others(tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    lock = threading.Lock()
    calls: list[str] = []
    down = {"9"}  # tasks whose backend is down

    class Flaky:
        name, model_name = "oracle", None

        def reset(self, domain: str, view: TaskView) -> str:
            with lock:
                calls.append(view.task_id)
            if view.task_id in down:
                raise BackendError("connection closed")
            self.inner = OracleAgent()
            return self.inner.reset(domain, view)

        def act(self, messages, tools):
            return self.inner.act(messages, tools)

    def no_model():
        raise RuntimeError("no model")

    jobs = [
        EpisodeJob("retail", get_task("retail", t), "oracle", Flaky, OracleUser) for t in ("5", "9")
    ]
    jobs.append(EpisodeJob("retail", get_task("retail", "12"), "oracle", no_model, OracleUser))
    limits = EnvConfig(max_steps=200)
    trajs = run_episodes(jobs, concurrency=2, out_path=out, progress=False, limits=limits,
                         retry_errors=False)
    assert [t.termination for t in trajs] == ["user_stop", "error", "error"]
    assert trajs[0].reward == 1.0
    assert "BackendError: connection closed" in trajs[1].errors[0]
    assert "no model" in trajs[2].errors[0]
    assert len(read_trajectories(out)) == 3

    down.clear()
    run_episodes(jobs[:2], 2, out, progress=False, limits=limits, retry_errors=False)
    assert sorted(calls) == ["5", "9"]  # a plain resume keeps the stored error
    retried = run_episodes(jobs[:2], 2, out, progress=False, limits=limits, retry_errors=True)
    assert sorted(calls) == ["5", "9", "9"]  # only the errored episode ran again
    assert [t.reward for t in retried] == [1.0, 1.0]


def test_a_task_with_prior_history_starts_where_it_left_off() -> None:
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage
    from tau2.data_model.tasks import InitialState

    from prour.env.environment import execute_tool_call, make_env

    task = get_task("retail", "5")
    call = task.evaluation_criteria.actions[0]  # the reference lookup, replayed as prior history
    observation, _ = execute_tool_call(make_env("retail"), call.name, call.arguments)
    task.initial_state = InitialState(
        message_history=[
            AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
            UserMessage(role="user", content="I want to return something."),
            AssistantMessage(
                role="assistant",
                tool_calls=[ToolCall(id="h0", name=call.name, arguments=call.arguments)],
            ),
            ToolMessage(id="h0", role="tool", content=observation),
        ]
    )
    agent = _Recorder(OracleAgent())
    traj = run_episode("retail", task, agent, OracleUser(), limits=EnvConfig(max_steps=200))
    history = [s for s in traj.steps if s.initial]
    assert [s.kind for s in history] == [
        "agent_message",
        "user_message",
        "agent_tool_call",
        "tool_result",
    ]
    assert agent.seen[0][-1]["content"] == observation  # the agent moves first, after the result
    assert greeting() not in [m["content"] for m in traj.messages[len(history) + 1 :]]
    assert traj.reward == 1.0 and traj.errors == []
