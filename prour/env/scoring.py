"""Score an episode offline with tau2's own per-check evaluators, combined over the task's basis.

tau2's ``evaluate_simulation`` imports its LLM stack; prour calls the three offline evaluators
(``EnvironmentEvaluator``, ``ActionEvaluator``, ``CommunicateEvaluator``) directly and multiplies
the checks named in the task's ``reward_basis``, as tau2 does. Natural-language assertions need
an LLM judge: a task whose basis includes them gets ``reward=None`` and the check listed under
``not_evaluated`` instead of an invented value (``prour nl-assertions`` judges them later,
:mod:`prour.eval.nl_judge`), except when the task lists no assertion: tau2's
``NLAssertionsEvaluator`` then scores the check 1 without calling a model, and so does this.
A registered domain with a scoring function of its own (:mod:`prour.env.plugins`) is scored by
it instead, once the episode ended normally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prour.env.domains import domain_scorer, require_tau2
from prour.env.environment import environment_constructor, parse_arguments
from prour.env.trajectory import NORMAL_ENDINGS, StepRecord, Trajectory

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

ENV_CHECKS = ("DB", "ENV_ASSERTION")


def score_episode(
    domain: str, task: Task, trajectory: Trajectory
) -> tuple[float | None, dict[str, Any]]:
    """``(reward, breakdown)`` of an episode by tau2's offline evaluators (0 if it ended early)."""
    if trajectory.termination not in NORMAL_ENDINGS:
        note = f"episode ended early ({trajectory.termination}); tau2 scores that 0"
        return 0.0, {"note": note}
    scorer = domain_scorer(domain)
    if scorer is not None:
        return scorer(task, trajectory)
    criteria = task.evaluation_criteria
    if criteria is None:
        return 1.0, {"note": "the task has no evaluation criteria"}
    basis = [kind.value for kind in criteria.reward_basis]
    messages = to_tau2_messages(trajectory)
    checks: dict[str, float] = {}
    failed: list[str] = []
    if set(basis) & set(ENV_CHECKS):
        _env_checks(domain, task, messages, checks, failed)
    if "ACTION" in basis:
        _action_check(task, messages, checks, failed)
    if "COMMUNICATE" in basis:
        _communicate_check(task, messages, checks, failed)
    if "NL_ASSERTION" in basis and not criteria.nl_assertions:
        checks["NL_ASSERTION"] = 1.0  # tau2: no assertion to judge scores 1, no model asked
    not_evaluated = [kind for kind in basis if kind == "NL_ASSERTION" and kind not in checks]
    reward = None if not_evaluated else combine_checks(basis, checks)
    breakdown = {"basis": basis, "checks": checks, "failed": failed, "not_evaluated": not_evaluated}
    return reward, breakdown


def combine_checks(basis: list[str], checks: dict[str, float]) -> float:
    """The episode's reward from its checks: the product over the kinds of the task's reward
    basis, as tau2's ``evaluate_simulation`` multiplies them; a kind that tau2's evaluator gave
    no value (an environment check of a task with no reference action) counts 1, as there."""
    reward = 1.0
    for kind in basis:
        if kind in checks:
            reward *= checks[kind]
    return reward


def _env_checks(domain: str, task: Task, messages: list[Any], checks: dict, failed: list) -> None:
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    info = EnvironmentEvaluator.calculate_reward(
        environment_constructor=environment_constructor(domain),
        task=task,
        full_trajectory=messages,
    )
    for kind, value in (info.reward_breakdown or {}).items():
        checks[getattr(kind, "value", kind)] = float(value)
    if info.db_check is not None and not info.db_check.db_match and "DB" in checks:
        failed.append("DB: the final database differs from the reference one")
    for check in info.env_assertions or []:
        if not check.met:
            call = check.env_assertion
            failed.append(
                f"ENV_ASSERTION: {call.env_type}.{call.func_name}({call.arguments}) failed"
            )


def _action_check(task: Task, messages: list[Any], checks: dict, failed: list) -> None:
    from tau2.evaluator.evaluator_action import ActionEvaluator

    info = ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
    checks["ACTION"] = float(info.reward)
    for check in info.action_checks or []:
        if not check.action_match:
            failed.append(f"ACTION: {check.action.action_id} ({check.action.name}) not taken")


def _communicate_check(task: Task, messages: list[Any], checks: dict, failed: list) -> None:
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
    checks["COMMUNICATE"] = float(info.reward)
    for check in info.communicate_checks or []:
        if not check.met:
            failed.append(f"COMMUNICATE: {check.info!r} never told to the user")


def to_tau2_messages(trajectory: Trajectory) -> list[Any]:
    """The transcript as tau2 messages for its evaluator.

    The system prompt and agent notes are left out, and so are tool calls that never reached the
    environment (malformed ones) with their observations: tau2 replays every call it is given and
    expects the recorded observation back.
    """
    return [message for _, message in tau2_message_steps(trajectory)]


def tau2_message_steps(trajectory: Trajectory) -> list[tuple[StepRecord, Any]]:
    """:func:`to_tau2_messages` with the step each message comes from (its timing)."""
    require_tau2()
    executed = {
        step.tool_call_id
        for step in trajectory.steps
        if step.kind == "tool_result" and step.executed
    }
    out: list[tuple[StepRecord, Any]] = []
    for step in trajectory.steps:
        message = trajectory.messages[step.message_index]
        converted = _convert(step, message, executed)
        if converted is not None:
            out.append((step, converted))
    return out


def _convert(step: StepRecord, message: dict[str, Any], executed: set[str | None]) -> Any:
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage

    content = message.get("content") or None
    if step.kind == "tool_result":
        if not step.executed:
            return None
        return ToolMessage(
            id=step.tool_call_id or "",
            role="tool",
            content=message.get("content"),
            requestor=step.requestor or "assistant",
            error=step.is_error,
        )
    if step.kind in ("agent_message", "user_message"):
        if step.kind == "agent_message":
            return AssistantMessage(role="assistant", content=content)
        return UserMessage(role="user", content=content)
    if step.kind in ("agent_tool_call", "user_tool_call"):
        requestor = "assistant" if step.kind == "agent_tool_call" else "user"
        calls = _tau2_calls(message, executed, requestor)
        if not calls and content is None:
            return None
        cls = AssistantMessage if requestor == "assistant" else UserMessage
        return cls(role=requestor, content=content, tool_calls=calls or None)
    return None  # agent notes


def _tau2_calls(message: dict[str, Any], executed: set[str | None], requestor: str) -> list[Any]:
    from tau2.data_model.message import ToolCall

    calls = []
    for call in message.get("tool_calls") or []:
        if call.get("id") not in executed:
            continue
        function = call.get("function", {})
        calls.append(
            ToolCall(
                id=call["id"],
                name=function.get("name", ""),
                arguments=parse_arguments(function.get("arguments", {})),
                requestor=requestor,
            )
        )
    return calls
