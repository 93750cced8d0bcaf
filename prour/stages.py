"""The stages in the paper's order, and the questions every caller asks of them.

The chain runs from tau2 tasks to the report (DESIGN.md §6): serve beside everything, collect
retail, the calibration reserve's dev episodes and airline, normalize, calibration states (dev,
test), annotate, the review gate, threshold search, held-out evaluation, extract, train, export,
eval, a recipe's study, the uncertainty taxonomy of the collected trajectories and its review
gate, report. Each package declares its own rows next to the code that does the work
(``prour/cluster/steps.py``: serve; ``prour/data/steps.py``: collect, normalize, extract,
taxonomy; ``prour/router/steps.py``: calibrate and its review gate; ``prour/train/steps.py``:
train, export; ``prour/eval/steps.py``: eval, report), out of the pieces of :mod:`prour.step`: a
:class:`Stage` is what ``--stages``, preflight, the GPU plan, ``slurm.<stage>`` and the Slurm
jobs name; its :class:`Step` rows say the command that runs each step, the files it reads and
writes, how "done" is read and the model roles it calls, derived from the recipe.

This module puts those stages in order (:data:`STAGES`) and answers from the whole chain: which
stage or step a name means, the roles a stage needs, which step writes a file, which steps a run
walks without a person (no gate, nothing the recipe leaves out). Every other module asks these
questions; none compares stage names. Nothing heavy is imported here (``prour --help`` stays
fast). The names other modules import from here (the row types, :func:`command_values`,
:func:`ig_recipe`, :func:`tradeoff_recipe`, :func:`served_ids`, ...) stay importable from here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from prour.cluster.steps import SERVE, serve_python, served_ids
from prour.cluster.study_steps import STUDY
from prour.data.steps import COLLECT, EXTRACT, NORMALIZE, TAXONOMY
from prour.eval.steps import EVAL, REPORT, tradeoff_recipe
from prour.router.steps import CALIBRATE
from prour.step import (
    AIRLINE_TRAJECTORIES,
    DEV_TRAJECTORIES,
    EXTERNAL,
    GPU_EXTRA,
    TRADEOFF_NAMES,
    Extra,
    File,
    Stage,
    Step,
    command_values,
    format_command,
    ig_recipe,
    ig_trains,
    union,
)
from prour.train.steps import EXPORT, TRAIN

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import ModelConfig, Recipe

__all__ = [
    "AIRLINE_TRAJECTORIES", "DEV_TRAJECTORIES", "EXTERNAL", "GPU_EXTRA", "STAGES",
    "TRADEOFF_NAMES", "Extra", "File", "Stage", "Step", "chain_supplied",
    "command_options", "command_values", "format_command", "get_stage", "get_step", "ig_recipe",
    "required_roles", "run_stages", "run_steps", "serve_python", "served_elsewhere",
    "served_ids", "stage_inputs", "stage_names", "stage_of", "stage_roles", "steps",
    "supplied_model",
    "tradeoff_recipe", "writer_of",
]


def writer_of(recipe: Recipe, path: Path) -> Step:
    """The step that writes ``path`` (:data:`EXTERNAL` when none of the chain does)."""
    for step in steps():
        if any(out.path == path for out in step.writes(recipe)):
            return step
    return EXTERNAL


def _standalone_study(recipe: Recipe) -> str | None:
    """Why a standalone study's run leaves the training chain out (None: it does not)."""
    if recipe.study is not None and recipe.study.standalone:
        return "the recipe is a study alone (study.standalone: true)"
    return None


def _in_chain(stage: Stage) -> Stage:
    """A stage of the training chain: left out of a standalone study's run as well."""
    return replace(stage, skip=lambda recipe: _standalone_study(recipe) or stage.skip(recipe))


# The paper's order; a recipe's study runs after its evaluation, before the report that reads it.
# The taxonomy (A.1) annotates the collected trajectories last, so that its review holds up
# neither training nor the evaluations; the report reads its labels.
STAGES: tuple[Stage, ...] = (*map(_in_chain, (SERVE, COLLECT, NORMALIZE, CALIBRATE, EXTRACT,
                                              TRAIN, EXPORT, EVAL)),
                             STUDY, *map(_in_chain, (TAXONOMY, REPORT)))


def stage_inputs(stage: Stage, recipe: Recipe) -> list[tuple[File, Step]]:
    """Files the stage's command reads that its own steps do not write first, with the step
    that writes them (:data:`EXTERNAL` for files from outside the chain); a step whose outputs
    are there already reads nothing (a rerun skips it)."""
    made: set[Path] = set()
    needed: list[tuple[File, Step]] = []
    for step in stage.steps:
        wanted = [file for file in step.reads(recipe) if file.path not in made]
        # a step whose outputs are there reads nothing; asked only when an input is missing
        # (reading "done" may load task lists)
        if step.by_stage and not (any(file.checked and not file.path.exists()
                                      for file in wanted) and _already_done(step, recipe)):
            for file in wanted:
                needed.append((file, writer_of(recipe, file.path)))
                made.add(file.path)  # named once, however many steps read it
        made.update(out.path for out in step.writes(recipe))
    return needed


def _already_done(step: Step, recipe: Recipe) -> bool:
    """Whether the step's outputs are there (a recipe its ``done`` cannot read: not done; the
    step's own command names the problem)."""
    try:
        return step.is_done(recipe)
    except (ValueError, LookupError, OSError):
        return False


# ---- questions every caller asks ----------------------------------------------------------------


def stage_names() -> tuple[str, ...]:
    """The stages in pipeline order (what ``--stages`` and ``slurm.<stage>`` name)."""
    return tuple(stage.name for stage in STAGES)


def steps() -> tuple[Step, ...]:
    """Every step of the chain, in order."""
    return tuple(step for stage in STAGES for step in stage.steps)


def get_stage(name: str) -> Stage:
    """The stage called ``name``; ``stage/step`` is that stage with only that step (what one
    command of a stage runs, e.g. ``prour train`` on its recipe: ``train/train``, not the
    ig-clarifier's training beside it). An unknown name lists the valid ones."""
    name, _, step = name.partition("/")
    for stage in STAGES:
        if stage.name == name:
            if not step:
                return stage
            one = tuple(s for s in stage.steps if s.name == step)
            if not one:
                from prour.registry import unknown_name

                raise ValueError(unknown_name(f"step of stage {name}", step,
                                              [s.name for s in stage.steps]))
            return replace(stage, steps=one)
    from prour.registry import unknown_name

    raise ValueError(unknown_name("stage", name, stage_names()))


def get_step(name: str) -> Step:
    """The step called ``name``; an unknown name lists the valid ones."""
    for step in steps():
        if step.name == name:
            return step
    from prour.registry import unknown_name

    raise ValueError(unknown_name("step", name, [step.name for step in steps()]))


def stage_of(step: Step) -> Stage:
    return next(stage for stage in STAGES if step in stage.steps)


def served_elsewhere(recipe: Recipe, step: Step) -> bool:
    """Whether ``step``'s servers are another node's (the trainer's stage under
    ``serve.colocate_train: false``): it reaches them through the recipe's endpoints file."""
    return stage_of(step).placement == "trainer" and not recipe.serve.colocate_train


def _rows(name: str) -> tuple[Step, ...]:
    """A stage's steps, or the one step called ``name``."""
    if name in stage_names() or "/" in name:
        return get_stage(name).steps
    return (get_step(name),)


def stage_roles(recipe: Recipe, name: str) -> tuple[str, ...]:
    """The ``models.<role>`` that a stage (or one step) calls, derived from the recipe."""
    return union(step.roles(recipe) for step in _rows(name))


def required_roles(recipe: Recipe, name: str) -> tuple[str, ...]:
    """The roles a stage (or step) needs in the recipe: those it calls and those whose tokenizer
    it reads (extract counts prompt tokens with the policy's), less those the chain's own
    commands supply (:func:`chain_supplied`)."""
    supplied = chain_supplied(recipe)
    return tuple(role for role in union([*(step.roles(recipe) for step in _rows(name)),
                                         *(step.tokenizers(recipe) for step in _rows(name))])
                 if role not in supplied)


def chain_supplied(recipe: Recipe) -> set[str]:
    """Roles the recipe need not have because a step's command sets them: eval's
    ``models.ig_clarifier`` when the run trains the ig-clarifier baseline (``--set
    models.ig_clarifier.path=<its export>``)."""
    return {"ig_clarifier"} if ig_trains(recipe) and "ig_clarifier" not in recipe.models \
        else set()


def supplied_model(recipe: Recipe, role: str) -> ModelConfig | None:
    """What a chain-supplied role loads, for plans that size it: the ig-clarifier checkpoint is a
    fine-tune of ``models.generator`` (same shape and dtype). None: not supplied."""
    if role not in chain_supplied(recipe):
        return None
    return recipe.models.get("generator")


def run_steps(recipe: Recipe) -> list[Step]:
    """The steps that the stages' own commands run, of the stages this recipe keeps: what one
    pass over the chain runs without a person (no gate, no step run by hand)."""
    return [step for stage in STAGES if stage.skip(recipe) is None
            for step in stage.steps
            if step.by_stage and (step.skip is None or step.skip(recipe) is None)]


def run_stages(recipe: Recipe) -> list[str]:
    """The stages a whole run of this recipe has that check their setup: each one the recipe
    does not leave out (serve only with models to serve, calibrate only without explicit
    ``router.tau_au``/``tau_eu``, train only with a ``train`` section)."""
    return [stage.name for stage in STAGES if stage.preflight and stage.skip(recipe) is None]


def command_options(stage: str, option: str) -> tuple[str, ...]:
    """The values the steps of ``stage`` give ``option`` (``prour calibrate --stage``)."""
    values = []
    for step in get_stage(stage).steps:
        command = list(step.command or ())
        if option in command[:-1]:
            values.append(command[command.index(option) + 1])
    return tuple(values)
