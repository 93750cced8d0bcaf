"""The study's judge pass: every delivered request of the study's episodes scored by
``models.judge`` (reading effort r, question value v: :mod:`prour.rewards.judge`), after the
episodes, as a step of its own.

Each result line whose requests are not all judged is rebuilt from its episode
(:func:`prour.eval.attention.agent.attention_summary` with the judge) and appended again with
the same key, so the later line replaces the earlier one and nothing scored is lost; the judge's
verdicts are cached in ``attention/judge_cache.jsonl`` (a rerun asks only what it lacks). A
request the judge never answers in valid JSON stays unscored and its line is asked again by the
next pass; when more than ``study.max_judge_failures`` of the requests judged stay unscored,
the pass fails with one line naming the judge's model and the error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.config.attention import variant_of
from prour.eval.study import RESULTS_FILE, study_dir

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

logger = logging.getLogger(__name__)

EPISODES_FILE = "episodes.jsonl"


class JudgeFailed(RuntimeError):
    """Too many requests stayed unscored: the judge's model answers no valid JSON, or is down."""


def needs_judging(line: dict[str, Any]) -> bool:
    """Whether a result line has delivered requests the judge has not scored."""
    block = line.get("attention")
    if not isinstance(block, dict) or not block.get("requests"):
        return False
    return not block.get("judged") or bool(block.get("judge_failures"))


def folder_tally(folder: Path) -> tuple[bool, int, int]:
    """(every line with requests judged, requests, requests left unscored) of a study folder's
    latest result lines."""
    from prour.eval.harness import load_result_lines

    path = folder / RESULTS_FILE
    lines = load_result_lines(path).values() if path.is_file() else []
    blocks = [line["attention"] for line in lines
              if isinstance(line.get("attention"), dict) and line["attention"].get("requests")]
    return (all(block.get("judged") for block in blocks),
            sum(len(block["requests"]) for block in blocks),
            sum(block.get("judge_failures") or 0 for block in blocks))


def _limit(recipe: Recipe) -> float:
    return recipe.study.max_judge_failures if recipe.study is not None else 0.0


def judge_done(recipe: Recipe) -> bool:
    """Done: every line with requests was judged, and no more than ``study.max_judge_failures``
    of the requests stayed unscored (a failed pass is asked again)."""
    folder = study_dir(recipe)
    if not (folder / RESULTS_FILE).is_file():
        return False
    judged, requests, unscored = folder_tally(folder)
    return judged and (not requests or unscored / requests <= _limit(recipe))


def pending_lines(folder: Path) -> list[dict[str, Any]]:
    """The latest result lines of the study folder that need the judge."""
    from prour.eval.harness import load_result_lines

    path = folder / RESULTS_FILE
    if not path.is_file():
        return []
    return [line for line in load_result_lines(path).values() if needs_judging(line)]


@dataclass
class JudgeTally:
    """What one pass did: lines rejudged, requests scored and unscored, the last error."""

    lines: int = 0
    requests: int = 0
    unscored: int = 0
    error: str | None = None


def judge_study(recipe: Recipe, say: Callable[[str], None] = print) -> JudgeTally:
    """Score every unjudged request of the study folder; :class:`JudgeFailed` when more than
    ``study.max_judge_failures`` of them stay unscored (what was scored is kept)."""
    from prour.build import Builder
    from prour.env.trajectory import read_trajectories
    from prour.eval.attention.agent import attention_summary
    from prour.files import append_jsonl
    from prour.llm.strict_json import JsonCache

    folder = study_dir(recipe)
    todo = pending_lines(folder)
    tally = JudgeTally()
    if not todo:
        say(f"judge: every delivered request in {folder} is judged")
        return tally
    episodes = {t.key: t for t in read_trajectories(folder / EPISODES_FILE, on_error="skip")}
    builder = Builder(recipe)
    judge = builder.judge(builder.judge_attempts(),
                          JsonCache(folder / "attention" / "judge_cache.jsonl"))
    base = recipe.eval.attention
    lock = threading.Lock()

    def rejudge(line: dict[str, Any]) -> None:
        trajectory = episodes.get(tuple(line["key"]))
        if trajectory is None:
            raise JudgeFailed(f"{folder / EPISODES_FILE} holds no episode {line['key']}: the "
                              "judge reads each request's conversation from it")
        config = base.model_copy(update=variant_of(line["variant"]).settings())
        block = attention_summary(trajectory, config, float(line["score"]), judge)
        with lock:
            append_jsonl(folder / RESULTS_FILE, {**line, "attention": block})
            tally.lines += 1
            tally.requests += len(block["requests"])
            tally.unscored += block["judge_failures"]
            errors = [r["judge_error"] for r in block["requests"] if r.get("judge_error")]
            tally.error = errors[-1] if errors else tally.error

    say(f"judge: {len(todo)} result line(s) with requests to judge in {folder}")
    try:
        with ThreadPoolExecutor(max_workers=recipe.eval.concurrency) as pool:
            list(pool.map(rejudge, todo))
    finally:
        builder.close()
    say(f"judge: {tally.requests - tally.unscored} of {tally.requests} request(s) scored in "
        f"{tally.lines} line(s)")
    _check_share(recipe, tally)
    return tally


def _check_share(recipe: Recipe, tally: JudgeTally) -> None:
    """JudgeFailed naming the judge's model when more of the folder's requests stay unscored
    than ``study.max_judge_failures`` allows (the step's done-check reads the same share)."""
    _, requests, unscored = folder_tally(study_dir(recipe))
    limit = _limit(recipe)
    if unscored and unscored / requests > limit:
        model = recipe.models["judge"]
        name = model.model or model.path or model.backend
        raise JudgeFailed(
            f"models.judge ({name}) left {unscored} of {requests} request(s) unscored "
            f"({unscored / requests:.0%} > study.max_judge_failures {limit:g}); last error: "
            f"{tally.error}; the scores it gave are kept and a rerun asks again for the rest")
