"""Reports say what was not measured and escape what they quote (issue items 4 and 6): a system
whose every episode errored shows steps, seconds and calls as missing with the reason; result
lines the report cannot read (no ``score``, ``"score": null``) are skipped, counted and named;
out-of-range options are refused as they parse; run text in markdown is escaped, once, by the
shared table helper."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.eval.harness import RESULTS_FILE
from prour.eval.report import write_report
from prour.markdown import md, table


def _line(method: str, task: str, seed: int, score: float, error: bool = False) -> dict:
    return {"schema": 1, "key": ["retail", task, seed, method], "method": method,
            "variant": None, "domain": "retail", "task_id": task, "seed": seed,
            "reward": score, "score": score, "success": score == 1.0,
            "termination": "error" if error else "user_stop", "error": error, "timeout": False,
            "unscored": False, "errors": ["backend down"] if error else [],
            "steps": {"act": 0 if error else 3, "clarify": 0, "verify": 0},
            "model_calls": {"agent.chat": 0 if error else 3},
            "model_calls_total": 0 if error else 3, "seconds": 0.0 if error else 4.0,
            "decisions": [], "attention": None}


def _run(folder: Path, lines: list, raw: list[str] = ()) -> Path:
    folder.mkdir(parents=True)
    text = "".join(json.dumps(line) + "\n" for line in lines) + "".join(raw)
    (folder / RESULTS_FILE).write_text(text)
    return folder


def _rows(markdown: str, title: str) -> dict[str, list[str]]:
    section = markdown.split(f"## {title}")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {row[0]: row for row in cells}


def test_an_eval_whose_every_episode_errored_measured_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", [_line("down", t, 0, 0.0, error=True) for t in "12"]
               + [_line("up", t, 0, 1.0) for t in "12"])
    markdown = write_report([run], tmp_path / "rep", n_boot=50)["markdown"].read_text()
    down = _rows(markdown, "Pass@1 (%) and interaction cost")["down"]
    # System, retail, Average, Act, Clarify, Verify, Total, Seconds, Calls, Errors, ...
    assert down[1:3] == ["error (2/2)", "error (2/2)"]
    assert down[3:9] == ["– (all 2 episodes errored)"] * 6  # not 0.00
    assert down[9] == "2"
    up = _rows(markdown, "Pass@1 (%) and interaction cost")["up"]
    assert up[3:9] == ["3.00", "0.00", "0.00", "3.00", "4.00", "3.0"]
    turns = _rows(markdown, "Agent turns per episode by tag")["down"]
    assert set(turns[1:]) == {"– (all 2 episodes errored)"}
    calls = _rows(markdown, "Model calls per episode by role")["down"]
    assert set(calls[1:]) == {"– (all 2 episodes errored)"}


def test_lines_without_a_score_are_skipped_counted_and_named(tmp_path: Path) -> None:
    good = [_line("m", t, 0, 1.0) for t in "123"]
    no_score = {k: v for k, v in _line("m", "4", 0, 1.0).items() if k != "score"}
    null_score = {**_line("m", "5", 0, 1.0), "score": None}
    run = _run(tmp_path / "run", [*good, no_score, null_score], ["{torn"])
    result = CliRunner().invoke(app, ["report", str(run), "--n-boot", "50", "--out",
                                      str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert f"skipped 3 result line(s) the report cannot read (first {run / RESULTS_FILE}:"\
        in result.output
    markdown = (tmp_path / "rep" / "report.md").read_text()
    assert "Skipped 3 result line(s) the report cannot read" in markdown
    assert f"- {run / RESULTS_FILE}:4: score: Field required" in markdown
    assert f"- {run / RESULTS_FILE}:5: score: Input should be a valid number (got None)" \
        in markdown
    assert f"- {run / RESULTS_FILE}:6: corrupt (not a JSON object)" in markdown
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert [s["episodes"] for s in report["systems"]] == [3]
    assert len(report["skipped_lines"]) == 3


@pytest.mark.parametrize("option, value", [("--n-boot", "0"), ("--n-boot", "-5"),
                                           ("--lam", "nan"), ("--lam", "-0.1"),
                                           ("--lam", "inf"), ("--accounting", "cheap"),
                                           ("--burden-pairs", "-1")])
def test_out_of_range_options_are_refused_as_they_parse(tmp_path: Path, option: str,
                                                        value: str) -> None:
    missing = tmp_path / "not-read"  # the refusal comes first: the run is never looked at
    result = CliRunner().invoke(app, ["report", str(missing), option, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output
    assert "holds no results.jsonl" not in result.output


def test_markdown_escapes_what_it_quotes() -> None:
    assert md("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert md("a|b") == "a\\|b" and md("x\ny") == "x y" and md("R&D") == "R&amp;D"
    assert md(None) == ""
    lines = table(["System", "Pass"], [["<b>m</b>|x", 1.5]])
    assert lines == ["| System | Pass |", "| --- | --- |", "| &lt;b&gt;m&lt;/b&gt;\\|x | 1.5 |"]


def test_run_text_in_the_report_is_escaped(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>|x"
    run = _run(tmp_path / "run", [_line(evil, t, 0, 1.0) for t in "12"]
               + [_line("base", t, 0, 0.0) for t in "12"])
    markdown = write_report([run], tmp_path / "rep", n_boot=50)["markdown"].read_text()
    assert "<script>" not in markdown
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;\\|x"
    lines = markdown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| System | retail"))
    row = next(line for line in lines[header:] if line.startswith(f"| {escaped} |"))
    cells = lambda line: len(re.split(r"(?<!\\)\|", line))  # pipes a cell does not escape
    assert cells(row) == cells(lines[header])  # the name is one cell: the columns hold
