"""Collection: the teacher wrapper, the episode plan, trajectory loading with corrupt lines, and
resume after ``prour collect`` is killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import data_scripts as scripts
import pytest
import yaml

from prour.config.data import DataConfig
from prour.data.collect import (
    AGENT_NAME,
    TeacherAgent,
    TeacherAwareUser,
    TeacherSession,
    load_trajectories,
    plan_episodes,
    teacher_exchanges,
)
from prour.env.agents import AgentTurn, TaskView
from prour.env.domains import load_tasks
from prour.env.trajectory import StepRecord, Trajectory
from prour.env.users import UserTurn
from prour.files import append_jsonl
from prour.llm.scripted import ScriptedLLM, render_prompt
from prour.rollout.query import PROMPTS_VERSION as QG_VERSION

TOOL_VIEW = [
    {"role": "system", "content": "policy text"},
    {"role": "user", "content": "Hi, I am Yusuf Rossi, zip 19122."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function",
         "function": {"name": "find_user_id_by_name_zip", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c0", "name": "find_user_id_by_name_zip",
     "content": "yusuf_rossi_9620"},
]


class EchoAgent:
    """Inner agent double: counts its calls and answers with a fixed reply."""

    name, model_name = "echo", "echo-model"

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, domain: str, task_view: TaskView) -> str:
        return "system"

    def act(self, messages, tools) -> AgentTurn:
        self.calls += 1
        return AgentTurn(content="inner reply", meta={"inner": True})


def make_teacher(reply: str, cap: int | None = None):
    inner, session = EchoAgent(), TeacherSession()
    llm = ScriptedLLM(default=reply)
    cfg = DataConfig(teacher_max_questions=cap)
    agent = TeacherAgent(inner, llm, session, cfg)
    agent.reset("retail", TaskView("retail", "0", "policy", seed=3))
    return agent, inner, llm, session


def test_teacher_asks_after_a_tool_result_and_only_once() -> None:
    agent, inner, llm, session = make_teacher("YES [QUESTION]Which order?[/QUESTION]")
    turn = agent.act(TOOL_VIEW, [])
    assert turn.content == "Which order?" and not turn.tool_calls and inner.calls == 0
    assert turn.meta["teacher_query"]["decision"] == "ask"
    assert session.pending == "Which order?" and session.asked == 1
    [request] = llm.chat_log
    prompt = render_prompt(request.messages)
    assert "yusuf_rossi_9620" in prompt and "policy text" not in prompt  # dialogue only
    again = agent.act(TOOL_VIEW, [])  # the same point is not consulted twice
    assert again.content == "inner reply" and llm.calls["chat"] == 1


def test_teacher_no_lets_the_agent_act_and_records_the_decision() -> None:
    agent, inner, llm, _ = make_teacher("NO")
    turn = agent.act(TOOL_VIEW, [])
    assert turn.content == "inner reply" and inner.calls == 1
    assert turn.meta["inner"] and turn.meta["teacher"]["decision"] == "none"
    assert agent.act(TOOL_VIEW[:2], []).meta == {"inner": True}  # no tool result: no teacher
    assert llm.calls["chat"] == 1


def test_teacher_invalid_output_is_not_a_question() -> None:
    agent, _, _, session = make_teacher("maybe ask about the color")
    turn = agent.act(TOOL_VIEW, [])
    assert turn.content == "inner reply" and session.asked == 0
    assert turn.meta["teacher"]["decision"] == "invalid" and turn.meta["teacher"]["invalid"]


def test_teacher_question_cap() -> None:
    agent, _, llm, _ = make_teacher("YES [QUESTION]Which order?[/QUESTION]", cap=0)
    assert agent.act(TOOL_VIEW, []).content == "inner reply" and llm.calls["chat"] == 0


def test_user_wrapper_labels_the_answer() -> None:
    class Fixed:
        name, model_name = "fixed", None

        def reset(self, *args) -> None: ...

        def respond(self, messages, tools) -> UserTurn:
            return UserTurn(content="Order #W2378156.")

    session = TeacherSession(pending="Which order?")
    user = TeacherAwareUser(Fixed(), session)
    plain = user.respond([{"role": "assistant", "content": "Hello"}], [])
    assert "teacher_answer" not in plain.meta and session.pending == "Which order?"
    turn = user.respond([{"role": "assistant", "content": "Which order?"}], [])
    assert turn.meta["teacher_answer"] == {"question": "Which order?"} and session.pending is None


def test_plan_is_seed_major_and_cut() -> None:
    tasks = load_tasks("retail", "train")[:3]
    plan = plan_episodes(tasks, DataConfig(num_trajectories=5, trial_seeds=[4, 9]))
    assert [(t.id, s) for t, s in plan] == [("0", 4), ("1", 4), ("2", 4), ("0", 9), ("1", 9)]
    with pytest.raises(ValueError, match="data.trial_seeds"):
        plan_episodes(tasks, DataConfig(num_trajectories=7, trial_seeds=[4, 9]))


def _trajectory(task_id: str, seed: int, reward: float = 1.0) -> Trajectory:
    messages = [{"role": "assistant", "content": "Which order?"},
                {"role": "user", "content": "Order #W1."}]
    steps = [StepRecord(kind="agent_message", message_index=0,
                        meta={"teacher_query": {"question": "Which order?"}}),
             StepRecord(kind="user_message", message_index=1,
                        meta={"teacher_answer": {"question": "Which order?"}})]
    return Trajectory(domain="retail", task_id=task_id, seed=seed, agent=AGENT_NAME,
                      user="llm", messages=messages, steps=steps, reward=reward,
                      termination="user_stop")


def test_teacher_exchanges_pairs_question_and_answer() -> None:
    assert teacher_exchanges(_trajectory("0", 0)) == [("Which order?", "Order #W1.")]


def test_corrupt_lines_are_refused_or_skipped_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "traj.jsonl"
    append_jsonl(path, _trajectory("0", 0))
    with open(path, "a") as handle:
        handle.write('{"schema_version": 1, "domain": "ret\n')  # a torn record on line 2
        handle.write('["not", "an", "object"]\n')  # line 3
    append_jsonl(path, _trajectory("1", 0))
    append_jsonl(path, _trajectory("0", 0, reward=0.0))  # a rerun's record for the same key
    with pytest.raises(ValueError, match=rf"{path}:2: not valid JSON"):
        load_trajectories(path, "error")
    loaded = load_trajectories(path, "skip")
    assert loaded.skipped == [2, 3] and loaded.duplicates == 1
    assert sorted((t.task_id, t.reward) for t in loaded) == [("0", 0.0), ("1", 1.0)]


def _recipe(tmp_path: Path, num: int) -> Path:
    files = scripts.write_script_files(tmp_path / "scripts")
    recipe = {
        "name": "collect-kill",
        "run_dir": str(tmp_path / "run"),
        "models": {role: {"backend": "scripted", "script": str(files[role])}
                   for role in ("agent", "user", "teacher")},
        "env": {"max_steps": 12},
        "data": {"num_trajectories": num, "trial_seeds": [0, 1, 2], "max_tasks": 2,
                 "concurrency": 1},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _collect(recipe: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "prour.cli.main", "collect", "--recipe", str(recipe),
         "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def _complete_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_bytes().split(b"\n")[:-1] if line.strip())


@pytest.mark.slow
def test_killed_collect_resumes_without_duplicates_or_losses(tmp_path: Path) -> None:
    recipe, num = _recipe(tmp_path, num=5), 5
    out = tmp_path / "run" / "data" / "trajectories.jsonl"
    proc = _collect(recipe)
    deadline = time.monotonic() + 240
    while _complete_lines(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    done_at_kill = _complete_lines(out)
    assert 1 <= done_at_kill < num, "collect must be killed mid-run for this test to mean anything"

    rerun = _collect(recipe)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output.decode()[-2000:]
    assert f"{num} trajectories" in output.decode()
    stored = load_trajectories(out, "skip")  # a line torn by the kill would be listed, not lost
    keys = sorted((t.task_id, t.seed) for t in stored)
    assert keys == [("0", 0), ("0", 1), ("0", 2), ("1", 0), ("1", 1)]
    assert stored.duplicates == 0
    records = [json.loads(x) for x in out.read_text().splitlines() if x.strip().endswith("}")]
    assert len(records) == num  # every planned episode exactly once in the file
    assert all(t.agent_model == "scripted" and t.prompts_version for t in stored)
    assert all(len(teacher_exchanges(t)) == 1 for t in stored)
    assert all(t.meta["teacher"] == {"model": "scripted", "prompts_version": QG_VERSION,
                                     "questions": 1, "max_questions": None} for t in stored)


def test_collect_refuses_a_trajectories_folder_held_by_a_live_command(tmp_path: Path) -> None:
    from prour.runlock import LOCK_FILE, run_lock

    recipe = _recipe(tmp_path, num=2)
    folder = tmp_path / "run" / "data"
    with run_lock(folder) as holder:  # this test process is the live holder
        proc = _collect(recipe)
        output = proc.communicate(timeout=120)[0].decode()
        assert proc.returncode == 2, output
        assert f"error: {folder} is in use by pid {holder.pid} " in output
        assert not (folder / "trajectories.jsonl").exists()
    assert not (folder / LOCK_FILE).exists()
