"""The episode runner: task agent ↔ user simulator ↔ tau2 tools, recorded step by step and
scored with tau2's evaluator; plus concurrent, resumable runs appending episodes to a JSONL file.

A turn is one ``agent.act`` or ``user.respond`` call; tool calls in a turn run right away and their
observations go back to the caller, which takes another turn. The episode ends on a user stop
token, the agent stop token, ``max_steps`` steps or ``max_errors`` tool errors. Steps are counted
as tau2's Orchestrator counts them (:func:`~prour.env.trajectory.tau2_steps`: a turn is one step,
two when it made tool calls) and, as in tau2, the limits are checked after every turn, a stop
included; the limits are the recipe's ``env`` section's (by default tau2's). A failure of the
agent, the user or a backend ends the episode with termination ``error`` and is recorded; it never
escapes :func:`run_episode`.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from prour import interrupt
from prour.env.agents import Agent, AgentTurn, TaskView
from prour.env.domains import domain_policy, task_split
from prour.env.environment import (
    call_problem,
    execute_tool_call,
    make_env,
    tool_schemas,
    user_tool_schemas,
)
from prour.env.prompts import AGENT_STOP, PROMPTS_VERSION, greeting, prompts_hash
from prour.env.scoring import score_episode
from prour.env.trajectory import (
    StepRecord,
    Trajectory,
    agent_view,
    read_trajectories,
    tau2_steps,
    user_view,
)
from prour.env.users import UserSimulator, UserTurn, is_stop
from prour.files import append_jsonl
from prour.llm.base import Message, ToolCall

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

    from prour.config import EnvConfig

logger = logging.getLogger(__name__)

StepCallback = Callable[[StepRecord, Message], None]


class _Episode:
    """Mutable state of one running episode: environment, transcript, counters, clock."""

    def __init__(
        self,
        domain: str,
        task: Task,
        agent: Agent,
        user: UserSimulator,
        seed: int,
        split: str | None,
        on_step: StepCallback | None,
    ):
        self.domain, self.task, self.agent, self.user = domain, task, agent, user
        self.on_step = on_step
        self.clock = time.perf_counter()
        self.errors = 0
        self._ids = itertools.count()
        self.traj = Trajectory(
            domain=domain,
            task_id=task.id,
            split=split,
            seed=seed,
            agent=agent.name,
            user=user.name,
            agent_model=getattr(agent, "model_name", None),
            user_model=getattr(user, "model_name", None),
            prompts_version=PROMPTS_VERSION,
            prompts_hash=prompts_hash(),
            started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        self.env: Any = None

    def now(self) -> float:
        return time.perf_counter() - self.clock

    def record(self, message: Message, kind: str, began: float, **fields: Any) -> StepRecord:
        """Append a message and its step record; tell ``on_step``."""
        self.traj.messages.append(message)
        step = StepRecord(
            kind=kind,
            message_index=len(self.traj.messages) - 1,
            started_s=round(began, 6),
            seconds=round(self.now() - began, 6),
            **fields,
        )
        self.traj.steps.append(step)
        if self.on_step is not None:
            self.on_step(step, message)
        return step

    def start(self) -> str:
        """Environment, system prompt, prior history and greeting; returns the side to move."""
        self.env = make_env(self.domain, self.task)
        view = TaskView(
            domain=self.domain,
            task_id=self.task.id,
            policy=domain_policy(self.domain),
            tools=tuple(tool_schemas(self.domain)),
            seed=self.traj.seed,
            split=self.traj.split,
        )
        system = self.agent.reset(self.domain, view)
        bind = getattr(self.agent, "bind_environment", None)
        if callable(bind):  # agents that verify against the live state (e.g. the proactive one)
            bind(self.env)
        self.user.reset(self.domain, self.task, self.traj.seed)
        if system:
            self.traj.messages.append({"role": "system", "content": system})
        history = self.task.initial_state.message_history if self.task.initial_state else None
        if history:
            return self.replay_history(history)
        self.record(
            {"role": "assistant", "content": greeting()},
            "agent_message",
            self.now(),
            meta={"greeting": True},
        )
        return "user"

    def replay_history(self, history: list[Any]) -> str:
        """Record the task's prior messages (already applied to the environment by make_env)."""
        side = "user"
        for message in history:
            side = _record_tau2_message(self, message)
        return side

    def tool_message(
        self,
        calls: Sequence[ToolCall],
        content: str,
        requestor: str,
        began: float,
        meta: dict[str, Any],
    ) -> None:
        """Record a tool-calling message, then run every call and record the observations."""
        ids = [f"call_{next(self._ids)}" for _ in calls]
        role = "assistant" if requestor == "assistant" else "user"
        message = {
            "role": role,
            "content": content or "",
            "tool_calls": [_openai_call(call, call_id) for call, call_id in zip(calls, ids)],
        }
        kind = "agent_tool_call" if requestor == "assistant" else "user_tool_call"
        self.record(message, kind, began, requestor=requestor, meta=meta)
        for call, call_id in zip(calls, ids):
            self.run_call(call, call_id, requestor)

    def run_call(self, call: ToolCall, call_id: str, requestor: str) -> None:
        began = self.now()
        problem = call.error or call_problem(call.name, call.arguments)
        if problem is not None:
            observation, is_error, executed = f"Error: malformed tool call: {problem}", True, False
        else:
            observation, is_error = execute_tool_call(
                self.env, call.name, call.arguments, requestor=requestor, call_id=call_id
            )
            executed = True
        self.errors += int(is_error)
        message = {
            "role": "tool",
            "tool_call_id": call_id,
            "name": call.name,
            "content": observation,
        }
        self.record(
            message,
            "tool_result",
            began,
            requestor=requestor,
            tool_name=call.name,
            tool_call_id=call_id,
            is_error=is_error,
            executed=executed,
        )

    def agent_step(self) -> str:
        """One agent turn; returns the side to move next or a termination."""
        began = self.now()
        turn: AgentTurn = self.agent.act(
            agent_view(self.traj.messages, self.traj.steps), tool_schemas(self.domain)
        )
        for extra in turn.extra_messages:
            self.record(dict(extra), "agent_note", began)
        meta = _with_reasoning(turn.meta, turn.reasoning)
        if turn.tool_calls:
            self.tool_message(turn.tool_calls, turn.content, "assistant", began, meta)
            return "agent"
        self.record(
            {"role": "assistant", "content": turn.content or ""}, "agent_message", began, meta=meta
        )
        return "agent_stop" if AGENT_STOP in (turn.content or "") else "user"

    def user_step(self) -> str:
        """One user turn; returns the side to move next or a termination."""
        began = self.now()
        turn: UserTurn = self.user.respond(
            user_view(self.traj.messages, self.traj.steps), user_tool_schemas(self.domain)
        )
        meta = _with_reasoning(turn.meta, turn.reasoning)
        if turn.tool_calls:
            self.tool_message(turn.tool_calls, turn.content, "user", began, meta)
            return "user"
        self.record(
            {"role": "user", "content": turn.content or ""}, "user_message", began, meta=meta
        )
        return "user_stop" if is_stop(turn.content) else "agent"

    def loop(self, side: str, max_steps: int, max_errors: int) -> str:
        """Alternate turns until a stop token or a limit; returns the termination reason.

        As in tau2's ``Orchestrator.run``, the limits are checked after every turn (once its tool
        results are in), a stop turn included, and too many errors wins over too many steps."""
        while side in ("agent", "user"):
            side = self.agent_step() if side == "agent" else self.user_step()
            self.env.sync_tools()
            if self.errors >= max_errors:
                return "too_many_errors"
            if tau2_steps(self.traj.steps) >= max_steps:
                return "max_steps"
        return side


def _with_reasoning(meta: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    return {**meta, "reasoning": reasoning} if reasoning else dict(meta)


def _openai_call(call: ToolCall, call_id: str) -> dict[str, Any]:
    """A tool call in OpenAI format. A malformed call keeps its raw text, JSON-quoted, so that
    the arguments field is still valid JSON for servers that parse it."""
    if call.error is None and isinstance(call.arguments, dict):
        arguments = json.dumps(call.arguments, ensure_ascii=False)
    else:
        arguments = json.dumps(call.raw or "", ensure_ascii=False)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _record_tau2_message(episode: _Episode, message: Any) -> str:
    """Record one message of a task's prior history (tau2 format); returns the side to move."""
    began = episode.now()
    if message.role == "tool":
        names = {
            c["id"]: c["function"]["name"]
            for m in episode.traj.messages
            for c in m.get("tool_calls") or []
        }
        name = names.get(message.id, "")
        episode.record(
            {
                "role": "tool",
                "tool_call_id": message.id,
                "name": name,
                "content": message.content or "",
            },
            "tool_result",
            began,
            initial=True,
            requestor=message.requestor,
            tool_name=name,
            tool_call_id=message.id,
            is_error=message.error,
        )
        return "agent" if message.requestor == "assistant" else "user"
    role = "assistant" if message.role == "assistant" else "user"
    record: Message = {"role": role, "content": message.content or ""}
    if message.tool_calls:
        record["tool_calls"] = [
            _openai_call(ToolCall(name=c.name, arguments=c.arguments), c.id)
            for c in message.tool_calls
        ]
        kind = "agent_tool_call" if role == "assistant" else "user_tool_call"
        episode.record(record, kind, began, initial=True, requestor=role)
        return "pending"
    kind = "agent_message" if role == "assistant" else "user_message"
    episode.record(record, kind, began, initial=True)
    return "user" if role == "assistant" else "agent"


def run_episode(
    domain: str,
    task: Task,
    agent: Agent,
    user: UserSimulator,
    *,
    limits: EnvConfig,
    seed: int = 0,
    on_step: StepCallback | None = None,
    split: str | None = None,
) -> Trajectory:
    """Run one episode and score it; failures end it with termination ``error``, never raise.
    ``limits``: the recipe's ``env`` section, whose ``max_steps`` and ``max_errors`` cut it."""
    episode = _Episode(
        domain, task, agent, user, seed, split or task_split(domain, task.id), on_step
    )
    traj = episode.traj
    try:
        side = episode.start()
        if side == "pending":
            raise ValueError(f"task {task.id}: its message history ends with unanswered tool calls")
        traj.termination = episode.loop(side, limits.max_steps, limits.max_errors)
    except Exception as exc:  # noqa: BLE001 - recorded in the trajectory, the run goes on
        traj.termination = "error"
        traj.errors.append(_describe(exc))
        logger.warning("episode %s/%s (seed %d) failed: %s", domain, task.id, seed, exc)
    traj.seconds = round(episode.now(), 6)
    traj.meta.update(getattr(agent, "episode_meta", dict)())  # optional agent-wrapper hook
    if traj.termination != "error":
        _score(traj, domain, task)
    return traj


def _score(traj: Trajectory, domain: str, task: Task) -> None:
    try:
        traj.reward, traj.reward_breakdown = score_episode(domain, task, traj)
    except Exception as exc:  # noqa: BLE001 - a scoring failure is recorded, not raised
        traj.errors.append("scoring failed: " + _describe(exc))
        logger.warning("scoring %s/%s failed: %s", domain, task.id, exc)


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    place = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{place}"


@dataclass
class EpisodeJob:
    """One episode to run: a task, how to build a fresh agent and user for it, and a seed."""

    domain: str
    task: Task
    agent_name: str
    make_agent: Callable[[], Agent]
    make_user: Callable[[], UserSimulator]
    seed: int = 0
    split: str | None = None

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.domain, self.task.id, self.seed, self.agent_name)


def run_job(job: EpisodeJob, limits: EnvConfig) -> Trajectory:
    """Run a job; even a failure to build its agent or user comes back as a trajectory. After a
    SIGINT/SIGTERM a queued job does not start (:class:`prour.interrupt.Stopping`)."""
    interrupt.check()
    try:
        agent, user = job.make_agent(), job.make_user()
    except Exception as exc:  # noqa: BLE001
        traj = Trajectory(
            domain=job.domain,
            task_id=job.task.id,
            split=job.split,
            seed=job.seed,
            agent=job.agent_name,
            user="?",
            termination="error",
            prompts_version=PROMPTS_VERSION,
            prompts_hash=prompts_hash(),
        )
        traj.errors.append("building the agent or user failed: " + _describe(exc))
        return traj
    traj = run_episode(
        job.domain,
        job.task,
        agent,
        user,
        limits=limits,
        seed=job.seed,
        split=job.split,
    )
    traj.agent = job.agent_name
    return traj


def stored_episodes(out_path: Path | None, retry_errors: bool) -> dict[tuple, Trajectory]:
    """Episodes already in the output file, by key (errored ones left out if retrying)."""
    if out_path is None or not out_path.exists():
        return {}
    stored = read_trajectories(out_path, on_error="skip")
    if stored.skipped:
        logger.warning(
            "%s: %d corrupt line(s) ignored (lines %s); their episodes will rerun",
            out_path,
            len(stored.skipped),
            stored.skipped,
        )
    return {t.key: t for t in stored if not (retry_errors and t.termination == "error")}


def run_episodes(
    jobs: Iterable[EpisodeJob],
    concurrency: int,
    out_path: str | Path | None = None,
    progress: bool = True,
    *,
    limits: EnvConfig,
    retry_errors: bool,
) -> list[Trajectory]:
    """Run jobs on a thread pool, append each finished episode to ``out_path`` at once, and skip
    jobs whose key is already stored there (resume; ``retry_errors`` runs errored ones again).
    Returns trajectories in job order; ``limits`` is the recipe's ``env`` section."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    jobs = list(jobs)
    path = Path(out_path) if out_path is not None else None
    results = stored_episodes(path, retry_errors)
    todo = list({job.key: job for job in jobs if job.key not in results}.values())
    logger.info("%d episode(s) to run, %d already stored", len(todo), len(jobs) - len(todo))
    with ThreadPoolExecutor(max_workers=concurrency) as pool, _Progress(len(todo), progress) as bar:
        futures = [pool.submit(run_job, job, limits) for job in todo]
        try:
            for future in as_completed(futures):
                traj = future.result()
                if path is not None:
                    append_jsonl(path, traj)
                results[traj.key] = traj
                bar.advance(traj)
        except BaseException:  # a signal: drop queued episodes; running ones end at their next
            # request (prour.interrupt.Stopping), their partial work is not saved
            for future in futures:
                future.cancel()
            raise
    return [results[job.key] for job in jobs]


class TooManyErrors(RuntimeError):
    """More than the allowed share of a run's episodes ended in an error (``eval`` and
    ``collect`` alike: such a run measured or collected nothing worth keeping)."""


def first_error(errors: Sequence[str] | None) -> str:
    """The first error of an errored episode, on one line (what the episode died of)."""
    text = " ".join(str((errors or ["(no message recorded)"])[0]).split())
    return text if len(text) <= 300 else text[:297] + "..."


def check_error_share(errors: Sequence[Sequence[str] | None], max_fraction: float, key: str,
                      rerun: str) -> None:
    """Raise :class:`TooManyErrors` when more than ``max_fraction`` of the episodes errored.

    ``errors`` has one entry per episode of the run: its error messages when it errored, None
    when it did not. The message names the share, the setting (``key``), the most common error
    and what a rerun of the same command does (``rerun``)."""
    errored = [first_error(found) for found in errors if found is not None]
    if not errors or len(errored) <= max_fraction * len(errors):
        return
    cause, count = Counter(errored).most_common(1)[0]
    raise TooManyErrors(
        f"{len(errored)} of {len(errors)} episodes ended in an error "
        f"({len(errored) / len(errors):.0%}, more than {key}={max_fraction:g}); "
        f"most common ({count} of {len(errored)}): {cause}. Fix the cause and rerun the same "
        f"command: {rerun}")


class _Progress:
    """A rich progress bar with the running mean reward, or nothing when disabled."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled and total > 0
        self.rewards: list[float] = []

    def __enter__(self) -> Self:
        if self.enabled:
            from rich.progress import Progress

            self._bar = Progress(transient=False)
            self._bar.start()
            self._task = self._bar.add_task("episodes", total=self.total)
        return self

    def advance(self, traj: Trajectory) -> None:
        if traj.reward is not None:
            self.rewards.append(traj.reward)
        if self.enabled:
            mean = sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")
            self._bar.update(
                self._task, advance=1, description=f"episodes (mean reward {mean:.3f})"
            )

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._bar.stop()
