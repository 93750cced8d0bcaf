"""Task agents: the protocol the episode runner drives, the standard LLM tool-calling agent, the
oracle that replays a task's reference actions, and a registry by name.

An agent step is one call, ``act(messages, tools) -> AgentTurn``, that receives the agent's whole
view of the dialogue; a wrapper (e.g. the proactive agent deciding to clarify, verify or act)
replaces that one call and may return extra annotated messages and step annotations.
A task agent only ever gets a :class:`TaskView`: the policy, the tools, ids and the seed, never
the user's instruction or the reference actions (the oracle, a harness check, looks those up).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prour.env.domains import get_task
from prour.env.prompts import AGENT_STOP, agent_system_prompt
from prour.llm.base import LLM, ChatRequest, Completion, Message, SamplingParams, ToolCall
from prour.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Action

    from prour.config import EnvConfig


@dataclass(frozen=True)
class TaskView:
    """All a task agent may know about its task."""

    domain: str
    task_id: str
    policy: str
    tools: tuple[dict[str, Any], ...] = ()
    seed: int = 0
    split: str | None = None  # the split the task was drawn from (its version of the task)


@dataclass
class AgentTurn:
    """One agent step: tool calls, or a text reply to the user when there are none.

    ``extra_messages`` are appended to the transcript before this turn's own message and are seen
    by the agent only (recorded as ``agent_note`` steps); ``meta`` is stored on the step record.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    extra_messages: list[Message] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    reasoning: str | None = None

    @property
    def is_tool_call(self) -> bool:
        return bool(self.tool_calls)


@runtime_checkable
class Agent(Protocol):
    """What the episode runner needs from a task agent."""

    name: str
    model_name: str | None

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        """Start an episode; return the system prompt to record as the first message (or None)."""
        ...

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        """Next step given the agent's view of the dialogue (system prompt first)."""
        ...


def model_label(llm: Any) -> str | None:
    """What a trajectory records as the model: the served name or path, else the backend name."""
    for attribute in ("model", "path", "name"):
        value = getattr(llm, attribute, None)
        if isinstance(value, str) and value:
            return value
    return None


class SeededChat:
    """One model's side of an episode: fixed decoding, and a seed per call derived from the
    episode seed and the call's index, so an episode replays exactly (task agent, user).

    ``sampling`` holds the decoding a recipe section sets (its ``seed`` is replaced per call).
    """

    def __init__(self, llm: LLM, sampling: SamplingParams, enable_thinking: bool = False):
        self.llm = llm
        self.model_name: str | None = model_label(llm)
        self.sampling = sampling
        self.enable_thinking = enable_thinking
        self._seed = 0
        self._calls = 0

    def restart(self, seed: int) -> None:
        """A new episode: calls are seeded from ``seed`` again."""
        self._seed, self._calls = seed, 0

    def request(self, messages: list[Message], tools: list[dict[str, Any]], seed: int,
                n: int, temperature: float | None) -> ChatRequest:
        """The chat request of this side's decoding on stream ``seed``, with ``tools`` offered:
        ``n`` samples at ``temperature`` (None: this side's own)."""
        changes: dict[str, Any] = {"seed": seed, "n": n}
        if temperature is not None:
            changes["temperature"] = temperature
        return ChatRequest(messages=list(messages), sampling=replace(self.sampling, **changes),
                           tools=list(tools) or None, enable_thinking=self.enable_thinking)

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> Completion:
        """One reply to ``messages`` with ``tools`` offered, on this call's seeded stream."""
        request = self.request(messages, tools, self._seed * 1000 + self._calls, n=1,
                               temperature=None)
        self._calls += 1
        return self.llm.chat([request])[0][0]


class LLMAgent(SeededChat):
    """The standard tool-calling agent, prompted as tau2's LLMAgent (its system prompt over the
    domain policy; the tools' OpenAI schemas in tau2's order, via the chat template); it decodes
    as the recipe's ``env`` section says (``agent_temperature``, ``agent_max_tokens``)."""

    name = "llm"

    def __init__(self, llm: LLM, env: EnvConfig, enable_thinking: bool = False):
        sampling = SamplingParams(temperature=env.agent_temperature,
                                  max_tokens=env.agent_max_tokens)
        super().__init__(llm, sampling, enable_thinking)

    def reset(self, domain: str, task_view: TaskView) -> str:
        self.restart(task_view.seed)
        return agent_system_prompt(task_view.policy)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        completion = self.complete(messages, tools)
        meta = {
            "finish_reason": completion.finish_reason,
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
        }
        return AgentTurn(
            content=completion.content,
            tool_calls=list(completion.tool_calls),
            meta=meta,
            reasoning=completion.reasoning,
        )


class OracleAgent:
    """Replays a task's reference actions in order, then reports and ends (a harness check).

    Its own (assistant) actions become tool calls; a user-side action becomes a message asking
    the user to perform it (the ``oracle`` user does). The last message carries the facts the
    task expects the agent to tell the user; after it the oracle sends the agent stop token.
    """

    name = "oracle"
    model_name = None

    def __init__(self, actions: list[Action] | None = None, communicate: list[str] | None = None):
        self._given = (list(actions), list(communicate or [])) if actions is not None else None
        self._queue: list[Action] = []
        self._communicate: list[str] = []
        self._final_sent = False

    def reset(self, domain: str, task_view: TaskView) -> str:
        if self._given is not None:
            actions, communicate = self._given
        else:
            criteria = get_task(domain, task_view.task_id, task_view.split).evaluation_criteria
            actions = list(criteria.actions or []) if criteria else []
            communicate = list(criteria.communicate_info or []) if criteria else []
        self._queue = list(actions)
        self._communicate = communicate
        self._final_sent = False
        return agent_system_prompt(task_view.policy)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        if self._queue:
            action = self._queue.pop(0)
            meta = {"oracle_action": action.action_id}
            if action.requestor == "assistant":
                call = ToolCall(name=action.name, arguments=dict(action.arguments))
                return AgentTurn(tool_calls=[call], meta=meta)
            return AgentTurn(content=user_action_request(action.name, action.arguments), meta=meta)
        if not self._final_sent:
            self._final_sent = True
            return AgentTurn(content=_closing_message(self._communicate))
        return AgentTurn(content=AGENT_STOP)


def user_action_request(name: str, arguments: dict[str, Any]) -> str:
    """The oracle's request that the user run one of their own tools."""
    args = json.dumps(arguments, sort_keys=True)
    return f"Please do this on your side: `{name}` with arguments {args}."


def _closing_message(facts: list[str]) -> str:
    text = "Everything you asked for has been taken care of."
    if facts:
        text += " For your records: " + "; ".join(facts) + "."
    return text


AgentFactory = Callable[..., Agent]
AGENTS: Registry[AgentFactory] = Registry("agent", {"llm": LLMAgent, "oracle": OracleAgent})


def register_agent(name: str, factory: AgentFactory) -> None:
    """Make an agent buildable by name (e.g. the proactive agent of the eval stage)."""
    AGENTS.register(name, factory)


def build_agent(name: str, **kwargs: Any) -> Agent:
    """Build a registered agent; unknown names list the valid ones."""
    return AGENTS.get(name)(**kwargs)
