"""The study stage's rows of the chain (a recipe with a ``study`` section): the study's episodes
(``prour study run``: each serving group of cells in turn, through one queue), the judge pass,
the second judge's sample (the ask-less paper's Table 12) and the study's report. Where each
reads and writes, how "done" is read, the roles each calls.

The episodes step serves its own models, group by group (:mod:`prour.cluster.study`): the runner
serves it nothing, and its dry run lists each group's servers instead. Nothing heavy is imported
here: what a row needs it imports inside its functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prour.step import RECIPE_OPTION as _R
from prour.step import File, Stage, Step

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

REPORT_INDEX = Path("report") / "ask-less" / "index.html"
SECOND_JUDGE_FILE = "second_judge.jsonl"


def study_folder(recipe: Recipe) -> Path:
    from prour.config.study import STUDY_FOLDER

    return recipe.resolved_run_dir() / STUDY_FOLDER


def _results(recipe: Recipe) -> File:
    return File("study (run_dir/study)", study_folder(recipe) / "results.jsonl")


def no_study(recipe: Recipe) -> str | None:
    if recipe.study is None:
        return "the recipe has no `study` section"
    return None if recipe.study.run else "study.run is false"


def study_roles(recipe: Recipe) -> tuple[str, ...]:
    """The roles the study's episodes call (every grid's methods under its variants; the judge
    is its own step's)."""
    from prour.config.attention import variant_of
    from prour.eval.methods import method_roles

    if recipe.study is None:
        return ()
    cfg = recipe.eval.model_copy(update={"judge": False})
    roles: dict[str, None] = {}
    for grid in recipe.study.grids.values():
        for method in grid.methods:
            for variant in grid.policies or [None]:
                attention = None if variant is None or cfg.attention is None else \
                    cfg.attention.model_copy(update=variant_of(variant).settings())
                roles.update(dict.fromkeys(method_roles(cfg, method, attention)))
    return tuple(roles)


def _study_reads(recipe: Recipe) -> tuple[File, ...]:
    """The exported final checkpoint when an axis value is the run's trained generator."""
    from prour.step import exported

    if recipe.study is None or not any(value.trained for values in recipe.study.axes.values()
                                       for value in values.values()):
        return ()
    return (File("--checkpoint (study.axes: trained)", exported(recipe) / "config.json",
                 checked=False),)


def _served_by_itself(recipe: Recipe) -> Recipe:
    """The recipe the runner serves the episodes step from: without the roles a server would
    answer, so that it serves the step nothing (the step serves each group itself)."""
    models = {role: cfg for role, cfg in recipe.models.items()
              if cfg.backend != "openai" or cfg.base_url}
    return recipe.model_copy(update={"models": models})


def _episodes_done(recipe: Recipe) -> bool:
    """Done: every episode the study plans has a result line."""
    from prour.eval.harness import load_result_lines
    from prour.eval.study import episode_key, study_plan

    path = _results(recipe).path
    if recipe.study is None or not path.is_file():
        return False
    have = load_result_lines(path)
    return all(episode_key(p, cell) in have for cell, planned in study_plan(recipe).items()
               for p in planned)


def _no_judge(recipe: Recipe) -> str | None:
    if no_study(recipe):
        return no_study(recipe)
    if not any(grid.policies for grid in recipe.study.grids.values()):
        return "no grid of the study runs an attention variant: no request to judge"
    return None


def _no_study_report(recipe: Recipe) -> str | None:
    if no_study(recipe):
        return no_study(recipe)
    if recipe.study.report != "ask-less":
        return "study.report is prour: the report step sets its tables in the paper's report"
    return None


def _judge_done(recipe: Recipe) -> bool:
    from prour.eval.study_judge import judge_done

    return recipe.study is not None and judge_done(recipe)


def _no_second_judge(recipe: Recipe) -> str | None:
    if no_study(recipe):
        return no_study(recipe)
    if not recipe.study.second_judge_sample:
        return "study.second_judge_sample is 0"
    return None if "second_judge" in recipe.models else "the recipe has no models.second_judge"


def _nl_judged(recipe: Recipe) -> bool:
    """Done: no latest result line of the study waits for the NL-assertion judge (unscored with
    only NL_ASSERTION left, as its episode's offline scoring recorded)."""
    from prour.eval.harness import load_result_lines

    path = _results(recipe).path
    if not path.is_file():
        return False
    return not any(line.get("unscored") and line.get("not_evaluated") == ["NL_ASSERTION"]
                   for line in load_result_lines(path).values())


def _nl_role(recipe: Recipe) -> tuple[str, ...]:
    """The judge of NL assertions: ``models.nl_judge``, else ``models.judge``."""
    if no_study(recipe):
        return ()
    return ("nl_judge",) if "nl_judge" in recipe.models else ("judge",)


def _second_judged(recipe: Recipe) -> bool:
    from prour.eval.study_second_judge import second_judged

    return second_judged(recipe)


def _report_reads(recipe: Recipe) -> tuple[File, ...]:
    second = (File("study second-judge", study_folder(recipe) / SECOND_JUDGE_FILE),) \
        if _no_second_judge(recipe) is None else ()
    return (_results(recipe), *second)


STUDY = Stage("study", "the study's grids: episodes per serving group, judge pass, report", (
    Step("study", "every episode the study's grids plan, each serving group in turn",
         ("study", "run", *_R), reads=_study_reads, writes=lambda r: (_results(r),),
         roles=study_roles,
         done=_episodes_done, keys=("study", "eval", "-eval.concurrency", "-eval.tradeoff",
                                    "models", "env", "router",
                                    "-router.calibration.approve_labels", "seed"),
         skip=no_study, serving=_served_by_itself, serves_itself=True),
    Step("nl-assertions", "the natural-language assertions of the study's episodes judged as "
         "tau2 judges them (τ³-bench retail)", ("nl-assertions", "{study_dir}", *_R),
         reads=lambda r: (_results(r),), writes=lambda r: (_results(r),), clears=lambda r: (),
         roles=_nl_role, done=_nl_judged, keys=("models.nl_judge", "models.judge"),
         skip=no_study),
    Step("judge", "the judge's reading effort and value of every delivered request",
         ("study", "judge", *_R), reads=lambda r: (_results(r),),
         writes=lambda r: (_results(r),), clears=lambda r: (),
         roles=lambda r: ("judge",) if _no_judge(r) is None else (), done=_judge_done,
         keys=("models.judge", "eval.attention.judge_attempts", "study.max_judge_failures"),
         skip=_no_judge),
    Step("second-judge", "a fixed sample of questions re-scored by models.second_judge",
         ("study", "second-judge", *_R), reads=lambda r: (_results(r),),
         writes=lambda r: (File("study second-judge", study_folder(r) / SECOND_JUDGE_FILE),),
         roles=lambda r: ("second_judge",) if _no_second_judge(r) is None else (),
         done=_second_judged, keys=("models.second_judge", "study.second_judge_sample"),
         skip=_no_second_judge),
    Step("study-report", "the study's tables and figures beside the paper's numbers",
         ("study", "report", *_R), reads=_report_reads,
         writes=lambda r: (File("study report (run_dir/study/report)",
                                study_folder(r) / REPORT_INDEX),),
         keys=("study", "eval.attention.accounting", "eval.attention.lam"),
         skip=_no_study_report),
), placement="servers", slurm_command=("run", *_R, "--only", "study"), skip=no_study)
