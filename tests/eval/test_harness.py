"""``prour eval`` / ``prour report`` end to end on real tau2 tasks (scripted models, tiny model).

- every method on two retail and two airline test tasks; the report's table equals a direct
  computation from results.jsonl;
- the oracle scores 1.0 on every test task of retail, airline and telecom (harness check);
- an evaluation killed with SIGKILL and rerun finishes only the missing episodes and ends equal
  to an uninterrupted run;
- a checkpoint saved by the local trainer's checkpoint code evaluates via ``--checkpoint``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from eval_world import SOLVABLE, recipe, register_scripts
from typer.testing import CliRunner

from prour.cli.main import app
from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.config.router import RouterConfig
from prour.env.domains import split_sizes
from prour.env.trajectory import read_jsonl, read_trajectories
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, Evaluation
from prour.eval.methods import METHODS
from prour.train.checkpoint import resolve_checkpoint

REPO = Path(__file__).resolve().parents[2]
ALL_METHODS = ["base", "prour", "clarify-only", "verify-only", "llm-router", "oracle"]
TASKS = ["retail:5", "retail:65", "airline:26"]  # airline's DB is the costly one: one task
PNG = b"\x89PNG\r\n\x1a\n"


def _write_recipe(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


# ---- every method, then the report --------------------------------------------------------


@pytest.fixture(scope="module")
def all_methods_run(tmp_path_factory) -> tuple[Path, Path]:
    register_scripts()
    root = tmp_path_factory.mktemp("all")
    run, report = root / "run", root / "report"
    path = _write_recipe(root / "r.yaml", recipe(str(root), methods=ALL_METHODS, tasks=TASKS))
    _invoke("eval", "--recipe", str(path), "--out", str(run), "--no-progress")
    _invoke("report", str(run), "--out", str(report), "--n-boot", "200")
    return run, report


@pytest.mark.slow
def test_every_method_writes_one_result_per_episode(all_methods_run) -> None:
    run, _ = all_methods_run
    lines = list(read_jsonl(run / RESULTS_FILE))
    assert sorted({line["method"] for line in lines}) == sorted(ALL_METHODS)
    assert len(lines) == len(ALL_METHODS) * len(TASKS)
    assert len(read_trajectories(run / EPISODES_FILE)) == len(lines)
    by_method = {m: [line for line in lines if line["method"] == m] for m in ALL_METHODS}
    assert all(line["score"] == 1.0 for line in by_method["oracle"])
    assert not any(line["steps"]["verify"] for line in by_method["clarify-only"])
    assert not any(line["steps"]["clarify"] for line in by_method["verify-only"])
    for method in ("prour", "llm-router"):
        assert all(line["steps"]["clarify"] == line["steps"]["verify"] == 1
                   for line in by_method[method])
    assert not any(line["decisions"] for line in by_method["base"])
    for line in lines:
        solvable = line["task_id"] == SOLVABLE[line["domain"]][1]
        assert line["success"] == (solvable or line["method"] == "oracle")
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["seeds"] == [0] and "git" in provenance and "packages" in provenance
    assert provenance["endpoints"]["generator"] == "eval-generator"


def _table_rows(markdown: str, title: str) -> dict[str, list[str]]:
    """The rows of the markdown table under ``## title``, keyed by their first cell."""
    section = markdown.split(f"## {title}")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in row.strip("|").split("|")] for row in rows[2:])}


@pytest.mark.slow
def test_report_table_equals_a_direct_computation(all_methods_run) -> None:
    run, report = all_methods_run
    markdown = (report / "report.md").read_text()
    rows = _table_rows(markdown, "Pass@1 (%) and interaction cost")
    lines = list(read_jsonl(run / RESULTS_FILE))
    for method in ALL_METHODS:
        mine = [line for line in lines if line["method"] == method]
        per_domain = {}
        for domain in ("retail", "airline"):
            cell = [line for line in mine if line["domain"] == domain]
            per_domain[domain] = 100 * sum(line["success"] for line in cell) / len(cell)
        average = sum(per_domain.values()) / 2
        shown = [float(re.match(r"[\d.]+", c).group()) for c in rows[method][:3]]
        assert shown == pytest.approx([per_domain["retail"], per_domain["airline"], average],
                                      abs=0.005)
        steps = {k: sum(sum(l["steps"][k] for l in mine if l["domain"] == d) /
                        sum(1 for l in mine if l["domain"] == d)
                        for d in ("retail", "airline")) / 2 for k in ("act", "clarify", "verify")}
        assert [float(c) for c in rows[method][3:6]] == pytest.approx(
            [steps["act"], steps["clarify"], steps["verify"]], abs=0.005)
        assert float(rows[method][6]) == pytest.approx(sum(steps.values()), abs=0.005)
        assert int(rows[method][9]) == sum(line["error"] for line in mine)
        assert int(rows[method][11]) == sum(line["termination"] == "max_steps" for line in mine)
        assert int(rows[method][12]) == len(mine)
    for name in ("success_vs_steps.png", "uncertainty_over_steps.png"):
        assert (report / name).read_bytes()[:8] == PNG


# ---- the oracle as a harness check ----------------------------------------------------------


def _oracle_evaluation(tmp_path: Path, max_tasks: int | None) -> None:
    """The oracle through the harness on the first ``max_tasks`` test tasks of each domain (None:
    all of them): one result per task, each scored 1.0."""
    domains = ["retail", "airline", "telecom"]
    cfg = EvalConfig(methods=["oracle"], seeds=[0], domains=domains, concurrency=2,
                     max_tasks=max_tasks)
    evaluation = Evaluation(Recipe(name="oracle", env={"max_steps": 200}, eval=cfg), tmp_path,
                            progress=False)
    results = evaluation.run()
    sizes = [split_sizes(d)["test"] for d in domains]
    assert len(results) == sum(min(n, max_tasks or n) for n in sizes)
    failed = [(r["domain"], r["task_id"], r["reward"], r["errors"]) for r in results
              if r["reward"] != 1.0]
    assert not failed


@pytest.mark.slow
def test_oracle_scores_one_on_the_first_test_tasks(tmp_path) -> None:
    """CI's share of the check below (tests/env/test_scoring.py replays a spread of every split)."""
    _oracle_evaluation(tmp_path, max_tasks=4)


@pytest.mark.full  # every test task of the three domains: ~50 s on two cores
def test_oracle_scores_one_on_every_test_task(tmp_path) -> None:
    _oracle_evaluation(tmp_path, max_tasks=None)


# ---- kill and resume ----------------------------------------------------------------------

AGENT_RULES = {"rules": [
    {"pattern": r"tool \w+ returned: [^\n]*\Z", "reply": "I looked it up. Your request is complete."},
    {"pattern": r"Airline Agent Policy(?!.*calls tool)",
     "reply": '<tool_call>{"name": "list_all_airports", "arguments": {}}</tool_call>'},
    {"pattern": r"^(?!.*calls tool)",
     "reply": '<tool_call>{"name": "list_all_product_types", "arguments": {}}</tool_call>'},
], "default": "Thank you. Your request is complete."}
USER_RULES = {"rules": [{"pattern": r"complete\.\s*\Z", "reply": "###STOP###"}],
              "default": "Hi, I need help with an item from my order."}


def _file_recipe(root: Path, run_dir: Path) -> Path:
    scripts = {}
    for name, rules in (("agent", AGENT_RULES), ("user", USER_RULES)):
        scripts[name] = root / f"{name}.yaml"
        scripts[name].write_text(yaml.safe_dump(rules))
    data = {"name": "resume", "run_dir": str(root),
            "models": {r: {"backend": "scripted", "script": str(p)} for r, p in scripts.items()},
            "env": {"max_steps": 10},
            "eval": {"methods": ["base"], "seeds": [0, 1], "domains": ["retail", "airline"],
                     "max_tasks": 2, "concurrency": 1}}
    return _write_recipe(root / "recipe.yaml", data)


def _cli(recipe_path: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "prour.cli.main", "eval", "--recipe", str(recipe_path),
            "--out", str(out), "--no-progress"]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _comparable(run: Path) -> tuple[dict, dict]:
    """Episodes and results by key without wall-clock fields."""
    episodes = {}
    for traj in read_trajectories(run / EPISODES_FILE, on_error="skip"):
        steps = [(s.kind, s.message_index, s.meta) for s in traj.steps]
        episodes[traj.key] = (traj.messages, steps, traj.reward, traj.termination)
    results = {}
    for line in read_jsonl(run / RESULTS_FILE):
        results[tuple(line["key"])] = {k: v for k, v in line.items()
                                       if k not in ("seconds", "episode_started_at")}
    return episodes, results


@pytest.mark.slow
def test_killed_evaluation_resumes_to_the_same_results(tmp_path) -> None:
    recipe_path = _file_recipe(tmp_path, tmp_path / "unused")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    process = subprocess.Popen(_cli(recipe_path, killed), env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(_lines(killed / EPISODES_FILE)) < 2 and time.monotonic() < deadline:
        assert process.poll() is None, "the evaluation ended before it could be killed"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = _lines(killed / EPISODES_FILE)
    assert 2 <= len(before) < 8 and not (killed / RESULTS_FILE).exists()

    subprocess.run(_cli(recipe_path, killed), env=env, cwd=REPO, check=True,
                   capture_output=True)
    after = _lines(killed / EPISODES_FILE)
    assert after[:len(before)] == before  # stored episodes were kept, not rerun
    stored = [t.key for t in read_trajectories(killed / EPISODES_FILE, on_error="skip")]
    assert len(stored) == len(set(stored)) == 8
    subprocess.run(_cli(recipe_path, clean), env=env, cwd=REPO, check=True, capture_output=True)
    assert _comparable(killed) == _comparable(clean)


# ---- checkpoints --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trainer_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """A checkpoint folder written by the local trainer's checkpoint code (step 3)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prour.train.checkpoint import save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = tmp_path_factory.mktemp("ckpt") / "policy"
    save_checkpoint(out, 3, model, tokenizer, {"step": 3})
    return out


def test_trainer_checkpoint_evaluates_via_the_cli(trainer_checkpoint, tmp_path) -> None:
    register_scripts()
    data = recipe(str(tmp_path), methods=["clarify-only"], domains=["retail"], tasks=["65"])
    data["train"] = {"rollout": {"max_response_tokens": 8, "enable_thinking": False}}
    del data["models"]["generator"]
    path = _write_recipe(tmp_path / "r.yaml", data)
    run = tmp_path / "run"
    _invoke("eval", "--recipe", str(path), "--checkpoint", str(trainer_checkpoint),
            "--out", str(run), "--no-progress")
    [line] = list(read_jsonl(run / RESULTS_FILE))
    assert line["model_calls"]["generator.chat"] >= 1 and not line["error"]
    [traj] = list(read_trajectories(run / EPISODES_FILE))
    first = next(s for s in traj.steps if s.meta.get("route"))
    assert first.meta["route"] == "clarify"
    assert first.meta["query"]["kind"] in ("ask", "none", "invalid")  # the tiny model's text
    recorded = yaml.safe_load((run / "recipe.resolved.yaml").read_text())
    assert recorded["models"]["generator"]["path"] == str((trainer_checkpoint / "step_3").resolve())


def test_checkpoint_layouts(trainer_checkpoint, tmp_path) -> None:
    step = trainer_checkpoint / "step_3"
    assert resolve_checkpoint(trainer_checkpoint) == step  # newest step_N of a trainer folder
    assert resolve_checkpoint(step) == step
    merged = tmp_path / "verl" / "global_step_7" / "actor" / "huggingface"
    merged.parent.mkdir(parents=True)
    merged.symlink_to(step, target_is_directory=True)
    assert resolve_checkpoint(tmp_path / "verl") == merged
    shards = tmp_path / "shards" / "global_step_1" / "actor"
    shards.mkdir(parents=True)
    (shards / "model_world_size_2_rank_0.pt").write_bytes(b"")
    hint = (f"export them with `prour train export --recipe RECIPE --step 1` (the recipe that "
            f"trained them; it writes {tmp_path / 'shards' / 'step_1'})")
    with pytest.raises(ValueError, match=re.escape(hint)):
        resolve_checkpoint(tmp_path / "shards")
    exported = tmp_path / "shards" / "step_1"  # where `prour train export` writes
    exported.symlink_to(step, target_is_directory=True)
    assert resolve_checkpoint(tmp_path / "shards") == exported
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is not a checkpoint"):
        resolve_checkpoint(empty)
    (empty / "config.json").write_text("{}")
    (empty / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no tokenizer"):
        resolve_checkpoint(empty)


# ---- configuration errors -----------------------------------------------------------------


def test_unknown_method_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="Did you mean 'prour'") as info:
        EvalConfig(methods=["prourr"])
    assert all(name in str(info.value) for name in METHODS)


def test_rerun_with_other_settings_is_refused(tmp_path) -> None:
    def evaluation(temperature: float) -> Evaluation:
        cfg = EvalConfig(methods=["oracle"], seeds=[0])
        recipe = Recipe(name="x", env={"agent_temperature": temperature}, eval=cfg)
        return Evaluation(recipe, tmp_path, progress=False)

    evaluation(0.01).check_run_dir()
    evaluation(0.01).check_run_dir()
    with pytest.raises(ValueError, match="env.agent_temperature"):
        evaluation(0.5).check_run_dir()


def test_a_run_folder_of_the_old_path_base_still_resumes(tmp_path, monkeypatch) -> None:
    """Older prour stored router.calibration.* as written, relative to the working directory."""
    from prour.eval.run_record import RUN_FILE

    monkeypatch.chdir(tmp_path)
    router = {"calibration": {"dev_states": "calibration/dev.jsonl"}}
    cfg = EvalConfig(methods=["oracle"], seeds=[0])
    evaluation = Evaluation(Recipe(name="x", run_dir=".", router=router, eval=cfg), tmp_path / "ev",
                            progress=False)
    evaluation.check_run_dir()
    record = json.loads((tmp_path / "ev" / RUN_FILE).read_text())
    assert record["settings"]["router"]["calibration"]["dev_states"] == str(
        tmp_path / "calibration" / "dev.jsonl")
    record["settings"]["router"]["calibration"]["dev_states"] = "calibration/dev.jsonl"
    (tmp_path / "ev" / RUN_FILE).write_text(json.dumps(record))
    evaluation.check_run_dir()  # the same file, named the old way
    record["settings"]["router"]["calibration"]["dev_states"] = "elsewhere/dev.jsonl"
    (tmp_path / "ev" / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(ValueError, match="router.calibration.dev_states"):
        evaluation.check_run_dir()


def test_missing_model_role_is_reported_before_any_episode(tmp_path) -> None:
    cfg = EvalConfig(methods=["prour"], seeds=[0])
    router = RouterConfig(tau_au=0.2, tau_eu=0.2)
    with pytest.raises(ValueError, match=r"models\.agent"):
        Evaluation(Recipe(name="x", eval=cfg, router=router), tmp_path, progress=False).run()
    assert not (tmp_path / EPISODES_FILE).exists()


# ---- one writer per run folder --------------------------------------------------------------


def test_a_second_evaluation_refuses_then_a_rerun_takes_over_the_dead_ones_lock(tmp_path) -> None:
    """A paused first eval holds the run folder; after its kill -9 a rerun takes the lock over
    and runs only the missing episodes."""
    from prour.runlock import LOCK_FILE

    recipe_path = _file_recipe(tmp_path, tmp_path / "unused")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = tmp_path / "run"
    first = subprocess.Popen(_cli(recipe_path, run), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not _lines(run / EPISODES_FILE) and time.monotonic() < deadline:
        assert first.poll() is None, "the evaluation ended before it could be paused"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)  # alive and holding the folder, writing nothing more
    try:
        second = subprocess.run(_cli(recipe_path, run), env=env, cwd=REPO, check=False,
                                capture_output=True, text=True, timeout=300)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert second.returncode == 2, second.stderr
    refusal = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(refusal) == 1 and f"pid {first.pid} " in refusal[0], second.stderr
    assert f"prour eval --recipe {recipe_path} --out {run}" in refusal[0]
    before = _lines(run / EPISODES_FILE)
    assert 1 <= len(before) < 8 and (run / LOCK_FILE).exists()

    rerun = subprocess.run(_cli(recipe_path, run), env=env, cwd=REPO, check=False,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"taking over the lock of {run} from a dead process (pid {first.pid} " in rerun.stderr
    after = _lines(run / EPISODES_FILE)
    assert after[:len(before)] == before  # the dead run's episodes were kept, not rerun
    keys = [tuple(line["key"]) for line in read_jsonl(run / RESULTS_FILE)]
    assert len(keys) == len(set(keys)) == 8
    assert not (run / LOCK_FILE).exists()
