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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prour.cluster.config import SlurmResources
from prour.cluster.recipe import nothing_to_serve, served_models
from prour.config import ConfigError, Recipe
from prour.stages import File, get_stage, stage_names, stage_roles
from prour.train.config import TrainConfig
from prour.train.recipe import output_dir

logger = logging.getLogger(__name__)

REPLACE_ME = "REPLACE_ME"
BLOCK_START = "# >>> prour settings"
BLOCK_END = "# <<< prour settings"
DIRECTIVE = re.compile(r"^#SBATCH\s+--([A-Za-z][\w-]*)(?:=(\S*))?(.*)$")
MANIFEST = "slurm_jobs.json"
TEMPLATES = {
    "serve": "serve.sbatch",
    "stage": "stage.sbatch",
    "train": "train_1node.sbatch",
    "train_multinode": "train_multinode.sbatch",
    "eval": "eval_array.sbatch",
}
SITE_KEYS = {
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "constraint": "constraint",
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


# ---- planning -------------------------------------------------------------------------------


@dataclass
class StagePlan:
    """One job to submit: its rendered script, where it logs, and what it waits for."""

    stage: str
    template: str
    script_path: Path
    script: str
    log_pattern: str  # sbatch --output pattern (%j, %A, %a)
    status_path: Path
    dependency: str | None = None  # "afterok" | "after" on the previous stage, filled at plan time
    after: str | None = None  # the stage it depends on
    tasks: list[dict[str, Any]] = field(default_factory=list)  # array tasks (index, seed, domain)
    notes: list[str] = field(default_factory=list)
    long_running: bool = False  # serve with servers: dependants start once it runs, not ends


@dataclass
class SubmitRequest:
    """What the user asked for: recipe file, stages, run folder, overrides, checkpoint."""

    recipe_path: Path
    stages: list[str]
    run_dir: Path
    overrides: list[str]
    workdir: Path
    checkpoint: str | None = None


def stage_overrides(request: SubmitRequest) -> list[str]:
    """``--set`` arguments every stage command gets: the run folder and the user's overrides.

    ``slurm.*`` overrides are for submission only and are not forwarded.
    """
    kept = [item for item in request.overrides if not item.startswith("slurm.")]
    args = ["--set", f"run_dir={request.run_dir}"]
    for item in kept:
        args += ["--set", item]
    return args


def default_setup() -> list[str]:
    """Put the environment that runs ``prour slurm submit`` first on PATH inside the jobs."""
    return [f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"']


def _train(recipe: Recipe) -> TrainConfig:
    """The recipe's ``train`` section (its defaults when the recipe has none)."""
    return recipe.train if recipe.train is not None else TrainConfig()


def train_layout(recipe: Recipe) -> tuple[str, int | None, int | None, list[str]]:
    """(template, nodes, GPUs per node, extra train args) from the recipe's train section."""
    train = _train(recipe)
    res = recipe.slurm.resources("train")
    if train.backend == "verl":
        nnodes, gpus = train.verl.nnodes, train.verl.n_gpus_per_node
        if res.nodes is not None and res.nodes != nnodes:
            raise ConfigError(
                "slurm.train.nodes",
                f"{res.nodes} differs from train.verl.nnodes "
                f"({nnodes}); set the node count in train.verl only",
            )
        template = "train_multinode" if nnodes > 1 else "train"
        return template, nnodes, gpus, ["--backend", "verl"]
    gpus = 0 if train.device == "cpu" else None
    return "train", res.nodes or 1, gpus, []


def train_output_dir(recipe: Recipe) -> str:
    """Where training writes ``step_N`` folders (``train.output_dir``; without a ``train``
    section its default, from ``run_dir`` by the path rule)."""
    return str(output_dir(recipe))


def serve_gpus(recipe: Recipe) -> int | None:
    """GPUs the serve job needs: one past the highest GPU index any server lists (None: unknown)."""
    specs = served_models(recipe)
    listed = [gpu for spec in specs.values() for gpu in (spec.gpus or [])]
    if not specs:
        return 0
    return max(listed) + 1 if listed else None


def eval_matrix(recipe: Recipe) -> list[tuple[int, str]]:
    """(seed, domain) per array task, seed-major: the eval section's seeds x domains."""
    cfg = recipe.eval
    return [(seed, domain) for seed in cfg.seeds for domain in cfg.domains]


def directive_values(
    res: SlurmResources, job_name: str, output: str, nodes: int | None, gpus: int | None
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
        "gpus-per-node": None if gpus is None else (str(gpus) if gpus > 0 else ""),
        "cpus-per-task": str(res.cpus_per_task) if res.cpus_per_task else None,
        "mem": res.mem,
        "constraint": res.constraint,
    }


@dataclass
class StageLayout:
    """Stage-specific parts of a job: template, size, log pattern, settings, array tasks."""

    template: str
    log: str
    nodes: int | None = 1
    gpus: int | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    array: str | None = None


def serve_stage(recipe: Recipe, slurm_dir: Path) -> StageLayout:
    return StageLayout("serve", str(slurm_dir / "logs" / "serve-%j.out"), gpus=serve_gpus(recipe))


def train_stage(recipe: Recipe, slurm_dir: Path, wait: int) -> StageLayout:
    template, nodes, gpus, train_args = train_layout(recipe)
    variables: dict[str, Any] = {"PROUR_TRAIN_ARGS": train_args, "PROUR_WAIT_ENDPOINTS": wait}
    if template == "train_multinode":
        variables.update(
            PROUR_GPUS_PER_NODE=gpus, RAY_PORT=recipe.slurm.ray_port, RAY_START_TIMEOUT=600
        )
    log = str(slurm_dir / "logs" / "train-%j.out")
    return StageLayout(template, log, nodes, gpus, variables)


def eval_stage(
    recipe: Recipe, request: SubmitRequest, slurm_dir: Path, wait: int
) -> StageLayout:
    matrix = eval_matrix(recipe)
    throttle = f"%{recipe.slurm.eval_max_parallel}" if recipe.slurm.eval_max_parallel else ""
    variables = {
        "PROUR_SEEDS": list(dict.fromkeys(seed for seed, _ in matrix)),
        "PROUR_DOMAINS": list(dict.fromkeys(domain for _, domain in matrix)),
        "PROUR_CHECKPOINT": request.checkpoint or "",
        "PROUR_WAIT_ENDPOINTS": wait,
    }
    tasks = [
        {
            "index": i,
            "seed": seed,
            "domain": domain,
            "status_file": str(slurm_dir / "status" / f"eval.{i}"),
        }
        for i, (seed, domain) in enumerate(matrix)
    ]
    log = str(slurm_dir / "logs" / "eval-%A_%a.out")
    return StageLayout(
        "eval", log, variables=variables, tasks=tasks, array=f"0-{len(matrix) - 1}{throttle}"
    )


def stage_command(recipe: Recipe, request: SubmitRequest, stage: str) -> list[str]:
    """The ``prour`` arguments of a one-command stage (the table's ``slurm_command``) on the
    submission's run folder."""
    on_run = recipe.model_copy(update={"run_dir": str(request.run_dir)})
    return get_stage(stage).job_argv(on_run, str(request.recipe_path), stage_overrides(request))


def command_stage(
    recipe: Recipe, request: SubmitRequest, stage: str, slurm_dir: Path, wait: int
) -> StageLayout:
    """A stage that runs one ``prour`` command; one that calls no model waits for no server."""
    variables = {
        "PROUR_COMMAND": stage_command(recipe, request, stage),
        "PROUR_WAIT_ENDPOINTS": wait if stage_roles(recipe, stage) else 0,
    }
    log = str(slurm_dir / "logs" / f"{stage}-%j.out")
    return StageLayout("stage", log, variables=variables)


def stage_layout(
    recipe: Recipe, request: SubmitRequest, stage: str, slurm_dir: Path, wait: int
) -> StageLayout:
    """The job of one stage, by the kind of template its table row renders."""
    layouts = {
        "serve": lambda: serve_stage(recipe, slurm_dir),
        "train": lambda: train_stage(recipe, slurm_dir, wait),
        "eval": lambda: eval_stage(recipe, request, slurm_dir, wait),
        "stage": lambda: command_stage(recipe, request, stage, slurm_dir, wait),
    }
    return layouts[get_stage(stage).slurm]()


def plan_stage(
    recipe: Recipe, request: SubmitRequest, stage: str, serves: bool
) -> StagePlan:
    """Render the script of one stage."""
    slurm_dir = request.run_dir / "slurm"
    wait = int(recipe.slurm.endpoints_wait_s) if serves else 0
    layout = stage_layout(recipe, request, stage, slurm_dir, wait)
    variables: dict[str, Any] = {
        "PROUR_STAGE": stage,
        "PROUR_WORKDIR": str(request.workdir),
        "PROUR_RECIPE": str(request.recipe_path),
        "PROUR_RUN_DIR": str(request.run_dir),
        "PROUR_SETS": stage_overrides(request),
        **layout.variables,
    }
    res = recipe.slurm.resources(stage)
    name = f"prour-{recipe.name}-{stage}"
    values = directive_values(res, name, layout.log, layout.nodes, layout.gpus)
    if layout.array:
        values["array"] = layout.array
    folder = recipe.slurm.templates_dir
    template_path = (Path(folder) if folder else default_templates_dir()) / TEMPLATES[
        layout.template
    ]
    if not template_path.is_file():
        raise RenderError(f"template {template_path} not found (slurm.templates_dir)")
    setup = recipe.slurm.setup if recipe.slurm.setup is not None else default_setup()
    script, notes = render_script(
        template_path.read_text(),
        str(template_path),
        values,
        res.extra,
        variables,
        recipe.slurm.env,
        setup,
    )
    return StagePlan(
        stage=stage,
        template=str(template_path),
        script=script,
        script_path=slurm_dir / f"{stage}.sbatch",
        log_pattern=layout.log,
        status_path=slurm_dir / "status" / stage,
        tasks=layout.tasks,
        notes=notes,
        long_running=get_stage(stage).long_running and serves,
    )


def refuse_empty_serve(recipe: Recipe, stages: list[str]) -> None:
    """A stage whose command fails with nothing to do (serve with nothing to serve) would fail at
    run time: refuse it now."""
    for stage in (name for name in stage_names() if name in stages):  # unknown: plan_submission
        why_not = get_stage(stage).skip(recipe) if get_stage(stage).refuse_idle else None
        if why_not:
            raise ValueError(f"--stages {stage}: {why_not}; leave {stage} out of --stages")


def plan_submission(recipe: Recipe, request: SubmitRequest) -> list[StagePlan]:
    """Scripts for the requested stages in pipeline order, each depending on the one before.

    With a stage submitted that writes ``train.output_dir`` (train, export), a stage that reads
    the checkpoint (eval) evaluates the newest one of ``train.output_dir`` in Hugging Face format
    (what ``prour train export`` leaves there) unless ``--checkpoint`` says otherwise.
    """
    known = stage_names()
    unknown = [s for s in request.stages if s not in known]
    if unknown or not request.stages:
        raise ValueError(
            f"--stages: unknown {unknown or 'empty list'}; valid: {', '.join(known)}"
        )
    serves = nothing_to_serve(recipe) is None
    if not request.checkpoint and _makes_and_reads_checkpoints(recipe, request.stages):
        request.checkpoint = str(request.workdir / train_output_dir(recipe))
    plans: list[StagePlan] = []
    for stage in (name for name in known if name in request.stages):
        plan = plan_stage(recipe, request, stage, serves)
        if plans:
            before = plans[-1]
            plan.after = before.stage
            plan.dependency = "after" if before.long_running else "afterok"
        plans.append(plan)
    return plans


def _makes_and_reads_checkpoints(recipe: Recipe, stages: list[str]) -> bool:
    """Whether one submitted stage writes under ``train.output_dir`` and another reads a
    checkpoint from it (the table's files)."""
    folder = Path(train_output_dir(recipe))

    def under(files: tuple[File, ...]) -> bool:
        return any(folder in file.path.parents for file in files)

    rows = [step for stage in stages for step in get_stage(stage).steps]
    return any(under(step.writes(recipe)) for step in rows) \
        and any(under(step.reads(recipe)) for step in rows if not under(step.writes(recipe)))
