"""``prour validate`` makes every check a stage makes of the recipe's values together
(prour/recipe_checks.py): each check of the registry is tripped here by a recipe a stage refuses,
the stage's own code raises its message, and ``prour validate`` refuses the recipe (exit 2) with
that very message, naming the step, before any model or server. A check added to the registry
without a case here fails the enumeration. ``prour collect`` itself now says it at its preflight,
before its models load (it was a ``ValueError`` traceback after them), and ``prour run`` before
it starts anything."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))  # the scripted data world

from prour.cli.main import app
from prour.recipe_checks import CHECKS, recipe_problems, run_problems
from prour.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "smoke.yaml"


def _collect(recipe):
    from prour.data.collect import plan_episodes
    from prour.data.reserve import data_tasks

    plan_episodes(data_tasks(recipe.data), recipe.data)


def _reserve(recipe):
    from prour.data.reserve import reserve_task_ids

    reserve_task_ids(recipe.data)


def _tasks(recipe):
    from prour.data.reserve import data_tasks

    data_tasks(recipe.data)


def _queue(recipe):
    from prour.eval.queue import check_limits

    check_limits(recipe)


def _kit(recipe):
    from prour.build import Builder
    from prour.eval.kit import MethodKit

    kit = MethodKit(Builder(recipe))
    for method in recipe.eval.methods:
        for attention in recipe.eval.variants():
            kit.check(method, attention)


# check name -> (the --set items on recipes/smoke.yaml that trip it, the step validate names,
# the stage's own code that raises it)
CASES: dict[str, tuple[list[str], str, Callable]] = {
    "data.calibration_reserve": (["data.calibration_reserve=5000"], "collect-retail", _reserve),
    "data.tasks": (["data.tasks=reserve"], "collect-retail", _tasks),
    "data.num_trajectories": (["data.max_tasks=2"], "collect-retail", _collect),
    "eval.max_in_flight": (["eval.max_in_flight={nosuch: 1}"], "eval", _queue),
    "eval.attention": (["eval.methods=[oracle]",
                        "eval.attention={policy: budgeted+review, budget: 1}"], "eval", _kit),
}


def test_every_check_of_the_registry_has_a_case():
    assert sorted(CASES) == sorted(check.name for check in CHECKS)


def _stage_message(sets: list[str], stage_code: Callable) -> str:
    recipe = load_recipe(SMOKE, sets)
    with pytest.raises(ValueError) as raised:
        stage_code(recipe)
    return str(raised.value)


@pytest.mark.parametrize("name", list(CASES))
def test_validate_refuses_what_the_stage_refuses_with_the_stages_message(name):
    sets, step, stage_code = CASES[name]
    message = _stage_message(sets, stage_code)
    args = ["validate", str(SMOKE), *(part for item in sets for part in ("--set", item))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: recipe: {step}: {message}"], result.output
    assert "ok:" not in result.output


def test_the_smoke_recipe_as_it_is_passes_every_check():
    recipe = load_recipe(SMOKE)
    from prour.stages import run_stages

    assert run_problems(recipe, run_stages(recipe)) == []
    ok = CliRunner().invoke(app, ["validate", str(SMOKE)])
    assert ok.exit_code == 0 and "ok: " in ok.output, ok.output


def test_each_step_is_checked_on_the_recipe_it_runs():
    """The chain's collect-dev collects the reserve's tasks (its own --set items): a reserve of
    one task cannot give router.calibration.dev_episodes=4 episodes on one seed. The recipe as
    written (collect-retail) is fine, so only the step's recipe shows it."""
    sets = ["data.calibration_reserve=1", "router.calibration.dev_episodes=4",
            "router.calibration.dev_states=calibration/dev_states.jsonl", "router.tau_au=null",
            "router.tau_eu=null"]
    recipe = load_recipe(SMOKE, sets)
    assert recipe_problems(recipe, ["collect"]) == []
    expected = ("collect-dev: data.num_trajectories=4 needs more episodes than 1 tasks x 1 "
                "data.trial_seeds = 1; add seeds to data.trial_seeds")
    assert run_problems(recipe, ["collect"]) == [expected]


def test_collect_refuses_it_at_its_preflight_and_prour_run_before_it_starts(tmp_path):
    """The stage command on the same recipe: exit 2 with the stage's line, before any model loads
    or episode runs (nothing written); ``prour run`` refuses it before its lock or its steps."""
    import data_scripts as scripts  # tests/data
    import yaml

    files = scripts.write_script_files(tmp_path / "scripts")
    recipe = tmp_path / "recipe.yaml"
    run = tmp_path / "run"
    recipe.write_text(yaml.safe_dump({
        "name": "checks", "run_dir": str(run),
        "models": {role: {"backend": "scripted", "script": str(files[role])}
                   for role in ("agent", "user")},
        "data": {"num_trajectories": 3, "trial_seeds": [0], "max_tasks": 2, "teacher": False}}))
    message = ("data.num_trajectories=3 needs more episodes than 2 tasks x 1 data.trial_seeds = 2; "
               "add seeds to data.trial_seeds")
    collect = CliRunner().invoke(app, ["collect", "--recipe", str(recipe), "--no-progress"])
    assert collect.exit_code == 2, collect.output
    assert "Traceback" not in collect.output
    assert collect.exception is None or isinstance(collect.exception, SystemExit)
    assert [line for line in collect.output.splitlines() if line.startswith("error: ")] == [
        f"error: recipe: {message}"], collect.output
    ran = subprocess.run([sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"error: recipe: collect-retail: {message}" in ran.stderr.splitlines(), ran.stderr
    assert "==" not in ran.stdout, ran.stdout  # no step started
    assert not run.exists()  # nothing written: not even the run folder or its lock
