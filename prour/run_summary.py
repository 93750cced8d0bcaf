"""What ``prour run`` says about the node around the chain.

Before it (``--dry-run``): the vLLM servers the run starts, each with the steps that call it and
its command line; the GPU memory plan of each stage that places models; and the problems the
whole run's preflight finds on this node (:mod:`prour.preflight`, ``whole_run``: what an earlier
step makes is not required yet). After it: one row per step of what ran where (host, servers and
their GPUs, trainer, in-process models) and how long it took, from the steps' stamps, then the
wall time of the steps this run ran. Nothing here runs a step or starts a server.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.stages import Step


def _gpus(ids: list[int] | None) -> str:
    if ids is None:
        return "the job's GPUs"
    return f"GPU {','.join(map(str, ids))}" if ids else "CPU"


def step_servers(recipe: Recipe, step: Step) -> dict[str, list[str]]:
    """Model id -> the roles of ``step`` that its server answers (the served roles it calls, of
    the recipe it runs on: eval's exported generator under ``eval.generator_backend: vllm``)."""
    from prour.cluster.recipe import served_roles

    called = set(step.roles(recipe))
    return {model_id: [role for role in roles if role in called]
            for model_id, roles in served_roles(step.served_recipe(recipe)).items()
            if called & set(roles)}


def where(recipe: Recipe, step: Step) -> str:
    """Where ``step``'s models run: its servers and their GPUs, the trainer, in-process models."""
    from prour.cluster.recipe import served_models
    from prour.stages import served_elsewhere, stage_of

    specs = served_models(step.served_recipe(recipe))
    elsewhere = served_elsewhere(recipe, step)  # reached through the endpoints file
    parts = [f"{model_id} vLLM on " + ("another node" if elsewhere else _gpus(specs[model_id].gpus))
             for model_id in step_servers(recipe, step)]
    placement = stage_of(step).placement
    train = recipe.train
    if placement == "trainer" and train is not None:
        if train.backend == "verl" and train.verl.engine == "cpu_rehearsal":
            nodes = f" x {train.verl.nnodes} nodes" if train.verl.nnodes > 1 else ""
            parts.insert(0, f"verl CPU rehearsal on CPU{nodes}")
        elif train.backend == "verl":
            nodes = f" x {train.verl.nnodes} nodes" if train.verl.nnodes > 1 else ""
            count = train.verl.n_gpus_per_node
            gpus = "GPU 0" if count == 1 else f"GPU 0-{count - 1}"
            parts.insert(0, f"verl trainer on {gpus}{nodes}")
        else:
            parts.insert(0, f"local trainer on {train.device}")
    elif placement == "in_process":
        loaded: dict[str, list[str]] = {}  # device -> the hf roles loaded in process on it
        for role in step.roles(recipe):
            cfg = step.served_recipe(recipe).models.get(role)
            if cfg is not None and cfg.backend == "hf":
                loaded.setdefault(cfg.device, []).append(role)
        parts += [f"{', '.join(roles)} in process ({device})" for device, roles in loaded.items()]
    return "; ".join(parts) or "CPU"


def _selected(names: list[str] | None) -> list[Step]:
    from prour.stages import steps

    return [step for step in steps() if names is None or step.name in names]


def server_lines(recipe: Recipe, names: list[str] | None = None) -> list[str]:
    """Each server the selected steps call: those steps, its GPUs and its command line."""
    from prour.cluster.recipe import served_roles
    from prour.cluster.serve import ServeError, plan_servers, vllm_server
    from prour.run_state import skip_reason
    from prour.stages import served_elsewhere

    chosen = [step for step in _selected(names) if skip_reason(recipe, step) is None]
    try:
        plans = plan_servers(recipe)
        for step in chosen:  # servers only a step's own recipe has (eval's exported generator)
            served = step.served_recipe(recipe)
            if served is not recipe and any(served_roles(served).values()):
                known = {plan.model_id for plan in plans}
                plans += [plan for plan in plan_servers(served) if plan.model_id not in known]
    except ServeError as exc:
        return [f"servers: none ({exc})"]
    lines = []
    for plan in plans:
        users = [step.name for step in chosen if plan.model_id in step_servers(recipe, step)
                 and not served_elsewhere(recipe, step)]  # another node starts those
        if not users:
            continue
        server = vllm_server(plan, recipe.serve.python, recipe.models_dir, strict=False)
        port = "" if plan.spec.port else " (its port is chosen when it starts)"
        lines.append(f"  {plan.model_id} on {_gpus(plan.spec.gpus)} for {', '.join(users)} "
                     f"(roles {', '.join(plan.roles)}){port}:")
        lines.append(f"    {shlex.join(server.command())}")
    if not lines:
        return ["servers: none (no selected step calls a served model)"]
    header = "servers (each started before the first step that calls it, stopped after the last):"
    return [header, *lines]


def _stages(recipe: Recipe, names: list[str] | None) -> list[str]:
    """The stages of the selected steps that this recipe keeps, in chain order."""
    from prour.stages import stage_of

    stages = []
    for step in _selected(names):
        stage = stage_of(step)
        if stage.name not in stages and stage.skip(recipe) is None and not stage.long_running:
            stages.append(stage.name)  # `prour run` serves per step: no serve stage of its own
    return stages


def gpu_plan_lines(recipe: Recipe, names: list[str] | None = None) -> list[str]:
    """The GPU memory plan of each selected stage that places models on this node."""
    from prour.cluster.gpu_plan import gpu_plan, has_plan

    lines = []
    for stage in _stages(recipe, names):
        if has_plan(stage):
            lines.extend(gpu_plan(recipe, stage).text().splitlines())
    return lines


def problem_lines(recipe: Recipe, names: list[str] | None = None) -> list[str]:
    """What this node lacks for the selected stages as one run (what an earlier one of them
    makes is not required yet), one line each; empty: preflight passes."""
    from prour.preflight import preflight
    from prour.stages import STAGES, get_stage, stage_of

    stages = [stage for stage in _stages(recipe, names) if get_stage(stage).preflight]
    serving = next(stage for stage in STAGES if stage.long_running)
    selected = _selected(names)
    served = serving.skip(recipe) is None and any(step_servers(recipe, s) for s in selected)
    # a step that starts its own servers (the study's) needs what the serve stage checks too
    serves_itself = any(s.serves_itself and stage_of(s).skip(recipe) is None for s in selected)
    if served or serves_itself:
        stages.insert(0, serving.name)  # the servers' own checks: weights, vLLM, their GPUs
    return [problem.line() for problem in preflight(recipe, stages, whole_run=True)]


def serving_problems(recipe: Recipe, step: Step) -> list[str]:
    """Why the servers ``step`` calls cannot start (``extra``: no vLLM in the serve python), to
    be said before any of them starts, whether ``prour run`` starts them or the step itself (the
    study's); none where it serves none."""
    from prour.preflight import check_extras
    from prour.stages import STAGES, served_elsewhere

    serving = next(stage for stage in STAGES if stage.long_running)
    if step.serves_itself:
        return [problem.line() for problem in check_extras(recipe, serving.name)]
    if not step_servers(recipe, step) or served_elsewhere(recipe, step):
        return []
    return [problem.line() for problem in check_extras(step.served_recipe(recipe), serving.name)]


def run_refusals(recipe: Recipe, names: list[str] | None, to_run: Iterable[Step]) -> list[str]:
    """What refuses a ``prour run`` before it starts anything: the checks the selected steps'
    commands make of the recipe's values together, each on its step's recipe
    (:mod:`prour.recipe_checks`), and :func:`serving_problems` of the steps ``to_run``."""
    from prour.recipe_checks import run_problems
    from prour.stages import stage_names

    lines = [f"recipe: {line}" for line in run_problems(recipe, stage_names(), names)]
    for step in to_run:
        lines += [line for line in serving_problems(recipe, step) if line not in lines]
    return lines


def node_plan(recipe: Recipe, names: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The dry run's lines about the node (servers, GPU plans) and its problems, for the
    selected steps (None: the whole chain)."""
    return ([*server_lines(recipe, names), *gpu_plan_lines(recipe, names)],
            problem_lines(recipe, names))


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def run_table(recipe: Recipe, read_stamp: Callable[[Recipe, Step], dict[str, Any] | None],
              names: list[str] | None = None, since: float | None = None,
              skip_reason: Callable[[Recipe, Step], str | None] | None = None,
              refused: Mapping[str, str] | None = None) -> str:
    """What ran where and how long each step took, from the steps' stamps (``read_stamp``: the
    runner's reader of ``<run_dir>/.prour/steps/<step>.json``; ``skip_reason``: its reason a
    run leaves a step out, such a step reads ``skipped``). A step this run started that failed
    reads ``failed``; one in ``refused`` (it did not start: its folder in use, its setup refused)
    reads ``refused``, whatever an earlier run stamped.

    ``names``: the steps asked for (None: every step); ``since``: when this run started, so that
    a step stamped earlier reads ``done before``. The last line is this run's wall time over the
    steps it ran."""
    from prour.stages import stage_of, steps

    rows = [("step", "state", "host", "where", "time")]
    ran: list[tuple[float, float]] = []
    for step in steps():
        if names is not None and step.name not in names:
            continue
        label = f"{stage_of(step).name}/{step.name}"
        if skip_reason is not None and skip_reason(recipe, step):
            rows.append((label, "skipped", "", "", ""))
            continue
        if refused and step.name in refused:
            rows.append((label, "refused", "", where(recipe, step), ""))
            continue
        if step.command is None:  # the review gate: a person passes it
            rows.append((label, "approved" if step.is_done(recipe) else "waiting", "",
                         "a person", ""))
            continue
        stamp = read_stamp(recipe, step)
        if stamp is None:
            rows.append((label, "not run", "", where(recipe, step), ""))
            continue
        started, ended = float(stamp.get("started", 0)), float(stamp.get("ended", 0))
        if stamp.get("adopted"):
            state, took = "adopted", ""
        elif since is not None and started < since:
            state, took = "done before", _clock(ended - started)
        else:
            state, took = "failed" if stamp.get("failed") else "ran", _clock(ended - started)
            ran.append((started, ended))
        rows.append((label, state, str(stamp.get("host", "")), where(recipe, step), took))
    widths = [max(len(row[col]) for row in rows) for col in range(4)]
    lines = ["what ran where (stamps in <run_dir>/.prour/steps/):"]
    lines += ["  " + "  ".join(row[col].ljust(widths[col]) for col in range(4)) + "  "
              + row[4].rjust(7) for row in rows]
    if ran:
        first, last = min(s for s, _ in ran), max(e for _, e in ran)
        busy = sum(e - s for s, e in ran)
        lines.append(f"  this run: {len(ran)} step(s), {_clock(busy)} in steps, "
                     f"{_clock(last - first)} wall clock from "
                     f"{time.strftime('%H:%M:%S', time.localtime(first))}")
    return "\n".join(lines)
