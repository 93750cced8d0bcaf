"""Trajectory records: JSON round trip, schema version, atomic appends, corrupt-line reports."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from prour.env.trajectory import (
    SCHEMA_VERSION,
    StepRecord,
    Trajectory,
    agent_view,
    read_jsonl,
    read_trajectories,
    user_view,
)
from prour.files import append_jsonl


def _trajectory(task_id: str = "1", seed: int = 0) -> Trajectory:
    messages = [
        {"role": "system", "content": "policy"},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "my phone"},
        {
            "role": "user",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "toggle_data", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "toggle_data", "content": "Data is ON"},
        {"role": "user", "content": "done"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_bill", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_bill", "content": "42"},
        {"role": "system", "content": "note for the agent"},
        {"role": "assistant", "content": "bye"},
    ]
    kinds = [
        ("agent_message", None),
        ("user_message", None),
        ("user_tool_call", "user"),
        ("tool_result", "user"),
        ("user_message", None),
        ("agent_tool_call", "assistant"),
        ("tool_result", "assistant"),
        ("agent_note", None),
        ("agent_message", None),
    ]
    steps = [
        StepRecord(kind=kind, message_index=i + 1, requestor=req, seconds=0.5)
        for i, (kind, req) in enumerate(kinds)
    ]
    return Trajectory(
        domain="telecom",
        task_id=task_id,
        seed=seed,
        agent="llm",
        user="scripted",
        messages=messages,
        steps=steps,
        termination="user_stop",
        reward=1.0,
        reward_breakdown={"checks": {"ENV_ASSERTION": 1.0}},
    )


def test_round_trip_and_key() -> None:
    traj = _trajectory()
    line = traj.to_json()
    assert "\n" not in line
    again = Trajectory.from_json(line)
    assert again == traj
    assert again.key == ("telecom", "1", 0, "llm")
    assert json.loads(line)["schema_version"] == SCHEMA_VERSION


def test_unknown_schema_version_is_refused() -> None:
    data = json.loads(_trajectory().to_json())
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="schema_version 2 is not supported"):
        Trajectory.from_json(json.dumps(data))


def test_views_split_the_transcript_by_side() -> None:
    traj = _trajectory()
    seen_by_agent = [m["content"] for m in agent_view(traj.messages, traj.steps)]
    seen_by_user = [m["content"] for m in user_view(traj.messages, traj.steps)]
    assert seen_by_agent == [
        "policy",
        "Hi",
        "my phone",
        "done",
        "",
        "42",
        "note for the agent",
        "bye",
    ]
    assert seen_by_user == ["Hi", "my phone", "", "Data is ON", "done", "bye"]


def test_concurrent_appends_give_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "out" / "episodes.jsonl"
    big = "x" * 200_000  # larger than a pipe buffer: a torn write would show

    def writer(worker: int) -> None:
        for i in range(10):
            append_jsonl(path, {"worker": worker, "i": i, "pad": big})

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = read_jsonl(path)
    assert sorted((r["worker"], r["i"]) for r in records) == [
        (w, i) for w in range(6) for i in range(10)
    ]
    assert records.skipped == []


def test_torn_last_line_is_reported_and_the_next_append_stays_readable(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    append_jsonl(path, _trajectory("1"))
    with open(path, "a") as handle:  # a crash in the middle of writing line 2
        handle.write(_trajectory("2").to_json()[:100])
    with pytest.raises(ValueError, match=rf"{path}:2: not valid JSON.*no newline"):
        read_jsonl(path)
    append_jsonl(path, _trajectory("3"))
    records = read_trajectories(path, on_error="skip")
    assert [t.task_id for t in records] == ["1", "3"]
    assert records.skipped == [2]


def test_corrupt_middle_line_raise_or_skip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(
        _trajectory("1").to_json()
        + "\n"
        + "{broken\n"
        + "\n"
        + "[1, 2]\n"
        + json.dumps({"schema_version": 99})
        + "\n"
        + _trajectory("5").to_json()
        + "\n"
    )
    with pytest.raises(ValueError, match=rf"{path}:2: not valid JSON"):
        read_jsonl(path)
    records = read_jsonl(path, on_error="skip")
    assert records.skipped == [2, 4]  # line 3 is blank: not a record
    assert len(records) == 3
    assert f"{path}:4: expected a JSON object, got list" in caplog.text
    trajectories = read_trajectories(path, on_error="skip")
    assert [t.task_id for t in trajectories] == ["1", "5"]
    assert trajectories.skipped == [2, 4, 5]


def test_wrong_schema_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(_trajectory("1").to_json() + "\n" + json.dumps({"schema_version": 99}) + "\n")
    assert len(read_jsonl(path)) == 2  # valid JSON objects both
    with pytest.raises(
        ValueError, match=rf"{path}:2: not a trajectory: trajectory schema_version 99"
    ):
        read_trajectories(path)


def test_bad_on_error_value(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text("{}\n")
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
        read_jsonl(path, on_error="ignore")  # type: ignore[arg-type]
