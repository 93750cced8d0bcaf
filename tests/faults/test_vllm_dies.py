"""The "vLLM dies mid-step" cells of normalize, calibrate --stage label, extract, eval and
``prour run`` (tests/faults/matrix.py lists every cell; collect's is
tests/data/test_collect_vllm.py): the command's model is the tiny model on a real vLLM CPU
server, which is killed (SIGKILL to its process group: no goodbye) once the first records are
on disk. The command exits 1 with one
error line naming the server and no traceback, no lock is left; with the server back on the same
address a rerun completes and holds every record exactly once, counted by key against what the
command was asked for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from test_collect_vllm import SERVED, SERVER_ARGS, START_TIMEOUT_S, _servable
from test_stage_signals import _rows

from prour.cluster.vllm_server import VLLMServer, free_port
from prour.runlock import LOCK_FILE

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.full]  # ~2 server starts each
WAIT_S = 600


def _served(base_url: str, **more) -> dict:
    return {"backend": "openai", "base_url": base_url, "model": SERVED, "max_retries": 1,
            "timeout_s": 120, **more}


class Case:
    """A command on the served tiny model: its argv, the file its records go to, their keys and
    the keys a whole run stores."""

    def __init__(self, command: str, tmp_path: Path, base_url: str, tiny_model_dir: Path):
        self.command, self.run = command, tmp_path / "run"
        if command == "extract":  # collected and normalized (scripted), then decomposed
            from test_stage_faults import _prepared

            self.recipe = _prepared("extract", tmp_path, tiny_model_dir)
            data = yaml.safe_load(self.recipe.read_text())
            data["models"]["decomposer"] = _served(base_url)
            data["router"].update(n_interpretations=2, n_actions=2, goal_max_tokens=16,
                                  action_max_tokens=32)
            data["data"]["concurrency"] = 1
            self.recipe.write_text(yaml.safe_dump(data))
            self.argv = ["extract", "--recipe", str(self.recipe), "--no-progress"]
            self.file = self.run / "data" / "decisions.jsonl"
            self.key = lambda r: r["key"]
            self.planned = None
        elif command == "normalize":  # 12 tasks: two of the normalizer's batches of 8
            from prour.env.domains import select_tasks

            self.recipe = self._write(tmp_path, {
                "name": "n", "run_dir": str(self.run),
                "models": {"normalizer": _served(base_url)},
                "data": {"max_tasks": 12, "normalizer_max_tokens": 64}})
            self.argv = ["normalize", "--recipe", str(self.recipe)]
            self.file = self.run / "data" / "goals.jsonl"
            self.key = lambda r: (r["domain"], r["task_id"])
            self.planned = Counter({("retail", t.id): 1
                                    for t in select_tasks("retail", "train", max_tasks=12)})
        elif command == "calibrate":  # dev labels in one call, then test labels in another
            from test_calibrate_cli import make_recipe

            self.recipe = make_recipe(tmp_path)
            data = yaml.safe_load(self.recipe.read_text())
            data["models"]["annotator"] = _served(base_url)
            self.recipe.write_text(yaml.safe_dump(data))
            self.argv = ["calibrate", "--recipe", str(self.recipe), "--stage", "label"]
            self.file = self.run / "calibration" / "labels_dev.jsonl"
            self.key = lambda r: r["state_id"]
            self.planned = None  # counted over both splits in check()
        else:  # eval or prour run: episodes of the served agent, each a few requests
            from test_harness import USER_RULES

            user = tmp_path / "user.yaml"
            user.write_text(yaml.safe_dump(USER_RULES))
            models = {"agent": _served(base_url),
                      "user": {"backend": "scripted", "script": str(user)},
                      "teacher": {"backend": "scripted", "script": str(user)}}
            self.recipe = self._write(tmp_path, {
                "name": "e", "run_dir": str(self.run), "models": models,
                "env": {"max_steps": 4, "agent_max_tokens": 8},
                "data": {"num_trajectories": 4, "trial_seeds": [0], "max_tasks": 4,
                         "concurrency": 1, "teacher": False},
                "eval": {"methods": ["base"], "seeds": [0], "domains": ["retail"],
                         "max_tasks": 4, "concurrency": 1}})
            if command == "eval":
                self.argv = ["eval", "--recipe", str(self.recipe), "--no-progress"]
                self.file = self.run / "eval" / "episodes.jsonl"
            else:
                self.argv = ["run", "--recipe", str(self.recipe), "--only", "collect-retail"]
                self.file = self.run / "data" / "trajectories.jsonl"
            self.key = lambda r: (r["task_id"], r["seed"])
            self.planned = None  # 4 tasks x 1 seed, each once, none errored: check()

    @staticmethod
    def _write(tmp_path: Path, data: dict) -> Path:
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def start(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "prour.cli.main", *self.argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)

    def check(self) -> None:
        """Every record exactly once after the rerun (the last one per key counts for eval and
        collect, whose errored episodes are stored and then run again)."""
        if self.command == "calibrate":
            for split, ids in (("dev", ["d1", "d2", "d3", "d4", "d5", "d6"]),
                               ("test", ["t1", "t2", "t3"])):
                rows = _rows(self.run / "calibration" / f"labels_{split}.jsonl")
                assert Counter(r["state_id"] for r in rows) == Counter(ids), (split, rows)
            return
        rows = _rows(self.file)
        if self.command == "extract":  # each decision once
            assert rows and max(Counter(self.key(r) for r in rows).values()) == 1
            return
        if self.planned is not None:  # normalize: a goal is written again only if it was empty
            assert set(Counter(self.key(r) for r in rows)) == set(self.planned)
            earlier: dict = {}
            for row in rows:
                key = self.key(row)
                assert key not in earlier or not earlier[key]["goal"], row  # retried: was empty
                earlier[key] = row
            return
        last = {self.key(r): r for r in rows}
        assert len(last) == 4 and all(r["termination"] != "error" for r in last.values())
        if self.command == "prour run":  # collect compacts its file: each key once
            assert len(rows) == 4


@pytest.mark.parametrize("command", ["normalize", "calibrate", "extract", "eval", "prour run"])
def test_the_model_server_dies_mid_step_then_a_rerun_completes(tmp_path, vllm_python,
                                                               tiny_model_dir, command):
    model = _servable(tiny_model_dir, tmp_path / "model")
    port = free_port()

    def server() -> VLLMServer:
        return VLLMServer(model, python=vllm_python, served_name=SERVED, port=port,
                          max_model_len=16384, extra_args=SERVER_ARGS)

    first = server().start(timeout_s=START_TIMEOUT_S)
    case = Case(command, tmp_path, first.base_url, tiny_model_dir)
    try:
        proc = case.start()
        deadline = time.monotonic() + WAIT_S
        while not _rows(case.file) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the command ended before the server died: " + (
            proc.communicate()[0][-3000:])
        assert first.pid is not None
        os.killpg(first.pid, signal.SIGKILL)
        output = proc.communicate(timeout=WAIT_S)[0]
    finally:
        first.stop()
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-3000:]
    assert first.base_url.removesuffix("/v1") in errors[0], errors[0]
    assert not list(case.run.rglob(LOCK_FILE)), "a run lock was left behind"

    with server().start(timeout_s=START_TIMEOUT_S):  # back, on the same address
        rerun = case.start()
        output = rerun.communicate(timeout=WAIT_S)[0]
    assert rerun.returncode == 0, output[-3000:]
    case.check()
    assert not list(case.run.rglob(LOCK_FILE))
