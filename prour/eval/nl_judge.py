"""The NL-assertion judge pass: episodes that the offline scorer left unscored because their
task's reward basis includes tau2's natural-language assertions get that check from an LLM
judge, after the episodes, with tau2's own prompt (:mod:`prour.env.nl_assertions`).

It works on any folder with ``results.jsonl`` and ``episodes.jsonl`` (an eval run folder, or a
study's ``<run_dir>/study``). For each latest result line that is unscored, and whose episode
lists only ``NL_ASSERTION`` under ``not_evaluated``, the task (the version of the split the
episode ran on) gives the assertions:

- none (an episode scored before prour followed tau2 there): the check is 1, with no model, as
  tau2's evaluator gives it;
- else the judge grades them in one call, as tau2 does, and the check is 1 when every verdict
  is met, else 0.

The check is combined with the checks the episode recorded by the product over the task's
reward basis (:func:`prour.env.scoring.combine_checks`) and a new line with the same key is
appended, so it replaces the earlier one: ``reward``, ``score`` and ``success`` of the product,
``unscored`` false, and an ``nl_assertions`` block with the check, the combined checks, the
judge (role and model) and each verdict; an attention block's utility follows the new reward.
A judge that gives no valid reply within its attempts leaves the line unscored: the appended
line keeps ``reward`` null and ``unscored`` true and records the judge and the last error under
``nl_assertions.error``; the next pass asks again. Verdicts are cached in
``nl_assertions_cache.jsonl`` by the judge's model and the prompt, so a rerun asks only what it
lacks. The judge is ``models.nl_judge``, or ``models.judge`` when the recipe has none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, load_result_lines, result_key
from prour.files import append_jsonl

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config import Recipe
    from prour.env.trajectory import Trajectory
    from prour.llm.strict_json import JsonCache

logger = logging.getLogger(__name__)

CACHE_FILE = "nl_assertions_cache.jsonl"
CACHE_VERSION = "tau2-nl-assertions-1"  # bump when the way the judge is asked changes
JUDGE_MAX_TOKENS = 2048  # tau2 sets no cap; a verdict with its reasoning per assertion
BATCH = 32  # lines judged per backend batch; each batch's lines are saved before the next


@dataclass
class NLTally:
    """What one pass did, in result lines."""

    pending: int = 0  # unscored because of NL assertions
    offline: int = 0  # scored without a model: the task lists no assertion
    judged: int = 0  # scored by the judge (cached verdicts included)
    cached: int = 0
    failed: int = 0  # left unscored: the judge gave no valid reply
    skipped: list[str] = field(default_factory=list)  # unscored lines this pass cannot score
    error: str | None = None  # the last judge failure
    judge: str | None = None  # ``models.<role> (<model>)`` when a judge was needed


@dataclass
class _Item:
    line: dict[str, Any]
    trajectory: Trajectory
    assertions: list[str]


def judge_role(builder: Builder) -> str:
    """The judge's role: ``nl_judge`` when the recipe (or the caller) gives one, else ``judge``."""
    return "nl_judge" if builder.has("nl_judge") else "judge"


def judge_record(builder: Builder, role: str) -> dict[str, Any]:
    """Who judged: the role and its model (served name, path, or the scripted rules)."""
    cfg = builder.recipe.models.get(role)
    if cfg is None:
        return {"role": role, "model": "given"}
    name = cfg.model or cfg.path or (f"scripted:{cfg.script}" if cfg.script else cfg.backend)
    return {"role": role, "model": name, "backend": cfg.backend}


def needs_nl_judge(line: dict[str, Any], trajectory: Trajectory | None) -> bool:
    """Whether an unscored line is unscored because of NL assertions alone (its episode's
    offline breakdown lists nothing else as not evaluated)."""
    if not line.get("unscored") or trajectory is None or trajectory.reward is not None:
        return False
    return list(trajectory.reward_breakdown.get("not_evaluated") or []) == ["NL_ASSERTION"]


def scored_line(line: dict[str, Any], basis: list[str], checks: dict[str, float],
                nl: float, record: dict[str, Any]) -> dict[str, Any]:
    """``line`` with the reward of its checks and the NL check ``nl`` (product over ``basis``),
    and ``record`` (verdicts, judge) as its ``nl_assertions`` block."""
    from prour.core.reward import utility
    from prour.env.scoring import combine_checks
    from prour.eval.metrics import is_success

    combined = {**checks, "NL_ASSERTION": nl}
    reward = combine_checks(basis, combined)
    out = {**line, "reward": reward, "score": reward, "success": is_success(reward),
           "unscored": False, "nl_assertions": {**record, "check": nl, "basis": basis,
                                                 "checks": combined}}
    block = line.get("attention")
    if isinstance(block, dict) and block.get("cost") is not None and block.get("lam") is not None:
        out["attention"] = {**block, "utility": utility(reward, block["cost"], block["lam"])}
    return out


def judge_nl_assertions(folder: str | Path, recipe: Recipe, builder: Builder | None = None,
                        say: Callable[[str], None] = print) -> NLTally:
    """Score every result line of ``folder`` left unscored by NL assertions (see the module);
    a backend that keeps failing raises :class:`prour.llm.base.BackendError` after the lines
    already scored were saved."""
    from prour.build import Builder
    from prour.env.domains import get_task
    from prour.env.trajectory import read_trajectories
    from prour.llm.strict_json import JsonCache

    folder = Path(folder)
    results_path, episodes_path = folder / RESULTS_FILE, folder / EPISODES_FILE
    for path in (results_path, episodes_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; the NL-assertion judge reads a run "
                                    f"folder's {RESULTS_FILE} and {EPISODES_FILE}")
    tally = NLTally()
    unscored = [line for line in load_result_lines(results_path).values() if line.get("unscored")]
    if not unscored:
        say(f"nl-assertions: no unscored result line in {folder}")
        return tally
    episodes = {result_key(t.key): t for t in read_trajectories(episodes_path, on_error="skip")}
    items: list[_Item] = []
    for line in unscored:
        name = "/".join(str(part) for part in line["key"])
        trajectory = episodes.get(result_key(line["key"]))
        if trajectory is not None and line.get("episode_started_at") not in (
                None, trajectory.started_at):
            tally.skipped.append(f"{name}: {episodes_path} holds a later episode of this key")
            continue
        if not needs_nl_judge(line, trajectory):
            why = "no episode" if trajectory is None else "unscored for another reason"
            tally.skipped.append(f"{name}: {why}")
            continue
        task = get_task(trajectory.domain, trajectory.task_id, trajectory.split)
        items.append(_Item(line, trajectory, list(task.evaluation_criteria.nl_assertions or [])))
    tally.pending = len(items)
    for item in (i for i in items if not i.assertions):
        _append(results_path, item, 1.0, {"judge": None, "verdicts": [],
                                          "note": "the task lists no assertion: tau2 scores the "
                                                  "check 1 without a model"})
        tally.offline += 1
    to_judge = [i for i in items if i.assertions]
    if to_judge:
        own = builder is None
        builder = builder or Builder(recipe)
        try:
            role = judge_role(builder)
            builder.require("the NL-assertion judge (models.nl_judge, else models.judge)",
                            [role])
            record = judge_record(builder, role)
            tally.judge = f"models.{role} ({record['model']})"
            say(f"nl-assertions: {len(to_judge)} episode(s) of {folder} to judge with "
                f"{tally.judge}")
            cache = JsonCache(folder / CACHE_FILE)
            _judge(builder.llm(role), record, to_judge, cache, builder, results_path, tally)
        finally:
            if own:
                builder.close()
    say(_summary(folder, tally))
    return tally


def _append(path: Path, item: _Item, nl: float, record: dict[str, Any]) -> None:
    breakdown = item.trajectory.reward_breakdown
    checks = {kind: float(value) for kind, value in (breakdown.get("checks") or {}).items()}
    append_jsonl(path, scored_line(item.line, list(breakdown.get("basis") or []), checks, nl,
                                   record))


def _judge(llm: Any, record: dict[str, Any], items: list[_Item], cache: JsonCache,
           builder: Builder, results_path: Path, tally: NLTally) -> None:
    """Judge ``items`` in batches of equal assertion counts (the reply must grade each one)."""
    from prour.env.nl_assertions import judge_messages, nl_check, parse_verdicts
    from prour.env.scoring import to_tau2_messages
    from prour.llm.strict_json import cache_key

    attempts = builder.judge_attempts()
    groups: dict[int, list[_Item]] = {}
    for item in items:
        groups.setdefault(len(item.assertions), []).append(item)
    for count, group in sorted(groups.items()):
        for start in range(0, len(group), BATCH):
            batch = group[start:start + BATCH]
            prompts = [judge_messages(to_tau2_messages(i.trajectory), i.assertions)
                       for i in batch]
            keys = [cache_key(CACHE_VERSION, record["model"], p) for p in prompts]
            answers = _ask(llm, prompts, keys, cache, attempts,
                           lambda data, n=count: parse_verdicts(data, n))
            for item, answer in zip(batch, answers):
                if "error" in answer:
                    append_jsonl(results_path, {**item.line, "nl_assertions": {
                        "judge": record, "error": answer["error"],
                        "attempts": answer["attempts"]}})
                    tally.failed += 1
                    tally.error = answer["error"]
                    continue
                verdicts = answer["verdicts"]
                _append(results_path, item, nl_check(verdicts),
                        {"judge": record, "verdicts": verdicts, "attempts": answer["attempts"],
                         "cached": answer["cached"]})
                tally.judged += 1
                tally.cached += bool(answer["cached"])


def _ask(llm: Any, prompts: list[list[dict[str, str]]], keys: list[str], cache: JsonCache,
         attempts: int, validate: Callable[[dict[str, Any]], list[dict[str, Any]]],
         ) -> list[dict[str, Any]]:
    """Per prompt: its cached verdicts, else the judge's validated ones (cached), else the
    error of its last attempt."""
    from prour.env.nl_assertions import tau2_judge_temperature
    from prour.llm.base import SamplingParams
    from prour.llm.strict_json import ask_json

    out: list[dict[str, Any]] = []
    for key in keys:
        hit = cache.get(key)
        out.append({**hit, "cached": True} if hit is not None else {})
    todo = [i for i, answer in enumerate(out) if not answer]
    if not todo:
        return out
    sampling = SamplingParams(n=1, temperature=tau2_judge_temperature(),
                              max_tokens=JUDGE_MAX_TOKENS)
    outcomes = ask_json(llm, [prompts[i] for i in todo], validate, attempts, sampling)
    for i, outcome in zip(todo, outcomes):
        if outcome.failed:
            out[i] = {"error": outcome.errors[-1] if outcome.errors else "no reply",
                      "attempts": outcome.attempts}
            continue
        value = {"verdicts": outcome.value, "attempts": outcome.attempts}
        cache.put(keys[i], value)
        out[i] = {**value, "cached": False}
    return out


def _summary(folder: Path, tally: NLTally) -> str:
    parts = [f"{tally.offline} scored offline (no assertion)"]
    if tally.judge is not None:
        parts.append(f"{tally.judged} judged by {tally.judge} ({tally.cached} from the cache)")
    if tally.failed:
        parts.append(f"{tally.failed} left unscored (last error: {tally.error}); a rerun asks "
                     "again")
    text = (f"nl-assertions: {tally.pending} result line(s) of {folder} unscored on NL "
            f"assertions: {', '.join(parts)}")
    if tally.skipped:
        text += (f"; {len(tally.skipped)} other unscored line(s) left as they are (e.g. "
                 f"{tally.skipped[0]})")
    return text
