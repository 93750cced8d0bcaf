"""Fuzzing the JSONL readers (fuzz_readers.READERS: results, result-lines, trajectories,
episodes, trajectory-records, metrics, goals) with near-valid files: each gives a result or one
error line naming the file and line, never a traceback; each line a skipping reader leaves out is
counted and said. Examples per test: 25 in CI (profile ``ci``), 200 under the ``full`` marker
(tests/fuzz/conftest.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fuzz_readers import check_cli, check_library, invoke, nonblank_lines
from hypothesis import given
from hypothesis import strategies as st
from jsonl_inputs import NAMES, apply, jsonl, mutation

# ---- results.jsonl: `prour report` and load_result_lines -------------------------------------

RESULT_FIELDS = ("key", "method", "variant", "domain", "task_id", "seed", "score", "success",
                 "termination", "error", "timeout", "unscored", "steps", "model_calls",
                 "model_calls_total", "seconds", "decisions", "router", "checkpoint", "sweep",
                 "turns", "generator", "question_writer")


def result_line(domain: str, task: str, seed: int, method: str, score: float,
                error: bool) -> dict[str, Any]:
    """A result line as `prour eval` writes it (prour.eval.results.result_line's fields)."""
    return {"schema": 1, "key": [domain, task, seed, method], "method": method, "variant": None,
            "domain": domain, "task_id": task, "seed": seed, "reward": score, "score": score,
            "success": score == 1.0, "termination": "error" if error else "user_stop",
            "error": error, "timeout": False, "unscored": False, "errors": [],
            "steps": {"act": 3, "clarify": 1, "verify": 0}, "turns": ["act"] * 3 + ["clarify"],
            "records": 9, "model_calls": {"agent.chat": 4}, "model_calls_total": 4,
            "seconds": 2.5, "decisions": [{"step": 0, "route": "clarify", "au": 0.4, "eu": 0.1,
                                           "total": 0.5}],
            "router": None, "generator": None, "question_writer": None, "checkpoint": None,
            "sweep": None, "episode_started_at": "t", "attention": None}


EPISODES = st.lists(
    st.tuples(st.sampled_from(["retail", "airline"]), st.sampled_from(["1", "2", "3"]),
              st.integers(0, 1), st.sampled_from(NAMES), st.sampled_from([0.0, 0.5, 1.0]),
              st.booleans(), mutation(RESULT_FIELDS)),
    min_size=1, max_size=10, unique_by=lambda e: e[:4])


def _results_file(episodes: list[tuple], torn: bool) -> bytes:
    return jsonl([apply(result_line(*spec), change) for *spec, change in episodes], torn)


@pytest.mark.slow  # ~40-60 s in CI on 2 cores
def test_report_on_fuzzed_result_lines(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(EPISODES, st.booleans())
    def run(episodes: list[tuple], torn: bool) -> None:
        data = _results_file(episodes, torn)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            run_dir, out = Path(folder) / "run", Path(folder) / "report"
            run_dir.mkdir()
            (run_dir / "results.jsonl").write_bytes(data)
            result = invoke("report", run_dir, "--n-boot", "20", "--out", out)
            error = check_cli(result, [run_dir])
            if error is not None:
                assert "no result lines" in error, error
                return
            report = json.loads((out / "report.json").read_text())
            kept = sum(system["episodes"] for system in report["systems"])
            skipped = report["skipped_lines"]
            assert kept + len(skipped) == nonblank_lines(data)  # every line counted
            markdown = (out / "report.md").read_text()
            if skipped:
                assert f"skipped {len(skipped)} result line(s)" in result.output
                assert f"Skipped {len(skipped)} result line(s)" in markdown
            assert "<script" not in markdown.lower()  # run text is escaped

    run()


def test_result_lines_are_kept_or_named(fuzz, tmp_path: Path) -> None:
    from prour.eval.harness import load_result_lines

    @fuzz
    @given(EPISODES, st.booleans())
    def run(episodes: list[tuple], torn: bool) -> None:
        data = _results_file(episodes, torn)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            path = Path(folder) / "results.jsonl"
            path.write_bytes(data)
            lines = check_library(lambda: load_result_lines(path), [path])
            assert len(lines) + len(lines.skipped) == nonblank_lines(data)
            assert all(entry.startswith(f"{path}:") for entry in lines.skipped)

    run()


# ---- trajectories: `prour score` (strict), `prour view` (skipping), read_trajectories -----------

TRAJECTORY_FIELDS = ("schema_version", "domain", "task_id", "seed", "agent", "user", "messages",
                     "steps", "termination", "reward", "seconds", "errors", "meta", "split")


def trajectory(domain: str, task: str, seed: int, agent: str, reward: float) -> dict[str, Any]:
    """A two-turn episode as prour.env.trajectory.Trajectory stores it."""
    from prour.env.trajectory import StepRecord, Trajectory

    return json.loads(Trajectory(
        domain=domain, task_id=task, seed=seed, agent=agent, user="user", reward=reward,
        termination="user_stop",
        messages=[{"role": "system", "content": "policy"}, {"role": "assistant", "content": "Hi"},
                  {"role": "user", "content": "Thanks ###STOP###"}],
        steps=[StepRecord(kind="agent_message", message_index=1, meta={"greeting": True}),
               StepRecord(kind="user_message", message_index=2)]).to_json())


TRAJECTORIES = st.lists(
    st.tuples(st.sampled_from(["retail", "airline", "nowhere"]), st.sampled_from(["5", "no-task"]),
              st.integers(0, 2), st.sampled_from(NAMES), st.sampled_from([0.0, 1.0]),
              mutation(TRAJECTORY_FIELDS)),
    min_size=1, max_size=3, unique_by=lambda e: e[:4])


def _trajectories_file(specs: list[tuple], torn: bool) -> bytes:
    return jsonl([apply(trajectory(*spec), change) for *spec, change in specs], torn)


def test_score_on_fuzzed_trajectories(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(TRAJECTORIES, st.booleans())
    def run(specs: list[tuple], torn: bool) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            path = Path(folder) / "trajectories.jsonl"
            path.write_bytes(_trajectories_file(specs, torn))
            result = invoke("score", path)
            if result.exit_code == 1 and isinstance(result.exception, (SystemExit, type(None))):
                # scored, and some episode disagreed or failed to score: a result, each named
                assert "Traceback" not in result.output and "episodes:" in result.output
                assert not any(line.startswith("error: ") for line in result.output.splitlines())
                return
            error = check_cli(result, [path])
            if error is not None:  # strict: the first bad line refuses the file, by number
                assert f"{path}:" in error, error

    run()


def test_view_on_fuzzed_episodes(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(TRAJECTORIES, st.booleans(), EPISODES)
    def run(specs: list[tuple], torn: bool, results: list[tuple]) -> None:
        data = _trajectories_file(specs, torn)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            run_dir = Path(folder) / "run"
            run_dir.mkdir()
            (run_dir / "episodes.jsonl").write_bytes(data)
            (run_dir / "results.jsonl").write_bytes(_results_file(results, False))
            result = invoke("view", run_dir, "--out", Path(folder) / "site")
            if check_cli(result, [run_dir]) is not None:
                return
            index = (Path(folder) / "site" / "index.html").read_text()
            pages = len(list((Path(folder) / "site").glob("episode-*.html")))
            skipped = nonblank_lines(data) - pages  # keys are unique: one page per good line
            if skipped:
                assert f"{skipped} unreadable line" in index
                assert f"{skipped} unreadable line" in result.output
            assert "<script>" not in index

    run()


def test_trajectory_records_are_kept_or_named(fuzz, tmp_path: Path) -> None:
    from prour.env.trajectory import read_trajectories

    @fuzz
    @given(TRAJECTORIES, st.booleans(), st.sampled_from(["raise", "skip"]))
    def run(specs: list[tuple], torn: bool, on_error: str) -> None:
        data = _trajectories_file(specs, torn)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            path = Path(folder) / "trajectories.jsonl"
            path.write_bytes(data)
            records = check_library(lambda: read_trajectories(path, on_error), [f"{path}:"])
            if not isinstance(records, Exception):
                assert len(records) + len(records.skipped) == nonblank_lines(data)

    run()


# ---- metrics.jsonl: `prour train report` -----------------------------------------------------


def metrics_line(step: int, verl: bool, reward: float) -> dict[str, Any]:
    """One step's metrics as the local trainer (flat) or verl's file logger (``data``) logs it."""
    from prour.train.metrics import PHASE_KEYS, STEP_TIME_KEY

    times = {key: 1.0 for key in PHASE_KEYS} | {STEP_TIME_KEY: float(len(PHASE_KEYS))}
    values = {"reward_mean": reward, "ask_fraction": 0.5, "entropy": 1.2, "lr": 1e-6, **times}
    if verl:
        return {"step": step, "data": {"training/prour/reward_mean": reward,
                                       "actor/entropy": 1.2, "actor/lr": 1e-6}}
    return {"step": step, **values}


METRIC_FIELDS = ("reward_mean", "ask_fraction", "entropy", "lr", "data", "time_step_s",
                 "time_generation_s")
METRICS = st.lists(st.tuples(st.booleans(), st.floats(-1, 1),
                             st.one_of(mutation(METRIC_FIELDS),
                                       st.just(("drop", "step")))),
                   min_size=1, max_size=8)


@pytest.mark.slow  # ~40-60 s in CI on 2 cores
def test_train_report_on_fuzzed_metrics(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(METRICS, st.booleans())
    def run(specs: list[tuple], torn: bool) -> None:
        # steps are unique and never set by a mutation (only dropped): no line replaces another
        data = jsonl([apply(metrics_line(step, verl, reward), change)
                      for step, (verl, reward, change) in enumerate(specs, start=1)], torn)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            output = Path(folder) / "train"
            output.mkdir()
            (output / "metrics.jsonl").write_bytes(data)
            result = invoke("train", "report", output, "--out", Path(folder) / "report")
            error = check_cli(result, [output])
            if error is not None:
                assert "no complete step" in error, error
                return
            report = json.loads((Path(folder) / "report" / "training_report.json").read_text())
            skipped = report["skipped_lines"]
            assert report["steps"] + len(skipped) == nonblank_lines(data)
            if skipped:
                assert f"skipped {len(skipped)} metrics line(s)" in result.output
                markdown = (Path(folder) / "report" / "training_report.md").read_text()
                assert f"skipped {len(skipped)} line(s) that hold no step record" in markdown

    run()


# ---- goals.jsonl: load_goals ------------------------------------------------------------------

GOAL_FIELDS = ("sha256", "instruction", "goal", "missing", "model", "prompt_version")
# domain and task id are dropped, never set: no line replaces another, so every line is counted
GOALS = st.lists(st.tuples(st.sampled_from(["retail", "airline"]), st.sampled_from(NAMES),
                           st.one_of(mutation(GOAL_FIELDS),
                                     st.tuples(st.just("drop"),
                                               st.sampled_from(["domain", "task_id"])))),
                 min_size=1, max_size=6, unique_by=lambda g: g[:2])


def test_goals_are_kept_or_named(fuzz, tmp_path: Path) -> None:
    from prour.data.normalize import load_goals

    @fuzz
    @given(GOALS, st.booleans(), st.sampled_from(["error", "skip"]))
    def run(specs: list[tuple], torn: bool, on_bad_line: str) -> None:
        lines = [apply({"domain": domain, "task_id": task, "sha256": "ab", "instruction": "i",
                        "goal": "g", "missing": [], "model": "m", "prompt_version": "v1"},
                       change) for domain, task, change in specs]
        data = jsonl(lines, torn)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            path = Path(folder) / "goals.jsonl"
            path.write_bytes(data)
            goals = check_library(lambda: load_goals(path, on_bad_line), [f"{path}:"])
            if isinstance(goals, Exception):
                assert on_bad_line == "error"
                return
            assert len(goals) + len(goals.skipped) == nonblank_lines(data)
            assert all(isinstance(g.goal, str) and isinstance(g.task_id, str)
                       and isinstance(g.missing, list) for g in goals.values())

    run()
