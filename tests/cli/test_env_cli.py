"""``prour env list|show`` and ``prour episode run`` through the real CLI app."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.trajectory import read_trajectories

runner = CliRunner()


def test_env_list_shows_splits_and_tool_counts() -> None:
    result = runner.invoke(app, ["env", "list"])
    assert result.exit_code == 0, result.output
    rows = {
        line.split()[1]: line.split()[3:-1]
        for line in result.output.splitlines()
        if line.startswith("│") and line.split()[1] in ("retail", "airline", "telecom")
    }
    # train, test, base, agent tools, read, write, user tools (from tau2's data and toolkits)
    assert [cell for cell in rows["retail"] if cell != "│"] == [
        "74",
        "40",
        "114",
        "15",
        "6",
        "7",
        "0",
    ]
    assert [cell for cell in rows["telecom"] if cell != "│"] == [
        "74",
        "40",
        "114",
        "13",
        "6",
        "6",
        "30",
    ]


def test_env_show_lists_tools_with_types_and_the_policy_head() -> None:
    result = runner.invoke(app, ["env", "show", "airline", "--policy-lines", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("book_reservation" in line and "WRITE" in line for line in lines)
    assert any("get_reservation_details" in line and "READ" in line for line in lines)
    assert any("transfer_to_human_agents" in line and "GENERIC" in line for line in lines)
    assert "user tools" not in result.output
    assert "Airline Agent Policy" in result.output


def test_env_show_unknown_domain() -> None:
    result = runner.invoke(app, ["env", "show", "airlines"])
    assert result.exit_code == 2
    assert "Did you mean 'airline'" in result.output


def test_episode_run_oracle_prints_transcript_and_reward(tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    result = runner.invoke(
        app, ["episode", "run", "--domain", "retail", "--task", "5", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "agent calls return_delivered_order_items" in result.output
    assert "user: ###STOP###" in result.output
    assert "reward: 1.000" in result.output
    (traj,) = read_trajectories(out)
    assert traj.reward == 1.0 and traj.agent == "oracle"


def test_episode_run_llm_agent_with_scripted_backend(tmp_path: Path) -> None:
    script = tmp_path / "agent.json"
    script.write_text(
        json.dumps(
            {"replies": ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "Goodbye."]}
        )
    )
    result = runner.invoke(
        app,
        [
            "episode",
            "run",
            "--domain",
            "retail",
            "--task",
            "5",
            "--agent",
            "llm",
            "--backend",
            "scripted",
            "--model",
            str(script),
            "--user",
            "scripted",
            "--user-reply",
            "I want to return a lamp.",
            "--user-reply",
            "###STOP###",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Error: Tool 'nope' not found." in result.output
    assert "termination: user_stop" in result.output
    assert "reward: 0.000" in result.output


def test_episode_run_bad_names() -> None:
    result = runner.invoke(
        app, ["episode", "run", "--domain", "retail", "--task", "5", "--agent", "orcale"]
    )
    assert result.exit_code == 2
    assert "Did you mean 'oracle'" in result.output
    result = runner.invoke(app, ["episode", "run", "--domain", "retail", "--task", "nope"])
    assert result.exit_code == 2 and "unknown task id 'nope'" in result.output
