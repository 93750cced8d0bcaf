"""``prour slurm submit | status``: render the sbatch templates for a recipe, chain and track them.

Templates (``slurm/*.sbatch``) are plain sbatch scripts that a person can also fill by hand. They
hold ``#SBATCH`` directives and one settings block between ``# >>> prour settings`` and
``# <<< prour settings``. Rendering sets each directive from the recipe's ``slurm`` section (or
drops a site value left as ``REPLACE_ME``, so the cluster default applies), and rewrites the
settings block with the recipe, run folder, overrides and stage values. Scripts write a status
file (start, end, exit code) into ``<run_dir>/slurm/status`` that ``status`` reads when Slurm
has no accounting database.
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from prour.cluster.submission import StagePlan, Submission, SubmitRequest
from prour.config import ConfigError, Recipe
from prour.config.cluster import SlurmResources
from prour.config.train import TrainConfig
from prour.stages import STAGES, File, Step, get_stage, stage_names, stage_of, steps
from prour.step import checkpoints

logger = logging.getLogger(__name__)

REPLACE_ME = "REPLACE_ME"
BLOCK_START = "# >>> prour settings"
BLOCK_END = "# <<< prour settings"
DIRECTIVE = re.compile(r"^#SBATCH\s+--([A-Za-z][\w-]*)(?:=(\S*))?(.*)$")
TEMPLATES = {
    "serve": "serve.sbatch",
    "stage": "stage.sbatch",
    "train": "train_1node.sbatch",
    "train_multinode": "train_multinode.sbatch",
}
class RenderError(ValueError):
    """A template cannot be rendered (a marker is missing or a REPLACE_ME would remain)."""


def default_templates_dir() -> Path:
    """The repository's ``slurm/`` folder (next to the ``prour`` package)."""
    return Path(__file__).resolve().parents[2] / "slurm"


# ---- rendering ------------------------------------------------------------------------------


def shell_value(value: Any) -> str:
    """A bash word: a quoted string, or ``(a b c)`` for a list (a bash array)."""
    if isinstance(value, (list, tuple)):
        return "(" + " ".join(shlex.quote(str(item)) for item in value) + ")"
    return shlex.quote(str(value))


def settings_block(variables: dict[str, Any], env: dict[str, str], setup: list[str]) -> list[str]:
    """The rendered settings block: stage variables, exported site variables, setup commands."""
    lines = [f"{BLOCK_START} (written by `prour slurm submit`)"]
    lines += [f"{name}={shell_value(value)}" for name, value in variables.items()]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines += list(setup)
    return [*lines, BLOCK_END]


def render_directives(
    lines: list[str], values: dict[str, str | None], extra: list[str]
) -> tuple[list[str], list[str]]:
    """Set directives from ``values`` (None: keep the template's), drop unset site values.

    Returns the new lines and a note for every site value left to the cluster default.
    """
    out, notes, last = [], [], -1
    for line in lines:
        match = DIRECTIVE.match(line)
        if not match:
            out.append(line)
            continue
        key, old = match.group(1), match.group(2)
        new = values.get(key)
        if new is None and old is not None and REPLACE_ME in old:
            notes.append(f"--{key} not set (slurm.*.{key}): the cluster default applies")
            continue
        if new == "":  # asked to drop (e.g. no GPUs)
            continue
        out.append(line if new is None else f"#SBATCH --{key}={new}")
        last = len(out) - 1
    present = {m.group(1) for m in map(DIRECTIVE.match, out) if m}
    added = [f"#SBATCH --{k}={v}" for k, v in values.items() if v and k not in present]
    added += [f"#SBATCH {option}" for option in extra]
    return out[: last + 1] + added + out[last + 1 :], notes


def replace_block(lines: list[str], block: list[str], template: str) -> list[str]:
    """Swap the template's settings block for ``block``."""
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(BLOCK_START))
        end = next(i for i, line in enumerate(lines) if line.startswith(BLOCK_END))
    except StopIteration:
        raise RenderError(f"{template}: no '{BLOCK_START}' ... '{BLOCK_END}' block") from None
    return lines[:start] + block + lines[end + 1 :]


def render_script(
    text: str,
    template: str,
    directives: dict[str, str | None],
    extra: list[str],
    variables: dict[str, Any],
    env: dict[str, str],
    setup: list[str],
) -> tuple[str, list[str]]:
    """Render one template; returns the script and notes about site values left unset."""
    lines, notes = render_directives(text.splitlines(), directives, extra)
    lines = replace_block(lines, settings_block(variables, env, setup), template)
    for number, line in enumerate(lines, 1):
        code = line.split("#", 1)[0] if not line.startswith("#SBATCH") else line
        if REPLACE_ME in code:
            raise RenderError(f"{template}: line {number} still holds {REPLACE_ME}: {line.strip()}")
    return "\n".join(lines) + "\n", notes


# ---- the chain: which stages a submission submits ----------------------------------------------


def chain_stages(recipe: Recipe) -> list[str]:
    """The stages of a whole run of this recipe, in pipeline order: each one the recipe keeps
    (the table's ``skip``) except a long-running one (serve): every job serves what its own steps
    call, so no job waits for another's servers."""
    return [stage.name for stage in STAGES if not stage.long_running and stage.skip(recipe) is None]


def gate_step() -> Step:
    """The review gate: the table's step that no command runs."""
    return next(step for step in steps() if step.command is None)


def gate_stage() -> str:
    """The stage holding the review gate."""
    return stage_of(gate_step()).name


def complete_stages(recipe: Recipe) -> set[str]:
    """The stages whose every step ``prour run`` would call done or skipped (its table of steps:
    outputs complete and made with the recipe's values)."""
    from prour.run_state import DONE, SKIPPED, table

    open_stages = {row.stage.name for row in table(recipe) if row.state not in (DONE, SKIPPED)}
    return set(stage_names()) - open_stages


def chain_plan(recipe: Recipe, approve: bool) -> tuple[list[str], bool]:
    """The stages a submission without ``--stages`` submits, and whether it stops at the gate.

    Until the labels are approved (:func:`labels_approved`, or ``approve``), only the stages up to
    and including the gate's: its job ends at the gate, so no job holds a node while a person
    reviews. With ``approve``, the chain from the first stage that is not complete."""
    chain = chain_stages(recipe)
    gate = gate_stage()
    if gate not in chain:  # thresholds given: nothing to calibrate, no gate
        return chain, False
    if approve:
        complete, start = complete_stages(recipe), 0
        while chain[start] != gate and chain[start] in complete:
            start += 1
        return chain[start:], False
    if labels_approved(recipe):
        return chain, False
    return chain[: chain.index(gate) + 1], True


def labels_approved(recipe: Recipe) -> bool:
    """Whether the review gate is open for this recipe: its labels are approved as they are, or
    the recipe approves them unattended (``router.calibration.approve_labels``)."""
    return recipe.router.calibration.approve_labels or gate_step().is_done(recipe)


# ---- planning -------------------------------------------------------------------------------


def stage_overrides(request: SubmitRequest) -> list[str]:
    """``--set`` arguments every stage command gets: the run folder and the user's overrides.

    ``slurm.*`` overrides are for submission only and are not forwarded.
    """
    kept = [item for item in request.overrides if not item.startswith("slurm.")]
    args = ["--set", f"run_dir={request.run_dir}"]
    for item in kept:
        args += ["--set", item]
    return args


def approve_command(request: SubmitRequest) -> str:
    """The submission's own command line with ``--approve-labels`` added (what the gate prints)."""
    argv = ["prour", "slurm", "submit", "--recipe", str(request.recipe_path)]
    if request.run_dir != _recipe_run_dir(request):
        argv += ["--run-dir", str(request.run_dir)]
    for item in request.overrides:
        argv += ["--set", item]
    return shlex.join([*argv, "--approve-labels"])


def _recipe_run_dir(request: SubmitRequest) -> Path | None:
    """The run folder the recipe names without ``--run-dir`` (None when it cannot be read)."""
    from prour.recipes import load_recipe

    items = [item for item in request.overrides if not item.startswith("run_dir=")]
    try:
        return load_recipe(request.recipe_path, items, cluster=True).resolved_run_dir()
    except (ConfigError, OSError, ValueError):
        return None


def default_setup() -> list[str]:
    """Put the environment that runs ``prour slurm submit`` first on PATH inside the jobs."""
    return [f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"']


def _train(recipe: Recipe) -> TrainConfig:
    """The recipe's ``train`` section (its defaults when the recipe has none)."""
    return recipe.train if recipe.train is not None else TrainConfig()


def train_layout(recipe: Recipe) -> tuple[str, int | None]:
    """(template, nodes) of the train job from the recipe's train section."""
    train = _train(recipe)
    res = recipe.slurm.resources("train")
    if train.backend == "verl":
        nnodes = train.verl.nnodes
        if res.nodes is not None and res.nodes != nnodes:
            raise ConfigError(
                "slurm.train.nodes",
                f"{res.nodes} differs from train.verl.nnodes "
                f"({nnodes}); set the node count in train.verl only",
            )
        return ("train_multinode" if nnodes > 1 else "train"), nnodes
    return "train", res.nodes or 1


def train_output_dir(recipe: Recipe) -> str:
    """Where training writes ``step_N`` folders (``train.output_dir``; without a ``train``
    section its default, from ``run_dir`` by the path rule)."""
    return str(checkpoints(recipe))


def job_gpus(recipe: Recipe, stage: str) -> tuple[int, list[str]]:
    """GPUs of one node the stage's job asks for, and notes: what its GPU plan places (the
    servers of the roles its steps call, the verl trainer, ``hf`` roles in process), at least
    one for a server the recipe does not place (no ``serve.models.<id>.gpus``) and for a local
    trainer on a GPU."""
    from prour.cluster.gpu_plan import gpu_plan, has_plan, stage_servers

    if not has_plan(stage):
        return 0, []
    plan = gpu_plan(recipe, stage)
    gpus, notes = plan.n_gpus, []
    unplaced = [model_id for model_id, spec in stage_servers(recipe, stage).items()
                if spec.gpus is None]
    if unplaced and not gpus:
        gpus = 1
        notes.append(f"{', '.join(unplaced)}: no serve.models.<id>.gpus, so the job asks for one "
                     f"GPU (slurm.{stage}.gpus_per_node sets it)")
    train = recipe.train
    if get_stage(stage).placement == "trainer" and train is not None \
            and train.backend == "local" and train.device != "cpu":
        gpus = max(gpus, 1)
    return gpus, notes


def directive_values(
    res: SlurmResources, job_name: str, output: str, nodes: int | None, gpus: int
) -> dict[str, str | None]:
    """sbatch directive values for one stage (None keeps the template's value)."""
    gpus = res.gpus_per_node if res.gpus_per_node is not None else gpus
    return {
        "job-name": job_name,
        "output": output,
        "partition": res.partition,
        "account": res.account,
        "qos": res.qos,
        "time": res.time,
        "nodes": str(res.nodes or nodes) if (res.nodes or nodes) else None,
        "gpus-per-node": str(gpus) if gpus > 0 else "",
        "cpus-per-task": str(res.cpus_per_task) if res.cpus_per_task else None,
        "mem": res.mem,
        "constraint": res.constraint,
        "nodelist": res.nodelist,
    }


def run_command(recipe: Recipe, request: SubmitRequest, stage: str) -> list[str]:
    """The ``prour run`` arguments of a stage's job: its steps only (``--only``), on the
    submission's run folder and overrides; the runner skips what is done and serves what each
    step calls."""
    argv = ["run", "--recipe", str(request.recipe_path), *stage_overrides(request)]
    if _reads_checkpoint(recipe, stage):
        if request.checkpoint:
            argv += ["--set", f"train.output_dir={request.checkpoint}"]
        elif request.base_model:  # without a train section eval evaluates models.generator
            argv += ["--set", "train=null"]
    argv += ["--only", stage]
    if request.approve_labels:
        argv.append("--approve-labels")
    if request.rerun_stale:
        argv.append("--rerun-stale")
    return argv


def plan_stage(recipe: Recipe, request: SubmitRequest, stage: str, then: str = "") -> StagePlan:
    """Render the script of one stage's job; ``then``: what its log says at the end (the gate's
    job: the command that continues the chain on Slurm)."""
    slurm_dir = request.run_dir / "slurm"
    kind = get_stage(stage).slurm
    variables: dict[str, Any] = {
        "PROUR_STAGE": stage,
        "PROUR_WORKDIR": str(request.workdir),
        "PROUR_RECIPE": str(request.recipe_path),
        "PROUR_RUN_DIR": str(request.run_dir),
        "PROUR_SETS": stage_overrides(request),
    }
    nodes: int | None = 1
    command: list[str] = []
    if kind == "serve":
        template = "serve"
    else:
        template, command = "stage", run_command(recipe, request, stage)
        if kind == "train":
            template, nodes = train_layout(recipe)
        variables["PROUR_COMMAND"] = command
        if template == "stage":
            variables["PROUR_THEN"] = then
    res = recipe.slurm.resources(stage)
    gpus, notes = job_gpus(recipe, stage)
    if res.gpus_per_node is not None:  # the recipe says how many: no guess to note
        gpus, notes = res.gpus_per_node, []
    if template == "train_multinode":
        store_mb = recipe.slurm.ray_object_store_mb
        variables.update(PROUR_GPUS_PER_NODE=gpus, RAY_PORT=recipe.slurm.ray_port,
                         RAY_START_TIMEOUT=600,
                         RAY_OBJECT_STORE_BYTES=store_mb * 2**20 if store_mb else "")
    log = str(slurm_dir / "logs" / f"{stage}-%j.out")
    values = directive_values(res, f"prour-{recipe.name}-{stage}", log, nodes, gpus)
    folder = recipe.slurm.templates_dir
    template_path = (Path(folder) if folder else default_templates_dir()) / TEMPLATES[template]
    if not template_path.is_file():
        raise RenderError(f"template {template_path} not found (slurm.templates_dir)")
    setup = recipe.slurm.setup if recipe.slurm.setup is not None else default_setup()
    script, site_notes = render_script(
        template_path.read_text(), str(template_path), values, res.extra, variables,
        recipe.slurm.env, setup,
    )
    return StagePlan(
        stage=stage,
        template=str(template_path),
        script=script,
        script_path=slurm_dir / f"{stage}.sbatch",
        log_pattern=log,
        status_path=slurm_dir / "status" / stage,
        command=command,
        notes=[*notes, *site_notes],
    )


def check_stages(recipe: Recipe, stages: list[str]) -> None:
    """``--stages``: known names; serve, a long-running job, only alone (every other job serves
    what it calls); a stage with nothing to do whose command would fail is refused now."""
    known = stage_names()
    unknown = [s for s in stages if s not in known]
    if unknown or not stages:
        raise ValueError(f"--stages: unknown {unknown or 'empty list'}; valid: {', '.join(known)}")
    for stage in stages:
        row = get_stage(stage)
        if row.long_running and len(stages) > 1:
            raise ValueError(
                f"--stages {','.join(stages)}: {stage} runs until cancelled and every other job "
                f"serves the models its steps call; submit {stage} alone (--stages {stage}) "
                f"or leave it out"
            )
        why_not = row.skip(recipe) if row.refuse_idle else None
        if why_not:
            raise ValueError(f"--stages {stage}: {why_not}; leave {stage} out of --stages")


def plan_submission(recipe: Recipe, request: SubmitRequest) -> Submission:
    """Scripts for the stages to submit in pipeline order, each depending on the one before
    (``afterok``): those of ``--stages``, or the chain (:func:`chain_plan`).

    A stage that evaluates the trained checkpoint (eval) needs one: made by a stage of the same
    submission (train, export), named by ``--checkpoint``, already at ``train.output_dir``, or
    the untrained generator asked for by name (``--base-model``); else it is refused."""
    gate = None
    if request.stages is None:
        stages, stops = chain_plan(recipe, request.approve_labels)
        gate = approve_command(request) if stops else None
    else:
        check_stages(recipe, request.stages)
        stages = [name for name in stage_names() if name in request.stages]
    check_checkpoint(recipe, request, stages)
    then = (f"on Slurm, once the labels named above are reviewed, approve them and submit the "
            f"rest of the chain with: {gate}") if gate else ""
    plans: list[StagePlan] = []
    for stage in stages:
        plan = plan_stage(recipe, request, stage, then if stage == stages[-1] else "")
        if plans:
            plan.after, plan.dependency = plans[-1].stage, "afterok"
        plans.append(plan)
    return Submission(plans, gate)


def _checkpoint_folder(recipe: Recipe) -> Path:
    return Path(train_output_dir(recipe))


def _reads_checkpoint(recipe: Recipe, stage: str) -> bool:
    """Whether a step of ``stage`` reads a checkpoint under ``train.output_dir`` that it does not
    write itself (the table's files)."""
    folder = _checkpoint_folder(recipe)

    def under(files: tuple[File, ...]) -> bool:
        return any(folder in file.path.parents for file in files)

    return any(under(step.reads(recipe)) and not under(step.writes(recipe))
               for step in get_stage(stage).steps)


def _writes_checkpoint(recipe: Recipe, stage: str) -> bool:
    folder = _checkpoint_folder(recipe)
    return any(folder in file.path.parents
               for step in get_stage(stage).steps for file in step.writes(recipe))


def check_checkpoint(recipe: Recipe, request: SubmitRequest, stages: list[str]) -> None:
    """Refuse a stage that would evaluate an untrained generator without being asked to."""
    if request.checkpoint or request.base_model or recipe.train is None:
        return  # asked for by name, or a recipe that trains nothing evaluates its generator
    if any(_writes_checkpoint(recipe, stage) for stage in stages):
        return
    for stage in (s for s in stages if _reads_checkpoint(recipe, s)):
        missing = [file.path for step in get_stage(stage).steps for file in step.reads(recipe)
                   if _checkpoint_folder(recipe) in file.path.parents and not file.path.exists()]
        if missing:
            raise ValueError(
                f"{stage} evaluates the trained checkpoint and there is none at "
                f"{missing[0].parent} (train.output_dir {_checkpoint_folder(recipe)}): submit "
                f"the chain that trains it (prour slurm submit --recipe {request.recipe_path}), "
                f"name one with --checkpoint DIR, or evaluate the untrained models.generator "
                f"with --base-model"
            )
