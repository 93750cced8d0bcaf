"""One writer per run folder, taken early (prour/cli/run.py, prour/runner.py): ``prour run`` holds
its run folder's lock from right after reading the recipe, so a second run on a busy folder is
refused at once: exit 2 (docs/cli.md), one line naming the holder, nothing loaded, nothing
written (its run record, the running step's log). A step whose own folder another live command
holds is refused before its log, servers or weights, and the end table says ``refused``, not
``ran``; so is a step whose command refuses its setup (exit 2). A step that writes in the run
folder itself works under its runner's lock and leaves it to the runner."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from installed_prour import prour_argv
from test_collect_faults import WAIT_S, _out, _planned, _recipe, _stored, _wait_for_records

from prour.runlock import LOCK_FILE, Holder, _process_start, read_holder

STEP = "collect-retail"
TASKS = 24  # ~0.5 s a scripted episode: the first run still runs when the second is refused
ROW = re.compile(r"^\s+(\S+/\S+)\s+(\S+)", re.MULTILINE)


def _prour_run(recipe: Path, *extra: str) -> list[str]:
    return prour_argv("run", "--recipe", str(recipe), "--only", STEP, *extra)


def _end_table(output: str) -> dict[str, str]:
    """stage/step -> its state word in ``prour run``'s closing table."""
    table = output.split("what ran where", 1)[1]
    return dict(ROW.findall(table))


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


def test_a_second_run_on_a_busy_folder_is_refused_before_it_loads_or_writes(tmp_path):
    recipe = _recipe(tmp_path, tasks=TASKS)
    run, out = tmp_path / "run", _out(recipe)
    log = tmp_path / "first.log"
    with open(log, "wb") as sink:
        first = subprocess.Popen(_prour_run(recipe), stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_for_records(first, out)
        record = run / ".prour" / "run.json"
        before = (record.read_bytes(), record.stat().st_mtime_ns)
        step_log = run / "logs" / f"{STEP}.log"
        second = subprocess.run(_prour_run(recipe), capture_output=True, text=True,
                                timeout=WAIT_S, check=False)
        assert first.poll() is None, "the first run ended before the second was refused"
        assert (record.read_bytes(), record.stat().st_mtime_ns) == before  # not overwritten
        headers = [line for line in step_log.read_text().splitlines() if line.startswith("$ ")]
    finally:
        code = first.wait(timeout=WAIT_S)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "Traceback" not in second.stderr
    (line,) = _errors(second.stderr)
    assert line.startswith(f"error: {run} is in use by pid {first.pid} on "), line
    assert f"kill -INT {first.pid}" in line and "prour run --recipe" in line, line
    assert "==" not in second.stdout and "what ran where" not in second.stdout, second.stdout
    assert len(headers) == 1, headers  # the running step's log holds its own command only
    assert code == 0, log.read_text()
    assert _stored(out) == _planned(TASKS)  # the first run, undisturbed, stored every key once
    assert not list(run.rglob(LOCK_FILE))


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_step_whose_folder_another_command_holds_is_refused_and_the_table_says_so(
        tmp_path, sleeper):
    recipe = _recipe(tmp_path, tasks=1)
    run, data = tmp_path / "run", _out(recipe).parent
    data.mkdir(parents=True)
    other = Holder(pid=sleeper.pid, host=socket.gethostname(), command="prour collect -r x.yaml",
                   since="then", started=_process_start(sleeper.pid))
    (data / LOCK_FILE).write_text(json.dumps(asdict(other)))
    done = subprocess.run(_prour_run(recipe), capture_output=True, text=True, timeout=WAIT_S,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    refused = [line for line in done.stdout.splitlines() if line.startswith(f"== {STEP}:")]
    expected = (f"== {STEP}: refused: {data} is in use by pid {sleeper.pid} on "
                f"{socket.gethostname()} since then: prour collect -r x.yaml (lock "
                f"{data / LOCK_FILE}; wait for that command to end, or stop it: kill -INT "
                f"{sleeper.pid})")
    assert refused == [expected], output
    assert _end_table(done.stdout)[f"collect/{STEP}"] == "refused", done.stdout
    assert sorted(p.name for p in data.iterdir()) == [LOCK_FILE]  # nothing written there
    assert read_holder(data / LOCK_FILE) == other
    assert not (run / "logs").exists() and not (run / ".prour" / "steps").exists()
    assert not (run / LOCK_FILE).exists()  # the runner's own lock is freed


def test_a_step_that_refuses_its_setup_makes_the_run_exit_2_and_reads_refused(tmp_path):
    """The agent's server does not answer: the step's preflight refuses it (exit 2) before any
    episode; the run passes the 2 on and its table says refused."""
    recipe = _recipe(tmp_path, tasks=1, backend="openai", model="m",
                     base_url="http://127.0.0.1:9/v1")
    done = subprocess.run(_prour_run(recipe), capture_output=True, text=True, timeout=WAIT_S,
                          check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert re.search(rf"^== {STEP}: refused after \d+ s: its command refused its setup or its "
                     rf"folder \(exit code 2\); log ", done.stdout, re.MULTILINE), done.stdout
    assert _end_table(done.stdout)[f"collect/{STEP}"] == "refused", done.stdout
    assert not _out(recipe).exists()


def test_a_step_writing_in_the_run_folder_itself_works_under_its_runners_lock(tmp_path):
    """data.trajectories in run_dir itself: the step's folder is the one its runner holds; it
    writes there without taking or freeing that lock, and the runner frees it at the end."""
    recipe = _recipe(tmp_path, tasks=2)
    run = tmp_path / "run"
    out = run / "trajectories.jsonl"
    done = subprocess.run(_prour_run(recipe, "--set", f"data.trajectories={out}"),
                          capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _stored(out) == _planned(2)
    assert _end_table(done.stdout)[f"collect/{STEP}"] == "ran", done.stdout
    assert not (run / LOCK_FILE).exists()


def test_a_dry_run_of_a_busy_folder_takes_no_lock(tmp_path, sleeper):
    """--dry-run writes nothing: it reads a folder another run holds without being refused, and
    leaves that lock as it found it (the holder: a live process standing for the running one)."""
    recipe = _recipe(tmp_path, tasks=1)
    run = tmp_path / "run"
    run.mkdir()
    other = Holder(pid=sleeper.pid, host=socket.gethostname(), command="prour run -r x.yaml",
                   since="then", started=_process_start(sleeper.pid))
    (run / LOCK_FILE).write_text(json.dumps(asdict(other)))
    dry = subprocess.run(_prour_run(recipe, "--dry-run"), capture_output=True, text=True,
                         timeout=WAIT_S, check=False)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"collect/{STEP}" in dry.stdout and "pending" in dry.stdout, dry.stdout
    assert read_holder(run / LOCK_FILE) == other
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]  # nothing written
    again = subprocess.run(_prour_run(recipe), capture_output=True, text=True, timeout=WAIT_S,
                           check=False)  # the run itself is refused
    assert again.returncode == 2, again.stdout + again.stderr
    assert f"error: {run} is in use by pid {sleeper.pid}" in again.stderr, again.stderr
