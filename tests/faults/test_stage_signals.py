"""Mid-run fault cells of ``prour normalize``, ``prour calibrate --stage label`` and ``prour
extract`` (tests/faults/matrix.py lists every cell): a real ``prour`` process on the stage tests'
scripted models, each of whose calls answers after ``DELAY_S`` (a small bootstrap registers the
scripts and slows them), gets SIGINT, SIGTERM, Slurm's repeated SIGTERM or SIGKILL once its first
records are on disk. A signal ends it with exit 130, no traceback, one ``interrupted:`` line
naming what was saved and the rerun, and its run lock freed; a kill leaves what it wrote (with a
half-written last line appended, as a kill mid-write leaves one). A rerun then completes and
holds every record exactly once, counted by key against the stage's inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "cli"))
DELAY_S = 0.4
WAIT_S = 180.0
FULL = pytest.mark.full

BOOT = """\
import sys, time
from prour import interrupt
interrupt.install()  # as the prour command does first (its argv[0] here is this file)
sys.path[:0] = {paths!r}
import data_scripts as scripts
import test_calibrate_cli  # registers router-test-decomposer
from prour.llm.scripted import ScriptedLLM, register_script

register_script("data-test-normalizer", scripts.normalizer_llm)
register_script("data-test-decomposer", scripts.decomposer_llm)
chat, score = ScriptedLLM.chat, ScriptedLLM.score
ScriptedLLM.chat = lambda self, requests: (time.sleep({delay}), chat(self, requests))[1]
ScriptedLLM.score = lambda self, requests: (time.sleep({delay}), score(self, requests))[1]
from prour.cli.main import main
sys.argv = ["prour", *sys.argv[1:]]
main()
"""


def _rows(path: Path) -> list[dict]:
    """The complete records of a JSONL file (a torn line is not one)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class Stage:
    """A stage's command line, its output file(s), its record key and the keys a whole run
    stores (from its inputs, not from the code under test)."""

    def __init__(self, command: str, tmp_path: Path, tiny_model_dir: Path):
        self.command, self.run = command, tmp_path / "run"
        if command == "calibrate":
            from test_calibrate_cli import make_recipe

            self.recipe, self.argv = make_recipe(tmp_path), ("--stage", "label")
            self.files = [self.run / "calibration" / f"labels_{s}.jsonl" for s in ("dev", "test")]
            self.planned = Counter({("dev", s): 1 for s in ("d1", "d2", "d3", "d4", "d5", "d6")}
                                   | {("test", s): 1 for s in ("t1", "t2", "t3")})
            return
        if command == "normalize":  # 12 tasks: two of the normalizer's batches of 8
            from test_data_cli import _recipe

            self.recipe = _recipe(tmp_path, tiny_model_dir)
            self.argv = ("--set", "data.max_tasks=12")
            self.files = [self.run / "data" / "goals.jsonl"]
            from prour.env.domains import select_tasks

            self.planned = Counter({("retail", t.id): 1
                                    for t in select_tasks("retail", "train", max_tasks=12)})
            return
        from test_stage_faults import _prepared  # collect, then normalize

        self.recipe = _prepared("extract", tmp_path, tiny_model_dir)
        self.argv = ("--no-progress", "--set", "data.concurrency=1")
        self.files = [self.run / "data" / "decisions.jsonl"]
        self.planned = None  # the decision keys: those of the uninterrupted rerun, each once

    def keys(self) -> Counter:
        if self.command == "calibrate":
            return Counter((path.stem.split("_")[1], row["state_id"])
                           for path in self.files for row in _rows(path))
        if self.command == "normalize":
            return Counter((row["domain"], row["task_id"]) for row in _rows(self.files[0]))
        return Counter(row["key"] for row in _rows(self.files[0]))

    def start(self, tmp_path: Path, log: Path, **env: str) -> subprocess.Popen:
        boot = tmp_path / "boot.py"
        paths = [str(TESTS / "data"), str(TESTS / "cli"), str(TESTS.parent)]
        boot.write_text(BOOT.format(paths=paths, delay=DELAY_S))
        with open(log, "wb") as output:
            return subprocess.Popen(
                [sys.executable, str(boot), self.command, "--recipe", str(self.recipe),
                 *self.argv], stdout=output, stderr=subprocess.STDOUT,
                env={**os.environ, **env}, cwd=tmp_path)

    def wait_for_records(self, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.keys():
            assert proc.poll() is None, f"{self.command} ended (exit {proc.returncode}) first"
            assert time.monotonic() < deadline, f"no record within {WAIT_S:g} s"
            time.sleep(0.02)


def _clean(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    return text


def _rerun_completes(stage: Stage, tmp_path: Path) -> None:
    log = tmp_path / "rerun.log"
    assert stage.start(tmp_path, log).wait(timeout=WAIT_S) == 0, log.read_text()
    _clean(log)
    stored = stage.keys()
    assert max(stored.values()) == 1, "a record stored twice"
    if stage.planned is not None:
        assert stored == stage.planned, "a record lost or stored twice"
    assert not list(stage.run.rglob(LOCK_FILE)), "the run lock was left behind"


CELLS = [pytest.param(command, how, marks=FULL) if (command, how) not in {
    ("normalize", "SIGTERM"), ("calibrate", "slurm-repeated-SIGTERM"), ("calibrate", "SIGINT"),
    ("normalize", "kill -9"), ("calibrate", "kill -9")} else (command, how)
    for command in ("normalize", "calibrate", "extract")
    for how in ("SIGINT", "SIGTERM", "slurm-repeated-SIGTERM", "kill -9")]


@pytest.mark.parametrize("command, how", CELLS)
def test_a_fault_mid_run_then_a_rerun_stores_every_record_once(tmp_path, tiny_model_dir,
                                                                command, how):
    stage = Stage(command, tmp_path, tiny_model_dir)
    log = tmp_path / "stage.log"
    proc = stage.start(tmp_path, log, **({"SLURM_JOB_ID": "4242"} if "slurm" in how else {}))
    stage.wait_for_records(proc)
    if how == "kill -9":
        proc.kill()
        assert proc.wait(timeout=WAIT_S) == -signal.SIGKILL
        newest = max((f for f in stage.files if f.exists()), key=lambda f: f.stat().st_mtime)
        with open(newest, "a") as handle:  # the record being written, cut off mid-write
            handle.write('{"domain": "retail", "task_id": "9')
    else:
        proc.send_signal(signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
        if "slurm" in how:
            time.sleep(1.5)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT, log.read_text()
        text = _clean(log)
        reports = [line for line in text.splitlines() if line.startswith("interrupted:")]
        assert len(reports) == 1, text
        rerun = f"rerun `prour {command}" + (" --stage label`" if command == "calibrate" else "`")
        assert str(stage.files[0]) in reports[0] and rerun in reports[0], reports[0]
        assert "released the lock" in reports[0] and reports[0].endswith("exit 130"), reports[0]
        assert not list(stage.run.rglob(LOCK_FILE)), "the run lock was left behind"
    saved = stage.keys()
    assert saved and max(saved.values()) == 1
    if stage.planned is not None:
        assert sum(saved.values()) < sum(stage.planned.values()), "the fault came after the work"
    _rerun_completes(stage, tmp_path)
    if stage.planned is None:  # extract: what was saved is kept, and the rerun's rows are whole
        assert set(saved) <= set(stage.keys())


def test_a_corrupt_split_left_by_an_earlier_run_is_replaced_by_extract(tmp_path, tiny_model_dir):
    """A split file that is not parquet (a disk fault, a copy cut short) in the dataset folder:
    extract writes both splits whole again and its card reads them."""
    from test_stage_faults import _extracted, _invoke, _prepared

    from prour.data.dataset import read_rows, split_path
    from prour.recipes import load_recipe

    recipe = _prepared("extract", tmp_path, tiny_model_dir)
    folder = load_recipe(recipe).data.dataset_dir
    split_path(folder, "train").parent.mkdir(parents=True, exist_ok=True)
    split_path(folder, "train").write_bytes(b"PAR1 not a parquet file")
    result = _invoke("extract", "--recipe", str(recipe), "--no-progress")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    _extracted(tmp_path / "run", result.output)
    assert len(read_rows(split_path(folder, "train"))) == 2

