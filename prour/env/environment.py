"""Fresh tau2 environments per episode, tool schemas and types, tool execution that never raises.

A tool call goes through tau2's own ``Environment.get_response`` so that its observation is exactly
what tau2's evaluator gets when it replays the episode; calls that cannot reach tau2 at all (no
name, arguments that are not a JSON object, a parse error) get an observation in tau2's
``Error: ...`` style instead and are marked as not executed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from prour.env.domains import check_domain, require_tau2, tau2_environment

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment

Requestor = Literal["assistant", "user"]


def new_environment(domain: str, solo_mode: bool = False) -> Environment:
    """A fresh tau2 Environment in the domain's default state (the constructor tau2's evaluator
    calls, hence ``solo_mode``)."""
    if solo_mode:
        raise ValueError("prour does not run tau2's solo mode")
    return tau2_environment(domain)


def environment_constructor(domain: str) -> Callable[..., Environment]:
    """A zero-argument constructor (accepting tau2's ``solo_mode`` keyword) for the evaluator."""
    check_domain(domain)
    return functools.partial(new_environment, domain)


def make_env(domain: str, task: Task | None = None) -> Environment:
    """A fresh environment with the task's initial state applied (data, actions, prior messages)."""
    env = new_environment(domain)
    state = task.initial_state if task is not None else None
    if state is not None:
        env.set_state(
            initialization_data=state.initialization_data,
            initialization_actions=state.initialization_actions,
            message_history=list(state.message_history or []),
        )
    return env


@functools.cache
def _reference_env(domain: str) -> Environment:
    """One default environment per domain, used only to read tool definitions (never stepped)."""
    return new_environment(domain)


def _toolkit(domain: str, requestor: Requestor) -> Any:
    env = _reference_env(domain)
    return env.tools if requestor == "assistant" else env.user_tools


@functools.cache
def _schemas(domain: str, requestor: Requestor) -> tuple[str, ...]:
    toolkit = _toolkit(domain, requestor)
    if toolkit is None:
        return ()
    # tau2's order (Environment.get_tools): the order tau2's LLMAgent offers the tools in.
    return tuple(json.dumps(tool.openai_schema) for tool in toolkit.get_tools().values())


def tool_schemas(domain: str, requestor: Requestor = "assistant") -> list[dict[str, Any]]:
    """OpenAI function schemas of the agent's tools (``requestor="user"``: the user's tools), in
    tau2's order, as tau2's LLMAgent and UserSimulator get them."""
    return [json.loads(text) for text in _schemas(domain, requestor)]


def user_tool_schemas(domain: str) -> list[dict[str, Any]]:
    """OpenAI function schemas of the user-side tools (telecom's device); empty elsewhere."""
    return tool_schemas(domain, "user")


@functools.cache
def _types(domain: str, requestor: Requestor) -> tuple[tuple[str, str], ...]:
    require_tau2()
    from tau2.environment.toolkit import get_tool_types

    toolkit = _toolkit(domain, requestor)
    if toolkit is None:
        return ()
    return tuple(sorted((name, kind.value) for name, kind in get_tool_types(toolkit).items()))


def tool_types(domain: str, requestor: Requestor = "assistant") -> dict[str, str]:
    """Tool name → tau2 ToolType value (``read``, ``write``, ``think``, ``generic``)."""
    return dict(_types(domain, requestor))


def read_only_tool_names(domain: str, requestor: Requestor = "assistant") -> set[str]:
    """Names of the tools tau2 marks ``ToolType.READ``: the verifier's whole toolset."""
    return {name for name, kind in _types(domain, requestor) if kind == "read"}


def call_problem(name: Any, arguments: Any) -> str | None:
    """Why a call cannot be handed to tau2 (None if it can); unknown names are tau2's to report."""
    if not isinstance(name, str) or not name.strip():
        return "the tool call has no tool name"
    if not isinstance(arguments, dict):
        return (
            f"the arguments of tool '{name}' must be a JSON object, got {type(arguments).__name__}"
        )
    return None


def parse_arguments(arguments: Any) -> Any:
    """Arguments as given, a JSON string decoded (an undecodable string is returned unchanged)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def execute_tool_call(
    env: Environment,
    name: Any,
    arguments: Any,
    requestor: Requestor = "assistant",
    call_id: str = "",
) -> tuple[str, bool]:
    """Run one tool call; returns ``(observation, is_error)`` and never raises for a bad call."""
    arguments = parse_arguments(arguments)
    problem = call_problem(name, arguments)
    if problem is not None:
        return f"Error: {problem}", True
    require_tau2()
    from tau2.data_model.message import ToolCall

    call = ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor)
    message = env.get_response(call)
    content = message.content if message.content is not None else ""
    return content, bool(message.error)


def db_hash(env: Environment) -> str:
    """One hash of the agent-side and user-side databases (equal hashes: equal states)."""
    parts = f"{env.get_db_hash()}|{env.get_user_db_hash()}"
    return hashlib.sha256(parts.encode()).hexdigest()
