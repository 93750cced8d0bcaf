"""`prour view` on hand-made run folders (no browser): which episodes the index shows and under
which label, so that its counts and means are those of the report."""

from __future__ import annotations

import re
from pathlib import Path

from prour.env.trajectory import StepRecord, Trajectory
from prour.eval.viewer import write_site
from prour.files import append_jsonl


def _episode(agent: str, reward: float | None, started_at: str, seconds: float,
             termination: str = "agent_stop") -> Trajectory:
    """A one-turn retail episode of task 7, seed 0: the user asks, the agent acts once."""
    return Trajectory(
        domain="retail", task_id="7", seed=0, agent=agent, user="user", started_at=started_at,
        seconds=seconds, reward=reward, termination=termination,
        errors=["server gone"] if termination == "error" else [],
        messages=[{"role": "user", "content": "I want a refund."},
                  {"role": "assistant", "content": "Done."}],
        steps=[StepRecord(kind="user_message", message_index=0),
               StepRecord(kind="agent_message", message_index=1,
                          meta={"route": "act", "turn": "act"})],
    )


def _line(traj: Trajectory, method: str, **fields) -> dict:
    """The fields of a result line the viewer reads."""
    return {"key": list(traj.key), "method": method, "variant": None, "attention": None,
            "episode_started_at": traj.started_at, "seconds": traj.seconds, **fields}


def _reward_cells(index: str) -> list[str]:
    """The per-method table's rows: method, episodes, mean reward."""
    methods = index.split('id="methods"')[1]
    return [re.findall(r"<td>(.*?)</td>", row)[:3] for row in methods.split("<tr>")[2:]]


def test_a_rerun_episode_replaces_its_errored_attempt(tmp_path: Path) -> None:
    """retry_errors appends the rerun after the errored attempt (same key): the viewer shows the
    rerun alone, as the results, the report and the tau2 export count it."""
    run = tmp_path / "run"
    errored = _episode("base", None, "2026-12-01T10:00:00", 2.0, termination="error")
    rerun = _episode("base", 1.0, "2026-12-01T11:00:00", 30.0)
    for traj in (errored, rerun):
        append_jsonl(run / "episodes.jsonl", traj)
        append_jsonl(run / "results.jsonl", _line(traj, "base"))
    index = write_site(run).read_text()
    assert "1 episodes" in index
    assert _reward_cells(index) == [["base", "1", "1.000"]]
    assert len(list((run / "view").glob("episode-*.html"))) == 1
    [page] = (run / "view").glob("episode-*.html")
    assert "server gone" not in page.read_text() and "30.0 s" in page.read_text()


def test_sweep_points_and_checkpoint_steps_are_apart(tmp_path: Path) -> None:
    """One task and seed under two router budgets and two checkpoint steps: four arms (the report
    reports four systems), so four columns and four rows of means, each of one episode."""
    run = tmp_path / "run"
    arms = [("prour [budget=1 every_n=1]", {"router.budget": 1, "router.every_n": 1}, None, 1.0),
            ("prour [budget=inf every_n=1]", {"router.budget": None, "router.every_n": 1}, None,
             0.0),
            ("prour [step 10]", None, {"name": "t", "step": 10}, 0.0),
            ("prour [step 20]", None, {"name": "t", "step": 20}, 1.0)]
    for number, (agent, sweep, checkpoint, reward) in enumerate(arms):
        traj = _episode(agent, reward, f"2026-12-01T10:0{number}:00", 10.0 + number)
        append_jsonl(run / "episodes.jsonl", traj)
        append_jsonl(run / "results.jsonl",
                     _line(traj, "prour", sweep=sweep, checkpoint=checkpoint))
    index = write_site(run).read_text()
    assert _reward_cells(index) == sorted(
        [[agent, "1", f"{reward:.3f}"] for agent, _, _, reward in arms])
    header = index.split('id="tasks"')[1].split("</thead>")[0]
    assert re.findall(r"<th>(.*?)</th>", header) == ["domain", "task",
                                                     *sorted(a for a, *_ in arms)]


def test_a_line_torn_by_a_crash_is_skipped_and_named(tmp_path: Path) -> None:
    """A crash mid-append leaves a torn line; the resumed run appends after it (append_jsonl
    starts a fresh line), and results.jsonl may be torn too. The run is still viewed, as the
    harness and the report read it, and the index names what it skipped."""
    run = tmp_path / "run"
    first = _episode("base", 1.0, "2026-12-01T10:00:00", 10.0)
    later = _episode("base", 0.0, "2026-12-01T10:05:00", 12.0).model_copy(update={"task_id": "8"})
    append_jsonl(run / "episodes.jsonl", first)
    with open(run / "episodes.jsonl", "a") as handle:
        handle.write('{"schema_version": 1, "domain": "ret')  # the crash
    append_jsonl(run / "episodes.jsonl", later)
    append_jsonl(run / "results.jsonl", _line(first, "base"))
    with open(run / "results.jsonl", "a") as handle:
        handle.write('{"key": ["retail", "8"')
    index = write_site(run).read_text()
    assert "2 episodes" in index and "1 unreadable line of episodes.jsonl skipped (line 2)" in index
    assert _reward_cells(index) == [["base", "2", "0.500"]]


def test_a_site_written_again_keeps_only_its_own_pages(tmp_path: Path) -> None:
    """The same --out for a second, smaller run: the pages of the first run that the new index
    does not link are gone, and the command counts the pages of this run."""
    from typer.testing import CliRunner

    from prour.cli.main import app

    runs = {"a": ["base", "prour"], "b": ["base"]}
    for name, agents in runs.items():
        for number, agent in enumerate(agents):
            append_jsonl(tmp_path / name / "episodes.jsonl",
                         _episode(agent, 1.0, f"2026-12-01T10:0{number}:00", 5.0))
    site = tmp_path / "site"
    for name, agents in runs.items():
        done = CliRunner().invoke(app, ["view", str(tmp_path / name), "--out", str(site)])
        assert done.exit_code == 0, done.output
        assert f"({len(agents)} episode pages)" in done.output
    index = (site / "index.html").read_text()
    pages = sorted(p.name for p in site.glob("episode-*.html"))
    assert len(pages) == 1 and f'href="{pages[0]}"' in index
