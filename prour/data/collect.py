"""Trajectory collection (paper A.2.1): task agent + teacher query generator + user simulator.

After every agent tool call a *teacher* query generator reads the dialogue (clarify template) and
may ask the user one follow-up question. The question goes to the user as an ordinary agent
message, the user simulator answers it in its next turn, and the exchange (Q_t, A_t) stays in the
transcript as messages and in the step meta (``teacher_query`` on the question, ``teacher_answer``
on the answer). The teacher only enriches the histories: its questions are never training targets.

The teacher is a wrapper around the runner's agent hook (``Agent.act``) plus a thin user wrapper
that labels the answer; both share one :class:`TeacherSession` per episode. Episodes run through
:func:`prour.env.runner.run_episodes`: concurrent, appended one JSONL line each as they finish.
A rerun skips the (domain, task, seed, agent) keys already stored and runs the errored ones again;
before and after a run the file is compacted to one line per key (a retry's record in place of
the errored one) and a last line torn by a crash is repaired (:func:`compact_trajectories`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.env.agents import Agent, AgentTurn, TaskView
from prour.env.runner import EpisodeJob, check_error_share, run_episodes
from prour.env.trajectory import JsonlRecords, Trajectory, read_trajectories
from prour.env.users import UserSimulator, UserTurn
from prour.files import write_atomic
from prour.llm.base import LLM, ChatRequest, Message, SamplingParams
from prour.rollout.query import PROMPTS_VERSION as QUERY_PROMPTS_VERSION
from prour.rollout.query import parse_query, query_prompt

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

log = logging.getLogger(__name__)

AGENT_NAME = "teacher-collect"
"""Recorded as ``Trajectory.agent``: part of the resume key of collected episodes."""


@dataclass
class TeacherSession:
    """Per-episode state shared by the teacher agent wrapper and the user wrapper."""

    pending: str | None = None  # question sent to the user and not yet answered
    asked: int = 0  # questions asked so far in this episode
    consulted_at: set[int] = field(default_factory=set)  # view lengths already consulted


class TeacherAgent:
    """Wraps a task agent: after each of its tool calls, a teacher may ask the user one question."""

    def __init__(self, inner: Agent, teacher: LLM, session: TeacherSession, cfg: DataConfig):
        self.inner, self.teacher, self.session, self.cfg = inner, teacher, session, cfg
        self.name = AGENT_NAME
        self.model_name = inner.model_name
        self.teacher_model = getattr(teacher, "name", None)
        self._seed = 0

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.session.pending, self.session.asked = None, 0
        self.session.consulted_at.clear()
        self._seed = task_view.seed
        return self.inner.reset(domain, task_view)

    def episode_meta(self) -> dict[str, Any]:
        """Stored in ``Trajectory.meta`` by the runner: who the teacher was and how often it asked."""
        return {"teacher": {"model": self.teacher_model, "prompts_version": QUERY_PROMPTS_VERSION,
                            "questions": self.session.asked,
                            "max_questions": self.cfg.teacher_max_questions}}

    def _due(self, messages: list[Message]) -> bool:
        """A tool result ends the view, this point was not consulted yet, the cap is not reached."""
        cap = self.cfg.teacher_max_questions
        return (
            bool(messages) and messages[-1].get("role") == "tool"
            and len(messages) not in self.session.consulted_at
            and (cap is None or self.session.asked < cap)
        )

    def consult(self, messages: list[Message]) -> dict[str, Any]:
        """Ask the teacher (clarify template, dialogue only) whether to ask the user something."""
        self.session.consulted_at.add(len(messages))
        request = ChatRequest(
            messages=query_prompt("clarify", messages),
            sampling=SamplingParams(temperature=self.cfg.teacher_temperature,
                                    max_tokens=self.cfg.teacher_max_tokens,
                                    seed=self._seed * 1000 + len(messages)),
            enable_thinking=self.cfg.teacher_thinking,
        )
        text = self.teacher.chat([request])[0][0].text
        parsed = parse_query(text)
        return {"decision": parsed.kind, "question": parsed.question, "invalid": parsed.reason,
                "model": self.teacher_model, "prompts_version": QUERY_PROMPTS_VERSION}

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        if not self._due(messages):
            return self.inner.act(messages, tools)
        verdict = self.consult(messages)
        if verdict["decision"] == "ask":
            self.session.pending = verdict["question"]
            self.session.asked += 1
            return AgentTurn(content=verdict["question"], meta={"teacher_query": verdict})
        turn = self.inner.act(messages, tools)
        turn.meta = {**turn.meta, "teacher": verdict}
        return turn


class TeacherAwareUser:
    """Wraps a user simulator and labels its reply to a pending teacher question as A_t."""

    def __init__(self, inner: UserSimulator, session: TeacherSession):
        self.inner, self.session = inner, session
        self.name = inner.name
        self.model_name = inner.model_name

    def reset(self, domain: str, task: Task, seed: int = 0) -> None:
        self.inner.reset(domain, task, seed)

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> UserTurn:
        turn = self.inner.respond(messages, tools)
        question = self.session.pending
        last = messages[-1] if messages else {}
        if question is not None and last.get("role") == "assistant" and last.get("content") == question:
            turn.meta = {**turn.meta, "teacher_answer": {"question": question}}
            if not turn.tool_calls:
                self.session.pending = None
        return turn


@dataclass
class EpisodeFactories:
    """Builds a fresh (agent, user) pair per episode sharing one teacher session."""

    make_agent: Callable[[], Agent]
    make_user: Callable[[], UserSimulator]
    teacher: LLM | None
    cfg: DataConfig

    def pair(self) -> tuple[Callable[[], Agent], Callable[[], UserSimulator]]:
        """Two zero-argument builders for one job; the session is made once, on first use."""
        holder: dict[str, TeacherSession] = {}

        def session() -> TeacherSession:
            return holder.setdefault("session", TeacherSession())

        def agent() -> Agent:
            inner = self.make_agent()
            if self.teacher is None or not self.cfg.teacher:
                return inner
            return TeacherAgent(inner, self.teacher, session(), self.cfg)

        def user() -> UserSimulator:
            return TeacherAwareUser(self.make_user(), session())

        return agent, user


def episodes_problem(n_tasks: int, cfg: DataConfig) -> str | None:
    """Why ``n_tasks`` tasks under ``data.trial_seeds`` cannot give ``data.num_trajectories``
    episodes (None: they can). :func:`plan_episodes` raises it; ``prour validate`` names it
    before collect starts (:mod:`prour.recipe_checks`)."""
    capacity = n_tasks * len(cfg.trial_seeds)
    if capacity < cfg.num_trajectories:
        return (f"data.num_trajectories={cfg.num_trajectories} needs more episodes than "
                f"{n_tasks} tasks x {len(cfg.trial_seeds)} data.trial_seeds = {capacity}; "
                "add seeds to data.trial_seeds")
    return None


def plan_episodes(tasks: Sequence[Task], cfg: DataConfig) -> list[tuple[Task, int]]:
    """(task, seed) pairs, seed-major, cut at ``num_trajectories`` (same list on every rerun)."""
    problem = episodes_problem(len(tasks), cfg)
    if problem:
        raise ValueError(problem)
    plan = [(task, seed) for seed in cfg.trial_seeds for task in tasks]
    return plan[: cfg.num_trajectories]


def collect_trajectories(
    tasks: Sequence[Task],
    factories: EpisodeFactories,
    cfg: DataConfig,
    out_path: str | Path,
    *,
    limits: EnvConfig,
    progress: bool = True,
    notify: Callable[[str], None] = log.warning,
) -> list[Trajectory]:
    """Run the planned episodes missing from ``out_path`` or errored there, and return them all;
    the recipe's ``env`` section (``limits``) cuts each episode. What resuming repaired in the
    file (a torn last line) is told to ``notify``."""
    out_path = Path(out_path)
    for note in compact_trajectories(out_path).notes:
        notify(note)
    jobs = []
    for task, seed in plan_episodes(tasks, cfg):
        make_agent, make_user = factories.pair()
        jobs.append(EpisodeJob(domain=cfg.domain, task=task, agent_name=AGENT_NAME,
                               make_agent=make_agent, make_user=make_user, seed=seed,
                               split=cfg.split))
    log.info("collect: %d episode(s) planned into %s", len(jobs), out_path)
    trajectories = run_episodes(jobs, cfg.concurrency, out_path, progress, limits=limits,
                                retry_errors=True)
    replaced = compact_trajectories(out_path).superseded
    if replaced:
        log.info("collect: %d errored record(s) in %s replaced by their retries", replaced, out_path)
    return trajectories


def check_collection(trajectories: Sequence[Trajectory], cfg: DataConfig) -> None:
    """Raise :class:`~prour.env.runner.TooManyErrors` when more than ``data.max_error_fraction``
    of the planned episodes ended in an error (eval's rule, shared)."""
    errors = [t.errors if t.termination == "error" else None for t in trajectories]
    check_error_share(errors, cfg.max_error_fraction, "data.max_error_fraction",
                      "it runs the errored episodes again and keeps the others")


@dataclass
class Compaction:
    """What :func:`compact_trajectories` did: lines to tell the user, records replaced."""

    notes: list[str] = field(default_factory=list)
    superseded: int = 0  # earlier records of a key dropped for its later one


def _record(raw: bytes) -> dict[str, Any] | None:
    """A stored episode line as its JSON object, None when the line is not an episode record."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not {"domain", "task_id", "agent"} <= record.keys():
        return None
    return record


def _key_of(record: dict[str, Any]) -> tuple[str, str, int, str]:
    """The resume key of a stored episode record (``Trajectory.key``)."""
    return (record["domain"], str(record["task_id"]), record.get("seed", 0), record["agent"])


def _record_key(raw: bytes) -> tuple[str, str, int, str] | None:
    """The resume key of a stored episode line (None when the line is not one)."""
    record = _record(raw)
    return None if record is None else _key_of(record)


def stored_episodes(path: str | Path) -> tuple[int, int]:
    """(episodes, errored) in a trajectories file, one per key (a key's last record counts); what
    the stage table reads to tell a finished collection from a failed one."""
    errored: dict[tuple, bool] = {}
    try:
        with open(path, "rb") as handle:
            for raw in handle:
                record = _record(raw)
                if record is not None:
                    errored[_key_of(record)] = record.get("termination") == "error"
    except FileNotFoundError:
        return 0, 0
    return len(errored), sum(errored.values())


def _torn(raw: bytes) -> bool:
    """Whether a line is the start of a record cut short (a crash mid-write), not a whole one."""
    if not raw.lstrip().startswith(b"{"):
        return False
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return True
    return False


def compact_trajectories(path: str | Path) -> Compaction:
    """Rewrite ``path`` atomically with one line per episode key, or leave it when it has one.

    A key's last record replaces its first in that first one's place (a retry stands where the
    errored episode stood). A record cut short by a crash mid-write is removed (its episode runs
    again): the last line, or one an older prour appended after; a whole last record that lacks
    its newline gets it. Other unreadable lines are kept as they are, for the readers to report
    (``data.on_bad_line``)."""
    path, out = Path(path), Compaction()
    if not path.is_file():
        return out
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # what follows the last newline: empty unless the last line is torn
    last, torn_tail = f"{path}:{len(lines) + 1}", _torn(tail)
    if tail.strip() and not torn_tail:
        lines.append(tail)
    kept: dict[Any, bytes] = {}
    for number, raw in enumerate(lines, start=1):
        if _torn(raw):
            out.notes.append(f"repaired {path}:{number}: removed a line torn by an earlier crash "
                             f"({len(raw)} bytes); its episode runs again")
        elif raw.strip():
            key = _record_key(raw)
            out.superseded += key is not None and key in kept
            kept[key if key is not None else number] = raw
    if torn_tail:
        out.notes.append(f"repaired {last}: removed the torn last line ({len(tail)} bytes cut by "
                         "a crash mid-write); its episode runs again")
    elif tail.strip():
        out.notes.append(f"repaired {last}: the last line lacked its newline; added it")
    compacted = b"".join(raw + b"\n" for raw in kept.values())
    if compacted != data:
        write_atomic(path, compacted, fsync=True)
    return out


def trajectory_id(traj: Trajectory) -> str:
    """A stable id of an episode: domain/task/seed/agent, readable and unique per resume key."""
    return f"{traj.domain}/{traj.task_id}/s{traj.seed}/{traj.agent}"


def teacher_exchanges(traj: Trajectory) -> list[tuple[str, str | None]]:
    """The (Q_t, A_t) pairs of an episode in order (A_t None when the user never answered)."""
    pairs: list[tuple[str, str | None]] = []
    for step in traj.steps:
        if "teacher_query" in step.meta:
            pairs.append((step.meta["teacher_query"]["question"], None))
        elif "teacher_answer" in step.meta and pairs and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], traj.messages[step.message_index].get("content") or "")
    return pairs


def stable_seed(*parts: Any) -> int:
    """A 31-bit seed derived from ``parts`` (same inputs, same seed, on every machine)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()
    return int(digest[:8], 16) & 0x7FFFFFFF


def load_trajectories(path: str | Path, on_bad_line: str) -> JsonlRecords:
    """Stored trajectories, one per resume key (a rerun's later record wins).

    Corrupt lines raise a ValueError naming ``file:line`` (``on_bad_line="error"``) or are
    skipped, logged, and listed in ``.skipped`` (``"skip"``); ``.duplicates`` counts replaced
    records and ``.duplicate_keys`` names them: trajectory id (:func:`trajectory_id`, the key
    domain/task/seed/agent) → records left out. The seed is the trial (``data.trial_seeds``), so
    several trials of one task are distinct trajectories; only records of the same key (a rerun
    appended without compaction, or a file concatenated twice) are duplicates.
    """
    if on_bad_line not in ("error", "skip"):
        raise ValueError(f"on_bad_line must be 'error' or 'skip', got {on_bad_line!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trajectories at {path}; run `prour collect` first")
    rows = read_trajectories(path, on_error="raise" if on_bad_line == "error" else "skip")
    by_key = {traj.key: traj for traj in rows}
    out = JsonlRecords(by_key.values(), rows.skipped)
    out.duplicates = len(rows) - len(by_key)
    repeats = Counter(trajectory_id(traj) for traj in rows)
    out.duplicate_keys = {tid: n - 1 for tid, n in sorted(repeats.items()) if n > 1}
    return out
