"""Preflight: what a stage needs before its first episode or step, checked in a few seconds.

Each check returns :class:`Problem` lines (one line each, naming the recipe key, file, URL or
package and the fix); an empty list means the stage can start. The checks:

- ``recipe``: the recipe's values against each other and tau2's task lists, as the stage checks
  them (:mod:`prour.recipe_checks`; for a whole run, each step on the recipe as it runs it);
- ``models``: the roles the stage uses are defined in the recipe;
- ``weights``: ``hf`` roles (and the models ``serve`` loads, and extract's tokenizer) have local
  weights (:func:`prour.llm.weights.local_weights`; nothing is downloaded), and a model folder
  holds its weight files, not only ``config.json``;
- ``endpoint``: ``openai`` roles answer ``GET <base_url>/models`` within a short timeout and list
  their model; without a ``base_url``, why the endpoints file gave none;
- ``extra``: the optional packages the recipe uses import (verl, transfer_queue, ray, vllm for
  ``train.backend: verl``; flash_attn when asked for; vllm in the serve python);
- ``path``: input files a stage reads (trajectories, goals, parquet, calibration states), and
  for parquet inputs that exist, that their footer reads;
- ``thresholds``: calibrated (τ_AU, τ_EU) for stages that route;
- ``gpus``: GPUs visible on this node against those the recipe places.

What each stage reads, calls, loads, imports and places comes from the table of stages
(:mod:`prour.stages`). A file or threshold written by a stage of the same run (``prour validate --preflight`` checks the
whole run) is not required to exist yet; nor is the endpoint of a model ``serve`` starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prour.cluster.devices import visible_gpus
from prour.cluster.endpoints import PROBE_TIMEOUT_S, probe_endpoint
from prour.config import Recipe
from prour.stages import (
    EXTERNAL,
    get_stage,
    required_roles,
    served_ids,
    stage_inputs,
    stage_of,
    writer_of,
)

TOKENIZER_KEYS = ("data.tokenizer",)  # keys naming a folder whose tokenizer alone is read


@dataclass(frozen=True)
class Problem:
    """One thing missing for a stage, as one line: ``<check>: <what, where, and the fix>``."""

    check: str  # recipe | models | weights | endpoint | extra | path | thresholds | gpus
    message: str

    def line(self) -> str:
        return f"{self.check}: {self.message}"


# ---- the recipe's values against each other ------------------------------------------------------


def not_said(problems: Iterable[Problem], said: Iterable[Problem]) -> list[Problem]:
    """``problems`` less those whose text a line of ``said`` holds already (the protocol rules
    read the reserve as the stages do, and would name its problem a second time)."""
    said = [problem.message for problem in said]
    return [p for p in problems if not any(p.message in line for line in said)]


def check_recipe(recipe: Recipe, stages: Sequence[str], whole_run: bool = False) -> list[Problem]:
    """The cross-field checks the stages make (:mod:`prour.recipe_checks`): on the recipe as it
    is for one command; for a whole run, each step on the recipe as that step runs it."""
    from prour.recipe_checks import recipe_problems, run_problems

    lines = run_problems(recipe, stages) if whole_run else recipe_problems(recipe, stages)
    return [Problem("recipe", line) for line in lines]


# ---- models and weights ------------------------------------------------------------------------


def _roles_by_stage(recipe: Recipe, stages: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The roles each stage needs in the recipe (:func:`prour.stages.required_roles`)."""
    return {stage: required_roles(recipe, stage) for stage in stages}


def check_models(recipe: Recipe, roles_by_stage: dict[str, tuple[str, ...]]) -> list[Problem]:
    """One line per role the stages use that the recipe does not define."""
    from prour.build import missing_roles

    needed_by = {f"`prour {stage.split('/')[0]}`": roles
                 for stage, roles in roles_by_stage.items()}
    return [Problem("models", line) for line in missing_roles(recipe.models, needed_by)]


def _weights(name: str, recipe: Recipe, key: str) -> Problem | None:
    """The folder of ``name`` exists and, unless only its tokenizer is read, holds weights."""
    from prour.llm.weights import ModelNotFound, local_weights, missing_weight_files

    try:
        folder = local_weights(name, recipe.models_dir, key)
    except ModelNotFound as exc:
        return Problem("weights", str(exc))
    tokenizer_only = all(k in TOKENIZER_KEYS for k in key.split(", "))
    why = None if tokenizer_only else missing_weight_files(folder, key, name)
    return Problem("weights", why) if why else None


def _weights_wanted(recipe: Recipe, stage: str, roles: Sequence[str]) -> list[tuple[str, str]]:
    """(model name, recipe key) whose weights ``stage`` loads in this process or serves: its
    ``hf`` roles and what the table says it loads besides (:attr:`prour.stages.Stage.weights`)."""
    wanted = [(str(cfg.path), f"models.{role}.path") for role in roles
              if (cfg := recipe.models.get(role)) is not None and cfg.backend == "hf"]
    return wanted + list(get_stage(stage).weights(recipe))


def check_weights(recipe: Recipe, roles_by_stage: dict[str, tuple[str, ...]]) -> list[Problem]:
    """One line per model without local weights, naming every key that uses it."""
    keys: dict[str, list[str]] = {}
    for stage, roles in roles_by_stage.items():
        for name, key in _weights_wanted(recipe, stage, roles):
            keys.setdefault(name, [])
            if key not in keys[name]:
                keys[name].append(key)
    found = (_weights(name, recipe, ", ".join(named)) for name, named in keys.items())
    return [problem for problem in found if problem is not None]


# ---- endpoints ---------------------------------------------------------------------------------


def _no_base_url(recipe: Recipe, role: str) -> str:
    from prour.cluster.endpoints import EndpointsError, endpoints_path, read_endpoints
    from prour.recipes import prour_command

    path = endpoints_path(recipe)
    model = recipe.models[role].model
    serve = f"start the servers with `{prour_command(recipe, 'serve')}`"
    try:
        record = read_endpoints(path)
    except EndpointsError as exc:
        return f"models.{role} ({model}) has no base_url and {exc}"
    if record is None:
        state = f"the endpoints file {path} does not exist"
    elif record["status"] == "starting":  # a serve is on its way: wait for it, start no other
        wait = prour_command(recipe, "endpoints", "--wait", f"{recipe.serve.startup_timeout_s:g}")
        return (f"models.{role} ({model}) has no base_url yet: the endpoints file {path} says "
                f"starting (the servers are loading); wait for them with `{wait}`, then rerun")
    elif record["status"] != "ready":
        error = f": {record['error']}" if record.get("error") else ""
        state = f"the endpoints file {path} says {record['status']}{error}"
    else:
        state = f"the endpoints file {path} serves no {model!r}"
    return f"models.{role} ({model}) has no base_url and {state}; {serve} or set models.{role}.base_url"


def check_endpoints(recipe: Recipe, roles: Sequence[str], served_later: bool = False,
                    timeout_s: float = PROBE_TIMEOUT_S) -> list[Problem]:
    """Health of the ``openai`` roles' servers (each URL probed once); with ``served_later``,
    roles whose model the recipe's ``serve`` starts are left to that stage."""
    problems, servers = [], {}
    for role in roles:
        cfg = recipe.models.get(role)
        if cfg is None or cfg.backend != "openai":
            continue
        if served_later and cfg.model in served_ids(recipe):
            continue
        if not cfg.base_url:
            problems.append(Problem("endpoint", _no_base_url(recipe, role)))
            continue
        servers.setdefault((cfg.base_url, cfg.model, cfg.api_key_env, cfg.api_key_file),
                           []).append(role)
    for (base_url, model, key_env, key_file), users in servers.items():
        from prour.llm.openai import request_key

        why = probe_endpoint(base_url, model, request_key(key_env, key_file), timeout_s)
        if why:
            keys = ", ".join(f"models.{role}" for role in users)
            problems.append(Problem("endpoint", f"{keys}: {why}; start the server or fix "
                                    f"{keys.split(', ')[0]}.base_url"))
    return problems


# ---- optional packages -------------------------------------------------------------------------


def module_available(name: str, python: str | None = None) -> bool:
    """Whether ``name`` imports in this interpreter (or in ``python``), without importing it."""
    # abspath, not resolve(): two venvs' pythons are symlinks to one interpreter
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return importlib.util.find_spec(name) is not None
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    try:
        found = subprocess.run([python, "-c", code], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


def check_extras(recipe: Recipe, stage: str) -> list[Problem]:
    """The optional modules the stage imports (:attr:`prour.stages.Stage.extras`), each in the
    python that imports it."""
    problems = []
    for extra in get_stage(stage).extras(recipe):
        python = extra.python
        if python is not None and not Path(python).is_file() and not shutil.which(python):
            problems.append(Problem("extra", f"serve python {python} does not exist (serve.python"
                                    " or $PROUR_VLLM_PYTHON)"))
        elif not module_available(extra.module, python):
            where = f"by {python} " if python is not None else ""
            problems.append(Problem("extra", f"`{extra.module}` is not importable {where}"
                                    f"({extra.why}); {extra.fix}"))
    return list(dict.fromkeys(problems))


# ---- input files and thresholds ------------------------------------------------------------------


def check_paths(recipe: Recipe, stage: str, stages: Iterable[str] = ()) -> list[Problem]:
    """Input files of ``stage`` (:func:`prour.stages.stage_inputs`) that exist neither now nor as
    the output of a step that one of ``stages`` runs."""
    later = set(stages)
    problems = []
    for file, writer in stage_inputs(get_stage(stage), recipe):
        if not file.checked or file.path.exists():
            continue
        if writer.by_stage and writer is not EXTERNAL and stage_of(writer).name in later:
            continue
        how = (f"run `{writer.hint(recipe)}` first" if writer is not EXTERNAL
               else f"fix {file.key}")
        problems.append(Problem("path", f"{file.key}: {file.path} does not exist; {how}"))
    return problems


def check_parquet(recipe: Recipe, stage: str) -> list[Problem]:
    """Parquet inputs of ``stage`` that exist but cannot be read: their footer (schema and row
    groups, a few KiB at the end of the file) is read, so a truncated, empty or foreign file is
    named here and not as a pyarrow traceback once the stage has loaded its models."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = []
    for file, writer in stage_inputs(get_stage(stage), recipe):
        if file.path.suffix != ".parquet" or not file.path.is_file():
            continue
        try:
            pq.read_metadata(file.path)
        except (pa.ArrowException, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            how = (f"write it again with `{writer.hint(recipe)}`" if writer is not EXTERNAL
                   else f"fix {file.key}")
            problems.append(Problem("path", f"{file.key}: {file.path} is not a readable parquet "
                                    f"file ({reason}); {how}"))
    return problems


def check_thresholds(recipe: Recipe, stage: str, stages: Iterable[str] = ()) -> list[Problem]:
    """(τ_AU, τ_EU) of the decomposer, for stages that route, unless the stage that writes them
    runs first."""
    from prour.router.thresholds import thresholds_path

    path = thresholds_path(recipe)
    writer = writer_of(recipe, path)
    if (writer is not EXTERNAL and stage_of(writer).name in set(stages)) \
            or not get_stage(stage).routes(recipe) or "decomposer" not in recipe.models:
        return []
    from prour.build import Builder

    try:  # read the way the stage itself reads them (no model is loaded for this)
        Builder(recipe).thresholds()
    except ValueError as exc:
        return [Problem("thresholds", str(exc).replace("\n", " "))]
    return []


# ---- GPUs ----------------------------------------------------------------------------------------


def _cuda_count(device: str) -> int:
    """GPUs an ``hf`` model's ``device`` demands: ``cuda:N`` -> N+1, ``cuda`` -> 1, else 0
    (``auto`` runs on the CPU when the node has no GPU)."""
    if not device.startswith("cuda"):
        return 0
    index = device.partition(":")[2]
    return int(index) + 1 if index.isdigit() else 1


def gpu_needs(recipe: Recipe, stages: Iterable[str]) -> dict[str, int]:
    """GPUs per node each placing key of the stages demands of this node: what the table places
    (:attr:`prour.stages.Stage.gpus`: the verl trainer, the servers' listed GPUs for serve; other
    stages reach the servers over HTTP, e.g. from a Slurm job without GPUs) and the ``hf`` roles
    the stages call pinned to a CUDA device."""
    needs: dict[str, int] = {}
    for stage in stages:
        needs.update(get_stage(stage).gpus(recipe))
        for role in required_roles(recipe, stage):
            cfg = recipe.models.get(role)
            if cfg is not None and cfg.backend == "hf" and _cuda_count(cfg.device):
                needs[f"models.{role}.device"] = _cuda_count(cfg.device)
    return needs


def check_gpus(recipe: Recipe, stages: Iterable[str]) -> list[Problem]:
    """The stages' GPU memory plans (:mod:`prour.cluster.gpu_plan`): one line per plan that does
    not fit, and one when this node shows fewer GPUs than the recipe places models on."""
    from prour.cluster.gpu_plan import gpu_plan, has_plan

    stages = list(stages)
    plans = [gpu_plan(recipe, stage) for stage in stages if has_plan(stage)]
    problems = [Problem("gpus", f"the GPU memory plan of stage {plan.stage} does not fit on "
                        f"{plan.n_gpus} x {plan.gpu_gib:g} GiB: {'; '.join(plan.problems)} "
                        f"(`prour serve --dry-run` / `prour train --dry-run` print the plan)")
                for plan in plans if not plan.fits]
    needs = gpu_needs(recipe, stages)
    needed, visible = max(needs.values(), default=0), visible_gpus()
    if visible < needed:
        keys = ", ".join(key for key, count in needs.items() if count == needed)
        problems.append(Problem("gpus", f"GPUs visible: {visible}, needed: {needed} ({keys}); "
                                "run on a node with them (check CUDA_VISIBLE_DEVICES and "
                                "`nvidia-smi -L`)"))
    return problems


# ---- the protocol (prour.eval.protocol) ----------------------------------------------------------------


def check_protocol(recipe: Recipe) -> list[Problem]:
    """The broken protocol rules as problems (``protocol.on_breach: error``); none under ``warn``
    (the CLI prints them as warnings: :func:`protocol_warnings`)."""
    if recipe.protocol.on_breach != "error" or _no_training_protocol(recipe):
        return []
    return [Problem("protocol", line.removeprefix("protocol: ")) for line in _protocol_lines(recipe)]


def protocol_warnings(recipe: Recipe) -> list[str]:
    """The ``protocol:`` lines a ``warn`` recipe prints instead of stopping."""
    if recipe.protocol.on_breach != "warn" or _no_training_protocol(recipe):
        return []
    return _protocol_lines(recipe)


def protocol_note_lines(recipe: Recipe) -> list[str]:
    """The ``note:`` lines `prour validate` prints (:func:`prour.eval.protocol.protocol_notes`: what
    the protocol allows and states, e.g. the content overlap); a split or reserve the recipe
    cannot have is left to :func:`check_protocol`, which names it."""
    from prour.eval.protocol import protocol_notes

    if _no_training_protocol(recipe):
        return []
    try:
        return [f"note: {note}" for note in protocol_notes(recipe)]
    except ValueError:
        return []


def _no_training_protocol(recipe: Recipe) -> bool:
    """Whether the Prour paper's protocol rules (eval tasks apart from training tasks, ...) do
    not apply: a standalone study trains nothing, and the calibration test collection is
    checked by the steps that run the recipe as written."""
    standalone = recipe.study is not None and recipe.study.standalone
    return standalone or _calibration_test_collection(recipe)


def _calibration_test_collection(recipe: Recipe) -> bool:
    """The chain's collect-airline step (its ``--set`` items: another domain, no reserve, the
    airline trajectories file): episodes for the calibration test states, which nothing trains
    on, so the study's protocol is checked by the steps that run the recipe as written."""
    from prour.stages import AIRLINE_TRAJECTORIES

    return recipe.data.trajectories == str(Path(recipe.run_dir) / AIRLINE_TRAJECTORIES)


def _protocol_lines(recipe: Recipe) -> list[str]:
    from prour.eval.protocol import protocol_findings

    try:
        return [finding.line() for finding in protocol_findings(recipe)]
    except ValueError as exc:  # a split or reserve the recipe cannot have (named by its key)
        return [f"protocol: {exc}"]


# ---- all together --------------------------------------------------------------------------------


def preflight(recipe: Recipe, stages: Sequence[str], whole_run: bool = False,
              timeout_s: float = PROBE_TIMEOUT_S, skip: Iterable[str] = ()) -> list[Problem]:
    """Every problem of ``stages``; ``whole_run``: the stages run in order, so what an earlier
    stage of the run makes (files, thresholds, served endpoints) need not exist yet. ``skip``
    leaves out checks by name (e.g. ``gpus`` on a Slurm login node: each job checks its node)."""
    for stage in stages:
        get_stage(stage)  # an unknown name: a ValueError listing the stages
    run = stages if whole_run else ()
    roles = _roles_by_stage(recipe, stages)
    recipe_lines = check_recipe(recipe, stages, whole_run)
    problems = recipe_lines + check_models(recipe, roles) + check_weights(recipe, roles)
    every_role = list(dict.fromkeys(role for used in roles.values() for role in used))
    problems += check_endpoints(recipe, every_role, served_later=whole_run, timeout_s=timeout_s)
    for stage in stages:
        problems += check_extras(recipe, stage)
        problems += check_paths(recipe, stage, run)
        problems += check_parquet(recipe, stage)
        problems += check_thresholds(recipe, stage, run)
    problems += check_gpus(recipe, stages)
    problems += not_said(check_protocol(recipe), recipe_lines)
    left_out = set(skip)
    # dict.fromkeys: a problem two stages share (thresholds for extract and eval) is named once
    return [p for p in dict.fromkeys(problems) if p.check not in left_out]
