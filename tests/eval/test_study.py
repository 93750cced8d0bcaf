"""The study (prour.config.study, prour.eval.study): axes, grids and cells, the episodes each
grid plans (a shared episode once), serving groups, endpoint keys, and a whole study run with
scripted models through one queue, then its judge pass.

Scripted world (tests/eval/eval_world.py): the agent looks a value up, asks one discretionary
question and closes; retail 65 and airline 26 score 1 whatever is asked, so the numbers checked
here are counts the test derives from the plan and the script.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eval_world import CLOSING, JUDGED_EFFORT, JUDGEMENT, recipe, register_scripts

from prour.config import ConfigError, parse_recipe
from prour.config.attention import variant_of
from prour.llm.scripted import ScriptedLLM, register_script

POLICIES = ["no-ask", "unrestricted", "budgeted@1", "budgeted+mgr@1", "voi-gate(c=0.5)"]


def quiet_agent() -> ScriptedLLM:
    """A second backbone: closes at once, never asks."""
    return ScriptedLLM(rules=[(r".", CLOSING)])


@pytest.fixture(autouse=True)
def scripts() -> None:
    register_scripts()
    register_script("study-quiet", quiet_agent)


def study_recipe(tmp_path: Path, **study: Any) -> dict[str, Any]:
    data = recipe(str(tmp_path / "run"), attention={"policy": "unrestricted"},
                  classifier="judge", judge=False)
    data["eval"]["tasks"] = ["retail:65", "airline:26"]
    data["eval"]["split"] = "base"
    data["study"] = {
        "standalone": True,
        "axes": {"backbone": {
            "asker": {"paper": "GPT-4.1",
                      "set": {"models": {"agent": {"backend": "scripted",
                                                   "script": "eval-agent"}}}},
            "quiet": {"set": {"models": {"agent": {"backend": "scripted",
                                                   "script": "study-quiet"}}}}},
            "simulator": {"original": {"set": {"env": {"user_regime": "standard"}}},
                          "guarded": {"set": {"env": {"user_regime": "guarded"}}}}},
        "grids": {"main": {"policies": POLICIES, "axes": {"simulator": ["original"]}},
                  "table25": {"policies": ["unrestricted", "budgeted@1"],
                              "axes": {"backbone": ["asker"]}, "tasks": ["retail:65"]}},
        **study}
    return data


# ---- variants and the section ------------------------------------------------------------------


def test_variant_labels_are_canonical_and_carry_their_options() -> None:
    assert variant_of("voi-gate(c=0.50)").label == "voi-gate(c=0.5)"
    assert variant_of(" voi-gate@1( c = 0.27 ) ").label == "voi-gate@1(c=0.27)"
    wide = variant_of("budgeted+review@2(evidence=9072)")
    assert wide.settings() == {"policy": "budgeted+review", "budget": 2,
                               "evidence_window_tokens": 9072}
    assert variant_of("voi-gate-as-run(c=0.27)").settings()["voi_threshold"] == 0.27
    for bad, says in (("budgeted(c=0.5)", "VoI threshold"), ("voi-gate(k=1)", "key of c"),
                      ("budgeted@two", "integer"), ("voi-gate(c=2)", "[0, 1]"),
                      ("nothing", "attention policy")):
        with pytest.raises(ValueError, match=says):
            variant_of(bad)


def test_a_bad_study_section_names_its_key(tmp_path: Path) -> None:
    data = study_recipe(tmp_path)
    data["study"]["grids"]["main"]["axes"] = {"backbone": ["nobody"]}
    with pytest.raises(ConfigError, match="study.*grids.main.axes.backbone.*nobody"):
        parse_recipe(data)
    data = study_recipe(tmp_path)
    data["study"]["axes"]["backbone"]["quiet"]["set"]["models"]["agent"] = {"backend": "openai"}
    with pytest.raises(ConfigError, match=r"study\.axes\.backbone\.quiet\.set\.models\.agent"):
        parse_recipe(data)
    data = study_recipe(tmp_path)
    data["study"]["axes"]["backbone"]["quiet"]["set"]["train"] = {}
    with pytest.raises(ConfigError, match="may set models, router, env, serve"):
        parse_recipe(data)


def test_replace_tag_replaces_a_mapping_of_the_extended_recipe(tmp_path: Path) -> None:
    from prour.recipes import load_recipe

    base = tmp_path / "base.yaml"
    base.write_text(json.dumps(study_recipe(tmp_path)))
    over = tmp_path / "over.yaml"
    over.write_text("extends: base.yaml\nstudy:\n  axes:\n    backbone: !replace\n"
                    "      solo: {set: {models: {agent: {backend: scripted, script: eval-agent}}}}\n"
                    "  grids:\n    table25: {axes: {backbone: [solo]}}\n")
    loaded = load_recipe(over)
    assert list(loaded.study.axes["backbone"]) == ["solo"]
    assert list(loaded.study.axes["simulator"]) == ["original", "guarded"]  # merged as before


# ---- cells, plans, keys -----------------------------------------------------------------------


def test_each_episode_several_grids_plan_runs_once(tmp_path: Path) -> None:
    from prour.eval.study import agent_key, grid_cells, grid_plan, planned_count, study_plan

    loaded = parse_recipe(study_recipe(tmp_path))
    assert [c.label for c in grid_cells(loaded.study, "main")] == [
        "backbone=asker simulator=original", "backbone=quiet simulator=original"]
    assert len(grid_cells(loaded.study, "table25")) == 2  # asker under both regimes
    main = sum(map(len, grid_plan(loaded, "main").values()))
    table25 = sum(map(len, grid_plan(loaded, "table25").values()))
    assert main == 2 * len(POLICIES) * 2  # cells x variants x tasks (one seed)
    assert table25 == 2 * 2 * 1
    shared = 2  # asker/original x {unrestricted, budgeted@1} on retail 65: main plans them too
    assert planned_count(loaded) == main + table25 - shared
    keys = {agent_key(p, cell) for cell, planned in study_plan(loaded).items() for p in planned}
    assert "base/budgeted+mgr@1 <backbone=asker simulator=original>" in keys
    assert "base/voi-gate(c=0.5) <backbone=quiet simulator=original>" in keys


def test_cell_recipes_lay_each_value_over_the_recipe(tmp_path: Path) -> None:
    from prour.eval.study import Cell, cell_recipe

    loaded = parse_recipe(study_recipe(tmp_path))
    cell = Cell((("backbone", "quiet"), ("simulator", "guarded")))
    made = cell_recipe(loaded, cell)
    assert made.models["agent"].script == "study-quiet"
    assert made.models["user"].script == "eval-user"  # untouched roles stay
    assert made.env.user_regime == "guarded" and made.env.max_steps == loaded.env.max_steps
    assert made.eval.judge is False  # the judge pass is a step of its own


# ---- endpoints and serving groups -------------------------------------------------------------


def _endpoint(model: str, key: str) -> dict[str, Any]:
    return {"backend": "openai", "model": model, "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": key}


def test_an_endpoint_without_its_key_is_named_or_skipped(tmp_path: Path, monkeypatch) -> None:
    from prour.cluster.study import runnable_cells
    from prour.eval.study import StudyError

    monkeypatch.delenv("PROUR_TEST_KEY", raising=False)
    data = study_recipe(tmp_path)
    data["study"]["axes"]["backbone"]["api"] = {
        "set": {"models": {"agent": _endpoint("api-model", "PROUR_TEST_KEY")}}}
    with pytest.raises(StudyError, match=r"backbone=api \(models.agent\).*\$PROUR_TEST_KEY"):
        runnable_cells(parse_recipe(data), print)
    data["study"]["missing_key"] = "skip"
    said: list[str] = []
    cells = runnable_cells(parse_recipe(data), said.append)
    assert all(cell.axes["backbone"] != "api" for cell in cells)
    assert len(said) == 1 and "skipping backbone=api" in said[0]
    monkeypatch.setenv("PROUR_TEST_KEY", "secret")
    assert any(cell.axes["backbone"] == "api" for cell in runnable_cells(parse_recipe(data),
                                                                          said.append))


def test_backbones_that_do_not_fit_together_are_served_one_after_another(tmp_path: Path) -> None:
    from prour.cluster.study_servers import serving_groups
    from prour.eval.study import cell_recipe, cell_roles, study_plan

    data = study_recipe(tmp_path)
    served = {"big-a": {"gpus": [0, 1], "gpu_memory_utilization": 0.9},
              "big-b": {"gpus": [0, 1], "gpu_memory_utilization": 0.9},
              "small": {"gpus": [0], "gpu_memory_utilization": 0.05}}
    data["serve"] = {"gpu_memory_gib": 80, "models": served}
    data["study"]["axes"]["backbone"] = {
        name: {"set": {"models": {"agent": {"backend": "openai", "model": name}}}}
        for name in ("big-a", "small", "big-b")}
    data["study"]["axes"]["backbone"]["api"] = {
        "set": {"models": {"agent": _endpoint("api-model", "OPENAI_API_KEY")}}}
    data["study"]["grids"] = {"main": {"policies": ["no-ask"],
                                       "axes": {"simulator": ["original"]}}}
    loaded = parse_recipe(data)
    plan = study_plan(loaded)
    recipes = {cell: cell_recipe(loaded, cell) for cell in plan}
    roles = {cell: cell_roles(recipes[cell], plan[cell]) for cell in plan}
    groups = serving_groups(loaded, recipes, roles)
    names = [[cell.axes["backbone"] for cell in group.cells] for group in groups]
    # big-a and small share the node; big-b does not fit beside them; the endpoint needs no server
    assert names == [["big-a", "small"], ["big-b", "api"]]
    assert [sorted(group.servers) for group in groups] == [["big-a", "small"], ["big-b"]]


# ---- a whole study, scripted ---------------------------------------------------------------------


def test_a_study_runs_every_cell_through_one_queue_and_resumes(tmp_path: Path) -> None:
    from prour.cluster.study import run_study
    from prour.eval.harness import load_result_lines
    from prour.eval.study import grid_lines, planned_count, study_dir

    data = study_recipe(tmp_path)
    data["study"]["grids"]["main"]["tasks"] = ["retail:65"]  # one task keeps the test short
    loaded = parse_recipe(data)
    said: list[str] = []
    results = run_study(loaded, progress=False, say=said.append)
    folder = study_dir(loaded)
    lines = load_result_lines(folder / "results.jsonl")
    assert len(results) == len(lines) == planned_count(loaded)
    for line in lines.values():
        assert set(line["axes"]) == {"backbone", "simulator"}
        assert line["variant"] == variant_of(line["variant"]).label
        assert line["error"] is False
        asked = sum(r["discretionary"] for r in line["attention"]["requests"])
        if line["axes"]["backbone"] == "quiet" or line["variant"] == "no-ask":
            assert asked == 0
        elif line["variant"] in ("unrestricted", "budgeted@1", "budgeted+mgr@1"):
            assert asked == 1  # the script's one question, within every budget here
        assert not line["attention"]["judged"]  # the judge pass has not run
    by_grid = grid_lines(loaded)
    assert len(by_grid["main"]) == 2 * len(POLICIES) and len(by_grid["table25"]) == 4
    guarded = [x for x in by_grid["table25"] if x["axes"]["simulator"] == "guarded"]
    assert len(guarded) == 2
    provenance = json.loads((folder / "provenance.json").read_text())
    assert provenance["study"]["planned"] == planned_count(loaded)
    again = run_study(loaded, progress=False, say=said.append)  # nothing missing: nothing runs
    assert len(again) == len(results)
    assert sum(1 for _ in (folder / "episodes.jsonl").open()) == planned_count(loaded)


def test_the_judge_pass_scores_every_request_once_and_names_a_failing_judge(
    tmp_path: Path,
) -> None:
    from prour.cluster.study import run_study
    from prour.eval.harness import load_result_lines
    from prour.eval.study import study_dir
    from prour.eval.study_judge import JudgeFailed, judge_done, judge_study

    data = study_recipe(tmp_path)
    data["study"]["grids"] = {"main": {"policies": ["unrestricted", "budgeted@1"],
                                       "axes": {"simulator": ["original"]}}}
    register_script("study-broken-judge", lambda: ScriptedLLM(rules=[
        (r"\[Message to label\]", '{"label": "discretionary", "atomic_questions": 1}'),
        (r"\[Request to judge\]", "not json")]))
    broken = json.loads(json.dumps(data))
    broken["models"]["judge"] = {"backend": "scripted", "script": "study-broken-judge"}
    loaded = parse_recipe(broken)
    run_study(loaded, progress=False, say=lambda _: None)
    with pytest.raises(JudgeFailed, match=r"models.judge \(scripted\) left \d+ of \d+ request"):
        judge_study(loaded, say=lambda _: None)
    assert not judge_done(loaded)
    # the working judge: a rerun scores what the broken one left; every request judged once more
    loaded = parse_recipe(data)
    judge_study(loaded, say=lambda _: None)
    assert judge_done(loaded)
    lines = load_result_lines(study_dir(loaded) / "results.jsonl")
    asked = [r for line in lines.values() for r in line["attention"]["requests"]]
    assert asked and all(r["reading_effort"] == JUDGED_EFFORT for r in asked)
    assert all(r["value"] == JUDGEMENT["value"] for r in asked)
    for line in lines.values():
        block = line["attention"]
        assert block["judged"] and block["judge_failures"] == 0
        assert block["cost"] == pytest.approx(
            sum(1 + JUDGED_EFFORT / 20 + (1 - JUDGEMENT["value"] / 10)
                for r in block["requests"] if r["discretionary"]))
    before = (study_dir(loaded) / "results.jsonl").read_text()
    judge_study(loaded, say=lambda _: None)  # nothing left to judge: nothing appended
    assert (study_dir(loaded) / "results.jsonl").read_text() == before


def test_a_backbone_that_is_down_is_named_in_one_line_and_nothing_runs(tmp_path: Path) -> None:
    """The installed `prour study run` on a study whose backbone's endpoint does not answer:
    exit 2, one line naming the backbone, its role and the URL, no traceback, no episode."""
    import subprocess
    import sys

    rules = tmp_path / "quiet.yaml"
    rules.write_text(json.dumps({"default": CLOSING}))
    scripted = {"backend": "scripted", "script": str(rules)}
    data = study_recipe(tmp_path)
    data["models"] = {role: scripted for role in ("agent", "user", "judge")}
    data["study"]["axes"]["backbone"] = {
        "down": {"set": {"models": {"agent": {"backend": "openai", "model": "m",
                                              "base_url": "http://127.0.0.1:9/v1",
                                              "max_retries": 0, "timeout_s": 2}}}},
        "local": {"set": {"models": {"agent": scripted}}}}
    data["study"]["grids"] = {"main": {"policies": ["no-ask"],
                                       "axes": {"simulator": ["original"]}}}
    path = tmp_path / "down.yaml"
    path.write_text(json.dumps(data))
    prour = Path(sys.executable).with_name("prour")
    done = subprocess.run([str(prour), "study", "run", "--recipe", str(path), "--no-progress"],
                          capture_output=True, text=True, timeout=300, check=False,
                          cwd=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert "backbone=down simulator=original (models.agent, m)" in errors[0]
    assert "http://127.0.0.1:9/v1/models is unreachable" in errors[0]
    assert not (tmp_path / "run" / "study" / "episodes.jsonl").exists()


def test_a_cell_two_grids_run_on_different_task_sets_keeps_both_episodes(tmp_path: Path) -> None:
    """recipes/paper.yaml: Tables 2 and 3 run the trained generator with the Qwen3-8B agent on
    tau2's base tasks, Table 4 the same cell on τ³-bench's, whose task ids name other tasks
    (revised ones): each is an episode of its own key, and the base grid's lines are base's."""
    from prour.eval.study import episode_key, grid_plan, planned_count, study_plan
    from prour.recipes import load_recipe

    paper = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml",
                        [f"run_dir={tmp_path}"])
    cell = next(c for c in grid_plan(paper, "table4")
                if dict(c.values) == {"generator": "trained", "agent": "qwen3-8b"})
    base = {p for p in grid_plan(paper, "table2")[cell] if p.domain == "retail"}
    tau3 = {p for p in grid_plan(paper, "table4")[cell]
            if p.domain == "retail" and p.method == "prour"}
    both = {(p.task_id, p.seed) for p in base} & {(p.task_id, p.seed) for p in tau3}
    assert both  # the same ids, two task sets
    keys = {episode_key(p, cell): p.split for p in base | tau3}
    assert len(keys) == len(base) + len(tau3)
    assert {split for split in keys.values()} == {"base", "tau3"}
    assert all("[split tau3]" in k for k, split in keys.items() if split == "tau3")
    assert not any("[split" in k for k, split in keys.items() if split == "base")
    assert planned_count(paper) == len({episode_key(p, c) for c, planned in
                                        study_plan(paper).items() for p in planned})
