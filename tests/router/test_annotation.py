"""Calibration labels: the annotator's rubric labels map to routes, the JSONL is reviewable and
resumable, and a person's ``corrected`` value wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.config.router import CalibrationConfig
from prour.llm.scripted import ScriptedLLM
from prour.router.annotation import DecisionState, annotate, parse_label, read_labels, read_states


def _states(*ids: str) -> list[DecisionState]:
    return [DecisionState(i, [{"role": "user", "content": f"message of {i}"}]) for i in ids]


def test_parse_label() -> None:
    assert parse_label("epistemic") == "epistemic"
    assert parse_label(" Aleatoric\n") == "aleatoric"
    assert parse_label("<think>hmm</think>\nno_uncertainty") == "no_uncertainty"
    assert parse_label("epistemic.") is None and parse_label("label: epistemic") is None


def test_annotate_writes_reviewable_jsonl_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    llm = ScriptedLLM(
        rules=[
            ("message of a", "epistemic"),
            ("message of b", "ALEATORIC"),
            ("message of c", "no_uncertainty"),
            ("message of d", "I am not sure"),
            ("message of e", "epistemic"),
        ]
    )
    records = annotate(llm, _states("a", "b", "c", "d"), CalibrationConfig(), out_path=out)
    assert [r["label"] for r in records] == ["verify", "clarify", "act", None]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[3] == {
        "state_id": "d",
        "history_excerpt": "user: message of d",
        "annotator_label": None,
        "label": None,
        "raw": "I am not sure",
        "corrected": None,
    }
    assert "message of a" in llm.chat_log[0].messages[-1]["content"]
    assert "epistemic" in llm.chat_log[0].messages[-1]["content"]  # rubric is in the prompt

    with pytest.raises(ValueError, match="'d' has no usable label"):
        read_labels(out)
    lines[3]["corrected"] = "aleatoric"  # reviewers may use rubric names or routes
    lines[0]["corrected"] = "act"
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_labels(out) == {"a": "act", "b": "clarify", "c": "act", "d": "clarify"}

    more = annotate(llm, _states("a", "b", "c", "d", "e"), CalibrationConfig(), out_path=out)  # only e is new
    assert [r["state_id"] for r in more] == ["e"] and llm.calls["chat_requests"] == 5
    assert json.loads(out.read_text().splitlines()[0])["corrected"] == "act"  # kept


def test_read_states(tmp_path: Path) -> None:
    path = tmp_path / "states.jsonl"
    path.write_text(
        '{"id": 1, "messages": []}\n{"state_id": "x", "messages": [], "domain": "retail"}\n'
    )
    states = read_states(path)
    assert [(s.state_id, s.domain) for s in states] == [("1", None), ("x", "retail")]
    path.write_text('{"id": 1, "messages": []}\n{"id": 1, "messages": []}\n')
    with pytest.raises(ValueError, match="repeats state id 1"):
        read_states(path)
    path.write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="needs `id`"):
        read_states(path)
