"""collect → normalize → extract on real tau2 retail train tasks with scripted models and the tiny
policy tokenizer; the ground-truth firewall with canaries planted in a copied task."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import data_scripts as scripts
import pytest

from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.config.router import RouterConfig
from prour.data.collect import (
    EpisodeFactories,
    collect_trajectories,
    load_trajectories,
    teacher_exchanges,
)
from prour.data.dataset import check_dataset, load_split, read_rows, split_path
from prour.data.decisions import DecisionCache, decomposer_fingerprint
from prour.data.extract import (
    Router,
    decision_states,
    extract_instances,
    target_of,
    write_dataset,
)
from prour.data.normalize import load_goals, normalize_tasks
from prour.data.truncate import PolicyTokens
from prour.env.agents import LLMAgent
from prour.env.domains import load_tasks
from prour.env.environment import tool_schemas
from prour.env.prompts import greeting
from prour.env.users import LLMUser
from prour.eval.protocol import protocol_findings, shared_tasks
from prour.llm.scripted import ScriptedLLM, render_prompt
from prour.recipes import load_recipe
from prour.router.decomposer import Decomposer

CANARY_INSTRUCTION = "CANARY-INSTR-7731"
CANARY_GOAL = "CANARY-GOAL-5520"
CANARY_ACTION = "CANARY-ACT-9040"
BUDGET = 600  # tiny tokenizer: the clarify prompts (~616 tokens) need truncating, verify ones not


def canary_task():
    """A copy of retail train task 0 with canaries in its instruction and a reference action."""
    from tau2.data_model.tasks import Action

    task = load_tasks("retail", "train")[0]
    task.user_scenario.instructions.reason_for_call += f" Your loyalty code is {CANARY_INSTRUCTION}."
    task.evaluation_criteria.actions.append(
        Action(action_id="canary", name="get_order_details",
               arguments={"order_id": f"#{CANARY_ACTION}"}))
    return task

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"


@dataclass
class Run:
    folder: Path
    cfg: DataConfig
    models: dict[str, ScriptedLLM]
    router: Router
    tokens: PolicyTokens
    summary: dict


def make_router(llm: ScriptedLLM, thresholds=scripts.THRESHOLDS) -> Router:
    config = RouterConfig()
    return Router(lambda d: Decomposer(llm, tool_schemas(d), config, thresholds=thresholds),
                  "scripted:decomposer", decomposer_fingerprint(config), thresholds)


def extract(run: Run, cfg: DataConfig, router: Router, out: str) -> dict:
    trajectories = load_trajectories(run.folder / "traj.jsonl", "error")
    goals = load_goals(run.folder / "goals.jsonl", "error")
    cache = DecisionCache(run.folder / "decisions.jsonl", "error")
    instances, summary = extract_instances(trajectories, goals, router, cache, run.tokens, cfg,
                                           progress=False)
    write_dataset(instances, summary, run.folder / out, {})
    return summary.to_dict({})


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir) -> Run:
    folder = tmp_path_factory.mktemp("pipeline")
    cfg = DataConfig(num_trajectories=4, trial_seeds=[0, 1], concurrency=2, val_ratio=0.25,
                     max_prompt_tokens=BUDGET)
    tasks = [canary_task(), load_tasks("retail", "train")[1]]
    models = {"agent": scripts.agent_llm(), "user": scripts.user_llm(),
              "teacher": scripts.teacher_llm(), "decomposer": scripts.decomposer_llm()}
    factories = EpisodeFactories(lambda: LLMAgent(models["agent"], EnvConfig()),
                                 lambda: LLMUser(models["user"], EnvConfig()), models["teacher"], cfg)
    collect_trajectories(tasks, factories, cfg, folder / "traj.jsonl", progress=False,
                         limits=EnvConfig())

    def goal_with_canary(messages):
        text = scripts.normalizer_llm()._reply(messages, render_prompt(messages))
        return text + (f" {CANARY_GOAL}" if CANARY_INSTRUCTION in text else "")

    normalize_tasks(tasks, "retail", ScriptedLLM([(r"Rewritten:", goal_with_canary)]),
                    folder / "goals.jsonl", "scripted:normalizer", cfg)
    run = Run(folder, cfg, models, make_router(models["decomposer"]),
              PolicyTokens(tiny_model_dir), {})
    run.summary = extract(run, cfg, run.router, "dataset")
    return run


def all_rows(folder: Path) -> list[dict]:
    return [row for split in ("train", "validation") for row in read_rows(split_path(folder, split))]


def test_splits_are_valid_non_empty_and_disjoint(run: Run) -> None:
    data = run.folder / "dataset"
    assert check_dataset(data) == []
    train, val = (load_split(split_path(data, s)) for s in ("train", "validation"))
    assert len(train) > 0 and len(val) > 0
    ids = [{r["extra_info"]["trajectory_id"] for r in split} for split in (train, val)]
    assert not ids[0] & ids[1]
    # split_by task (the default): of 2 tasks one is held out (at least one per side), with its
    # 2 trials; the sides share no task
    assert (len(ids[0]), len(ids[1])) == (2, 2)
    tasks = [{tid.rsplit("/", 2)[0] for tid in side} for side in ids]
    assert len(tasks[0]) == len(tasks[1]) == 1 and not tasks[0] & tasks[1]
    assert shared_tasks(data) == []  # the protocol guard reads the parquet files the same way
    # each episode has 3 decisions: verify (before any tool result), clarify (after the teacher's
    # question), act (after the order details) → one verify and one clarify row per trajectory
    modes = sorted(r["extra_info"]["mode"] for r in all_rows(data))
    assert modes == ["clarify"] * 4 + ["verify"] * 4


def test_the_protocol_guard_counts_a_task_with_rows_on_both_sides(run: Run, tmp_path) -> None:
    import shutil

    shutil.copytree(run.folder / "dataset", tmp_path / "both")
    val = split_path(tmp_path / "both", "validation")
    task = read_rows(val)[0]["extra_info"]["task_id"]
    shutil.copy(val, split_path(tmp_path / "both", "train"))  # validation's task on both sides
    assert shared_tasks(tmp_path / "both") == [("retail", str(task))]
    found = protocol_findings(load_recipe(PAPER), dataset_dir=tmp_path / "both")
    assert [(f.count, f.ids) for f in found if f.rule == "shared-task"] == [(1, (f"retail:{task}",))]


def test_trajectories_record_the_teacher_exchange(run: Run) -> None:
    for traj in load_trajectories(run.folder / "traj.jsonl", "error"):
        assert teacher_exchanges(traj) == [(scripts.QUESTION, scripts.ANSWER)]
        texts = [m.get("content") for m in traj.messages]
        assert texts.index(scripts.ANSWER) == texts.index(scripts.QUESTION) + 1
        assert traj.meta["teacher"]["questions"] == 1 and traj.agent_model == "scripted"
        assert traj.termination == "user_stop" and traj.seed in (0, 1)


def test_decision_states_skip_greeting_and_teacher_questions(run: Run) -> None:
    traj = load_trajectories(run.folder / "traj.jsonl", "error")[0]
    states = decision_states(traj, run.cfg)
    assert [s.step for s in states] == [0, 1, 2]
    assert [m["content"] for m in states[0].history] == [greeting(), scripts.OPENING]
    assert [m.get("content") for m in states[1].history][-2:] == [scripts.QUESTION, scripts.ANSWER]
    assert all(m["role"] != "system" for s in states for m in s.history)
    assert states[0].action == scripts.CANONICAL[2] and states[1].action == scripts.CANONICAL[1]
    assert states[2].is_reply and states[2].action is None
    assert len(decision_states(traj, run.cfg.model_copy(update={"max_decisions": 2}))) == 2
    respond = run.cfg.model_copy(update={"verify_on_reply": "respond"})
    assert target_of(states[2], "verify", {}, respond) == (scripts.CANONICAL[0], None)
    assert target_of(states[2], "verify", {}, run.cfg) == (None, "verify_reply")


def test_rows_carry_the_designed_uncertainty_targets_and_truncation(run: Run) -> None:
    rows = all_rows(run.folder / "dataset")
    goals = load_goals(run.folder / "goals.jsonl", "error")
    for row in rows:
        extra = row["extra_info"]
        assert extra["prompt_tokens"] <= BUDGET
        if extra["mode"] == "verify":
            assert extra["step"] == 0 and extra["au"] == pytest.approx(0.0, abs=1e-9)
            assert extra["eu"] == pytest.approx(1.0986123, abs=1e-6)  # ln 3
            assert row["reward_model"]["ground_truth"] == scripts.CANONICAL[2]
            assert not extra["truncated"]
        else:
            assert extra["step"] == 1 and extra["au"] == pytest.approx(0.6730, abs=2e-3)
            assert row["reward_model"]["ground_truth"] == goals[("retail", extra["task_id"])].goal
            assert extra["truncated"] and extra["dropped_messages"] >= 1
            history = json.loads(extra["history"])
            assert history[-1]["content"] == scripts.ANSWER  # the latest turn survives


def test_card_reports_decomposer_cost(run: Run) -> None:
    card = json.loads((run.folder / "dataset" / "card.json").read_text())
    extraction = card["extraction"]
    assert extraction["states"] == 12
    assert extraction["routes"] == {"act": 4, "clarify": 4, "verify": 4}
    assert extraction["decomposer_calls_per_state"] == 3.0  # goals, actions, scores
    # K goals + K·L actions + (2 distinct goals × 3 candidates) scored = 5 + 20 + 6
    assert extraction["decomposer_requests_per_state"] == 31.0
    assert card["splits"]["train"]["by_mode"] == {"clarify": 2, "verify": 2}  # 2 trajectories


def test_canaries_reach_only_the_reward_side(run: Run) -> None:
    canaries = (CANARY_INSTRUCTION, CANARY_GOAL, CANARY_ACTION)
    user_prompts = [render_prompt(r.messages) for r in run.models["user"].chat_log]
    assert any(CANARY_INSTRUCTION in p for p in user_prompts)  # the planted task was played
    for role in ("agent", "teacher", "decomposer"):
        llm = run.models[role]
        seen = [render_prompt(r.messages) for r in llm.chat_log]
        seen += [render_prompt(r.context) + r.target for r in llm.score_log]
        assert seen
        assert not [c for c in canaries for text in seen if c in text], role
    rows = all_rows(run.folder / "dataset")
    rewarded = [r for r in rows if CANARY_GOAL in r["reward_model"]["ground_truth"]]
    assert rewarded and all(CANARY_INSTRUCTION in r["reward_model"]["ground_truth"]
                            for r in rewarded)
    for row in rows:
        visible = json.dumps([row["prompt"], row["extra_info"], row["data_source"]])
        assert not [c for c in canaries if c in visible]
    assert not [r for r in rows if CANARY_ACTION in json.dumps(r)]


def test_rerun_reuses_every_cached_decision(run: Run) -> None:
    before = run.models["decomposer"].calls.copy()
    summary = extract(run, run.cfg, run.router, "dataset_again")
    assert run.models["decomposer"].calls == before
    assert summary["cache_hits"] == 12
    assert all_rows(run.folder / "dataset_again") == all_rows(run.folder / "dataset")


def test_new_thresholds_reroute_from_the_cache(run: Run) -> None:
    before = run.models["decomposer"].calls.copy()
    strict = make_router(run.models["decomposer"], thresholds=(0.8, 0.2))
    summary = extract(run, run.cfg, strict, "dataset_strict")
    assert run.models["decomposer"].calls == before
    assert summary["routes"] == {"act": 8, "verify": 4}  # AU 0.67 < 0.8 and EU ≈ 0: act


def test_only_successful_drops_verify_of_failed_episodes(run: Run) -> None:
    rewards = {t.reward for t in load_trajectories(run.folder / "traj.jsonl", "error")}
    assert rewards == {0.0}  # the scripted agent never finishes these tasks
    cfg = run.cfg.model_copy(update={"only_successful": True})
    summary = extract(run, cfg, run.router, "dataset_successful")
    assert summary["dropped"] == {"verify_unsuccessful": 4}
    modes = {r["extra_info"]["mode"] for r in all_rows(run.folder / "dataset_successful")}
    assert modes == {"clarify"}


def test_no_clarify_or_verify_state_writes_an_empty_dataset_and_says_why(run: Run) -> None:
    """Thresholds no state reaches: every state routes to act. Both splits are written empty
    (what train then reads), the summary counts the routes, and the reason names them."""
    from prour.data.extract_summary import empty_reason

    before = run.models["decomposer"].calls.copy()
    never = make_router(run.models["decomposer"], thresholds=(50.0, 50.0))
    trajectories = load_trajectories(run.folder / "traj.jsonl", "error")
    goals = load_goals(run.folder / "goals.jsonl", "error")
    cache = DecisionCache(run.folder / "decisions.jsonl", "error")
    instances, summary = extract_instances(trajectories, goals, never, cache, run.tokens, run.cfg,
                                           progress=False)
    card = write_dataset(instances, summary, run.folder / "dataset_empty", {})
    assert run.models["decomposer"].calls == before  # rerouted from the cache
    assert card["extraction"]["rows"] == {"train": 0, "validation": 0}
    for split in ("train", "validation"):
        assert read_rows(split_path(run.folder / "dataset_empty", split)) == []
    assert empty_reason(card["extraction"]) == (
        "no clarify or verify state among 12 decision states (routes: 12 act; 0 decisions had "
        "no valid candidate; dropped: none)")


def ig_recipe_for(run: Run, tiny_model_dir: Path, *sets: str):
    """paper.yaml on this module's files, with the ig-clarifier's settings (its chain step's
    --set items) and ``sets`` on top."""
    from prour.config.ig_clarifier import setting_items

    return load_recipe(PAPER, [
        f"run_dir={run.folder}", f"data.trajectories={run.folder / 'traj.jsonl'}",
        f"data.goals={run.folder / 'goals.jsonl'}", f"data.tokenizer={tiny_model_dir}",
        "data.calibration_reserve=0", f"data.max_prompt_tokens={BUDGET}", "data.val_ratio=0.25",
        *setting_items(), *sets])


@pytest.mark.parametrize("router", [
    ["router.tau_au=0.8", "router.tau_eu=0.2"],
    ["router.tau_au=50", "router.tau_eu=50", "router.n_actions=2",
     "router.thresholds_file=/nonexistent/thresholds.json"],
])
def test_ig_clarifier_rows_are_every_decision_state_whatever_the_router(
        run: Run, tiny_model_dir: Path, router: list[str]) -> None:
    """The baseline's own set (data.states: every): one clarify row per decision state of every
    trajectory, target G*, the same rows under thresholds that route prour's states otherwise
    (test_new_thresholds_reroute_from_the_cache: 8 act + 4 verify; 50/50: all act), and the
    chain's extract-ig-clarifier step depends on no router key (never made stale by one)."""
    from prour.data.collect import trajectory_id
    from prour.data.pipeline import run_extract
    from prour.data.schema import state_from_row
    from prour.run_state import step_values
    from prour.stages import get_step

    base = ig_recipe_for(run, tiny_model_dir, "router.tau_au=0.25", "router.tau_eu=0.2")
    other = ig_recipe_for(run, tiny_model_dir, *router)
    step = get_step("extract-ig-clarifier")
    assert step_values(base, step) == step_values(other, step)
    assert step_values(base, get_step("extract")) != step_values(other, get_step("extract"))
    rows = {}
    for name, recipe in (("base", base), ("other", other)):
        recipe.data.dataset_dir = str(run.folder / f"ig-{name}-{len(router)}")
        result = run_extract(recipe, progress=False)
        assert result.errors == [] and result.card["extraction"]["decomposer_calls"] == 0
        rows[name] = all_rows(Path(recipe.data.dataset_dir))
    assert rows["base"] == rows["other"]
    # every decision state: 4 trajectories x their 3 decisions (greeting and teacher turns are
    # not decisions), each a clarify row whose target is its task's goal
    goals = load_goals(run.folder / "goals.jsonl", "error")
    trajectories = load_trajectories(run.folder / "traj.jsonl", "error")
    got = [(r["extra_info"]["trajectory_id"], r["extra_info"]["step"]) for r in rows["base"]]
    assert sorted(got) == sorted((trajectory_id(t), s) for t in trajectories for s in (0, 1, 2))
    for row in rows["base"]:
        extra = row["extra_info"]
        assert extra["mode"] == "clarify" and extra["au"] is extra["eu"] is extra["total"] is None
        assert state_from_row(row).target == row["reward_model"]["ground_truth"]  # trainable
        assert row["reward_model"]["ground_truth"] == goals[("retail", extra["task_id"])].goal
    # prour's routed rows (a clarify and a verify state of each trajectory) are among them, on
    # the same train/validation side
    sides = {(r["extra_info"]["trajectory_id"], r["extra_info"]["step"]): split
             for split in ("train", "validation")
             for r in read_rows(split_path(Path(base.data.dataset_dir), split))}
    routed = {(r["extra_info"]["trajectory_id"], r["extra_info"]["step"]): split
              for split in ("train", "validation")
              for r in read_rows(split_path(run.folder / "dataset", split))}
    assert len(routed) == 8 and all(sides[key] == split for key, split in routed.items())
