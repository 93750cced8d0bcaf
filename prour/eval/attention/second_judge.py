"""Cross-family judge sensitivity (ask-less paper, Table 12): a second judge scores a fixed sample
of the study's questions with the same prompts, and the two judges' scores are compared.

The sample (:func:`sample_questions`) is a seeded draw of the delivered discretionary requests
that the first judge scored, each with the conversation the first judge saw before it. The
second judge (:func:`score_second_judge`) appends one line per question to
``STUDY/second_judge.jsonl``:

```
{"id": "retail|5|0|agent-key#7",          # the episode's key and the message index
 "domain": "retail", "task_id": "5", "seed": 0, "message_index": 7,
 "backbone": "gpt-4.1", "variant": "budgeted+mgr@2", "text": "...",
 "first":  {"reading_effort": 6.0, "value": 7.0},     # the study's judge (r in [0, 20], v in [0, 10])
 "second": {"reading_effort": 8.0, "value": 6.0},     # null when the second judge failed
 "error": null,                                       # why it failed, else null
 "judge": "grok-4.6", "prompt_version": "judge-v1"}
```

A rerun skips every question with a scored line and asks again for those that failed (the
latest line of an id is the one that counts); lines of questions outside the sample are refused.

:func:`table12` compares the judges on 0-100 scales (value × 10, reading effort × 5): the mean of
each, Spearman's rank correlation, the mean absolute difference, and policy effects under each
judge. A policy effect is the difference of mean scores between two policies within each cell
(backbone and domain, plus the budget N when both policies have one), each side averaging its
variants equally, then averaged over the cells both policies have, so every backbone and domain
weighs the same. Intervals resample the sampled questions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prour.eval.attention.validation_files import (
    ValidationInputError,
    backbone_of,
    episode_key,
    question_id,
)
from prour.eval.attention.validation_stats import spearman, weighted_bootstrap

log = logging.getLogger(__name__)

SCALES = {"value": 10.0, "reading_effort": 5.0}  # onto 0-100
DIMENSIONS = ("value", "reading_effort")
BATCH = 32  # questions judged between two appends


@dataclass(frozen=True)
class Contrast:
    """``plus`` minus ``minus`` (policy names); ``matched`` compares at the same budget N."""

    name: str
    plus: str
    minus: str
    matched: bool


CONTRASTS = (
    Contrast("Budgeted + MGR − Budgeted", "budgeted+mgr", "budgeted", True),
    Contrast("Budgeted + Review − Budgeted", "budgeted+review", "budgeted", True),
    Contrast("Budgeted + Review + Summary − Budgeted", "budgeted+review+summary", "budgeted",
             True),
    Contrast("Budgeted − Unrestricted", "budgeted", "unrestricted", False),
    Contrast("Frugal prompt − Unrestricted", "frugal", "unrestricted", False),
)


# ---- the sample -----------------------------------------------------------------------------


def eligible_questions(lines: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Delivered discretionary requests with text and both first-judge scores."""
    out = []
    for line in lines:
        for request in (line.get("attention") or {}).get("requests") or []:
            scores = (request.get("reading_effort"), request.get("value"))
            if not request.get("discretionary") or request.get("fallback") \
                    or None in scores or not request.get("text") \
                    or request.get("message_index") is None:
                continue
            index = int(request["message_index"])
            out.append({
                "id": question_id(line, index), "domain": line["domain"],
                "task_id": str(line["task_id"]), "seed": int(line["seed"]),
                "message_index": index, "backbone": backbone_of(line),
                "variant": line.get("variant"), "text": request["text"],
                "first": {"reading_effort": float(scores[0]), "value": float(scores[1])},
                "key": list(episode_key(line["key"]))})
    return out


def judge_context(trajectory: Any, message_index: int) -> str:
    """The conversation the judge saw before a delivered message (the agent's view)."""
    from prour.env.trajectory import agent_view
    from prour.llm.history import render_history

    return render_history(agent_view(trajectory.messages[:message_index], trajectory.steps))


def add_contexts(questions: Sequence[dict[str, Any]], episodes: Mapping[tuple, Any]) -> None:
    """Set each question's ``context`` from its episode (None when the episode is missing)."""
    for q in questions:
        trajectory = episodes.get(tuple(q["key"]))
        q["context"] = None if trajectory is None else judge_context(trajectory,
                                                                     q["message_index"])


def sample_questions(lines: Iterable[Mapping[str, Any]], n: int, seed: int,
                     episodes: Mapping[tuple, Any] | None = None) -> list[dict[str, Any]]:
    """A fixed, seeded sample of ``n`` delivered discretionary requests the first judge scored
    (all of them when fewer), sorted by id: text, backbone, variant, domain, task, seed, the
    first judge's scores and, given the episodes, the context the first judge saw."""
    if n < 1:
        raise ValueError(f"the sample needs n >= 1 questions, got {n}")
    pool = sorted(eligible_questions(lines), key=lambda q: q["id"])
    chosen = np.random.default_rng(seed).permutation(len(pool))[:n]
    sample = sorted((pool[i] for i in chosen), key=lambda q: q["id"])
    if episodes is not None:
        add_contexts(sample, episodes)
    else:
        for q in sample:
            q.setdefault("context", None)
    return sample


def study_questions(study: Any, n: int, seed: int) -> list[dict[str, Any]]:
    """:func:`sample_questions` of a :class:`~.validation_files.Study`, with its contexts."""
    sample = sample_questions(study.lines, n, seed)
    add_contexts(sample, study.episodes({tuple(q["key"]) for q in sample}))
    return sample


# ---- the second judge -----------------------------------------------------------------------


def latest_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The latest line of each question id."""
    return {row["id"]: dict(row) for row in rows if "id" in row}


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a second-judge file (none when it does not exist)."""
    from prour.env.trajectory import read_jsonl

    path = Path(path)
    return list(read_jsonl(path, on_error="skip")) if path.is_file() else []


def score_second_judge(sample: Sequence[Mapping[str, Any]], judge: Any, out_path: str | Path,
                       judge_name: str | None = None) -> dict[str, int]:
    """Score the sample with a second :class:`~prour.rewards.judge.RequestJudge` (the study
    judge's prompts), appending one line per question (module docstring); questions already
    scored in ``out_path`` are skipped. Returns counts: scored, failed, skipped."""
    from prour.files import append_jsonl, repair_torn_tail
    from prour.rewards.judge import PROMPT_VERSION

    out_path = Path(out_path)
    repair_torn_tail(out_path, "that question is judged again")
    done = latest_rows(read_rows(out_path))
    wanted = {q["id"] for q in sample}
    outside = sorted(set(done) - wanted)
    if outside:
        raise ValidationInputError(
            f"{out_path} holds {len(outside)} question(s) outside this sample (e.g. "
            f"{outside[0]}): the study or the sample's size or seed changed; move the file away")
    todo = [q for q in sample if done.get(q["id"], {}).get("second") is None]
    missing = [q["id"] for q in todo if q.get("context") is None]
    if missing:
        raise ValidationInputError(f"no conversation for {len(missing)} question(s) (e.g. "
                                   f"{missing[0]}): sample them with the study's episodes")
    counts = {"scored": 0, "failed": 0, "skipped": len(sample) - len(todo)}
    for start in range(0, len(todo), BATCH):
        batch = todo[start:start + BATCH]
        judgments = judge.judge([(q["text"], q["context"]) for q in batch])
        for q, judgment in zip(batch, judgments):
            failed = judgment.failed or judgment.reading_effort is None or judgment.value is None
            row = {k: q[k] for k in ("id", "domain", "task_id", "seed", "message_index",
                                     "backbone", "variant", "text", "first")}
            row.update(second=None if failed else {"reading_effort": judgment.reading_effort,
                                                   "value": judgment.value},
                       error=(judgment.error or "no scores") if failed else None,
                       judge=judge_name, prompt_version=PROMPT_VERSION)
            append_jsonl(out_path, row)
            counts["failed" if failed else "scored"] += 1
    return counts


# ---- Table 12 -------------------------------------------------------------------------------


def _policy(variant: str | None) -> tuple[str, int | None] | None:
    """(policy, budget) of a plain variant label; None for one with options or unparsable."""
    from prour.config.attention import variant_of

    try:
        parsed = variant_of(variant or "")
    except ValueError:
        return None
    return None if parsed.options else (parsed.policy, parsed.budget)


def _effect_groups(rows: Sequence[Mapping[str, Any]], contrast: Contrast,
                   ) -> tuple[np.ndarray, list[tuple[list[int], list[int]]]] | str:
    """Each question's group (backbone, domain, variant; -1 if unused) and, per cell, the
    groups of each side; or why the contrast has no cell."""
    parsed = [_policy(r.get("variant")) for r in rows]
    groups: dict[tuple, int] = {}
    member = np.full(len(rows), -1, dtype=np.int64)
    cells: dict[tuple, tuple[set[int], set[int]]] = {}
    for i, (row, pv) in enumerate(zip(rows, parsed)):
        if pv is None or pv[0] not in (contrast.plus, contrast.minus):
            continue
        cell = (row["backbone"], row["domain"]) + ((pv[1],) if contrast.matched else ())
        if contrast.matched and pv[1] is None:
            continue
        member[i] = groups.setdefault((row["backbone"], row["domain"], row.get("variant")),
                                      len(groups))
        sides = cells.setdefault(cell, (set(), set()))
        sides[0 if pv[0] == contrast.plus else 1].add(int(member[i]))
    both = [(sorted(p), sorted(m)) for p, m in cells.values() if p and m]
    if not both:
        return f"no backbone and domain{' and budget' if contrast.matched else ''} has " \
               f"questions of both {contrast.plus} and {contrast.minus}"
    return member, both


def _effect(weights: np.ndarray, scores: np.ndarray, member: np.ndarray,
            cells: list[tuple[list[int], list[int]]]) -> np.ndarray:
    """(B,) equally weighted contrast of group means (module docstring) under item weights."""
    n_groups = int(member.max()) + 1
    onehot = np.zeros((len(member), n_groups))
    used = member >= 0
    onehot[np.flatnonzero(used), member[used]] = 1.0
    sums, counts = weights @ (onehot * scores[:, None]), weights @ onehot
    means = np.full(sums.shape, np.nan)
    np.divide(sums, counts, out=means, where=counts > 0)
    diffs = []
    for plus, minus in cells:
        with np.errstate(all="ignore"):
            diffs.append(np.nanmean(means[:, plus], axis=1) - np.nanmean(means[:, minus], axis=1))
    with np.errstate(all="ignore"):
        return np.nanmean(np.stack(diffs, axis=1), axis=1)


def table12(rows: Iterable[Mapping[str, Any]], n_boot: int, seed: int = 0, ci: float = 0.95,
            ) -> dict[str, Any]:
    """Table 12 from second-judge lines (module docstring): ``questions``, ``failed``, per
    dimension the two means, rank correlation and mean absolute difference (0-100), and the
    policy ``effects`` under each judge with sampled-question bootstrap intervals."""
    import warnings

    latest = list(latest_rows(rows).values())
    scored = [r for r in latest if r.get("second") and r.get("first")
              and all(r["first"].get(d) is not None and r["second"].get(d) is not None
                      for d in DIMENSIONS)]
    out: dict[str, Any] = {"questions": len(scored),
                           "failed": sum(1 for r in latest if not r.get("second")),
                           "dimensions": {}, "effects": []}
    if not scored:
        return out
    first = {d: np.array([r["first"][d] for r in scored], float) * SCALES[d] for d in DIMENSIONS}
    second = {d: np.array([r["second"][d] for r in scored], float) * SCALES[d]
              for d in DIMENSIONS}
    for d in DIMENSIONS:
        out["dimensions"][d] = {"mean_first": float(first[d].mean()),
                                "mean_second": float(second[d].mean()),
                                "rank_corr": spearman(first[d], second[d]),
                                "mean_abs_diff": float(np.abs(first[d] - second[d]).mean())}
    for contrast in CONTRASTS:
        found = _effect_groups(scored, contrast)
        if isinstance(found, str):
            out["effects"].append({"contrast": contrast.name, "note": found})
            continue
        member, cells = found

        def statistics(w: np.ndarray, member: np.ndarray = member,
                       cells: list = cells) -> dict[str, np.ndarray]:
            return {f"{judge}:{d}": _effect(w, scores[d], member, cells)
                    for judge, scores in (("first", first), ("second", second))
                    for d in DIMENSIONS}

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # empty cells in a resample
            results = weighted_bootstrap(statistics, range(len(scored)), n_boot, seed, ci)
        out["effects"].append({"contrast": contrast.name, "cells": len(cells),
                               "results": results})
    return out
