"""The verifier: the responder for verify queries, a ReAct loop over the domain's READ tools only.

Read-only is enforced in code, not left to the prompt: only tools that tau2 marks
``ToolType.READ`` are offered and executed; any other requested tool (WRITE, GENERIC such as
``calculate`` or ``transfer_to_human_agents``, or an unknown name) is refused with an error
observation and recorded. The loop runs on a deep copy of the environment, so nothing it does
can reach the episode that tau2 scores, and the database hashes of both the copy and the
original are compared after the loop (a change raises :class:`ReadOnlyViolation`).
The final answer must pass :func:`prour.rollout.grounding.grounding`; otherwise it becomes
exactly ``insufficient evidence``.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prour.llm.base import LLM, ChatRequest, Completion, Message, ToolCall
from prour.llm.history import render_history
from prour.llm.meter import record
from prour.rollout.grounding import INSUFFICIENT, Evidence, ToolEvidence, grounding, is_insufficient
from prour.rollout.strict_user import responder_sampling

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.rewards import RewardConfig

logger = logging.getLogger(__name__)

VERIFIER_VERSION = "verifier-v1"

VERIFIER_SYSTEM = """\
You are a Verifier. You answer one question about the current state of a customer-service
conversation, using evidence only: never guess.

You may call READ-ONLY tools (listed below) to look things up, and you may use the conversation
and the policy. Tools that change anything are not available to you.

Rules for your final answer:
1. It must contain at least one piece of evidence:
   (a) the name of a tool you called together with the value it returned, for example
       get_order_details(order_id="#W0000000") returned status "pending";
   (b) a calculation written out with its inputs, for example
       "price 150 + 155 = 305 (both from get_flight_details)";
   (c) a word-for-word quotation of the policy in double quotes.
2. If you cannot get grounded evidence (the tool you need is missing, or the data is not there),
   your whole answer must be exactly: insufficient evidence
3. Do not speculate and do not invent values.
4. You have at most {max_steps} rounds of tool calls; after that, give your final answer.

Domain policy:
{policy}"""

VERIFIER_USER = """\
Conversation so far:
{history}

Question to verify:
{question}"""

FINAL_ROUND_NOTE = "You have used all your tool rounds. Give your final answer now, without tools."


class ReadOnlyViolation(RuntimeError):
    """The environment's database changed during verification (a READ tool mutated state)."""


@dataclass
class VerifierCall:
    """One tool call the verifier asked for, with what it got back."""

    name: str
    arguments: dict[str, Any]
    output: str
    error: bool = False
    refused: bool = False


@dataclass
class VerifierResult:
    """The verifier's reply to one query.

    ``answer`` is the grounded answer or exactly ``insufficient evidence`` ("" when ``failed``);
    ``evidence`` says which check passed; ``steps`` counts tool rounds; ``refused`` lists the
    names of refused (non-READ) tool requests; ``failed``/``error`` report a backend failure.
    """

    answer: str
    grounded: bool
    tool_calls: list[VerifierCall] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    steps: int = 0
    failed: bool = False
    error: str | None = None
    evidence: Evidence | None = None


@dataclass
class _Loop:
    """The running state of one query's ReAct loop."""

    question: str
    messages: list[Message]
    calls: list[VerifierCall] = field(default_factory=list)
    steps: int = 0
    result: VerifierResult | None = None


class Verifier:
    """Answers verify queries on a snapshot of a tau2 environment through READ tools only.

    The recipe's ``reward`` section sets its tool rounds (``verifier_max_steps``) and how it
    decodes (:func:`prour.rollout.strict_user.responder_sampling`).
    """

    def __init__(self, llm: LLM, domain: str, reward: RewardConfig, enable_thinking: bool = False):
        from prour.env.domains import domain_policy
        from prour.env.environment import read_only_tool_names, tool_schemas

        self.llm = llm
        self.domain = domain
        self.max_steps = reward.verifier_max_steps
        self.sampling = responder_sampling(reward)
        self.enable_thinking = enable_thinking
        self.allowed = set(read_only_tool_names(domain))
        self.schemas = [s for s in tool_schemas(domain) if _schema_name(s) in self.allowed]
        self.policy = domain_policy(domain)

    def messages(self, question: str, history: Sequence[Message] | str) -> list[Message]:
        """The opening chat messages of one query's loop."""
        text = history if isinstance(history, str) else render_history(history)
        return [
            {
                "role": "system",
                "content": VERIFIER_SYSTEM.format(max_steps=self.max_steps, policy=self.policy),
            },
            {
                "role": "user",
                "content": VERIFIER_USER.format(history=text, question=question.strip()),
            },
        ]

    def answer_many(
        self,
        questions: Sequence[str],
        history: Sequence[Message] | str,
        env: Any,
        copy_env: bool = True,
    ) -> list[VerifierResult]:
        """Verify each question against ``env`` (never modified); one batched chat call per round.

        ``copy_env=False`` skips the snapshot when the caller owns ``env`` privately (a copy it
        rebuilt for this purpose); the database hash is checked either way.
        """
        from prour.env.environment import db_hash

        before = db_hash(env)
        snapshot = copy.deepcopy(env) if copy_env else env
        context = history if isinstance(history, str) else render_history(history)
        loops = [_Loop(q, self.messages(q, history)) for q in questions]
        for round_index in range(self.max_steps + 1):
            active = [loop for loop in loops if loop.result is None]
            if not active:
                break
            self._round(active, snapshot, context, final=round_index == self.max_steps)
        self._check_unchanged(
            snapshot, before, "the verifier's snapshot" if copy_env else "the environment"
        )
        if copy_env:
            self._check_unchanged(env, before, "the original environment")
        return [loop.result for loop in loops]  # type: ignore[misc]

    def answer(
        self, question: str, history: Sequence[Message] | str, env: Any, copy_env: bool = True
    ) -> VerifierResult:
        """Verify one question (see :meth:`answer_many`)."""
        return self.answer_many([question], history, env, copy_env)[0]

    def _round(self, active: list[_Loop], env: Any, context: str, final: bool) -> None:
        """One batched model call for every unfinished loop, then tools or final answers."""
        requests = [self._request(loop, final) for loop in active]
        try:
            outputs = self.llm.chat(requests)
            if len(outputs) != len(requests):
                raise RuntimeError(
                    f"backend returned {len(outputs)} results for {len(requests)} requests"
                )
            record(len(requests), outputs)
        except Exception as exc:  # noqa: BLE001 - a responder failure: reported, never an answer
            logger.warning("verifier backend failed: %s", exc)
            record(len(requests))  # sent, and waited for: counted without tokens
            for loop in active:
                loop.result = self._failed(loop, f"{type(exc).__name__}: {exc}")
            return
        for loop, completions in zip(active, outputs):
            if not completions:
                loop.result = self._failed(loop, "backend returned no completion")
            elif completions[0].tool_calls and not final:
                self._run_tools(loop, completions[0], env)
            else:
                loop.result = self._finish(loop, completions[0], context)

    def _request(self, loop: _Loop, final: bool) -> ChatRequest:
        messages = loop.messages
        if final and self.max_steps > 0:
            messages = messages + [{"role": "user", "content": FINAL_ROUND_NOTE}]
        return ChatRequest(
            messages=messages,
            sampling=self.sampling,
            tools=None if final else self.schemas,
            enable_thinking=self.enable_thinking,
        )

    def _run_tools(self, loop: _Loop, completion: Completion, env: Any) -> None:
        """Execute (or refuse) each requested call and append the exchange to the loop's messages."""
        loop.steps += 1
        calls = [
            _with_id(call, f"verify_{loop.steps}_{i}")
            for i, call in enumerate(completion.tool_calls)
        ]
        loop.messages.append(
            {
                "role": "assistant",
                "content": completion.content or "",
                "tool_calls": [_openai_call(c) for c in calls],
            }
        )
        for call in calls:
            record = self._execute(call, env)
            loop.calls.append(record)
            loop.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": record.output,
                }
            )

    def _execute(self, call: ToolCall, env: Any) -> VerifierCall:
        """Run a READ tool on the snapshot; refuse anything else with an error observation."""
        from prour.env.environment import execute_tool_call

        if call.error:
            return VerifierCall(
                call.name, call.arguments, f"Error: malformed tool call: {call.error}", error=True
            )
        if call.name not in self.allowed:
            allowed = ", ".join(sorted(self.allowed))
            message = (
                f"Error: refused: {call.name!r} is not a read-only tool of the {self.domain} domain; "
                f"the verifier may only call: {allowed}"
            )
            logger.info("verifier refused tool %r", call.name)
            return VerifierCall(call.name, call.arguments, message, error=True, refused=True)
        output, is_error = execute_tool_call(env, call.name, call.arguments, call_id=call.id)
        return VerifierCall(call.name, call.arguments, output, error=is_error)

    def _finish(self, loop: _Loop, completion: Completion, context: str) -> VerifierResult:
        """Turn the final reply into a grounded answer or exactly ``insufficient evidence``."""
        answer = (completion.content or "").strip()
        if completion.tool_calls:
            logger.info("verifier still asked for tools after %d rounds; no answer", loop.steps)
            answer = ""
        evidence = [ToolEvidence(c.name, c.output) for c in loop.calls if not c.error]
        kind = grounding(answer, evidence, self.policy, context) if answer else None
        if kind is None and answer and not is_insufficient(answer):
            logger.info("verifier answer not grounded; replaced by %r", INSUFFICIENT)
        return VerifierResult(
            answer=answer if kind else INSUFFICIENT,
            grounded=kind is not None,
            tool_calls=loop.calls,
            refused=[c.name for c in loop.calls if c.refused],
            steps=loop.steps,
            evidence=kind,
        )

    def _failed(self, loop: _Loop, error: str) -> VerifierResult:
        return VerifierResult(
            answer="",
            grounded=False,
            tool_calls=loop.calls,
            refused=[c.name for c in loop.calls if c.refused],
            steps=loop.steps,
            failed=True,
            error=error,
        )

    @staticmethod
    def _check_unchanged(env: Any, before: str, what: str) -> None:
        from prour.env.environment import db_hash

        after = db_hash(env)
        if after != before:
            raise ReadOnlyViolation(
                f"database hash of {what} changed during verification ({before} -> {after}); "
                "a tool marked READ modified state"
            )


def _schema_name(schema: dict[str, Any]) -> str:
    return schema.get("function", schema).get("name", "")


def _with_id(call: ToolCall, fallback: str) -> ToolCall:
    if call.id:
        return call
    return ToolCall(
        name=call.name, arguments=call.arguments, id=fallback, raw=call.raw, error=call.error
    )


def _openai_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }


def environment_at(domain: str, task_id: str | None, history: Sequence[Message]) -> Any:
    """The tau2 environment at the end of ``history``: the task's initial state plus its tool calls,
    each replayed and checked against its recorded result (:class:`ToolReplay`)."""
    replay = ToolReplay(domain, task_id)
    replay.extend(history)
    return replay.env


class ToolReplay:
    """A task's tau2 environment onto which recorded tool traffic is replayed, in order.

    Each call is executed as its requestor (the user for a user message, else the agent) and each
    recorded tool result is compared with what its call returned on replay, so a history that does
    not belong to this task and domain is reported instead of silently verified. ``extend`` may be
    called again with later traffic: after ``replayed`` the environment is the one a fresh replay
    of ``replayed`` builds.
    """

    def __init__(self, domain: str, task_id: str | None):
        from prour.env.domains import get_task
        from prour.env.environment import make_env

        self.domain, self.task_id = domain, task_id
        self.env = make_env(domain, get_task(domain, task_id) if task_id is not None else None)
        self.replayed: list[Message] = []
        self._outputs: dict[Any, tuple[str, Any]] = {}  # call id -> (tool name, replayed output)

    def extends(self, history: Sequence[Message]) -> bool:
        """Whether ``history`` starts with the traffic replayed so far."""
        return list(history[: len(self.replayed)]) == self.replayed

    def extend(self, messages: Sequence[Message]) -> None:
        """Replay ``messages`` after the traffic replayed so far (ValueError: a differing result)."""
        from prour.env.environment import execute_tool_call

        for message in messages:
            if message.get("role") == "tool":
                self._check(message)
            requestor = "user" if message.get("role") == "user" else "assistant"
            for call in message.get("tool_calls") or []:
                fn = call.get("function", call)
                output, _ = execute_tool_call(
                    self.env, fn.get("name"), fn.get("arguments", {}), requestor, call.get("id", "")
                )
                self._outputs[call.get("id")] = (fn.get("name"), output)
            self.replayed.append(message)

    def _check(self, result: Message) -> None:
        """Compare a recorded tool result with its replayed call's output (results of calls not
        replayed here are not checked)."""
        call_id = result.get("tool_call_id")
        if call_id not in self._outputs:
            return
        name, output = self._outputs[call_id]
        if _json_or_text(result.get("content")) != _json_or_text(output):
            raise ValueError(
                f"replaying {name} (call {call_id!r}) of task {self.task_id!r} in "
                f"{self.domain} gave a different result than the history records"
            )


def _json_or_text(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return text
