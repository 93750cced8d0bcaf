"""A ``prour eval`` run in tau2's results format and back: the files the harness writes load in
tau2's own ``Results`` model and tau2 view's metrics, import with ``prour import tau2`` and
re-score with ``prour score`` to the rewards the run recorded; ``prour export tau2`` writes the
same files again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from method_run import run_method
from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.tau2_export import EXPORT_DIR, export_episodes
from prour.env.trajectory import read_trajectories


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The routed method on eval_world's tasks (retail 5 and airline 2 fail, 65 and 26 pass):
    tool calls, clarify questions and verification notes in one run."""
    return run_method("prour", tmp_path_factory.mktemp("tau2-export"))


def _load(path: Path):
    from tau2.data_model.simulation import Results

    return Results.load(path)


def test_eval_writes_one_tau2_file_per_domain_that_tau2_reads(run) -> None:
    from tau2.data_model.message import ToolMessage
    from tau2.metrics.agent_metrics import compute_metrics

    assert any(t.steps_of("agent_note") for t in run.trajectories)  # notes tau2 never sees
    files = sorted((run.run_dir / EXPORT_DIR).glob("*.json"))
    assert [f.name for f in files] == ["airline__prour.json", "retail__prour.json"]
    for path in files:
        results = _load(path)
        domain = results.info.environment_info.domain_name
        mine = {(t.task_id, t.seed): t for t in run.trajectories if t.domain == domain}
        assert path.name.startswith(domain)
        assert results.info.agent_info.implementation == "prour"
        assert {(s.task_id, s.seed): s.reward_info.reward for s in results.simulations} == \
            {key: t.reward for key, t in mine.items()}
        assert sorted(t.id for t in results.tasks) == sorted({tid for tid, _ in mine})
        # tau2 view's metrics of the file: the mean of the rewards the run recorded
        expected = sum(t.reward for t in mine.values()) / len(mine)
        assert compute_metrics(results).avg_reward == pytest.approx(expected)
        for sim in results.simulations:
            open_calls: set[str] = set()
            for message in sim.messages:
                assert message.role != "system"
                assert not (message.content or "").startswith("[Verification]")
                if isinstance(message, ToolMessage):
                    assert message.id in open_calls, (sim.id, message.id)
                    open_calls.remove(message.id)
                for call in getattr(message, "tool_calls", None) or []:
                    open_calls.add(call.id)
            assert not open_calls  # every call answered under its own id
            calls = [m for m in sim.messages if getattr(m, "tool_calls", None)]
            assert calls, sim.id  # the scripted agent looks something up in every episode


def test_round_trip_import_and_rescore_keep_every_reward(run, tmp_path) -> None:
    files = sorted(str(p) for p in (run.run_dir / EXPORT_DIR).glob("*.json"))
    imported = _cli("import", "tau2", *files, "--run-dir", str(tmp_path))
    assert imported.exit_code == 0, imported.output
    assert f"{len(run.trajectories)} trajectories added" in imported.output
    back = read_trajectories(tmp_path / "trajectories.jsonl")
    original = {(t.domain, t.task_id, t.seed): t.reward for t in run.trajectories}
    assert {(t.domain, t.task_id, t.seed): t.reward for t in back} == original
    assert set(original.values()) == {0.0, 1.0}
    assert {t.agent for t in back} == {"tau2:prour"}
    for traj in back:  # the greeting comes back as a greeting, not as decision 0
        assert traj.steps[0].meta == {"greeting": True}
    scored = _cli("score", str(tmp_path))
    assert scored.exit_code == 0, scored.output
    for domain in ("retail", "airline"):
        assert f"{domain}: 2 episodes: 2 agree" in scored.output
    again = _cli("import", "tau2", *files, "--run-dir", str(tmp_path))
    assert "0 trajectories added" in again.output


def test_export_command_rewrites_the_same_files(run) -> None:
    folder = run.run_dir / EXPORT_DIR
    before = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    for path in folder.glob("*.json"):
        path.unlink()
    result = _cli("export", "tau2", str(run.run_dir))
    assert result.exit_code == 0, result.output
    assert "2 tau2 results file(s)" in result.output
    assert {p.name: p.read_bytes() for p in folder.glob("*.json")} == before
    missing = _cli("export", "tau2", str(run.run_dir / "nowhere"))
    assert missing.exit_code == 2 and "episodes.jsonl: missing" in missing.output


def test_an_errored_episode_exports_as_agent_error_scored_zero(run, tmp_path) -> None:
    [traj] = [t.model_copy(deep=True) for t in run.trajectories
              if (t.domain, t.task_id) == ("retail", "65")]
    traj.termination, traj.reward, traj.errors = "error", None, ["backend timed out"]
    [path] = export_episodes([traj], tmp_path, max_steps=16, max_errors=10, git_commit="c0ffee")
    [sim] = _load(path).simulations
    assert sim.termination_reason.value == "agent_error"
    assert sim.reward_info.reward == 0.0 and "ended early (error)" in sim.reward_info.info["note"]
    assert json.loads(path.read_text())["info"]["git_commit"] == "c0ffee"
    assert _cli("import", "tau2", str(path), "--run-dir", str(tmp_path)).exit_code == 0
    [back] = read_trajectories(tmp_path / "trajectories.jsonl")
    assert back.termination == "error" and back.reward == 0.0
