"""``prour calibrate states``: decision states sampled from collected trajectories, in the JSONL
that ``prour calibrate`` labels and measures (paper A.2.2)."""

from __future__ import annotations

import json
from pathlib import Path

import data_scripts as scripts
import pytest
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.domains import get_task
from prour.llm.scripted import register_script

AGENT_SEES = ("agent_message", "agent_tool_call", "agent_note", "user_message")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    """Scripted agent/user/teacher (the data tests' world), annotator and decomposer; three
    collected retail trajectories."""
    folder = tmp_path_factory.mktemp("calstates")
    files = scripts.write_script_files(folder / "scripts")
    register_script("calstates-decomposer", scripts.decomposer_llm)
    annotator = folder / "annotator.yaml"
    annotator.write_text(yaml.safe_dump({"rules": [
        {"pattern": "(?i)which order", "reply": "aleatoric"}], "default": "no_uncertainty"}))
    models = {role: {"backend": "scripted", "script": str(files[role])}
              for role in ("agent", "user", "teacher")}
    models["annotator"] = {"backend": "scripted", "script": str(annotator)}
    models["decomposer"] = {"backend": "scripted", "script": "calstates-decomposer"}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "calstates", "seed": 3, "run_dir": str(folder / "run"), "models": models,
        "env": {"max_steps": 12},
        "data": {"num_trajectories": 3, "trial_seeds": [0], "max_tasks": 3, "concurrency": 2},
        "router": {"calibration": {"dev_states": str(folder / "cal" / "dev_states.jsonl")}},
        # these tests sample states of the training trajectories on purpose (the reserve's
        # test sets data.calibration_reserve): the protocol guard warns instead of refusing
        "protocol": {"on_breach": "warn"},
    }))
    result = invoke("collect", "--recipe", str(path), "--no-progress")
    assert result.exit_code == 0, result.output
    return path


def trajectories_of(recipe: Path) -> Path:
    return recipe.parent / "run" / "data" / "trajectories.jsonl"


def expected_prefixes(trajectories: Path) -> dict[str, list[dict]]:
    """Independently: per agent decision, the non-system messages before it that the agent
    could see (its own turns, user text, results of its own tool calls)."""
    out = {}
    for line in trajectories.read_text().splitlines():
        traj = json.loads(line)
        tid = f"{traj['domain']}/{traj['task_id']}/s{traj['seed']}/{traj['agent']}"
        steps = {s["message_index"]: s for s in traj["steps"]}
        decisions = [s for s in traj["steps"]
                     if s["kind"] in ("agent_message", "agent_tool_call") and not s["initial"]
                     and not s["meta"].get("greeting") and "teacher_query" not in s["meta"]]
        for t, decision in enumerate(decisions):
            seen = []
            for i, message in enumerate(traj["messages"][: decision["message_index"]]):
                step = steps.get(i)
                if step is None:
                    visible = message["role"] != "system"
                elif step["kind"] == "tool_result":
                    visible = (step["requestor"] or "assistant") == "assistant"
                else:
                    visible = step["kind"] in AGENT_SEES
                if visible:
                    seen.append(message)
            out[f"{tid}#{t}"] = seen
    return out


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_states_are_the_agents_view_spread_and_reproducible(recipe: Path, tmp_path: Path) -> None:
    source = trajectories_of(recipe)
    expected = expected_prefixes(source)
    n = len(expected) - 1
    assert n >= 4, expected.keys()
    result = invoke("calibrate", "states", "--recipe", str(recipe), "--split", "dev",
                    "--from", str(source), "--n", str(n))
    assert result.exit_code == 0, result.output
    out = recipe.parent / "cal" / "dev_states.jsonl"
    states = read(out)
    assert len(states) == n and len({s["id"] for s in states}) == n
    assert f"{n} dev candidate decision states from 3 trajectories" in result.output
    for state in states:
        assert state["messages"] == expected[state["id"]], state["id"]
        assert state["id"] == f"{state['trajectory_id']}#{state['step']}"
        assert state["source"] == str(source) and state["domain"] == "retail"
        instructions = get_task("retail", state["task_id"]).user_scenario.instructions
        text = json.dumps(state["messages"])
        assert instructions.reason_for_call not in text
        assert all(m["role"] != "system" for m in state["messages"])
    # Same seed, same bytes; another seed, another sample of the same states.
    again = tmp_path / "again.jsonl"
    assert invoke("calibrate", "states", "--recipe", str(recipe), "--split", "dev", "--from",
                  str(source), "--n", str(n), "--out", str(again)).exit_code == 0
    assert again.read_bytes() == out.read_bytes()
    other = tmp_path / "other.jsonl"
    draws = set()
    for seed in range(6):
        invoke("calibrate", "states", "--recipe", str(recipe), "--split", "dev", "--from",
               str(source), "--n", str(n), "--out", str(other), "--seed", str(seed))
        draws.add(frozenset(s["id"] for s in read(other)))
    assert len(draws) > 1


def test_too_few_states_or_missing_file_is_refused(recipe: Path, tmp_path: Path) -> None:
    source = trajectories_of(recipe)
    total = len(expected_prefixes(source))
    out = tmp_path / "none.jsonl"
    result = invoke("calibrate", "states", "--recipe", str(recipe), "--split", "test",
                    "--from", str(source), "--n", str(total + 1), "--out", str(out))
    assert result.exit_code == 2 and not out.exists()
    assert f"hold {total} decision states" in result.output
    assert f"pass --n {total}" in result.output
    result = invoke("calibrate", "states", "--recipe", str(recipe), "--split", "test",
                    "--from", str(tmp_path / "missing.jsonl"), "--n", "1", "--out", str(out))
    assert result.exit_code == 2 and "trajectories file not found" in result.output
    result = invoke("calibrate", "states", "--recipe", str(recipe), "--split", "test",
                    "--from", str(source), "--n", "1")
    assert result.exit_code == 2 and "router.calibration.test_states is not set" in result.output


def test_calibrate_labels_and_measures_the_sampled_states(recipe: Path) -> None:
    source = trajectories_of(recipe)
    out = recipe.parent / "cal" / "dev_states.jsonl"
    expected = expected_prefixes(source)
    invoke("calibrate", "states", "--recipe", str(recipe), "--split", "dev", "--from",
           str(source), "--n", str(len(expected)))
    ids = [s["id"] for s in read(out)]
    result = invoke("calibrate", "--recipe", str(recipe), "--stage", "label")
    assert result.exit_code == 0, result.output
    labels = read(recipe.parent / "run" / "calibration" / "labels_dev.jsonl")
    assert sorted(r["state_id"] for r in labels) == sorted(ids)
    by_id = {r["state_id"]: r["label"] for r in labels}
    assert set(by_id.values()) == {"clarify", "act"}  # the teacher's question reached some states
    for state_id in ids:
        asked = any(scripts.QUESTION in (m.get("content") or "") for m in expected[state_id])
        assert by_id[state_id] == ("clarify" if asked else "act"), state_id
    from prour.build import Builder
    from prour.recipes import load_recipe
    from prour.router.pipeline import cache_path, measure_split

    builder = Builder(load_recipe(str(recipe), endpoints=True))
    try:
        assert measure_split(builder, "dev") == len(ids)
    finally:
        builder.close()
    assert sorted(r["state_id"] for r in read(cache_path(builder.recipe, "dev"))) == sorted(ids)


def test_preflight_names_the_command_that_collects_the_missing_source_and_it_runs(
    recipe: Path,
) -> None:
    """Held-out states not sampled yet, and no airline trajectories to sample them from: the
    calibrate stage's preflight names the airline collection, with the recipe and its --set
    items, and that command runs as printed (then the problem is gone)."""
    import shlex

    from prour.preflight import check_paths
    from prour.recipes import load_recipe

    missing = f"router.calibration.test_states={recipe.parent}/no.jsonl"
    loaded = load_recipe(str(recipe), [missing, "router.calibration.test_episodes=1"],
                         endpoints=True)
    [problem] = [p for p in check_paths(loaded, "calibrate") if "airline" in p.message]
    command = problem.message.split("run `")[1].split("` first")[0]
    assert command.startswith(f"prour collect --recipe {recipe} --set {missing} ")
    assert "--set data.domain=airline" in command and "data.num_trajectories=1" in command
    result = invoke(*shlex.split(command)[1:], "--no-progress")
    assert result.exit_code == 0, result.output
    airline = recipe.parent / "run" / "data" / "airline_trajectories.jsonl"
    assert [json.loads(x)["domain"] for x in airline.read_text().splitlines()] == ["airline"]
    assert [p for p in check_paths(loaded, "calibrate") if "airline" in p.message] == []


def test_a_torn_last_line_follows_data_on_bad_line(recipe: Path, tmp_path: Path) -> None:
    """A crash's torn last line: refused by default naming the file and line, skipped with
    data.on_bad_line=skip (the recipe key or --on-bad-line), the other states sampled as before."""
    source = trajectories_of(recipe)
    torn = tmp_path / "torn.jsonl"
    lines = source.read_text().splitlines()
    torn.write_text("\n".join(lines) + "\n" + lines[0][: len(lines[0]) // 2])
    n = len(expected_prefixes(source))
    args = ["calibrate", "states", "--recipe", str(recipe), "--split", "dev", "--n", str(n)]
    refused = invoke(*args, "--from", str(torn), "--out", str(tmp_path / "a.jsonl"))
    assert refused.exit_code == 2 and f"{torn}:{len(lines) + 1}" in refused.output
    clean = tmp_path / "clean.jsonl"
    assert invoke(*args, "--from", str(source), "--out", str(clean)).exit_code == 0
    for how in (["--set", "data.on_bad_line=skip"], ["--on-bad-line", "skip"]):
        out = tmp_path / f"skip{len(how[1])}.jsonl"
        result = invoke(*args, "--from", str(torn), "--out", str(out), *how)
        assert result.exit_code == 0, result.output
        assert [(s["id"], s["messages"]) for s in read(out)] == \
            [(s["id"], s["messages"]) for s in read(clean)]


def test_dev_states_come_only_from_the_reserves_trajectories(recipe: Path, tmp_path: Path) -> None:
    """With a calibration reserve, the dev candidates are the decision states of trajectories of
    reserve tasks (collected with data.tasks=reserve): every one of them, ids within
    reserve_task_ids; trajectories of training tasks are refused, naming them and the fix."""
    from prour.data.reserve import reserve_task_ids, training_task_ids
    from prour.recipes import load_recipe

    reserve = ["--set", "data.calibration_reserve=2"]
    dev = tmp_path / "dev_trajectories.jsonl"
    result = invoke("collect", "--recipe", str(recipe), *reserve, "--set", "data.tasks=reserve",
                    "--set", f"data.trajectories={dev}", "--set", "data.num_trajectories=2",
                    "--no-progress")
    assert result.exit_code == 0, result.output
    cfg = load_recipe(str(recipe), reserve[1:]).data
    reserved = set(reserve_task_ids(cfg))
    assert len(reserved) == 2 and not reserved & set(training_task_ids(cfg))
    out = tmp_path / "dev_states.jsonl"
    result = invoke("calibrate", "states", "--recipe", str(recipe), *reserve, "--split", "dev",
                    "--from", str(dev), "--out", str(out))
    assert result.exit_code == 0, result.output
    states = read(out)
    assert {s["task_id"] for s in states} == reserved  # both reserve tasks, nothing else
    assert sorted(s["id"] for s in states) == sorted(expected_prefixes(dev))  # every state

    training = trajectories_of(recipe)  # the fixture's: training tasks (no reserve then)
    foreign = [json.loads(x)["task_id"] for x in training.read_text().splitlines()]
    outside = [t for t in foreign if t not in reserved]
    assert outside
    refused = invoke("calibrate", "states", "--recipe", str(recipe), *reserve, "--split", "dev",
                     "--from", str(training), "--out", str(tmp_path / "no.jsonl"))
    assert refused.exit_code == 2 and not (tmp_path / "no.jsonl").exists()
    text = " ".join(refused.output.split())
    assert f"{len(outside)} of {len(foreign)} trajectories are not of the 2 calibration-reserve" \
        in text and "data.tasks=reserve" in text
