"""The training row, owned in both directions by this one module.

- instance → row: :meth:`Instance.to_row` (what ``prour extract`` writes, what verl's RLHFDataset
  and the local trainer read);
- row → reward state: :func:`state_from_row` (what the information-gain reward scores);
- the verifier's environment of a state: :func:`decision_environment` rebuilds it by replaying
  the state's untruncated tool traffic and checks it against the DB hash recorded at extraction.

Row layout, ``schema_version`` 2 (parquet types in brackets; every field is always present):

- ``prompt`` [list<struct<role: string, content: string>>]: the query-generator chat of the
  state's mode with the (truncated) history inside;
- ``data_source`` [string]: ``prour/<domain>``;
- ``reward_model`` [struct<style: string, ground_truth: string>]: style ``rule``; ground truth
  G* (clarify) or the canonical JSON ``{"arguments","tool"}`` of the reference next tool call
  (verify), the only place ground truth lives;
- ``extra_info`` [struct]:
  ``index`` [int64] verl's row id within the split; ``state_id`` [string]
  ``<trajectory_id>#<step>:<mode>``, stable across re-extractions and unique per row;
  ``mode`` [string] clarify/verify; ``domain``, ``task_id``, ``trajectory_id`` [string];
  ``step`` [int64] index of the decision among the agent's decisions;
  ``history`` [string] JSON list of the messages the agent saw before deciding, left-truncated to
  the prompt budget (what the prompt and the belief prompts show; a tool result never without
  its call, see :mod:`prour.data.truncate`);
  ``env_history`` [string] JSON list of every tool call message and its verbatim result (agent's
  and user's, in order) from the episode start up to the decision, never truncated: the task's
  initial state plus these calls is the environment at the decision;
  ``db_hash`` [string] sha256 over tau2's ``get_db_hash()`` and ``get_user_db_hash()`` of that
  environment, recorded at extraction;
  ``au``, ``eu``, ``total`` [float64] the decomposer's uncertainties (nats);
  ``truncated`` [bool], ``dropped_messages`` [int64] what truncation did;
  ``prompt_tokens``, ``target_tokens`` [int64] with the policy tokenizer;
  ``decomposer_calls`` [int64]; ``prompts_version`` [string];
  ``schema_version`` [int64] = :data:`SCHEMA_VERSION`.

Version 1 rows (no ``state_id``, ``env_history``, ``db_hash``) are refused with an error that
says to rebuild the dataset with ``prour extract``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from prour.llm.base import Message
from prour.router.candidates import canonical_json

SCHEMA_VERSION = 2
MODES = ("clarify", "verify")
DATA_SOURCE_PREFIX = "prour/"
REBUILD = "rebuild the dataset with `prour extract`"

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
EXTRA_INFO = pa.struct(
    [
        ("index", pa.int64()),
        ("state_id", pa.string()),
        ("mode", pa.string()),
        ("domain", pa.string()),
        ("task_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("step", pa.int64()),
        ("history", pa.string()),
        ("env_history", pa.string()),
        ("db_hash", pa.string()),
        ("au", pa.float64()),
        ("eu", pa.float64()),
        ("total", pa.float64()),
        ("truncated", pa.bool_()),
        ("dropped_messages", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("target_tokens", pa.int64()),
        ("decomposer_calls", pa.int64()),
        ("prompts_version", pa.string()),
        ("schema_version", pa.int64()),
    ]
)
ROW_SCHEMA = pa.schema(
    [
        ("prompt", pa.list_(_MESSAGE)),
        ("data_source", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", EXTRA_INFO),
    ]
)


def decision_id_of(trajectory_id: str, step: int) -> str:
    """A decision's stable id: ``<trajectory_id>#<step>`` (calibration states use it as is)."""
    return f"{trajectory_id}#{step}"


def state_id_of(trajectory_id: str, step: int, mode: str) -> str:
    """The row's stable id: ``<trajectory_id>#<step>:<mode>``."""
    return f"{decision_id_of(trajectory_id, step)}:{mode}"


# ---------------------------------------------------------------- instance → row


@dataclass
class Instance:
    """One state–mode instance as extraction builds it, before it becomes a row."""

    mode: str
    domain: str
    task_id: str
    trajectory_id: str
    step: int
    history: list[Message]
    prompt: list[Message]
    target: str
    au: float
    eu: float
    total: float
    truncated: bool
    dropped_messages: int
    prompt_tokens: int
    target_tokens: int
    decomposer_calls: int
    prompts_version: str
    env_history: list[Message]
    db_hash: str

    @property
    def state_id(self) -> str:
        return state_id_of(self.trajectory_id, self.step, self.mode)

    def to_row(self, index: int) -> dict[str, Any]:
        """The parquet row; ``index`` is verl's per-row id within the split."""
        extra = {name: getattr(self, name) for name in EXTRA_INFO.names if hasattr(self, name)}
        extra.update(
            index=index,
            history=json.dumps(self.history, ensure_ascii=False),
            env_history=json.dumps(self.env_history, ensure_ascii=False),
            schema_version=SCHEMA_VERSION,
        )
        return {
            "prompt": [{"role": m["role"], "content": m["content"]} for m in self.prompt],
            "data_source": f"{DATA_SOURCE_PREFIX}{self.domain}",
            "reward_model": {"style": "rule", "ground_truth": self.target},
            "extra_info": extra,
        }


# ---------------------------------------------------------------- row → reward state


@dataclass
class RewardState:
    """One training state: what the reward needs to answer and score a group of queries.

    ``target`` is G* (clarify) or the canonical JSON of the reference action (verify); it reaches
    only the strict user simulator and the scored target, never a policy prompt. ``env`` is an
    optional live tau2 environment at this state for the verifier; without it the environment is
    rebuilt by :func:`decision_environment` from ``domain``, ``task_id`` and ``env_history`` (the
    untruncated tool traffic; ``history`` itself when not given) and checked against ``db_hash``
    when given (rows always give both).
    """

    mode: Literal["clarify", "verify"]
    history: list[Message]
    target: str
    domain: str
    task_id: str | None = None
    state_id: str = ""
    env: Any = None
    env_history: list[Message] | None = None
    db_hash: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"RewardState.mode must be 'clarify' or 'verify', got {self.mode!r}")
        if not isinstance(self.target, str) or not self.target.strip():
            raise ValueError(f"RewardState.target must be non-empty text (state {self.state_id!r})")
        if not self.state_id:
            self.state_id = content_id(self.mode, self.domain, self.history, self.target)


def content_id(mode: str, domain: str, history: Sequence[Message], target: str) -> str:
    """A stable id for a state built without a row, from its content."""
    payload = json.dumps([mode, domain, list(history), target], sort_keys=True, default=str)
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def state_from_row(row: Mapping[str, Any]) -> RewardState:
    """The :class:`RewardState` of a dataset row (a plain dict, or what pandas/verl hand over)."""
    extra, reward = _plain(row.get("extra_info") or {}), _plain(row.get("reward_model") or {})
    if not isinstance(extra, dict) or not isinstance(reward, dict):
        raise ValueError(  # noqa: TRY004 - a bad row, reported like the others
            "dataset row: extra_info and reward_model must be structs, got "
            f"{type(extra).__name__} and {type(reward).__name__}; {REBUILD}")
    where = extra.get("state_id") or f"row {extra.get('index')}"
    problems = version_problem(extra) or _check_extra(extra)
    target = reward.get("ground_truth")
    problems += [] if isinstance(target, str) and target.strip() else [
        "reward_model.ground_truth must be non-empty text"]
    if problems:
        raise ValueError(f"dataset row {where}: {'; '.join(problems)}")
    return RewardState(
        mode=extra["mode"],
        history=_messages(extra["history"]),
        target=target,
        domain=extra["domain"],
        task_id=extra["task_id"],
        state_id=extra["state_id"],
        env_history=_messages(extra["env_history"]),
        db_hash=extra["db_hash"],
    )


def _plain(value: Any) -> Any:
    """Nested lists/dicts from parquet values (numpy arrays become lists, nulls are dropped)."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _messages(value: Any) -> list[Message]:
    """A message list from a row field (its JSON text)."""
    return [dict(m) for m in json.loads(value)]


# ---------------------------------------------------------------- the verifier's environment


class EnvironmentMismatch(ValueError):
    """The environment rebuilt for a state is not the one recorded at extraction."""


def tool_traffic_hash(domain: str, task_id: str | None, env_history: Sequence[Message]) -> str:
    """DB hash of the task's initial environment after replaying ``env_history`` (extraction)."""
    from prour.env.environment import db_hash
    from prour.rollout.verifier import environment_at

    return db_hash(environment_at(domain, task_id, env_history))


def tool_traffic_hashes(domain: str, task_id: str | None,
                        prefixes: Iterable[Sequence[Message]]) -> Iterator[str]:
    """:func:`tool_traffic_hash` of each of ``prefixes``, lazily, each prefix's traffic replayed
    once: a prefix that extends the one before continues on the same environment (one tau2
    environment per trajectory, not per row), and one equal to it keeps its hash (tau2's DB hash
    serializes the whole database: most of the cost); any other starts a fresh replay."""
    from prour.env.environment import db_hash
    from prour.rollout.verifier import ToolReplay

    replay, last = None, ""
    for prefix in prefixes:
        if replay is None or not replay.extends(prefix):
            replay, last = ToolReplay(domain, task_id), ""
        if not last or len(prefix) > len(replay.replayed):
            replay.extend(prefix[len(replay.replayed):])
            last = db_hash(replay.env)
        yield last


def decision_environment(state: RewardState) -> Any:
    """The tau2 environment at the state's decision, checked against the recorded DB hash.

    Every tool call of ``env_history`` is replayed on the task's initial state and its result
    compared with the recorded one; a differing result or DB hash raises
    :class:`EnvironmentMismatch` naming the state, never a silently different environment.
    """
    from prour.env.environment import db_hash
    from prour.rollout.verifier import environment_at

    calls = state.history if state.env_history is None else state.env_history
    try:
        env = environment_at(state.domain, state.task_id, calls)
    except ValueError as exc:
        raise EnvironmentMismatch(f"state {state.state_id}: {exc}; {REBUILD}") from exc
    if state.db_hash is not None and (found := db_hash(env)) != state.db_hash:
        raise EnvironmentMismatch(
            f"state {state.state_id}: the environment replayed from extra_info.env_history has DB "
            f"hash {found[:12]}…, extraction recorded {state.db_hash[:12]}… (the row was edited "
            f"or tau2's data changed since extraction); {REBUILD}"
        )
    return env


# ---------------------------------------------------------------- row checks


def version_problem(extra: Mapping[str, Any]) -> list[str]:
    """The schema-version error of a row's ``extra_info`` (empty when it is current)."""
    version = extra.get("schema_version")
    if version == SCHEMA_VERSION:
        return []
    problem = (f"extra_info.schema_version is {version!r}, this prour reads {SCHEMA_VERSION} "
               f"(rows before version 2 lack state_id, env_history and db_hash); {REBUILD}")
    return [problem]


def _check_prompt(prompt: Any) -> list[str]:
    if not isinstance(prompt, list) or not prompt:
        return ["prompt must be a non-empty list of messages"]
    errors = []
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            errors.append(f"prompt[{i}] must have exactly the keys role and content")
        elif message["role"] not in ("system", "user", "assistant"):
            errors.append(f"prompt[{i}].role {message['role']!r} is not system/user/assistant")
        elif not isinstance(message["content"], str) or not message["content"].strip():
            errors.append(f"prompt[{i}].content must be non-empty text")
    if not errors and prompt[-1]["role"] != "user":
        errors.append("the last prompt message must come from the user role")
    return errors


def _check_target(mode: str, target: Any) -> list[str]:
    if not isinstance(target, str) or not target.strip():
        return ["reward_model.ground_truth must be non-empty text"]
    if mode != "verify":
        return []
    try:
        action = json.loads(target)
    except json.JSONDecodeError:
        return ["a verify ground_truth must be the JSON of an action"]
    if not isinstance(action, dict) or set(action) != {"tool", "arguments"}:
        return ["a verify ground_truth must have exactly the keys tool and arguments"]
    return [] if canonical_json(action) == target else ["a verify ground_truth must be canonical JSON"]


def _check_messages(extra: Mapping[str, Any], key: str) -> list[str]:
    try:
        messages = json.loads(extra[key])
    except (TypeError, json.JSONDecodeError):
        return [f"extra_info.{key} must be a JSON string"]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m and isinstance(m.get("tool_calls") or [], list)
        and all(isinstance(c, dict) for c in m.get("tool_calls") or []) for m in messages
    ):
        return [f"extra_info.{key} must be a JSON list of messages"]
    if key == "env_history" and not all(m.get("tool_calls") or m["role"] == "tool"
                                        for m in messages):
        return ["extra_info.env_history must hold only tool calls and tool results"]
    orphan = _orphan_result(messages)
    if orphan is not None:
        return [f"extra_info.{key} has the result of tool call {orphan!r} without the call; {REBUILD}"]
    return []


def _orphan_result(messages: Sequence[Message]) -> str | None:
    """The call id of the first tool result whose call is not earlier in ``messages``."""
    called: set[Any] = set()
    for message in messages:
        called.update(call.get("id") for call in message.get("tool_calls") or [])
        if message["role"] == "tool" and message.get("tool_call_id") not in called:
            return str(message.get("tool_call_id"))
    return None


def _check_uncertainty(extra: Mapping[str, Any]) -> list[str]:
    values = [extra.get(key) for key in UNMEASURED]
    if all(v is None for v in values):  # not measured: a row no decomposer routed
        return []
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return ["extra_info.au/eu/total must be finite numbers"]
    au, eu, total = values
    if min(au, eu) < -1e-6:
        return [f"extra_info.au/eu must be >= 0, got au={au} eu={eu}"]
    if abs(au + eu - total) > 1e-4:
        return [f"extra_info.total ({total}) must equal au + eu ({au + eu})"]
    return []


def _check_identity(extra: Mapping[str, Any]) -> list[str]:
    """Ids, counts and the environment hash."""
    errors = []
    for key in ("domain", "task_id", "trajectory_id", "prompts_version"):
        if not isinstance(extra[key], str) or not extra[key]:
            errors.append(f"extra_info.{key} must be non-empty text")
    for key in ("step", "index", "dropped_messages", "decomposer_calls"):
        if not isinstance(extra[key], int) or extra[key] < 0:
            errors.append(f"extra_info.{key} must be an integer >= 0")
    for key in ("prompt_tokens", "target_tokens"):
        if not isinstance(extra[key], int) or extra[key] < 1:
            errors.append(f"extra_info.{key} must be an integer >= 1")
    if not isinstance(extra["truncated"], bool):
        errors.append("extra_info.truncated must be a boolean")
    if not errors and extra["state_id"] != state_id_of(extra["trajectory_id"], extra["step"],
                                                       extra["mode"]):
        errors.append("extra_info.state_id must be <trajectory_id>#<step>:<mode>")
    if not isinstance(extra["db_hash"], str) or not re.fullmatch(r"[0-9a-f]{64}", extra["db_hash"]):
        errors.append("extra_info.db_hash must be a sha256 hex digest")
    return errors


UNMEASURED = ("au", "eu", "total")
"""Null in a row no decomposer routed (``data.states: every``); a reader that drops nulls (the
verl path's :func:`_plain`) leaves them out altogether."""


def _check_extra(extra: Any) -> list[str]:
    if isinstance(extra, dict) and not set(UNMEASURED) & set(extra):
        extra = {**extra, **dict.fromkeys(UNMEASURED)}
    if not isinstance(extra, dict) or set(extra) != set(EXTRA_INFO.names):
        missing = sorted(set(EXTRA_INFO.names) - set(extra or {}))
        return [f"extra_info must have the fields {EXTRA_INFO.names}; missing {missing}"]
    if extra["mode"] not in MODES:
        return [f"extra_info.mode {extra['mode']!r} is not one of {MODES}"]
    errors = _check_identity(extra) + _check_uncertainty(extra)
    return errors + _check_messages(extra, "history") + _check_messages(extra, "env_history")


def check_row(row: dict[str, Any]) -> list[str]:
    """Everything wrong with one row (empty list: the row is valid)."""
    if not isinstance(row, dict) or set(row) != set(ROW_SCHEMA.names):
        return [f"a row must have exactly the columns {ROW_SCHEMA.names}"]
    reward = row["reward_model"]
    if not isinstance(reward, dict) or reward.get("style") != "rule":
        return ["reward_model must be {'style': 'rule', 'ground_truth': ...}"]
    extra = row["extra_info"]
    if not isinstance(extra, dict):
        return ["extra_info must be a struct"]
    if version_problem(extra):
        return version_problem(extra)
    errors = _check_prompt(row["prompt"]) + _check_extra(extra)
    if row["data_source"] != f"{DATA_SOURCE_PREFIX}{extra.get('domain')}":
        errors.append(f"data_source {row['data_source']!r} does not match domain "
                      f"{extra.get('domain')!r}")
    return errors + _check_target(extra.get("mode"), reward.get("ground_truth"))


def check_rows(rows: Iterable[dict[str, Any]], where: str = "") -> list[str]:
    """Errors of all rows, each prefixed with ``where`` and the row number."""
    errors = []
    for i, row in enumerate(rows):
        errors.extend(f"{where}row {i}: {error}" for error in check_row(row))
    return errors
