"""The table of stages: the paper's chain from tau2 tasks to the report, one row per step.

A :class:`Stage` is what ``--stages``, preflight, the GPU plan, ``slurm.<stage>`` and the Slurm
jobs name (``serve``, ``collect``, ..., ``report``); its :class:`Step` rows are the chain as a run
walks it (DESIGN.md §6): collect retail, collect the calibration reserve's dev episodes,
collect airline, normalize, calibration states (dev,
test), annotate, the review gate, threshold search, held-out evaluation, extract, train, export,
eval, report. Each step says the command that runs it (printable, runnable as printed), the files
it reads and writes (resolved the way the stage itself resolves them), how "done" is read from
those outputs and the model roles it calls, derived from the recipe: an eval calls what its
methods call, a train with the judge-priced attention reward calls the judge, a collect calls
the teacher only with ``data.teacher``. A stage adds what holds for all its steps: extras to
install, GPU placement, Slurm template, what its command checks before starting.

Every other module asks this table; none compares stage names. Nothing heavy is imported here
(``prour --help`` stays fast): what a row needs it imports inside its functions.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import ModelConfig, Recipe

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

    def roles(self, recipe: Recipe) -> tuple[str, ...]:
        return _union(step.roles(recipe) for step in self.steps)

    def job_argv(self, recipe: Recipe, recipe_path: str, sets: Iterable[str] = ()) -> list[str]:
        """The ``prour`` arguments its one-command Slurm job runs (``slurm_command``), with
        ``sets`` (``--set`` items) after the recipe."""
        if self.slurm_command is None:
            raise ValueError(f"stage {self.name!r} renders its own template ({self.slurm})")
        return format_command(self.slurm_command, recipe, recipe_path, list(sets))

    def inputs(self, recipe: Recipe) -> list[tuple[File, Step]]:
        """Files its command reads that its own steps do not write first, with the step that
        writes them (:data:`EXTERNAL` for files from outside the chain); a step whose outputs
        are there already reads nothing (a rerun skips it)."""
        made: set[Path] = set()
        needed: list[tuple[File, Step]] = []
        for step in self.steps:
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


def _union(groups: Iterable[Iterable[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(role for group in groups for role in group))


# ---- paths the steps read and write ----------------------------------------------------------


def _run_dir(recipe: Recipe) -> Path:
    return recipe.resolved_run_dir()


def _data(recipe: Recipe, name: str) -> File:
    return File(f"data.{name}", Path(getattr(recipe.data, name)))


def _airline(recipe: Recipe) -> File:
    return File("collect-airline (--set data.trajectories)", _run_dir(recipe) / AIRLINE_TRAJECTORIES)


def _dev_trajectories(recipe: Recipe) -> File:
    return File("collect-dev (--set data.trajectories)", _run_dir(recipe) / DEV_TRAJECTORIES)


def _states(recipe: Recipe, split: str) -> tuple[File, ...]:
    """The split's calibration states where the calibrate stage reads them (none when unset)."""
    from prour.router.pipeline import states_path

    if not getattr(recipe.router.calibration, f"{split}_states"):
        return ()
    return (File(f"router.calibration.{split}_states", states_path(recipe, split)),)


def _sampled_from(recipe: Recipe, split: str) -> tuple[File, ...]:
    """The trajectories a split's states are sampled from: the retail collection of the
    calibration reserve (dev), the airline collection (test); none when the split has no states
    file."""
    if not _states(recipe, split):
        return ()
    return (_dev_trajectories(recipe),) if split == "dev" else (_airline(recipe),)


def _no_states(recipe: Recipe, split: str) -> str | None:
    if getattr(recipe.router.calibration, f"{split}_states"):
        return None
    return f"router.calibration.{split}_states is not set"


def _calibration(recipe: Recipe, kind: str, split: str) -> File:
    from prour.router.pipeline import cache_path, labels_path

    path = labels_path(recipe, split) if kind == "labels" else cache_path(recipe, split)
    return File(f"router.calibration.out_dir ({path.name})", path)


def _mix_file(recipe: Recipe) -> File:
    from prour.router.pipeline import mix_path

    return File("router.calibration.out_dir (dev_mix.json)", mix_path(recipe))


def _evidence_file(recipe: Recipe) -> File:
    from prour.router.pipeline import router_evidence_path

    return File("router.calibration.out_dir (router_evidence.json)",
                router_evidence_path(recipe))


def _heldout_done(recipe: Recipe) -> bool:
    """A decomposer decision per held-out state, and the router evidence written."""
    return _covers(_measured, ("test",))(recipe) and _evidence_file(recipe).path.is_file()


def _thresholds(recipe: Recipe) -> File:
    from prour.router.thresholds import thresholds_path

    return File("router.thresholds_file", thresholds_path(recipe), checked=False)


def _dataset(recipe: Recipe) -> tuple[File, ...]:
    folder = Path(recipe.data.dataset_dir)
    return (File("data.dataset_dir", folder / "train.parquet"),
            File("data.dataset_dir", folder / "validation.parquet"))


def _train_files(recipe: Recipe) -> tuple[File, ...]:
    """``train.train_file`` / ``val_file`` as the trainer reads them."""
    if recipe.train is None:
        return ()
    files = (("train.train_file", recipe.train.train_file), ("train.val_file", recipe.train.val_file))
    return tuple(File(key, Path(path)) for key, path in files if path)


def _checkpoints(recipe: Recipe) -> Path:
    from prour.train.recipe import output_dir

    return output_dir(recipe)


def _eval_dir(recipe: Recipe) -> Path:
    return _run_dir(recipe) / "eval"


TRADEOFF_NAMES = ("budget", "every_n")  # prour.config.eval.TRADEOFF_SWEEPS, in step order


def _tradeoff_dir(recipe: Recipe, name: str) -> Path:
    """The run folder of a trade-off sweep (``eval-budget``, ``eval-every-n`` under run_dir)."""
    from prour.config.eval import TRADEOFF_FOLDERS

    return _run_dir(recipe) / TRADEOFF_FOLDERS[name]


def _tradeoff_sweep(recipe: Recipe, name: str) -> dict[str, list[int | None]]:
    """The ``eval.sweep`` a trade-off step runs: its router key over eval.tradeoff.<name>."""
    from prour.config.eval import TRADEOFF_SWEEPS

    return {TRADEOFF_SWEEPS[name]: list(getattr(recipe.eval.tradeoff, name))}


def _tradeoff_methods(recipe: Recipe) -> list[str]:
    """The methods the trade-off sweeps run: eval.tradeoff.methods that eval.methods holds."""
    return [m for m in recipe.eval.tradeoff.methods if m in recipe.eval.methods]


def tradeoff_recipe(recipe: Recipe, name: str) -> Recipe:
    """The recipe a trade-off step's ``prour eval`` runs: eval.tradeoff.methods over one router
    key's values (the ``--set`` items of its command)."""
    from prour.recipes import with_settings

    items = [f"eval.methods={json.dumps(_tradeoff_methods(recipe))}",
             f"eval.sweep={json.dumps(_tradeoff_sweep(recipe, name))}"]
    return with_settings(recipe, items, f"the eval.tradeoff.{name} sweep")


def command_values(recipe: Recipe) -> dict[str, str]:
    """The values a step's command names (``{trajectories}``, ``{checkpoints}``, ...)."""
    return {
        "run_dir": str(_run_dir(recipe)),
        "trajectories": str(_data(recipe, "trajectories").path),
        "airline_trajectories": AIRLINE_TRAJECTORIES,
        "airline_path": str(_airline(recipe).path),
        "airline_episodes": str(recipe.router.calibration.test_episodes),
        "dev_trajectories": DEV_TRAJECTORIES,
        "dev_path": str(_dev_trajectories(recipe).path),
        "dev_episodes": str(recipe.router.calibration.dev_episodes),
        # none without a train section: eval then evaluates models.generator as the recipe has it
        "checkpoints": str(_checkpoints(recipe)) if recipe.train is not None else "",
        # eval's models.ig_clarifier: the exported ig-clarifier checkpoint (none: not trained)
        "ig_clarifier": _ig_clarifier_set(recipe),
        "eval_dir": str(_eval_dir(recipe)),
        # the trade-off sweeps' run folders and settings (eval.tradeoff; steps eval-budget and
        # eval-every-n): eval.tradeoff.methods over one router key's values
        **{f"{name}_dir": str(_tradeoff_dir(recipe, name)) for name in TRADEOFF_NAMES},
        **{f"{name}_sweep": json.dumps(_tradeoff_sweep(recipe, name)) for name in TRADEOFF_NAMES},
        "tradeoff_methods": json.dumps(_tradeoff_methods(recipe)),
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


# ---- how "done" is read --------------------------------------------------------------------------


def _lines(path: Path) -> int:
    """Non-empty lines of a JSONL file (0 when it does not exist)."""
    try:
        with open(path) as handle:
            return sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        return 0


def _collected(recipe: Recipe) -> bool:
    return _collection_done(_data(recipe, "trajectories").path, recipe.data.num_trajectories,
                            recipe)


def _airline_collected(recipe: Recipe) -> bool:
    return _collection_done(_airline(recipe).path, recipe.router.calibration.test_episodes, recipe)


def _dev_collected(recipe: Recipe) -> bool:
    return _collection_done(_dev_trajectories(recipe).path,
                            recipe.router.calibration.dev_episodes, recipe)


def _collection_done(path: Path, wanted: int, recipe: Recipe) -> bool:
    """What ``prour collect`` exits 0 on: ``wanted`` episodes stored, at most
    ``data.max_error_fraction`` of them errored (a failed collection reruns its errored ones)."""
    from prour.data.collect import stored_episodes

    episodes, errored = stored_episodes(path)
    return episodes >= wanted and errored <= recipe.data.max_error_fraction * episodes


def _covers(outputs: Callable[[Recipe, str], File], splits: tuple[str, ...]) -> Callable:
    """Done when, for each split, the output has a line per calibration state."""
    def done(recipe: Recipe) -> bool:
        states = {split: _states(recipe, split) for split in splits}
        return all(files and files[0].path.exists()
                   and _lines(outputs(recipe, split).path) >= _lines(files[0].path)
                   for split, files in states.items())
    return done


def _annotated(recipe: Recipe) -> bool:
    """Every test state has a label line, and the dev labels' walk ended (its mix file is
    there and the walk needs no further label, or a review reopened it and
    ``router.calibration.short_mix: continue`` goes on short); without dev_mix, every dev state
    labelled."""
    from prour.router.pipeline import dev_mix, goes_on_short, mix_path

    if recipe.router.calibration.dev_mix is None or not _states(recipe, "dev"):
        return _covers(_labels, ("dev", "test"))(recipe)
    if _states(recipe, "test") and not _covers(_labels, ("test",))(recipe):
        return False
    try:
        mix = dev_mix(recipe)
    except ValueError:  # no candidates file yet
        return False
    return mix_path(recipe).is_file() and (mix.pending is None or goes_on_short(recipe, mix))


def _normalized(recipe: Recipe) -> bool:
    """A goal line for every task of the data split (normalize skips the tasks it has)."""
    from prour.data.reserve import data_tasks

    return _lines(_data(recipe, "goals").path) >= len(data_tasks(recipe.data))


def _evaluated(recipe: Recipe, folder: Path | None = None) -> bool:
    """A result line for every episode the eval section plans: methods (a routed one once per
    eval.sweep point) x attention variants x the tasks of each domain x seeds (``prour eval`` reruns only the missing ones)."""
    from prour.env.domains import select_tasks
    from prour.eval.harness import wanted_tasks

    cfg = recipe.eval
    tasks = sum(len(select_tasks(domain, cfg.split, None if cfg.tasks is None
                                 else wanted_tasks(cfg.tasks, domain), cfg.max_tasks,
                                 key="eval.tasks")) for domain in cfg.domains)
    from prour.eval.harness import arm_points

    arms = sum(len(arm_points(cfg, method)) for method in cfg.methods) * len(cfg.variants())
    planned = arms * tasks * len(cfg.seeds)
    return _lines((folder or _eval_dir(recipe)) / "results.jsonl") >= planned


def _sweeping(name: str, fn: Callable[[Recipe], Any], absent: Any) -> Callable[[Recipe], Any]:
    """``fn`` of the trade-off step's recipe (:func:`tradeoff_recipe`); ``absent`` (the recipe
    itself when None) for a recipe that leaves the sweep out."""
    def of(recipe: Recipe) -> Any:
        if _no_tradeoff(name)(recipe) is not None:
            return recipe if absent is None else absent
        return fn(tradeoff_recipe(recipe, name))
    return of


def _swept(name: str) -> Callable[[Recipe], bool]:
    """Done: the trade-off sweep's folder holds a result line per episode it plans."""
    return lambda recipe: _no_tradeoff(name)(recipe) is None and _evaluated(
        tradeoff_recipe(recipe, name), _tradeoff_dir(recipe, name))


def _no_tradeoff(name: str) -> Callable[[Recipe], str | None]:
    def why(recipe: Recipe) -> str | None:
        if not recipe.eval.tradeoff.run:
            return "eval.tradeoff.run is false"
        if not _tradeoff_methods(recipe):
            return "eval.methods holds none of eval.tradeoff.methods"
        return None if getattr(recipe.eval.tradeoff, name) else \
            f"eval.tradeoff.{name} lists no value"
    return why


def _tradeoff_results(recipe: Recipe) -> tuple[File, ...]:
    """The result files of the trade-off sweeps this recipe runs (what the report also reads)."""
    return tuple(File(f"eval.tradeoff.{name}", _tradeoff_dir(recipe, name) / "results.jsonl")
                 for name in TRADEOFF_NAMES if _no_tradeoff(name)(recipe) is None)


def _posthoc_file(recipe: Recipe) -> File:
    from prour.eval.posthoc import POSTHOC_FILE

    return File("eval (run_dir/eval)", _eval_dir(recipe) / POSTHOC_FILE)


def _posthoc_done(recipe: Recipe) -> bool:
    """Every decision the post-hoc pass measures has its line (eval's episodes read)."""
    from prour.eval.posthoc import posthoc_pending

    return _posthoc_file(recipe).path.is_file() and posthoc_pending(_eval_dir(recipe)) == 0


def _no_posthoc(recipe: Recipe) -> str | None:
    from prour.eval.posthoc import needs_posthoc

    methods = recipe.eval.methods
    if all(needs_posthoc(method) for method in methods):  # Figure 6 sets them beside Prour's
        return "eval.methods holds no method that routes with the decomposer"
    if not any(needs_posthoc(method) for method in methods):
        return "every method of eval.methods records its own AU/EU"
    return None if "decomposer" in recipe.models else "the recipe has no models.decomposer"


def _report_reads(recipe: Recipe) -> tuple[File, ...]:
    """The main eval's results, the sweeps' and the post-hoc pass's: what the report draws."""
    posthoc = (_posthoc_file(recipe),) if _no_posthoc(recipe) is None else ()
    return (File("eval (run_dir/eval)", _eval_dir(recipe) / "results.jsonl"),
            *_tradeoff_results(recipe), *posthoc)


def _labels(recipe: Recipe, split: str) -> File:
    return _calibration(recipe, "labels", split)


def _measured(recipe: Recipe, split: str) -> File:
    return _calibration(recipe, "cache", split)


def _thresholds_stored(recipe: Recipe) -> bool:
    """The thresholds file holds a pair for this recipe's decomposer model, fitted on the dev
    labels as they are now (a review that changed them makes the search due again; a pair
    stored without the labels' digest is taken as fitted on them)."""
    from prour.router.review import labels_sha256
    from prour.router.thresholds import decomposer_model_id, load_thresholds

    if "decomposer" not in recipe.models or not _thresholds(recipe).path.is_file():
        return False
    try:
        stored = load_thresholds(_thresholds(recipe).path,
                                 decomposer_model_id(recipe.models["decomposer"]))
    except (LookupError, ValueError):
        return False
    if stored.labels_sha256 is None or not _states(recipe, "dev"):
        return True
    return stored.labels_sha256 == labels_sha256(_labels(recipe, "dev").path)


def _total_steps(recipe: Recipe) -> int:
    return recipe.train.total_steps if recipe.train is not None else 0


def _verl(recipe: Recipe) -> bool:
    """verl's trainer with its FSDP engine, which saves ``global_step_N`` (the CPU rehearsal,
    ``train.verl.engine: cpu_rehearsal``, saves ``step_N`` folders as the local trainer does)."""
    return (recipe.train is not None and recipe.train.backend == "verl"
            and recipe.train.verl.engine != "cpu_rehearsal")


def _final_step(recipe: Recipe) -> Path:
    """The last step's folder: ``step_N`` (local) or ``global_step_N`` (verl's)."""
    from prour.train.checkpoint import step_dir

    if _verl(recipe):
        return _checkpoints(recipe) / f"global_step_{_total_steps(recipe)}"
    return step_dir(_checkpoints(recipe), _total_steps(recipe))


def _trained(recipe: Recipe) -> bool:
    """The trainer saved its last step (a complete local ``step_N``, or verl's newest step)."""
    from prour.train.checkpoint import complete_checkpoints, latest_verl_step, untrained_verl_step

    if _verl(recipe):  # or the initial policy saved as the last step (an empty train file)
        saved = [latest_verl_step(_checkpoints(recipe)), untrained_verl_step(_checkpoints(recipe))]
        return max(step or 0 for step in saved) >= _total_steps(recipe)
    return any(step >= _total_steps(recipe) for step, _ in complete_checkpoints(_checkpoints(recipe)))


def _exported(recipe: Recipe) -> Path:
    """Where ``prour train export`` leaves the final step as a Hugging Face folder."""
    from prour.train.checkpoint import step_dir

    return step_dir(_checkpoints(recipe), _total_steps(recipe))


def _export_clears(recipe: Recipe) -> tuple[File, ...]:
    """What a rerun of export replaces: verl's merged folder; nothing for the local trainer,
    whose step folder already is the Hugging Face folder (export only checks it)."""
    if not _verl(recipe):
        return ()
    return (File("train.output_dir", _exported(recipe)),)


def _exported_done(recipe: Recipe) -> bool:
    from prour.train.checkpoint import is_hf_folder

    return is_hf_folder(_exported(recipe))


def _export_clears(recipe: Recipe) -> tuple[File, ...]:
    """What a rerun of export replaces: verl's merged folder; a local step_N is train's own."""
    return (File("train.output_dir", _exported(recipe)),) if _verl(recipe) else ()


# ---- the IG-Clarifier baseline's own training (prour.train.ig_clarifier) -----------------------


def _eval_serving(recipe: Recipe) -> Recipe:
    """Eval's recipe under ``eval.generator_backend: vllm``: the generator a server of the
    exported checkpoint (a recipe without training: of ``models.generator``'s folder), which
    the runner starts before eval, once export has written it."""
    from prour.cluster.recipe import generator_folder, serves_generator, with_served_generator

    if not serves_generator(recipe):
        return recipe
    folder = _exported(recipe) if recipe.train is not None else generator_folder(recipe)
    return with_served_generator(recipe, folder)


def _ig_trains(recipe: Recipe) -> bool:
    """Whether the run trains the ig-clarifier baseline: eval.methods holds it and the recipe
    trains (a recipe without ``train`` evaluates it with a given ``models.ig_clarifier``)."""
    from prour.train.ig_clarifier import NAME

    return recipe.train is not None and NAME in recipe.eval.methods


def _no_ig(recipe: Recipe) -> str | None:
    if recipe.train is None:
        return "the recipe has no `train` section"
    return None if _ig_trains(recipe) else "eval.methods has no ig-clarifier"


def ig_recipe(recipe: Recipe) -> Recipe:
    """The run's recipe with IG-Clarifier's settings (:data:`prour.train.ig_clarifier.SETTINGS`,
    the ``--set`` items its steps pass) applied: what its train and export steps run on."""
    from prour.recipes import with_settings
    from prour.train.ig_clarifier import setting_items

    return with_settings(recipe, setting_items(),
                         "the ig-clarifier settings (prour.train.ig_clarifier)")


def _ig(fn: Callable[[Recipe], Any]) -> Callable[[Recipe], Any]:
    """``fn`` of the ig-clarifier recipe (:func:`ig_recipe`); nothing without its training."""
    return lambda recipe: fn(ig_recipe(recipe)) if _ig_trains(recipe) else ()


def _ig_exported(recipe: Recipe) -> Path | None:
    """The exported ig-clarifier checkpoint that eval's ``models.ig_clarifier`` loads."""
    return _exported(ig_recipe(recipe)) if _ig_trains(recipe) else None


def _ig_clarifier_set(recipe: Recipe) -> str:
    """Eval's ``--set`` of ``models.ig_clarifier``: the exported ig-clarifier checkpoint, loaded
    as ``prour eval --checkpoint`` loads prour's (dtype, device and context of an ``hf``
    generator kept); empty without its training."""
    import json

    if not _ig_trains(recipe):
        return ""
    model: dict[str, Any] = {"backend": "hf", "path": str(_ig_exported(recipe))}
    base = recipe.models.get("generator")
    if base is not None and base.backend == "hf":
        model.update(dtype=base.dtype, device=base.device, max_model_len=base.max_model_len)
    return "models.ig_clarifier=" + json.dumps({k: v for k, v in model.items() if v is not None})


def _ig_sets() -> tuple[str, ...]:
    from prour.train.ig_clarifier import setting_items

    return tuple(part for item in setting_items() for part in ("--set", item))


def _endpoints(recipe: Recipe) -> File:
    from prour.cluster.endpoints import endpoints_path

    return File("endpoints_file", endpoints_path(recipe))


def _serving(recipe: Recipe) -> bool:
    """The endpoints file says the servers are ready."""
    from prour.cluster.endpoints import EndpointsError, read_endpoints

    try:
        record = read_endpoints(_endpoints(recipe).path)
    except EndpointsError:
        return False
    return record is not None and record.get("status") == "ready"


# ---- which roles a step calls --------------------------------------------------------------------


def _collect_roles(recipe: Recipe) -> tuple[str, ...]:
    return ("agent", "user", *(("teacher",) if recipe.data.teacher else ()))


def _heldout_roles(recipe: Recipe) -> tuple[str, ...]:
    """The decomposer, and the prompted router when the recipe has one (its held-out scores)."""
    return ("decomposer", *(("router",) if "router" in recipe.models else ()))


def _train_modes(recipe: Recipe) -> set[str]:
    """The modes of the states in the train file that training keeps (``train.modes``): all
    of ``train.modes`` while the file does not exist yet; none when it exists but cannot be read
    (the path check names that file, the one cause: no guess at the roles it would need)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prour.train.reward import RESPONDERS

    files = _train_files(recipe)
    wanted = set(recipe.train.modes or RESPONDERS) if recipe.train is not None else set(RESPONDERS)
    try:
        return wanted & set(pq.read_table(files[0].path, columns=["extra_info"])
                            .column("extra_info").combine_chunks().field("mode").to_pylist())
    except (IndexError, OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return set() if files and Path(files[0].path).is_file() else wanted


def _train_roles(recipe: Recipe) -> tuple[str, ...]:
    """The policy and what the reward calls on the train file's modes
    (:func:`prour.train.reward.reward_roles`: the responders, and the judge when the attention
    reward prices questions with it)."""
    from prour.train.reward import reward_roles

    return ("generator", *reward_roles(recipe, _train_modes(recipe)))


def _eval_roles(recipe: Recipe) -> tuple[str, ...]:
    """What the methods call under each attention variant (:func:`prour.eval.methods.eval_roles`:
    the judge when the attention protocol labels or scores with it)."""
    from prour.eval.methods import eval_roles

    return eval_roles(recipe.eval)


def _extract_tokenizer(recipe: Recipe) -> tuple[str, ...]:
    return () if recipe.data.tokenizer else ("generator",)


def _routed_extract(recipe: Recipe) -> bool:
    """Whether extract routes with the decomposer (``data.states: routed``); ``every`` (the
    ig-clarifier's rows) calls no model and reads no threshold."""
    return recipe.data.states == "routed"


def _extract_roles(recipe: Recipe) -> tuple[str, ...]:
    return ("decomposer",) if _routed_extract(recipe) else ()


def _extract_reads(recipe: Recipe) -> tuple[File, ...]:
    thresholds = (_thresholds(recipe),) if _routed_extract(recipe) else ()
    return (_data(recipe, "trajectories"), _data(recipe, "goals"), *thresholds)


# ---- what a stage installs, loads and places ----------------------------------------------------


def serve_python(recipe: Recipe) -> str:
    """The python ``prour serve`` starts vLLM with: ``serve.python``, $PROUR_VLLM_PYTHON, this."""
    return recipe.serve.python or os.environ.get("PROUR_VLLM_PYTHON") or sys.executable


def served_ids(recipe: Recipe) -> set[str]:
    """Model ids ``prour serve`` starts for this recipe."""
    from prour.cluster.recipe import served_roles

    return {model_id for model_id, roles in served_roles(recipe).items() if roles}


def _serve_extras(recipe: Recipe) -> tuple[Extra, ...]:
    if not served_ids(recipe):
        return ()
    return (Extra("vllm", "serve.models", f"install the gpu extra ({GPU_EXTRA}) or set "
                  "serve.python / $PROUR_VLLM_PYTHON to a python that has vLLM",
                  serve_python(recipe)),)


def _train_extras(recipe: Recipe) -> tuple[Extra, ...]:
    train = recipe.train
    if train is None or train.backend != "verl":
        return ()
    why = "train.backend=verl"
    fix = f"install it: {GPU_EXTRA}"
    needed = [Extra("verl", why, fix), Extra("ray", why, fix), Extra("transfer_queue", why, fix)]
    if train.verl.engine != "cpu_rehearsal":  # the rehearsal's policy samples its own rollouts
        needed.append(Extra("vllm", f"{why} rolls out with vLLM", fix))
    if train.verl.attn_implementation == "flash_attention_2":
        needed.append(Extra("flash_attn", "train.verl.attn_implementation=flash_attention_2",
                            "install it: pip install flash-attn --no-build-isolation (a source "
                            "build)"))
    return tuple(needed)


def _served_weights(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    from prour.cluster.recipe import served_models

    wanted = served_ids(recipe)
    return tuple((spec.path or model_id, f"serve.models.{model_id}")
                 for model_id, spec in served_models(recipe).items() if model_id in wanted)


def _verl_policy(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    """verl loads the policy by path or hub id whatever its backend."""
    policy = recipe.models.get("generator")
    if policy is None or recipe.train is None or recipe.train.backend != "verl" \
            or policy.backend == "hf":  # an hf role's weights are checked as such
        return ()
    return ((str(policy.path or policy.model), "models.generator"),)


def _tokenizer_weights(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    return ((recipe.data.tokenizer, "data.tokenizer"),) if recipe.data.tokenizer else ()


def _server_gpus(recipe: Recipe) -> dict[str, int]:
    from prour.cluster.recipe import served_models

    wanted = served_ids(recipe)
    return {f"serve.models.{model_id}.gpus": max(spec.gpus) + 1
            for model_id, spec in served_models(recipe).items() if model_id in wanted and spec.gpus}


def _trainer_gpus(recipe: Recipe) -> dict[str, int]:
    if recipe.train is None or recipe.train.backend != "verl":
        return {}
    if recipe.train.verl.engine == "cpu_rehearsal":  # CPU only: places nothing on GPUs
        return {}
    return {"train.verl.n_gpus_per_node": recipe.train.verl.n_gpus_per_node}


def _eval_routes(recipe: Recipe) -> bool:
    from prour.eval.methods import check_method

    return any(check_method(m).router == "decomposer" for m in recipe.eval.methods)


def _nothing_to_serve(recipe: Recipe) -> str | None:
    from prour.cluster.recipe import nothing_to_serve

    return nothing_to_serve(recipe)


def _thresholds_set(recipe: Recipe) -> str | None:
    if recipe.router.tau_au is not None:
        return "router.tau_au/tau_eu are set: nothing to calibrate"
    return None


def _no_calibration(recipe: Recipe) -> str | None:
    """The airline collection only feeds the held-out calibration states."""
    why = _thresholds_set(recipe) or (None if recipe.router.calibration.test_states
                                      else "router.calibration.test_states is not set")
    return f"{why} (the airline episodes feed only calibration)" if why else None


def _no_dev_calibration(recipe: Recipe) -> str | None:
    """The reserve's retail collection only feeds the dev calibration states."""
    why = _thresholds_set(recipe) or (None if recipe.router.calibration.dev_states
                                      else "router.calibration.dev_states is not set")
    return f"{why} (the reserve's episodes feed only calibration)" if why else None


def _approved(recipe: Recipe) -> bool:
    from prour.router.review import is_approved

    return is_approved(recipe)


def _no_train(recipe: Recipe) -> str | None:
    return None if recipe.train is not None else "the recipe has no `train` section"


# ---- the table ----------------------------------------------------------------------------------

_R = ("--recipe", "{recipe}")

# ---- the recipe keys each step's outputs depend on (Step.keys) ---------------------------------
# A change of one of them makes the step stale, and with it every later step that reads what it
# wrote. Keys that change how fast, not what, a step writes (concurrency, logging) are left out.
_EPISODES = ("models.agent", "models.user", "models.teacher", "env", "data.teacher*",
             "data.trial_seeds", "data.max_tasks")
_COLLECT_KEYS = (*_EPISODES, "data.domain", "data.split", "data.num_trajectories",
                 "data.calibration_reserve", "data.reserve_seed", "data.tasks")
_AIRLINE_KEYS = (*_EPISODES, "router.calibration.test_episodes")
_DEV_COLLECT_KEYS = (*_EPISODES, "data.domain", "data.split", "data.calibration_reserve",
                     "data.reserve_seed", "router.calibration.dev_episodes")
_NORMALIZE_KEYS = ("models.normalizer", "data.domain", "data.split", "data.max_tasks",
                   "data.calibration_reserve", "data.reserve_seed", "data.tasks",
                   "data.normalizer*")
# What the decomposer's AU/EU depend on (routing keys left out); extract routes with the
# thresholds too (a left-out key stays out even when listed again, so the routing keys are
# added to the base, not re-listed after a leave-out).
_DECOMPOSER_OUTPUT = ("models.decomposer", "router", "-router.thresholds_file",
                      "-router.calibration", "-router.llm_router*", "-router.budget",
                      "-router.every_n")
_DECOMPOSER = (*_DECOMPOSER_OUTPUT, "-router.tau_au", "-router.tau_eu")
_SEARCH_KEYS = (*_DECOMPOSER, "router.calibration.lo", "router.calibration.hi",
                "router.calibration.step")
_HELDOUT_KEYS = (*_SEARCH_KEYS, "models.router", "router.llm_router*")
_DATASET_KEYS = ("data", "-data.concurrency", "-data.teacher*", "-data.normalizer*",
                 "data.tokenizer", "models.generator", "seed")
_EXTRACT_KEYS = (*_DECOMPOSER_OUTPUT, *_DATASET_KEYS)  # router.tau_au/tau_eu included
_IG_EXTRACT_KEYS = ("-data.decisions", *_DATASET_KEYS)  # no router key: its rows ignore the router
_TRAIN_KEYS = ("train", "-train.wandb", "-train.keep_checkpoints", "models.generator",
               "models.strict_user", "models.verifier", "models.judge", "reward",
               "-reward.responder_concurrency", "seed")
_EVAL_BASE = ("eval", "-eval.concurrency", "models", "env", "router", "-router.calibration",
              "-router.thresholds_file", "reward", "-reward.responder_concurrency", "seed")
_EVAL_KEYS = (*_EVAL_BASE, "-eval.tradeoff")  # the sweeps are steps of their own

STAGES: tuple[Stage, ...] = (
    Stage("serve", "vLLM servers for the recipe's frozen models", (
        Step("serve", "start one server per served model id; write the endpoints file",
             ("serve", *_R), writes=lambda r: (_endpoints(r),), done=_serving),
    ), placement="servers", slurm="serve", extras=_serve_extras, weights=_served_weights,
        gpus=_server_gpus, skip=_nothing_to_serve, long_running=True, refuse_idle=True),
    Stage("collect", "task agent + teacher + user episodes on tau2", (
        Step("collect-retail", "training trajectories (data.domain, data.split)",
             ("collect", *_R), writes=lambda r: (_data(r, "trajectories"),),
             roles=_collect_roles, done=_collected, keys=_COLLECT_KEYS),
        Step("collect-dev", "retail trajectories of the calibration reserve for the dev states",
             ("collect", *_R, "--set", "data.tasks=reserve",
              "--set", "data.trajectories={dev_trajectories}",
              "--set", "data.num_trajectories={dev_episodes}"),
             writes=lambda r: (_dev_trajectories(r),), roles=_collect_roles,
             done=_dev_collected, keys=_DEV_COLLECT_KEYS, skip=_no_dev_calibration),
        Step("collect-airline", "airline trajectories for the held-out calibration states",
             ("collect", *_R, "--set", "data.domain=airline", "--set", "data.split=train",
              "--set", "data.calibration_reserve=0", "--set", "protocol.on_breach=warn",
              "--set", "data.trajectories={airline_trajectories}",
              "--set", "data.num_trajectories={airline_episodes}"),
             writes=lambda r: (_airline(r),), roles=_collect_roles, done=_airline_collected,
             keys=_AIRLINE_KEYS, skip=_no_calibration),
    ), placement="in_process", slurm_command=("collect", *_R, "--no-progress")),
    Stage("normalize", "each task's instruction as the first-person goal G*", (
        Step("normalize", "goals (G*) of the data split's tasks", ("normalize", *_R),
             writes=lambda r: (_data(r, "goals"),), roles=lambda r: ("normalizer",),
             done=_normalized, keys=_NORMALIZE_KEYS),
    ), placement="in_process", slurm_command=("normalize", *_R)),
    Stage("calibrate", "labelled decision states, (τ_AU, τ_EU) and their held-out score", (
        Step("states-dev", "dev candidate states from the reserve's trajectories",
             ("calibrate", "states", *_R, "--split", "dev", "--from", "{dev_path}"),
             reads=lambda r: _sampled_from(r, "dev"), writes=lambda r: _states(r, "dev"),
             skip=lambda r: _no_states(r, "dev"),
             keys=("router.calibration.dev_states", "seed", "data.on_bad_line",
                   "data.max_decisions", "data.calibration_reserve", "data.reserve_seed")),
        Step("states-test", "held-out decision states from the airline trajectories",
             ("calibrate", "states", *_R, "--split", "test", "--from", "{airline_path}"),
             reads=lambda r: _sampled_from(r, "test"), writes=lambda r: _states(r, "test"),
             skip=lambda r: _no_states(r, "test"),
             keys=("router.calibration.test_states", "router.calibration.n_states", "seed",
                   "data.on_bad_line")),
        Step("annotate", "the annotator's reviewable label of every state",
             ("calibrate", *_R, "--stage", "label"),
             reads=lambda r: (*_states(r, "dev"), *_states(r, "test")),
             writes=lambda r: (_labels(r, "dev"), _labels(r, "test"), _mix_file(r)),
             roles=lambda r: ("annotator",), done=_annotated,
             keys=("models.annotator", "router.calibration.annotator*",
                   "router.calibration.excerpt_chars", "router.calibration.dev_mix")),
        Step("review", "review the labels by hand (fix a wrong one in its labels file)", None,
             reads=lambda r: (_labels(r, "dev"), _labels(r, "test")), by_stage=False,
             done=_approved),
        Step("search", "grid search of (τ_AU, τ_EU) on the dev states",
             ("calibrate", *_R, "--stage", "search"),
             reads=lambda r: (*_states(r, "dev"), _labels(r, "dev")),
             writes=lambda r: (_measured(r, "dev"), _thresholds(r)),
             roles=lambda r: ("decomposer",), done=_thresholds_stored, keys=_SEARCH_KEYS),
        Step("heldout", "the thresholds (and the prompted router) on the held-out states",
             ("calibrate", *_R, "--stage", "evaluate"),
             reads=lambda r: (*_states(r, "test"), _labels(r, "test"), _thresholds(r)),
             writes=lambda r: (_measured(r, "test"), _evidence_file(r)), roles=_heldout_roles,
             done=_heldout_done, keys=_HELDOUT_KEYS),
    ), placement="in_process", slurm_command=("calibrate", *_R), skip=_thresholds_set),
    Stage("extract", "route every state; clarify/verify states as train/validation parquet", (
        Step("extract", "train/validation parquet and the dataset card", ("extract", *_R),
             reads=_extract_reads, writes=_dataset, roles=_extract_roles,
             tokenizers=_extract_tokenizer, keys=_EXTRACT_KEYS),
        # The IG-Clarifier baseline's own rows (prour.train.ig_clarifier): every decision state of
        # the same trajectories, target G*, no decomposer: no router key makes it stale.
        Step("extract-ig-clarifier", "the ig-clarifier baseline's rows: every decision state, "
             "target G*", ("extract", *_R, *_ig_sets()), reads=_ig(_extract_reads),
             writes=_ig(_dataset), tokenizers=_ig(_extract_tokenizer), keys=_IG_EXTRACT_KEYS,
             skip=_no_ig),
    ), placement="in_process", slurm_command=("extract", *_R, "--no-progress"),
        weights=_tokenizer_weights, routes=_routed_extract),
    Stage("train", "DAPO on the information-gain reward", (
        Step("train", "checkpoints every train.save_every steps, metrics.jsonl", ("train", *_R),
             reads=_train_files, writes=lambda r: (File("train.output_dir", _final_step(r)),),
             roles=_train_roles, done=_trained, keys=_TRAIN_KEYS,
             clears=lambda r: (File("train.output_dir", _checkpoints(r)),), resume=("--resume",)),
        # The IG-Clarifier baseline's own DAPO run: the same recipe with its settings (one table,
        # prour.train.ig_clarifier.SETTINGS) into its own folder; only when eval.methods has it.
        Step("train-ig-clarifier", "the ig-clarifier baseline's clarifier (its own reward)",
             ("train", *_R, *_ig_sets()), reads=_ig(_train_files),
             writes=_ig(lambda r: (File("train.output_dir", _final_step(r)),)),
             roles=_ig(_train_roles), done=lambda r: _ig_trains(r) and _trained(ig_recipe(r)),
             keys=_TRAIN_KEYS,
             clears=_ig(lambda r: (File("train.output_dir", _checkpoints(r)),)),
             resume=("--resume",), skip=_no_ig),
    ), placement="trainer", slurm="train", extras=_train_extras, weights=_verl_policy,
        gpus=_trainer_gpus, skip=_no_train),
    Stage("export", "the saved steps as Hugging Face folders", (
        Step("export", "the final step as a Hugging Face folder (what eval loads)",
             ("train", "export", *_R),
             reads=lambda r: (File("train.output_dir", _final_step(r)),),
             writes=lambda r: (File("train.output_dir", _exported(r) / "config.json"),),
             done=_exported_done, keys=("train.output_dir", "train.total_steps",
                                        "train.backend"), clears=_export_clears),
        Step("export-ig-clarifier", "the ig-clarifier's final step (what eval's "
             "models.ig_clarifier loads)", ("train", "export", *_R, *_ig_sets()),
             reads=_ig(lambda r: (File("train.output_dir", _final_step(r)),)),
             writes=_ig(lambda r: (File("train.output_dir", _exported(r) / "config.json"),)),
             done=lambda r: _ig_trains(r) and _exported_done(ig_recipe(r)),
             keys=("train.output_dir", "train.total_steps", "train.backend"),
             clears=_ig(_export_clears), skip=_no_ig),
    ), placement="none", slurm_command=("train", "export", *_R), skip=_no_train,
        preflight=False),
    Stage("eval", "every method of eval.methods on tau2, with the final checkpoint", (
        Step("eval", "one result line per episode", ("eval", *_R, "--checkpoint", "{checkpoints}",
                                                     "--set", "{ig_clarifier}"),
             reads=lambda r: (File("--checkpoint", _exported(r) / "config.json", checked=False),
                              *_ig(lambda i: (File("models.ig_clarifier.path",
                                                   _exported(i) / "config.json",
                                                   checked=False),))(r)),
             writes=lambda r: (File("eval (run_dir/eval)", _eval_dir(r) / "results.jsonl"),),
             roles=_eval_roles, done=_evaluated, keys=_EVAL_KEYS, serving=_eval_serving),
        # Figures 5 and 8 (A.2.3): eval.tradeoff.methods once per value of one router key, each
        # sweep into a run folder of its own under run_dir.
        *(Step(f"eval-{name.replace('_', '-')}", f"{figure}: eval.tradeoff.methods once per "
               f"value of router.{name} (eval.tradeoff.{name})",
               ("eval", *_R, "--checkpoint", "{checkpoints}", "--out", f"{{{name}_dir}}",
                "--set", "eval.methods={tradeoff_methods}", "--set", f"eval.sweep={{{name}_sweep}}"),
               reads=lambda r: (File("--checkpoint", _exported(r) / "config.json", checked=False),),
               writes=lambda r, n=name: (File(f"eval.tradeoff.{n}",
                                              _tradeoff_dir(r, n) / "results.jsonl"),),
               roles=_sweeping(name, lambda r: _eval_roles(r), ()), done=_swept(name),
               keys=(*_EVAL_BASE, "-eval.methods", "-eval.sweep", "-eval.tradeoff.run",
                     f"-eval.tradeoff.{other}"),
               serving=_sweeping(name, _eval_serving, None),
               skip=_no_tradeoff(name))
          for name, other, figure in (("budget", "every_n", "Figure 5"),
                                      ("every_n", "budget", "Figure 8"))),
        # Figure 6's baselines: the decomposer over the episodes of the methods that record no
        # AU/EU of their own (served like every step that calls the decomposer).
        Step("posthoc", "Figure 6's baselines: the decomposer's AU/EU at their first 16 decisions",
             ("posthoc", "{eval_dir}", *_R),
             reads=lambda r: (File("eval (run_dir/eval)", _eval_dir(r) / "results.jsonl"),),
             writes=lambda r: (_posthoc_file(r),),
             roles=lambda r: ("decomposer",) if _no_posthoc(r) is None else (),
             done=_posthoc_done, keys=_DECOMPOSER, skip=_no_posthoc),
    ), placement="in_process", slurm="eval", routes=_eval_routes),
    Stage("report", "Pass@1 tables with intervals, steps by mode, plots", (
        Step("report", "the report of the eval run", ("report", "{eval_dir}"),
             reads=_report_reads,
             writes=lambda r: (File("eval (run_dir/eval/report)", _eval_dir(r) / "report"),),
             keys=("eval.methods", "eval.seeds", "eval.domains", "eval.sweep", "eval.tradeoff",
                   "protocol")),
    ), placement="none", slurm_command=("report", "{eval_dir}"), preflight=False),
)

EXTERNAL = Step("external", "a file from outside the chain", None)


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
            from dataclasses import replace

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
    return _union(step.roles(recipe) for step in _rows(name))


def required_roles(recipe: Recipe, name: str) -> tuple[str, ...]:
    """The roles a stage (or step) needs in the recipe: those it calls and those whose tokenizer
    it reads (extract counts prompt tokens with the policy's), less those the chain's own
    commands supply (:func:`chain_supplied`)."""
    supplied = chain_supplied(recipe)
    return tuple(role for role in _union([*(step.roles(recipe) for step in _rows(name)),
                                          *(step.tokenizers(recipe) for step in _rows(name))])
                 if role not in supplied)


def chain_supplied(recipe: Recipe) -> set[str]:
    """Roles the recipe need not have because a step's command sets them: eval's
    ``models.ig_clarifier`` when the run trains the ig-clarifier baseline (``--set
    models.ig_clarifier.path=<its export>``)."""
    return {"ig_clarifier"} if _ig_trains(recipe) and "ig_clarifier" not in recipe.models \
        else set()


def supplied_model(recipe: Recipe, role: str) -> ModelConfig | None:
    """What a chain-supplied role loads, for plans that size it: the ig-clarifier checkpoint is a
    fine-tune of ``models.generator`` (same shape and dtype). None: not supplied."""
    if role not in chain_supplied(recipe):
        return None
    return recipe.models.get("generator")


def writer_of(recipe: Recipe, path: Path) -> Step:
    """The step that writes ``path`` (:data:`EXTERNAL` when none of the chain does)."""
    for step in steps():
        if any(out.path == path for out in step.writes(recipe)):
            return step
    return EXTERNAL


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
