"""Submission and status logic against a recorded Slurm: sbatch chaining, manifest, state merging.

The scontrol lines are copied from the local Slurm 22.05 cluster (trimmed to the fields read);
the sacct lines follow `sacct -n -P -X --format=JobID,State,ExitCode`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster_helpers import write_recipe

from prour.cluster.jobs import (
    SubmitError,
    expand_indices,
    load_manifest,
    parse_sacct,
    parse_scontrol,
    submit,
    summarize,
)
from prour.cluster.slurm import SubmitRequest, plan_submission
from prour.recipes import load_recipe

SCONTROL = {
    "1": "JobId=1 JobName=prour-unit-extract JobState=COMPLETED Reason=None Dependency=(null) "
    "ExitCode=0:0",
    "2": "JobId=2 JobName=prour-unit-train JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) "
    "ExitCode=1:0",
    "3": "JobId=3 JobName=prour-unit-eval JobState=CANCELLED "
    "Reason=DependencyNeverSatisfied Dependency=afterok:2(failed) ExitCode=0:0",
}
# an eval array of a submission made before eval ran as one job: status still reads it
ARRAY = "JobId=3 ArrayJobId=3 ArrayTaskId=0-1 JobName=prour-unit-eval JobState=CANCELLED " \
    "Reason=DependencyNeverSatisfied Dependency=afterok:2(failed) ExitCode=0:0"


class FakeSlurm:
    """sbatch gives increasing ids, sacct acts as if accounting were off, scontrol reads a table."""

    def __init__(self, scontrol: dict[str, str] | None = None, refuse: str | None = None):
        self.calls: list[list[str]] = []
        self.next_id = 1
        self.scontrol = scontrol or {}
        self.refuse = refuse

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        if cmd[0] == "sbatch":
            if self.refuse and self.refuse in cmd[-1]:
                return subprocess.CompletedProcess(
                    cmd, 1, "", "sbatch: error: Invalid partition name"
                )
            job, self.next_id = self.next_id, self.next_id + 1
            return subprocess.CompletedProcess(cmd, 0, f"{job};cluster\n", "")
        if cmd[0] == "sacct":
            return subprocess.CompletedProcess(cmd, 1, "", "Slurm accounting storage is disabled")
        if cmd[0] == "scontrol":
            line = self.scontrol.get(cmd[-1])
            return subprocess.CompletedProcess(cmd, 0 if line else 1, line or "", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")


STAGES = ["extract", "train", "eval"]


def unit_recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path / "recipe.yaml", {
        "name": "unit",
        "run_dir": str(tmp_path / "run"),
        "models": {"generator": {"backend": "hf", "path": "gen"}},
        "eval": {"seeds": [0, 1], "domains": ["retail"]},
    })


def submitted(tmp_path: Path, runner: FakeSlurm, stages: list[str] | None = STAGES,
              approve: bool = False) -> dict:
    path = unit_recipe(tmp_path)
    loaded = load_recipe(path, cluster=True)
    request = SubmitRequest(path, stages, tmp_path / "run", [], tmp_path, approve_labels=approve)
    return submit(loaded, request, plan_submission(loaded, request), runner=runner)


def test_submit_chains_jobs_and_writes_the_manifest(tmp_path: Path) -> None:
    runner = FakeSlurm()
    manifest = submitted(tmp_path, runner)
    sbatch = [c for c in runner.calls if c[0] == "sbatch"]
    assert sbatch[0][-1].endswith("extract.sbatch") and not any(
        a.startswith("--dependency") for a in sbatch[0]
    )
    assert "--dependency=afterok:1" in sbatch[1] and "--kill-on-invalid-dep=yes" in sbatch[1]
    assert "--dependency=afterok:2" in sbatch[2]
    assert load_manifest(tmp_path / "run") == manifest
    stages = {e["stage"]: e for e in manifest["stages"]}
    assert [e["stage"] for e in manifest["stages"]] == STAGES
    assert stages["train"]["log"] == str(tmp_path / "run/slurm/logs/train-2.out")
    assert stages["eval"]["log"] == str(tmp_path / "run/slurm/logs/eval-3.out")
    assert stages["eval"]["command"][-2:] == ["--only", "eval"]
    assert Path(stages["eval"]["script"]).read_text().startswith("#!/bin/bash")
    assert manifest["gate"] is None and manifest["earlier"] == []


def test_a_chain_at_the_gate_then_its_continuation_shows_both_parts(tmp_path: Path) -> None:
    """The chain stops at the review gate: status says so with the approve command; the approved
    continuation keeps the first part's jobs (and their status files) in its manifest."""
    first = submitted(tmp_path, FakeSlurm(), stages=None)
    gated = [e["stage"] for e in first["stages"]]
    assert gated == ["collect", "normalize", "calibrate"]
    approve = f"prour slurm submit --recipe {tmp_path / 'recipe.yaml'} --approve-labels"
    assert first["gate"] == approve
    status_dir = tmp_path / "run" / "slurm" / "status"
    for stage in gated:
        (status_dir / stage).write_text(f"job={stage}\nstart=1\nend=2\nrc=0\n")
    (status_dir / "calibrate").write_text("job=calibrate\nstart=1\n")  # still running
    assert summarize(first, FakeSlurm()).at_gate is None
    (status_dir / "calibrate").write_text("job=calibrate\nstart=1\nend=2\nrc=0\n")
    report = summarize(first, FakeSlurm())
    assert report.failed is None and report.at_gate == approve
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    shown = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "slurm", "status", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"waiting at the review gate (the labels to review and their counts: " \
        f"{first['stages'][-1]['log']}); approve and continue with:\n  {approve}\n" in shown.stdout

    second = submitted(tmp_path, FakeSlurm(), stages=None, approve=True)
    # nothing of the chain exists yet, so it starts again at collect (done steps are skipped)
    assert [e["stage"] for e in second["stages"]][:3] == gated
    assert second["stages"][-1]["stage"] == "report" and second["gate"] is None
    assert all(e["command"][-1] == "--approve-labels" for e in second["stages"])
    assert [e["label"] for e in second["earlier"]] == [f"{s} (before-review)" for s in gated]
    for stage in gated:
        (status_dir / stage).write_text("start=3\nend=4\nrc=0\n")
    report = summarize(load_manifest(tmp_path / "run"), FakeSlurm())
    labels = [(u.label, u.state) for u in report.units]
    assert labels[:4] == [("collect (before-review)", "COMPLETED"),
                          ("normalize (before-review)", "COMPLETED"),
                          ("calibrate (before-review)", "COMPLETED"), ("collect", "COMPLETED")]
    assert Path(second["earlier"][0]["status_file"]).read_text().startswith("job=collect")
    assert report.at_gate is None


def test_a_refused_stage_cancels_what_was_submitted(tmp_path: Path) -> None:
    runner = FakeSlurm(refuse="eval.sbatch")
    with pytest.raises(
        SubmitError, match="sbatch refused stage 'eval'.*Invalid partition.*\\(1, 2\\)"
    ):
        submitted(tmp_path, runner)
    assert runner.calls[-1] == ["scancel", "1", "2"]
    assert not (tmp_path / "run" / "slurm_jobs.json").exists()


def test_status_names_the_failed_stage_from_scontrol_and_status_files(tmp_path: Path) -> None:
    manifest = submitted(tmp_path, FakeSlurm())
    status_dir = tmp_path / "run" / "slurm" / "status"
    (status_dir / "extract").write_text("job=1\nstart=100.0\nend=101.0\nrc=0\n")
    (status_dir / "train").write_text("job=2\nstart=102.0\nend=110.5\nrc=1\n")
    report = summarize(manifest, FakeSlurm(SCONTROL))
    assert report.source == "scontrol"
    states = [(u.label, u.state, u.exit_code) for u in report.units]
    assert states == [
        ("extract", "COMPLETED", 0),
        ("train", "FAILED", 1),
        ("eval", "CANCELLED", None),
    ]
    assert report.failed is not None and report.failed.stage == "train"
    assert report.failed.log == str(tmp_path / "run/slurm/logs/train-2.out")
    assert report.never_ran == ["eval"] and report.finished


def test_status_without_any_slurm_record_uses_the_status_files(tmp_path: Path) -> None:
    manifest = submitted(tmp_path, FakeSlurm())
    status_dir = tmp_path / "run" / "slurm" / "status"
    for name, rc in (("extract", 0), ("train", 0), ("eval", 2)):
        (status_dir / name).write_text(f"start=1.0\nend=2.0\nrc={rc}\n")
    report = summarize(manifest, FakeSlurm())  # Slurm purged the jobs: no scontrol record
    assert [u.state for u in report.units] == ["COMPLETED", "COMPLETED", "FAILED"]
    assert report.failed.label == "eval" and report.failed.exit_code == 2


def test_status_still_reads_an_eval_array_of_an_earlier_submission(tmp_path: Path) -> None:
    manifest = submitted(tmp_path, FakeSlurm())
    logs = tmp_path / "run" / "slurm" / "logs"
    manifest["stages"][2]["tasks"] = [
        {"index": i, "seed": i, "domain": "retail", "log": str(logs / f"eval-3_{i}.out"),
         "status_file": None} for i in range(2)]
    report = summarize(manifest, FakeSlurm({**SCONTROL, "3": ARRAY}))
    assert [(u.label, u.state) for u in report.units][2:] == [
        ("eval[0] seed 0 retail", "CANCELLED"), ("eval[1] seed 1 retail", "CANCELLED")]
    assert report.never_ran == ["eval"]


def test_sacct_records_win_when_accounting_is_on() -> None:
    text = "5|COMPLETED|0:0\n6|FAILED|2:0\n7_0|TIMEOUT|0:15\n7_[1-2]|CANCELLED by 0|0:0\n"
    records = parse_sacct(text)
    assert {k: (r.state, r.exit_code) for k, r in records.items()} == {
        "5": ("COMPLETED", 0),
        "6": ("FAILED", 2),
        "7_0": ("TIMEOUT", 143),
        "7_1": ("CANCELLED", 0),
        "7_2": ("CANCELLED", 0),
    }


def test_scontrol_array_lines_expand_to_tasks() -> None:
    records = parse_scontrol(
        ARRAY + "\n" + "JobId=9 ArrayJobId=8 ArrayTaskId=4 JobState=RUNNING "
        "Reason=None ExitCode=0:0"
    )
    assert sorted(records) == ["3_0", "3_1", "8_4"]
    assert records["3_1"].reason == "DependencyNeverSatisfied" and records["8_4"].reason is None
    assert expand_indices("[0-2,5,7-8%2]") == [0, 1, 2, 5, 7, 8]


def test_cli_status_exit_code_and_message(tmp_path: Path) -> None:
    """`prour slurm status` on a run whose jobs Slurm no longer knows (no slurm binaries needed)."""
    manifest = submitted(tmp_path, FakeSlurm())
    status_dir = tmp_path / "run" / "slurm" / "status"
    (status_dir / "extract").write_text("start=1\nend=2\nrc=0\n")
    (status_dir / "train").write_text("start=3\nend=4\nrc=1\n")
    log = Path(manifest["stages"][1]["log"])
    log.write_text("Traceback ...\nFileNotFoundError: data/dataset/train.parquet\n")
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}  # no Slurm client at all
    done = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "slurm", "status", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "failed stage: train" in done.stdout and f"log: {log}" in done.stdout
    assert "never ran: eval" in done.stdout and "FileNotFoundError" in done.stdout
    assert json.loads((tmp_path / "run" / "slurm_jobs.json").read_text())["name"] == "unit"


def test_submission_records_its_provenance(tmp_path: Path) -> None:
    submitted(tmp_path, FakeSlurm())
    folder = tmp_path / "run" / "slurm"
    provenance = json.loads((folder / "provenance.json").read_text())
    assert provenance["stages"] == STAGES and provenance["seed"] == 0
    resolved = yaml.safe_load((folder / "recipe.resolved.yaml").read_text())
    assert resolved["eval"]["seeds"] == [0, 1] and resolved["name"] == "unit"
    assert resolved["slurm"]["kill_on_invalid_dep"] is True


def test_status_names_the_cause_of_a_failed_eval(tmp_path: Path) -> None:
    """An eval job that exited 1 because its episodes errored: FAILED, with the eval's own
    error line as the cause (not the lines printed after it)."""
    manifest = submitted(tmp_path, FakeSlurm())
    status_dir = tmp_path / "run" / "slurm" / "status"
    for name, rc in (("extract", 0), ("train", 0), ("eval", 1)):
        (status_dir / name).write_text(f"start=1\nend=2\nrc={rc}\n")
    cause = (
        "error: 1 of 1 episodes ended in an error (100%, more than eval.max_error_fraction=0.1); "
        "most common (1 of 1): BackendError: connection refused"
    )
    log = Path(manifest["stages"][2]["log"])
    log.write_text(f"[prour] stage eval started\nbase: 1 episodes\n{cause}\n"
                   "Exception ignored in: <function Client.__del__>\n")
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    done = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "slurm", "status", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, check=False,
    )
    assert done.returncode == 1, done.stderr
    state = {line.split()[0]: line.split()[2] for line in done.stdout.splitlines()
             if line.startswith(("train ", "eval "))}  # unit job state ...
    assert state == {"train": "COMPLETED", "eval": "FAILED"}
    assert "failed stage: eval (eval, job 3" in done.stdout
    assert f"cause: {cause}\n" in done.stdout


def test_the_cause_of_a_job_whose_step_failed_without_an_error_line(tmp_path: Path) -> None:
    """A step stopped because its server died prints no `error:` line: the cause is the line
    `prour run` printed for the failed step (naming the server), not the summary after it."""
    from prour.cluster.jobs import failure_cause

    line = ("== eval: failed after 172 s, exit code 130: server 'tiny' at http://127.0.0.1:9/v1 "
            "(pid 42) exited while serving; last log lines of /run/serve/tiny.log:")
    log = tmp_path / "eval.out"
    log.write_text(f"== eval: start: prour eval --recipe r.yaml\n{line}\nKilled\n"
                   "what ran where (stamps in <run_dir>/.prour/steps/):\n"
                   "  eval/eval  not run        tiny vLLM on the job's GPUs\n")
    assert failure_cause(log) == line
    log.write_text(f"error: eval: 2 of 2 episodes errored: connection refused\n{line}\n")
    assert failure_cause(log).startswith("error: eval: 2 of 2")  # the command's own words first
