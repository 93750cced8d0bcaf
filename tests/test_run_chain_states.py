"""``prour run``'s table without running a step: which recipe keys make which steps stale, how
``--from/--to/--only`` read names, and the dry run's chain (tests/test_runner_chain.py runs it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.recipes import load_recipe
from prour.run_state import (
    DONE,
    PENDING,
    STALE,
    affected_steps,
    flat_values,
    step_values,
    table,
    write_stamp,
)
from prour.runner import RunError, select
from prour.stages import get_step, stage_names, steps

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "recipes" / "paper.yaml"
SMOKE = ROOT / "recipes" / "smoke.yaml"


def _paper(tmp_path: Path, *sets: str):
    return load_recipe(PAPER, [f"run_dir={tmp_path}", *sets])


def test_a_change_of_n_actions_makes_the_routing_steps_and_all_after_them_stale(tmp_path) -> None:
    made, now = _paper(tmp_path), _paper(tmp_path, "router.n_actions=3")
    # the ig-clarifier's own rows depend on no router key: its steps stay done
    assert affected_steps(made, now) == [
        "search", "heldout", "extract", "train", "export", "eval", "eval-budget",
        "eval-every-n", "posthoc", "study", "nl-assertions", "report"]


def test_a_change_of_one_sweep_makes_only_that_sweep_and_the_report_stale(tmp_path) -> None:
    made = _paper(tmp_path)
    assert affected_steps(made, _paper(tmp_path, "eval.tradeoff.budget=[1,16]")) == [
        "eval-budget", "report"]
    assert affected_steps(made, _paper(tmp_path, "eval.tradeoff.every_n=[2]")) == [
        "eval-every-n", "report"]


@pytest.mark.parametrize(("change", "first"), [
    ("data.num_trajectories=7", "collect-retail"),  # retail only: the airline count is its own
    ("models.annotator.max_model_len=4096", "annotate"),
    ("train.total_steps=5", "train"),
    ("eval.seeds=[1]", "eval"),
])
def test_a_change_makes_stale_its_step_and_the_steps_reading_its_outputs(
        tmp_path, change: str, first: str) -> None:
    stale = affected_steps(_paper(tmp_path), _paper(tmp_path, change))
    order = [step.name for step in steps()]
    assert stale[0] == first
    assert order.index(stale[0]) < order.index("report") and stale[-1] == "report"
    assert "collect-airline" not in stale and "normalize" not in stale


@pytest.mark.parametrize("change", ["data.concurrency=9", "eval.concurrency=9",
                                    "router.calibration.approve_labels=true",
                                    "train.wandb.track=true"])
def test_keys_that_change_speed_or_logging_make_nothing_stale(tmp_path, change: str) -> None:
    assert affected_steps(_paper(tmp_path), _paper(tmp_path, change)) == []


def test_stamped_values_name_paths_relative_to_the_run_folder(tmp_path) -> None:
    values = step_values(_paper(tmp_path), get_step("collect-retail"))
    copied = step_values(_paper(tmp_path / "copy"), get_step("collect-retail"))
    assert values == copied  # a copied run folder keeps its stamps
    assert "models.agent.model" in values and "data.concurrency" not in values
    assert flat_values(_paper(tmp_path))["data.trajectories"] == \
        "${run_dir}/data/trajectories.jsonl"


def test_names_select_stages_steps_and_ranges_in_chain_order() -> None:
    assert select(only=["calibrate"]) == [
        "states-dev", "states-test", "annotate", "review", "search", "heldout"]
    assert select(only=["report,train", "normalize"]) == [
        "normalize", "train", "train-ig-clarifier", "report"]
    assert select(first="extract", last="export") == [
        "extract", "extract-ig-clarifier", "train", "train-ig-clarifier", "export",
        "export-ig-clarifier"]
    after_eval = select(first="eval")  # the study, then the taxonomy (A.1), then the report
    assert after_eval[:5] == ["eval", "eval-budget", "eval-every-n", "posthoc", "study"]
    assert after_eval[-3:] == ["taxonomy", "taxonomy-review", "report"]
    with pytest.raises(RunError, match="comes after"):
        select(first="eval", last="collect")


def test_an_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(RunError) as caught:
        select(only=["trian"])
    message = str(caught.value)
    assert "'trian'" in message and "train" in message
    assert all(name in message for name in [*stage_names(), "collect-airline", "heldout"])
    result = CliRunner().invoke(app, ["run", "--recipe", str(PAPER), "--only", "trian"])
    assert result.exit_code == 2 and "unknown stage or step 'trian'" in result.output


def test_stamps_make_a_done_step_stale_when_its_values_change(tmp_path) -> None:
    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path}"])
    goals = Path(recipe.data.goals)
    step = get_step("normalize")
    assert {r.step.name: r.state for r in table(recipe)}["normalize"] == PENDING
    goals.parent.mkdir(parents=True)
    from prour.env.domains import select_tasks

    tasks = select_tasks(recipe.data.domain, recipe.data.split, max_tasks=recipe.data.max_tasks)
    goals.write_text("".join(json.dumps({"task_id": t.id, "goal": "g"}) + "\n" for t in tasks))
    write_stamp(recipe, step, "prour normalize", 1.0, 2.0)
    assert {r.step.name: r.state for r in table(recipe)}["normalize"] == DONE
    changed = load_recipe(SMOKE, [f"run_dir={tmp_path}", "data.normalizer_max_tokens=99"])
    row = {r.step.name: r for r in table(changed)}["normalize"]
    assert row.state == STALE and "data.normalizer_max_tokens: 128 -> 99" in row.why


def test_the_dry_run_prints_every_step_with_its_state_command_and_servers(tmp_path) -> None:
    result = CliRunner().invoke(app, ["run", "--recipe", str(PAPER), "--set",
                                      f"run_dir={tmp_path}", "--dry-run"])
    lines = result.output.splitlines()
    # this machine lacks the paper's weights and GPUs: a broken setup, so the dry run exits 2
    problems = [line for line in lines if line.startswith("problem: ")]
    assert any(line.startswith("problem: weights: ") for line in problems), result.output
    assert f"{len(problems)} problem(s) on this node for these steps" in result.output
    assert result.exit_code == 2, result.output
    for step in steps():
        assert any(f"/{step.name} " in line for line in lines), step.name
    state = {line.split()[0].split("/")[1]: line.split()[1] for line in lines
             if line.startswith("  ") and "/" in line.split()[0] and not line.startswith("    ")}
    assert state["review"] == "gate" and state["serve"] == "skipped"
    assert {state[name] for name in ("collect-retail", "extract", "report")} == {PENDING}
    assert "      serves Qwen/Qwen3-32B (roles teacher)" in lines
    # eval.generator_backend vllm: the servers eval calls include the exported checkpoint's
    assert any(line.startswith("  exported-generator on GPU 0 for eval, eval-budget, "
                               "eval-every-n (roles generator)") for line in lines), result.output
    # The run-time estimates of the steps it would start (prour.estimate; tests/test_estimate.py)
    assert "estimate (train): from recorded benchmark rates" in result.output
    episodes = (114 + 50) * 3  # retail + airline base tasks x seeds 0, 1, 2
    conc = load_recipe(PAPER).eval.concurrency
    assert (f"  base: {episodes} episodes x 697 s (assumed) / {conc} = "  # the paper's 696.51 s
            f"{episodes * 696.51 / conc / 3600:.1f} h alone") in lines
    # prour's episodes wait on the exported generator's server: at most the requests its KV
    # cache holds at once, as the eval step sizes it (printed), and at most eval.concurrency
    sized = next(line for line in lines if line.startswith("  requests in flight at once per "
                                                          "model, as eval sizes"))
    seqs = min(conc, int(re.search(r"exported-generator (\d+)", sized).group(1)))
    assert (f"  prour: {episodes} episodes x 697 s (assumed) / {seqs} = "
            f"{episodes * 696.51 / seqs / 3600:.1f} h alone") in lines
    assert not (tmp_path / ".prour").exists()  # a dry run writes nothing


def test_a_dry_run_that_finds_no_problem_exits_0(tmp_path) -> None:
    """The report step places nothing and checks no setup: nothing to find, exit 0."""
    result = CliRunner().invoke(app, ["run", "--recipe", str(PAPER), "--set",
                                      f"run_dir={tmp_path}", "--only", "report", "--dry-run"])
    assert "0 problem(s) on this node for these steps" in result.output
    assert "problem: " not in result.output and result.exit_code == 0, result.output


def test_status_of_a_slurm_run_folder_shows_the_table_and_each_jobs_state(tmp_path) -> None:
    from prour.cluster.jobs import MANIFEST, SCHEMA

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    status_file = run_dir / "collect.status"
    status_file.write_text("start=1700000000\nend=1700000100\nrc=0\n")  # what the job writes
    manifest = {"schema": SCHEMA, "recipe": str(SMOKE), "name": "smoke", "run_dir": str(run_dir),
                "workdir": str(ROOT), "overrides": ["data.max_tasks=1"], "submitted": "now",
                "stages": [{"stage": "collect", "job_id": "41", "script": None,
                            "log": str(run_dir / "collect-41.log"),
                            "status_file": str(status_file), "depends_on": None, "tasks": []}]}
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["status", str(run_dir)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = [line for line in lines if line.startswith("  ") and "/" in line.split()[0]]
    assert [row.split()[0].split("/")[1] for row in rows] == [s.name for s in steps()]
    assert any(row.split()[0] == "collect/collect-retail" and row.split()[1] == PENDING
               for row in rows)
    jobs = [line for line in lines if "job 41" in line]
    assert len(jobs) == 1 and "COMPLETED" in jobs[0] and "exit 0" in jobs[0]


def test_status_of_a_folder_no_run_made_names_what_it_lacks(tmp_path) -> None:
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 2
    assert "neither" in result.output and "prour run --recipe RECIPE --dry-run" in result.output
