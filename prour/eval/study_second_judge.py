"""The study's second-judge pass (the ask-less paper's Table 12): a fixed, seeded sample of the
delivered discretionary questions the first judge scored, re-scored by a judge of another model
family with the same prompts, appended to ``<study>/second_judge.jsonl`` (the line format:
:mod:`prour.eval.attention.second_judge`). The requests of an exported Table 10 are scored too,
into ``validation/requests/second_judge.jsonl``, for its second-judge row. Resumable: a rerun
asks only for what has no score.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from prour.eval.study import study_dir

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


def sample_size(recipe: Recipe) -> int:
    return recipe.study.second_judge_sample if recipe.study is not None else 0


def sample_ids(folder: Path, n: int, seed: int) -> set[str]:
    """The ids of the questions the pass samples from the study folder's judged lines."""
    from prour.eval.attention.second_judge import sample_questions
    from prour.eval.attention.validation_files import load_study

    return {q["id"] for q in sample_questions(load_study(folder).lines, n, seed)}


def second_judged(recipe: Recipe) -> bool:
    """Done: the second-judge file holds a line for every sampled question."""
    from prour.eval.attention.second_judge import latest_rows, read_rows
    from prour.eval.attention.validation_files import SECOND_JUDGE

    folder = study_dir(recipe)
    path = folder / SECOND_JUDGE
    if not sample_size(recipe) or not path.is_file():
        return False
    return sample_ids(folder, sample_size(recipe), recipe.seed) <= set(latest_rows(read_rows(path)))


def second_judge_pass(recipe: Recipe, say: Callable[[str], None] = print, *,
                      role: str = "second_judge", folder: Path | None = None,
                      questions: int | None = None, seed: int | None = None) -> None:
    """Score the sample (``questions``, default ``study.second_judge_sample``; ``seed``, default
    the recipe's) with ``models.<role>``, and the exported Table 10 requests if any."""
    from prour.build import Builder
    from prour.eval.attention import validation as v
    from prour.files import write_atomic
    from prour.rewards.judge import RequestJudge

    folder = folder or study_dir(recipe)
    count = questions if questions is not None else sample_size(recipe)
    builder = Builder(recipe)
    try:
        builder.require(f"the second-judge pass (models.{role})", [role])
        config = builder.model_config(role)
        judge = RequestJudge(builder.llm(role), builder.judge_attempts())
        study = v.load_study(folder)
        sample = v.study_questions(study, count, recipe.seed if seed is None else seed)
        jobs = [("sample", sample, folder / v.SECOND_JUDGE)]
        pairs = v.pair_questions(study)
        if pairs:
            jobs.append(("Table 10 requests", pairs,
                         v.kind_dir(folder, "requests") / v.SECOND_JUDGE))
        name = config.model or config.path or config.backend
        for what, items, out in jobs:
            if not out.exists():  # an empty sample is a finished pass too
                write_atomic(out, "")
            counts = v.score_second_judge(items, judge, out, name)
            say(f"second judge ({name}), {what}: {counts['scored']} scored, {counts['failed']} "
                f"failed, {counts['skipped']} already scored -> {out}")
    finally:
        builder.close()
