"""The pieces of the chain's table: :class:`Step` (one row: its command, the files it reads and
writes, how "done" is read, the roles it calls), :class:`Stage` (the unit ``--stages``,
preflight, the GPU plan and Slurm name, with its rows), :class:`File` and :class:`Extra`; how a
row's command is filled in (:func:`format_command`, :func:`command_values`); and the paths and
helpers the rows of several packages share (the run folder, the data files, the collections the
calibration states are sampled from, the exported checkpoint, eval's folders, the ig-clarifier
baseline's recipe).

Each stage package declares its own rows next to its code (``prour/<package>/steps.py``);
:mod:`prour.stages` puts them in the paper's order and answers the questions every caller asks.
This module sits below all of them: it imports the standard library only (what a helper needs
from a stage package it imports inside the function, so ``prour --help`` stays fast).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


GPU_EXTRA = "pip install -e '.[gpu]'"

# The airline collection that yields the held-out calibration states (docs/run-the-paper.md;
# paper A.2.2: 240 airline decision states; the protocol allows them, so its command sets
# protocol.on_breach=warn: the guard would otherwise read airline's train split as training
# tasks). Paper A.2.2: 240
# airline decision states sampled from router.calibration.test_episodes = 60 episodes of the
# airline train split).
AIRLINE_TRAJECTORIES = "data/airline_trajectories.jsonl"

# The retail collection of the calibration reserve's tasks (data.calibration_reserve) that yields
# the dev candidate states (paper A.2.2: a development set disjoint from training);
# router.calibration.dev_episodes episodes.
DEV_TRAJECTORIES = "data/calibration_dev_trajectories.jsonl"

TRADEOFF_NAMES = ("budget", "every_n")  # prour.config.eval.TRADEOFF_SWEEPS, in step order
RECIPE_OPTION = ("--recipe", "{recipe}")  # a row's command on the run's recipe


@dataclass(frozen=True)
class File:
    """A file (or folder) a step reads or writes: the recipe key (or what names it) and where."""

    key: str
    path: Path
    checked: bool = True  # preflight requires it (False: a check of its own reads it, or a flag
    # names it: the thresholds, eval's --checkpoint)


@dataclass(frozen=True)
class Extra:
    """An optional module a stage imports: why, what to do when it is missing, in which python."""

    module: str
    why: str
    fix: str
    python: str | None = None  # None: this interpreter


Files = Callable[["Recipe"], tuple[File, ...]]
Roles = Callable[["Recipe"], tuple[str, ...]]


@dataclass(frozen=True)
class Approval:
    """How a gate of its own passes (the taxonomy's review; the calibration review is the
    runner's own): ``approve(recipe, by)`` records the approval (``by``: ``--approve-labels`` or
    the recipe key) and returns one line saying what it approved, raising ``ValueError`` when
    there is nothing it can approve; ``waiting(recipe)`` gives a line per file a person reviews;
    ``unattended(recipe)`` names the recipe key that approves without a person when the recipe
    sets it (else None); ``correct`` says what a wrong line's ``corrected`` field takes."""

    approve: Callable[[Recipe, str], str]
    waiting: Callable[[Recipe], list[str]]
    unattended: Callable[[Recipe], str | None]
    correct: str


def _nothing(recipe: Recipe) -> tuple:
    return ()


@dataclass(frozen=True)
class Step:
    """One row of the chain.

    ``command`` is the argv after ``prour``; ``{recipe}`` and the names of :func:`command_values`
    stand for the run's values. ``None`` marks a gate: a person passes it, nothing runs.
    ``done`` reads the outputs (default: every written file exists); a gate has none.
    ``by_stage``: the stage's own command (its Slurm job, its preflight) runs this step; False
    for a step run by hand before it (today: the review of the labels). ``prour run`` walks
    every row, by_stage or not.

    ``keys``: the dotted recipe key prefixes its outputs depend on (``data.teacher*`` matches by
    string prefix, ``-router.thresholds_file`` leaves a key out); ``prour run`` stamps their
    values and calls the step stale when they change. ``clears``: what ``--rerun-stale`` moves
    aside before running it again, and what shows a partial run (default: ``writes``).
    ``resume``: arguments its command takes to continue a partial run. ``skip``: why a run of
    this recipe leaves the step out (its stage's own ``skip`` holds too)."""

    name: str
    summary: str
    command: tuple[str, ...] | None
    reads: Files = _nothing
    writes: Files = _nothing
    roles: Roles = _nothing  # the model roles the step calls
    tokenizers: Roles = _nothing  # roles whose tokenizer (not model) the step reads
    done: Callable[[Recipe], bool] | None = None
    by_stage: bool = True
    keys: tuple[str, ...] = ()
    clears: Files | None = None
    resume: tuple[str, ...] = ()
    skip: Callable[[Recipe], str | None] | None = None
    # The recipe whose servers the step calls, when the step serves more than the recipe's own
    # openai roles (eval under eval.generator_backend vllm: the exported checkpoint too).
    serving: Callable[[Recipe], Recipe] | None = None
    # The step starts the servers it calls itself, one serving group after another (the study:
    # prour.cluster.study); the runner serves it nothing, and its dry run prints the groups.
    serves_itself: bool = False
    # A gate that says how it passes (``prour run --approve-labels`` or its recipe key), what a
    # person reviews and how; None: the calibration review, which the runner knows.
    approval: Approval | None = None

    def served_recipe(self, recipe: Recipe) -> Recipe:
        """The recipe whose ``serve.models`` and roles the servers of this step come from."""
        return self.serving(recipe) if self.serving is not None else recipe

    @property
    def is_gate(self) -> bool:
        """A person passes it; nothing runs (its ``done`` reads the approval)."""
        return self.command is None

    def cleared(self, recipe: Recipe) -> tuple[File, ...]:
        """What a rerun of this step replaces (``clears``, else ``writes``)."""
        return (self.clears or self.writes)(recipe)

    def argv(self, recipe: Recipe, recipe_path: str | None = "{recipe}",
             extra: Iterable[str] = ()) -> list[str]:
        """The command's arguments for this recipe, ``extra`` after the recipe (or at the end of
        a command without one); ``recipe_path=None`` leaves ``--recipe`` out (as in "run `prour
        collect` first": the command on the same recipe)."""
        if self.command is None:
            raise ValueError(f"step {self.name!r} is a gate: no command runs it")
        extra = list(extra)
        if not self.takes_recipe:
            return [*format_command(self.command, recipe, recipe_path), *extra]
        return format_command(self.command, recipe, recipe_path, extra)

    @property
    def takes_recipe(self) -> bool:
        """Whether its command reads the recipe (and so takes ``--set`` overrides)."""
        return "--recipe" in (self.command or ())

    def hint(self, recipe: Recipe, recipe_path: str | None = None) -> str:
        """``prour <command>`` as a person types it (a gate: what to do instead): on
        ``recipe_path``, else on the file and ``--set`` items the recipe was loaded from (a
        runner's endpoints file left out: the command serves or finds its own)."""
        if self.command is None:
            return self.summary
        import shlex

        extra: list[str] = []
        if recipe_path is None and recipe.origin() is not None:
            recipe_path, items = recipe.origin()
            extra = [part for item in items if not item.startswith("endpoints_file=")
                     for part in ("--set", item)]
        return shlex.join(["prour", *self.argv(recipe, recipe_path, extra)])

    def is_done(self, recipe: Recipe) -> bool:
        """Whether the outputs say this step has run (a gate: whether its ``done`` says passed)."""
        if self.command is None:
            return self.done(recipe) if self.done is not None else False
        if self.done is not None:
            return self.done(recipe)
        outputs = self.writes(recipe)
        return bool(outputs) and all(out.path.exists() for out in outputs)


@dataclass(frozen=True)
class Stage:
    """A unit the CLI, preflight, the GPU plan and Slurm name, with its steps of the chain.

    ``placement`` is where its models sit on a node's GPUs: ``servers`` (the vLLM servers it
    starts), ``trainer`` (the verl trainer, beside its responders' servers), ``in_process``
    (``hf`` roles it loads) or ``none`` (it places nothing). ``slurm`` is the kind of sbatch
    template its job renders (``serve``, ``train``, ``eval`` array, or one ``stage`` command:
    ``slurm_command``)."""

    name: str
    summary: str
    steps: tuple[Step, ...]
    placement: str
    slurm: str = "stage"
    slurm_command: tuple[str, ...] | None = None
    extras: Callable[[Recipe], tuple[Extra, ...]] = _nothing
    weights: Callable[[Recipe], tuple[tuple[str, str], ...]] = _nothing  # (model, key) loaded
    # beside the hf roles (the verl policy, extract's tokenizer, the served models)
    gpus: Callable[[Recipe], dict[str, int]] = lambda recipe: {}  # GPUs a node must show, by key
    routes: Callable[[Recipe], bool] = lambda recipe: False  # reads the decomposer's thresholds
    skip: Callable[[Recipe], str | None] = lambda recipe: None  # why a run leaves it out
    preflight: bool = True  # its command checks the setup before its first step
    long_running: bool = False  # runs beside the later stages (serve): they start once it runs
    refuse_idle: bool = False  # with nothing to do (skip) its command fails: refuse to submit it
    # the run's own result lines its servers are sized from (tokens per request; None: none)
    sized_from: Callable[[Recipe], Path | None] = lambda recipe: None

    def roles(self, recipe: Recipe) -> tuple[str, ...]:
        return union(step.roles(recipe) for step in self.steps)

    def job_argv(self, recipe: Recipe, recipe_path: str, sets: Iterable[str] = ()) -> list[str]:
        """The ``prour`` arguments its one-command Slurm job runs (``slurm_command``), with
        ``sets`` (``--set`` items) after the recipe."""
        if self.slurm_command is None:
            raise ValueError(f"stage {self.name!r} renders its own template ({self.slurm})")
        return format_command(self.slurm_command, recipe, recipe_path, list(sets))


def union(groups: Iterable[Iterable[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(role for group in groups for role in group))


EXTERNAL = Step("external", "a file from outside the chain", None)


# ---- paths the steps of several packages read and write ------------------------------------------


def run_folder(recipe: Recipe) -> Path:
    return recipe.resolved_run_dir()


def data_file(recipe: Recipe, name: str) -> File:
    return File(f"data.{name}", Path(getattr(recipe.data, name)))


def airline_file(recipe: Recipe) -> File:
    return File("collect-airline (--set data.trajectories)",
                run_folder(recipe) / AIRLINE_TRAJECTORIES)


def dev_file(recipe: Recipe) -> File:
    return File("collect-dev (--set data.trajectories)", run_folder(recipe) / DEV_TRAJECTORIES)


def line_count(path: Path) -> int:
    """Non-empty lines of a JSONL file (0 when it does not exist)."""
    try:
        with open(path) as handle:
            return sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        return 0


def checkpoints(recipe: Recipe) -> Path:
    """Where training writes its checkpoints: ``train.output_dir``, or its default taken from
    ``run_dir`` by the path rule when the recipe has no ``train`` section."""
    from prour.config import run_path
    from prour.config.train import TrainConfig

    if recipe.train is not None:
        return Path(recipe.train.output_dir)
    return Path(run_path(TrainConfig().output_dir, recipe.resolved_run_dir(), recipe.name))


def total_steps(recipe: Recipe) -> int:
    return recipe.train.total_steps if recipe.train is not None else 0


def exported(recipe: Recipe) -> Path:
    """Where ``prour train export`` leaves the final step as a Hugging Face folder."""
    from prour.config.train import step_dir

    return step_dir(checkpoints(recipe), total_steps(recipe))


def eval_dir(recipe: Recipe) -> Path:
    return run_folder(recipe) / "eval"


def tradeoff_dir(recipe: Recipe, name: str) -> Path:
    """The run folder of a trade-off sweep (``eval-budget``, ``eval-every-n`` under run_dir)."""
    from prour.config.eval import TRADEOFF_FOLDERS

    return run_folder(recipe) / TRADEOFF_FOLDERS[name]


def tradeoff_sweep(recipe: Recipe, name: str) -> dict[str, list[int | None]]:
    """The ``eval.sweep`` a trade-off step runs: its router key over eval.tradeoff.<name>."""
    from prour.config.eval import TRADEOFF_SWEEPS

    return {TRADEOFF_SWEEPS[name]: list(getattr(recipe.eval.tradeoff, name))}


def tradeoff_methods(recipe: Recipe) -> list[str]:
    """The methods the trade-off sweeps run: eval.tradeoff.methods that eval.methods holds."""
    return [m for m in recipe.eval.tradeoff.methods if m in recipe.eval.methods]


# ---- the IG-Clarifier baseline's own training (prour.config.ig_clarifier) -------------------------


def ig_trains(recipe: Recipe) -> bool:
    """Whether the run trains the ig-clarifier baseline: eval.methods holds it and the recipe
    trains (a recipe without ``train`` evaluates it with a given ``models.ig_clarifier``)."""
    from prour.config.ig_clarifier import NAME

    return recipe.train is not None and NAME in recipe.eval.methods


def no_ig(recipe: Recipe) -> str | None:
    if recipe.train is None:
        return "the recipe has no `train` section"
    return None if ig_trains(recipe) else "eval.methods has no ig-clarifier"


def ig_recipe(recipe: Recipe) -> Recipe:
    """The run's recipe with IG-Clarifier's settings (:data:`prour.config.ig_clarifier.SETTINGS`,
    the ``--set`` items its steps pass) applied: what its train and export steps run on."""
    from prour.config.ig_clarifier import setting_items
    from prour.recipes import with_settings

    return with_settings(recipe, setting_items(),
                         "the ig-clarifier settings (prour.config.ig_clarifier)")


def of_ig(fn: Callable[[Recipe], Any]) -> Callable[[Recipe], Any]:
    """``fn`` of the ig-clarifier recipe (:func:`ig_recipe`); nothing without its training."""
    return lambda recipe: fn(ig_recipe(recipe)) if ig_trains(recipe) else ()


def _ig_exported(recipe: Recipe) -> Path | None:
    """The exported ig-clarifier checkpoint that eval's ``models.ig_clarifier`` loads."""
    return exported(ig_recipe(recipe)) if ig_trains(recipe) else None


def ig_clarifier_model(recipe: Recipe) -> dict[str, Any] | None:
    """``models.ig_clarifier`` as eval and a study load it: the exported ig-clarifier checkpoint,
    loaded as ``prour eval --checkpoint`` loads prour's (dtype, device and context of an ``hf``
    generator kept); None without its training."""
    if not ig_trains(recipe):
        return None
    model: dict[str, Any] = {"backend": "hf", "path": str(_ig_exported(recipe))}
    base = recipe.models.get("generator")
    if base is not None and base.backend == "hf":
        model.update(dtype=base.dtype, device=base.device, max_model_len=base.max_model_len)
    return {k: v for k, v in model.items() if v is not None}


def _ig_clarifier_set(recipe: Recipe) -> str:
    """Eval's ``--set`` of ``models.ig_clarifier`` (:func:`ig_clarifier_model`); empty without
    its training."""
    import json

    model = ig_clarifier_model(recipe)
    return "" if model is None else "models.ig_clarifier=" + json.dumps(model)


def ig_sets() -> tuple[str, ...]:
    from prour.config.ig_clarifier import setting_items

    return tuple(part for item in setting_items() for part in ("--set", item))


# ---- the servers eval calls ----------------------------------------------------------------------


def eval_serving(recipe: Recipe) -> Recipe:
    """Eval's recipe under ``eval.generator_backend: vllm``: the generator a server of the
    exported checkpoint (a recipe without training: of ``models.generator``'s folder), which
    the runner starts before eval, once export has written it."""
    from prour.cluster.recipe import generator_folder, serves_generator, with_served_generator

    if not serves_generator(recipe):
        return recipe
    folder = exported(recipe) if recipe.train is not None else generator_folder(recipe)
    return with_served_generator(recipe, folder)


# ---- a row's command -----------------------------------------------------------------------------


def command_values(recipe: Recipe) -> dict[str, str]:
    """The values a step's command names (``{trajectories}``, ``{checkpoints}``, ...)."""
    return {
        "run_dir": str(run_folder(recipe)),
        "trajectories": str(data_file(recipe, "trajectories").path),
        "airline_trajectories": AIRLINE_TRAJECTORIES,
        "airline_path": str(airline_file(recipe).path),
        "airline_episodes": str(recipe.router.calibration.test_episodes),
        "dev_trajectories": DEV_TRAJECTORIES,
        "dev_path": str(dev_file(recipe).path),
        "dev_episodes": str(recipe.router.calibration.dev_episodes),
        # none without a train section: eval then evaluates models.generator as the recipe has it
        "checkpoints": str(checkpoints(recipe)) if recipe.train is not None else "",
        # eval's models.ig_clarifier: the exported ig-clarifier checkpoint (none: not trained)
        "ig_clarifier": _ig_clarifier_set(recipe),
        "eval_dir": str(eval_dir(recipe)),
        "study_dir": str(run_folder(recipe) / "study"),  # prour.config.study.STUDY_FOLDER
        # the trade-off sweeps' run folders and settings (eval.tradeoff; steps eval-budget and
        # eval-every-n): eval.tradeoff.methods over one router key's values
        **{f"{name}_dir": str(tradeoff_dir(recipe, name)) for name in TRADEOFF_NAMES},
        **{f"{name}_sweep": json.dumps(tradeoff_sweep(recipe, name)) for name in TRADEOFF_NAMES},
        "tradeoff_methods": json.dumps(tradeoff_methods(recipe)),
    }


def format_command(command: Iterable[str], recipe: Recipe, recipe_path: str | None,
                   after_recipe: list[str] | None = None) -> list[str]:
    """``command`` with its ``{names}`` filled from the recipe; ``after_recipe`` follows
    ``--recipe PATH``; with ``recipe_path=None`` the ``--recipe`` pair is left out, and so is an
    option whose value fills in empty (``--checkpoint`` of a recipe without training)."""
    values = {"recipe": recipe_path, **command_values(recipe)}
    out: list[str] = []
    parts = list(command)
    while parts:
        part = parts.pop(0)
        if part == "--recipe":
            value = parts.pop(0)
            if recipe_path is not None:
                out += [part, value.format(**values), *(after_recipe or [])]
            continue
        filled = part.format(**values)
        if not filled and out and out[-1].startswith("--") and part != filled:
            out.pop()
            continue
        out.append(filled)
    return out
