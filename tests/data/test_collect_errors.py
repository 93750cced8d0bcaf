"""Collection that fails when it fails: the error share (``data.max_error_fraction``), retrying
errored episodes on the next run, repairing a torn last line, and one provenance record per
collected file. The broken backend is a small local HTTP server that answers every chat request
with HTTP 500 (a server whose engine died); the working one is the scripted model of the other
data tests. A real vLLM server killed mid-collection: test_collect_vllm.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import data_scripts as scripts
import pytest
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.config.data import DataConfig
from prour.config.eval import EvalConfig
from prour.data.collect import (
    AGENT_NAME,
    check_collection,
    compact_trajectories,
    load_trajectories,
)
from prour.env.runner import TooManyErrors
from prour.env.trajectory import Trajectory
from prour.files import append_jsonl

SERVED = "tiny"
BROKEN = "the engine died: CUDA error: an illegal memory access"


class BrokenBackend:
    """An OpenAI-style server that lists its model (preflight passes) and answers every POST with
    HTTP 500 and an error body."""

    def __init__(self) -> None:
        self.posts = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply(200, {"object": "list", "data": [{"id": SERVED, "object": "model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                backend.posts += 1
                self._reply(500, {"error": {"message": BROKEN, "type": "InternalServerError"}})

        return Handler


@pytest.fixture
def broken_backend() -> Iterator[BrokenBackend]:
    backend = BrokenBackend()
    backend.thread.start()
    try:
        yield backend
    finally:
        backend.httpd.shutdown()
        backend.httpd.server_close()


def _recipe(tmp_path: Path, **data: Any) -> Path:
    files = scripts.write_script_files(tmp_path / "scripts")
    recipe = {
        "name": "collect-errors",
        "run_dir": str(tmp_path / "run"),
        "models": {role: {"backend": "scripted", "script": str(files[role])}
                   for role in ("agent", "user", "teacher")},
        "env": {"max_steps": 12},
        "data": {"num_trajectories": 2, "trial_seeds": [0, 1], "max_tasks": 2, "concurrency": 2,
                 **data},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _broken_agent(backend: BrokenBackend) -> list[str]:
    """``--set`` values pointing the task agent at the broken server (one quick retry)."""
    return ["--set", "models.agent.backend=openai", "--set", f"models.agent.base_url={backend.url}",
            "--set", f"models.agent.model={SERVED}", "--set", "models.agent.script=null",
            "--set", "models.agent.max_retries=1"]


def collect(recipe: Path, *args: str):
    return CliRunner().invoke(app, ["collect", "--recipe", str(recipe), "--no-progress", *args],
                              catch_exceptions=False)


def _trajectory(task_id: str, seed: int, error: str | None = None) -> Trajectory:
    return Trajectory(domain="retail", task_id=task_id, seed=seed, agent=AGENT_NAME, user="llm",
                      termination="error" if error else "user_stop",
                      errors=[error] if error else [], reward=None if error else 1.0)


def _keys(path: Path) -> list[tuple[str, int]]:
    """The (task, seed) of every line of a trajectories file, in file order."""
    return [(json.loads(line)["task_id"], json.loads(line)["seed"])
            for line in path.read_text().splitlines()]


def test_the_error_share_names_the_most_common_error() -> None:
    refused = "BackendError: POST http://h:1/v1/chat/completions: HTTP 500: dead"
    timeout = "BackendError: timed out after 5 s"
    trajs = [_trajectory("0", 0), _trajectory("1", 0, refused), _trajectory("2", 0, timeout),
             _trajectory("3", 0, refused)]
    check_collection(trajs, DataConfig(max_error_fraction=0.75))  # 3 of 4 is not more than 3/4
    with pytest.raises(TooManyErrors) as info:
        check_collection(trajs, DataConfig(max_error_fraction=0.5))
    assert str(info.value).startswith(
        "3 of 4 episodes ended in an error (75%, more than data.max_error_fraction=0.5); "
        f"most common (2 of 3): {refused}. Fix the cause and rerun the same command: it runs the "
        "errored episodes again")
    check_collection(trajs[:1], DataConfig(max_error_fraction=0.0))  # none errored
    assert DataConfig().max_error_fraction == EvalConfig().max_error_fraction == 0.1


def test_collect_against_a_backend_answering_500_exits_1_naming_it_and_retries_later(
        tmp_path: Path, broken_backend: BrokenBackend) -> None:
    recipe = _recipe(tmp_path)
    out = tmp_path / "run" / "data" / "trajectories.jsonl"
    result = collect(recipe, *_broken_agent(broken_backend))
    assert result.exit_code == 1, result.output
    assert "2 trajectories in" in result.output and "2 errored" in result.output
    # the summary counts the retries that did not help: each episode's first call retried once
    assert ("retried: 0 errored episode(s) of an earlier run, 2 request(s) after a transient "
            "backend error") in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert error_lines == [
        "error: 2 of 2 episodes ended in an error (100%, more than data.max_error_fraction=0.1); "
        f"most common (2 of 2): BackendError: POST {broken_backend.url}/chat/completions failed "
        f"after 2 attempt(s); last error: HTTP 500: {BROKEN} (at openai.py:"
        + error_lines[0].split("(at openai.py:")[1]]
    assert error_lines[0].endswith("Fix the cause and rerun the same command: it runs the errored "
                                   "episodes again and keeps the others")
    assert "Traceback" not in result.output
    assert broken_backend.posts == 4  # each episode's first agent call, tried twice
    assert [t.termination for t in load_trajectories(out, "error")] == ["error", "error"]
    errored_order = _keys(out)  # the order the two episodes finished in

    # The backend is fixed (here: the scripted agent) and the plan grows to 4 episodes: the two
    # errored ones run again in place, the two new ones are appended, each key once.
    result = collect(recipe, "--set", "data.num_trajectories=4")
    assert result.exit_code == 0, result.output
    assert "4 trajectories in" in result.output and "0 errored" in result.output
    assert ("retried: 2 errored episode(s) of an earlier run, 0 request(s) after a transient "
            "backend error") in result.output
    keys = _keys(out)
    assert keys[:2] == errored_order and sorted(keys[2:]) == [("0", 1), ("1", 1)]
    stored = load_trajectories(out, "error")
    assert stored.duplicates == 0 and all(t.termination == "user_stop" for t in stored)

    result = collect(recipe, "--set", "data.num_trajectories=4")  # nothing left to do
    assert result.exit_code == 0 and "4 trajectories in" in result.output
    assert out.read_text().count("\n") == 4


def test_within_the_error_share_collect_succeeds_and_keeps_the_errored(
        tmp_path: Path, broken_backend: BrokenBackend) -> None:
    recipe = _recipe(tmp_path, max_error_fraction=1.0)
    result = collect(recipe, *_broken_agent(broken_backend))
    assert result.exit_code == 0, result.output
    assert "2 errored" in result.output and "error:" not in result.output


def test_a_torn_last_line_is_repaired_when_collect_resumes(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    out = tmp_path / "run" / "data" / "trajectories.jsonl"
    assert collect(recipe, "--set", "data.num_trajectories=1").exit_code == 0
    whole = out.read_bytes()
    second = whole.replace(b'"task_id":"0"', b'"task_id":"1"')
    out.write_bytes(whole + second[: len(second) // 2])  # a crash in the middle of line 2
    with pytest.raises(ValueError, match=rf"{out}:2: not valid JSON"):
        load_trajectories(out, "error")

    result = collect(recipe)
    assert result.exit_code == 0, result.output
    assert (f"repaired {out}:2: removed the torn last line ({len(second) // 2} bytes cut by a "
            "crash mid-write); its episode runs again") in result.output
    stored = load_trajectories(out, "error")  # extract's default: no --on-bad-line skip needed
    assert sorted(t.key[1:3] for t in stored) == [("0", 0), ("1", 0)]
    assert out.read_bytes().startswith(whole)  # the episode before the tear was kept, not rerun


def test_compaction_keeps_one_line_per_key_in_place(tmp_path: Path) -> None:
    path = tmp_path / "traj.jsonl"
    append_jsonl(path, _trajectory("0", 0, "BackendError: down"))
    append_jsonl(path, _trajectory("1", 0))
    with open(path, "a") as handle:
        handle.write('["not a record"]\n')  # a corrupt line: kept for the readers to report
        handle.write('{"schema_version": 1, "domain": "ret\n')  # torn, then appended after
    append_jsonl(path, _trajectory("0", 0))  # the retry of the errored episode
    retry = _trajectory("2", 0).to_json()
    with open(path, "a") as handle:
        handle.write(retry)  # a whole record whose newline was never written

    done = compact_trajectories(path)
    assert done.superseded == 1
    torn = (f"repaired {path}:4: removed a line torn by an earlier crash (36 bytes); its episode "
            "runs again")
    assert done.notes == [torn, f"repaired {path}:6: the last line lacked its newline; added it"]
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and lines[2] == '["not a record"]' and lines[3] == retry
    records = [json.loads(lines[i]) for i in (0, 1, 3)]
    assert [(r["task_id"], r["termination"]) for r in records] == [
        ("0", "user_stop"), ("1", "user_stop"), ("2", "user_stop")]
    before = path.stat().st_mtime_ns
    assert compact_trajectories(path).notes == [] and path.stat().st_mtime_ns == before


def test_each_collection_keeps_its_own_provenance(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, num_trajectories=1)
    run = tmp_path / "run"
    assert collect(recipe).exit_code == 0
    result = collect(recipe, "--set", "data.domain=airline",
                     "--set", "data.trajectories=data/airline_trajectories.jsonl")
    assert result.exit_code == 0, result.output
    kept = {}
    for name, domain in (("trajectories.jsonl", "retail"),
                         ("airline_trajectories.jsonl", "airline")):
        folder = run / "provenance" / "collect" / "data" / name
        record = json.loads((folder / "provenance.json").read_text())
        resolved = yaml.safe_load((folder / "recipe.resolved.yaml").read_text())
        assert record["stage"] == "collect" and record["output"] == str(run / "data" / name)
        assert resolved["data"]["domain"] == domain
        kept[name] = record
    assert len(kept) == 2


def test_an_interrupted_collection_counts_what_it_saved_by_key(tmp_path: Path) -> None:
    from prour.cli.collect import _saved_trajectories

    path = tmp_path / "traj.jsonl"
    append_jsonl(path, _trajectory("0", 0, "BackendError: down"))
    append_jsonl(path, _trajectory("1", 0, "BackendError: down"))
    append_jsonl(path, _trajectory("0", 0))  # a retry, the run stopped before compacting
    assert _saved_trajectories(path) == (
        f"2 trajectories saved in {path} (1 errored: the rerun runs them again)")
    assert _saved_trajectories(tmp_path / "none.jsonl") == (
        f"0 trajectories saved in {tmp_path / 'none.jsonl'}")
