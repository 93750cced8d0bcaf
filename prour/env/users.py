"""User simulators: the protocol, the standard LLM user (tau2's UserSimulator prompt), a scripted
user for tests, the oracle user that performs a task's user-side reference actions, and a
registry by name.

A user simulator knows the task (its scenario is the user's instruction). It sees the dialogue
from its side: the agent's text messages, its own messages, its own tool calls and their
results; it never sees the agent's tool calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prour.env.agents import SeededChat
from prour.env.environment import user_tool_schemas
from prour.env.prompts import USER_STOP, USER_STOP_TOKENS, user_system_prompt
from prour.llm.base import LLM, Message, SamplingParams, ToolCall
from prour.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

    from prour.config import EnvConfig


@dataclass
class UserTurn:
    """One user step: calls to the user's own tools, or a text message to the agent."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    reasoning: str | None = None

    @property
    def is_stop(self) -> bool:
        """True when a text message carries one of the stop tokens."""
        return not self.tool_calls and is_stop(self.content)


def is_stop(text: str) -> bool:
    """Whether a user message ends the conversation (stop, transfer or out-of-scope token)."""
    return any(token in (text or "") for token in USER_STOP_TOKENS)


@runtime_checkable
class UserSimulator(Protocol):
    """What the episode runner needs from a user simulator."""

    name: str
    model_name: str | None

    def reset(self, domain: str, task: Task, seed: int = 0) -> None:
        """Start an episode of ``task`` (the user may read its scenario and ground truth)."""
        ...

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> UserTurn:
        """Next user step given the user's view of the dialogue."""
        ...


def flip_roles(messages: Sequence[Message]) -> list[Message]:
    """The user's view as a chat for an LLM playing the user: the agent becomes ``user`` and the
    simulated user becomes ``assistant``; the user's tool calls and results keep their form."""
    flipped: list[Message] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            flipped.append({"role": "user", "content": message.get("content") or ""})
        elif role == "user":
            turn: Message = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                turn["tool_calls"] = message["tool_calls"]
            flipped.append(turn)
        elif role == "tool":
            flipped.append(dict(message))
    return flipped


# The guarded regime (env.user_regime: guarded), in our words: tau2's simulated customer, told
# to hold back what the agent has not asked for, so that what the task leaves unsaid reaches the
# agent only through its questions.
GUARDED_GUIDELINES = """\
## How much to volunteer
Answer what the agent asks, and only that. Do not offer details from your instructions that the
agent has not asked about, and do not list everything you want at once: wait for the agent's
questions. When a question is vague, ask the agent what exactly it needs instead of guessing."""


class LLMUser(SeededChat):
    """The standard simulated customer, prompted as tau2's UserSimulator (its guidelines, the tool
    guidelines when the domain gives the user tools, then ``str(task.user_scenario)``); it stops
    on tau2's stop tokens and decodes as the recipe's ``env`` section says (``user_temperature``,
    ``user_max_tokens``). Under ``env.user_regime: guarded`` the prompt ends with
    :data:`GUARDED_GUIDELINES`, after the scenario."""

    name = "llm"

    def __init__(self, llm: LLM, env: EnvConfig, enable_thinking: bool = False):
        sampling = SamplingParams(temperature=env.user_temperature, max_tokens=env.user_max_tokens)
        super().__init__(llm, sampling, enable_thinking)
        self.system_prompt = ""
        self.guarded = env.user_regime == "guarded"

    def reset(self, domain: str, task: Task, seed: int = 0) -> None:
        with_tools = bool(user_tool_schemas(domain))
        self.system_prompt = user_system_prompt(str(task.user_scenario), with_tools)
        if self.guarded:
            self.system_prompt = f"{self.system_prompt}\n\n{GUARDED_GUIDELINES}"
        self.restart(seed)

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> UserTurn:
        chat = [{"role": "system", "content": self.system_prompt}, *flip_roles(messages)]
        completion = self.complete(chat, tools)
        meta = {"finish_reason": completion.finish_reason}
        return UserTurn(
            content=completion.content,
            tool_calls=list(completion.tool_calls),
            meta=meta,
            reasoning=completion.reasoning,
        )


Reply = str | UserTurn


class ScriptedUser:
    """A test user: replies from a list (then the stop token) or from ``reply(messages)``."""

    name = "scripted"
    model_name = None

    def __init__(self, replies: Sequence[Reply] | Callable[[list[Message]], Reply] = ()):
        self._script = replies
        self._queue: list[Reply] = []

    def reset(self, domain: str, task: Task, seed: int = 0) -> None:
        self._queue = [] if callable(self._script) else list(self._script)

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> UserTurn:
        if callable(self._script):
            reply = self._script(messages)
        else:
            reply = self._queue.pop(0) if self._queue else USER_STOP
        return reply if isinstance(reply, UserTurn) else UserTurn(content=reply)


class OracleUser:
    """Harness user for oracle replays: opens the conversation, runs its next user-side reference
    action (or those of ``actions``) when the agent names it, reports back, and stops once the
    agent asks for nothing more."""

    name = "oracle"
    model_name = None
    OPENING = "Hello, I need some help, please."
    DONE = "Done."

    def __init__(self, actions: Sequence[Any] | None = None) -> None:
        self._given = list(actions) if actions is not None else None
        self._pending: list[Any] = []

    def reset(self, domain: str, task: Task, seed: int = 0) -> None:
        if self._given is not None:
            actions = self._given
        else:
            criteria = task.evaluation_criteria
            actions = list(criteria.actions or []) if criteria else []
        self._pending = [action for action in actions if action.requestor == "user"]

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> UserTurn:
        if not any(message.get("role") == "user" for message in messages):
            return UserTurn(content=self.OPENING)
        last = messages[-1]
        if last.get("role") == "tool":
            return UserTurn(content=self.DONE)
        text = last.get("content") or ""
        if self._pending and f"`{self._pending[0].name}`" in text:
            action = self._pending.pop(0)
            call = ToolCall(name=action.name, arguments=dict(action.arguments))
            return UserTurn(tool_calls=[call], meta={"oracle_action": action.action_id})
        return UserTurn(content=USER_STOP)


UserFactory = Callable[..., UserSimulator]
USERS: Registry[UserFactory] = Registry(
    "user", {"llm": LLMUser, "scripted": ScriptedUser, "oracle": OracleUser}
)


def register_user(name: str, factory: UserFactory) -> None:
    """Make a user simulator buildable by name."""
    USERS.register(name, factory)


def build_user(name: str, **kwargs: Any) -> UserSimulator:
    """Build a registered user simulator; unknown names list the valid ones."""
    return USERS.get(name)(**kwargs)
