"""Fault cells of ``prour normalize``, ``prour calibrate --stage label`` and ``prour extract``
(tests/faults/matrix.py lists every cell), each fault one test parametrised over the three. The
stage's model is tests/faults/test_collect_faults.py's faulty server, which hangs past the
client's time limit or closes the connection mid-reply on every request; or the run folder is a
small tmpfs, read-only or full. The stage exits 1 with one line naming the cause and the fix, no
lock is left, and with the fault removed a rerun writes every record exactly once (counted by key
against the stage's inputs)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from test_collect_faults import Faulty
from typer.testing import CliRunner

from prour.cli.main import app
from prour.runlock import LOCK_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

STAGES = {  # command: (argv after the recipe, the role whose server fails)
    "normalize": ((), "normalizer"),
    "calibrate": (("--stage", "label"), "annotator"),
    "extract": (("--no-progress",), "decomposer"),
}
CELLS = [pytest.param(command, kind, marks=pytest.mark.full) if (command, kind) == (
    "extract", "timeout") else (command, kind)  # extract's CI cell: closed-mid-reply
         for command in STAGES for kind in ("timeout", "closed-mid-reply")]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _prepared(command: str, tmp_path: Path, tiny_model_dir: Path) -> Path:
    """The stage's recipe with its inputs in place (collect, then normalize before extract)."""
    if command == "calibrate":
        from test_calibrate_cli import make_recipe

        return make_recipe(tmp_path)
    from test_data_cli import _recipe

    recipe = _recipe(tmp_path, tiny_model_dir)
    for before in ("collect", "normalize")[: 1 if command == "normalize" else 2]:
        extra = ["--no-progress"] if before == "collect" else []
        result = _invoke(before, "--recipe", str(recipe), *extra)
        assert result.exit_code == 0, result.output
    return recipe


@pytest.mark.parametrize("command, kind", CELLS)
def test_a_backend_fault_fails_the_stage_in_one_line_then_a_rerun_writes_each_record_once(
        tmp_path, tiny_model_dir, command, kind):
    recipe = _prepared(command, tmp_path, tiny_model_dir)
    argv, role = STAGES[command]
    server = Faulty(kind, failures=None)
    served = json.dumps({"backend": "openai", "model": "m", "base_url": server.url,
                         "max_retries": 1, "timeout_s": 1.0})
    try:
        result = _invoke(command, "--recipe", str(recipe), *argv,
                         "--set", f"models.{role}={served}")
    finally:
        server.close()
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert f"models.{role}" in errors[0] and server.url in errors[0], errors[0]
    assert f"then rerun `prour {command}" in errors[0], errors[0]
    run = tmp_path / "run"
    assert not list(run.rglob(LOCK_FILE)), "the run lock was left behind"

    fixed = _invoke(command, "--recipe", str(recipe), *argv)
    assert fixed.exit_code == 0, fixed.output
    assert "Traceback" not in fixed.output
    EXPECTED[command](run, fixed.output)


def _normalized(run: Path, output: str) -> None:
    """One goal per collected task, each once."""
    tasks = {(t["domain"], t["task_id"]) for t in _rows(run / "data" / "trajectories.jsonl")}
    goals = Counter((g["domain"], g["task_id"]) for g in _rows(run / "data" / "goals.jsonl"))
    assert goals == Counter(dict.fromkeys(tasks, 1)) and len(tasks) == 2, goals


def _labelled(run: Path, output: str) -> None:
    """One label per dev and test state (the states make_recipe writes), each once."""
    for split, ids in (("dev", ["d1", "d2", "d3", "d4", "d5", "d6"]), ("test", ["t1", "t2", "t3"])):
        labels = Counter(r["state_id"] for r in _rows(run / "calibration" / f"labels_{split}.jsonl"))
        assert labels == Counter(ids), (split, labels)


def _extracted(run: Path, output: str) -> None:
    """Each decision cached once, none from the failed server, and the dataset of an
    uninterrupted run (tests/cli/test_data_cli.py: 2 train rows, 2 validation rows)."""
    rows = _rows(run / "data" / "decisions.jsonl")
    assert rows and max(Counter(r["key"] for r in rows).values()) == 1
    assert {r["model"] for r in rows} == {"scripted:data-test-decomposer"}
    assert "train 2 rows, validation 2 rows" in output, output


EXPECTED = {"normalize": _normalized, "calibrate": _labelled, "extract": _extracted}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- a read-only or full run folder (a small tmpfs as run_dir; root ignores file modes) ------


def _console(capsys, *args: str) -> tuple[int, str]:
    """``prour ARGS`` through the console entry's disk handling (prour.cli.failures.run_app):
    the exit status and stderr."""
    from prour.cli.failures import run_app

    argv = sys.argv
    sys.argv = ["prour", *args]
    try:
        with pytest.raises(SystemExit) as stop:
            run_app(app)
    finally:
        sys.argv = argv
    return stop.value.code or 0, capsys.readouterr().err


def _fill(mount: Path) -> Path:
    """Write a file until the disk refuses: nothing left free."""
    filler = mount / "filler"
    with open(filler, "wb") as handle, pytest.raises(OSError):
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    return filler


@pytest.mark.parametrize("command, fault", [
    pytest.param(command, fault, marks=pytest.mark.full) if (command, fault) == (
        "extract", "full") else (command, fault)  # extract's CI cell: read-only
    for command in STAGES for fault in ("read-only", "full")])
def test_a_read_only_or_full_run_folder_is_one_line_then_a_rerun_writes_each_record_once(
        tmp_path, tiny_model_dir, capsys, command, fault):
    from test_bad_setups import tmpfs

    argv, _ = STAGES[command]
    run = tmp_path / "run"
    with tmpfs(run, "16m"):
        recipe = _prepared(command, tmp_path, tiny_model_dir)
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(run)], check=True)
        else:
            filler = _fill(run)
        code, err = _console(capsys, command, "--recipe", str(recipe), *argv)
        assert code == 1 and "Traceback" not in err, err
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, err
        assert f"cannot write {run}" in errors[0], errors[0]
        assert (f"the file system ({run}) is read-only" if fault == "read-only" else
                f"no space left on the device ({run})") in errors[0], errors[0]
        assert not list(run.rglob(LOCK_FILE)), "the run lock was left behind"
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(run)], check=True)
        else:
            filler.unlink()
        fixed = _invoke(command, "--recipe", str(recipe), *argv)
        assert fixed.exit_code == 0, fixed.output
        EXPECTED[command](run, fixed.output)
