"""An evaluation whose episodes error fails: `prour eval` exits 1 naming the most common error,
the report marks the errored cells instead of printing a Pass@1 that counts them as 0, and a rerun
of the same command runs the errored episodes again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from eval_world import agent_reply, domain_of, recipe, register_scripts
from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.trajectory import read_jsonl, read_trajectories
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, TooManyErrors, check_errors
from prour.eval.report import SUCCESS_PLOT
from prour.llm.base import BackendError
from prour.llm.scripted import ScriptedLLM, register_script

TASKS = ["retail:5", "retail:65", "airline:2", "airline:26"]
REFUSED = "server http://127.0.0.1:9/v1 refused the connection"
BROKEN = {"airline"}  # domains whose agent server is down; emptied to "fix" it


def _flaky_agent(messages: list[dict]) -> str:
    if domain_of(messages) in BROKEN:
        raise BackendError(REFUSED)
    return agent_reply(messages)


def _cells(markdown: str, title: str) -> dict[str, list[str]]:
    section = markdown.split(f"## {title}")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


def test_errored_episodes_fail_the_eval_mark_the_report_and_rerun(tmp_path: Path) -> None:
    register_scripts()
    register_script("eval-flaky-agent", lambda: ScriptedLLM(rules=[(r".", _flaky_agent)]))
    data = recipe(str(tmp_path), methods=["base"], tasks=TASKS)
    data["models"]["agent"]["script"] = "eval-flaky-agent"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run, runner = tmp_path / "run", CliRunner()
    command = ["eval", "--recipe", str(path), "--out", str(run), "--no-progress"]

    BROKEN.add("airline")
    failed = runner.invoke(app, command)
    assert failed.exit_code == 1, failed.output
    error = [line for line in failed.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1, failed.output
    assert error[0].startswith(
        "error: 2 of 4 episodes ended in an error (50%, more than eval.max_error_fraction=0.1); "
        f"most common (2 of 2): BackendError: {REFUSED}"
    )
    assert error[0].endswith(
        ". Fix the cause and rerun the same command: it runs the errored episodes again "
        "(eval.retry_errors=true)"
    )
    report = runner.invoke(app, ["report", str(run), "--n-boot", "50"])
    assert report.exit_code == 0, report.output
    markdown = (run / "report" / "report.md").read_text()
    retail, airline, average = _cells(markdown, "Pass@1 (%) and interaction cost")["base"][:3]
    assert re.fullmatch(r"50\.00 \[[\d.]+, [\d.]+\]", retail)  # retail 65 solved, 5 not
    assert (airline, average) == ("error (2/2)", "error (2/4)")
    assert "error (n/N): n of the cell's N episodes ended in an error" in markdown
    assert ["airline", "error (2/2)"] in _pass_hat_rows(markdown)
    assert not (run / "report" / SUCCESS_PLOT).exists()  # no point drawn from an errored system

    BROKEN.clear()  # the server is back: the same command reruns the two errored episodes
    fixed = runner.invoke(app, command)
    assert fixed.exit_code == 0, fixed.output
    episodes = read_trajectories(run / EPISODES_FILE)
    assert len(episodes) == 6  # 4 first, the 2 airline ones again
    results = {(r["domain"], r["task_id"]): r for r in read_jsonl(run / RESULTS_FILE)}
    assert not any(r["error"] for r in results.values())
    assert results["airline", "26"]["success"] and not results["airline", "2"]["success"]
    runner.invoke(app, ["report", str(run), "--n-boot", "50"])
    markdown = (run / "report" / "report.md").read_text()
    _, airline, average = _cells(markdown, "Pass@1 (%) and interaction cost")["base"][:3]
    assert airline.startswith("50.00 [") and average.startswith("50.00 [")
    assert "error (" not in markdown
    assert (run / "report" / SUCCESS_PLOT).exists()


def _pass_hat_rows(markdown: str) -> list[list[str]]:
    """(domain, pass^1) of each pass^k row."""
    section = markdown.split("## pass^k (%)")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    return [[c.strip() for c in row.strip("|").split("|")][1:3] for row in rows]


def test_the_error_share_is_compared_with_max_error_fraction() -> None:
    lines = [{"error": i < 2, "errors": ["BackendError: timed out"] if i < 2 else []}
             for i in range(4)]
    check_errors(lines, 0.5)  # 2 of 4 is not more than half
    with pytest.raises(TooManyErrors, match=r"2 of 4 .* most common \(2 of 2\): BackendError"):
        check_errors(lines, 0.49)
    check_errors([], 0.0)  # nothing ran, nothing to judge
