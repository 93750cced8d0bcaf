"""The uncertainty taxonomy (paper A.1): the decision steps of a trajectory, the annotator's
strict-JSON reply and its checks, the resumable labels file, a reviewer's corrections, the counts
per source and side (hand-computed), and the approval the review gate and the report read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from taxonomy_world import (
    DONE,
    EXPECTED,
    FIND_USER,
    ORDER,
    SWITCHES,
    airline,
    annotation,
    retail,
    rules,
)

from prour.config.taxonomy import TaxonomyConfig
from prour.data.taxonomy import annotate, annotation_prompt, decision_steps, reference_of
from prour.data.taxonomy_labels import (
    APPROVAL_FILE,
    Label,
    approve,
    corrected_label,
    count_labels,
    describe,
    drawn_from,
    effective_label,
    is_approved,
    read_labels,
    side_shares,
    validate_annotation,
)
from prour.llm.scripted import ScriptedLLM

# ---- decision steps ----------------------------------------------------------------------------


def test_every_agent_response_or_tool_call_is_a_decision_step() -> None:
    steps = decision_steps(retail(), context_messages=3)
    # messages 3, 5, 7 and 12: the greeting (1) and the teacher's question (10) are not the agent's
    assert [(s.message_index, s.type, s.tools) for s in steps] == [
        (3, "tool_call", ("find_user_id_by_name_zip",)), (5, "response", ()),
        (7, "tool_call", ("get_order_details", "get_product_details")), (12, "response", ())]
    assert [s.decision_id for s in steps] == [f"retail/0/s0/agent#{i}" for i in range(4)]
    # the tool results right after a call, none after a reply
    assert [len(s.observations) for s in steps] == [1, 0, 2, 0]
    assert [m["content"] for m in steps[2].observations] == [
        '{"status": "delivered"}', '{"name": "Mechanical Keyboard"}']
    # the last three messages the agent saw before it (no system prompt)
    assert [m["content"] for m in steps[2].context] == [
        "yusuf_rossi_9620", "Which switches do you prefer?", "Clicky ones."]
    assert [m["content"] for m in steps[0].context] == [
        "Hi! How can I help you today?", "I want to exchange a keyboard."]
    assert [m["content"] for m in steps[3].context][-2:] == [
        "May I ask which colour you like?", "Black."]
    assert len(decision_steps(airline(), 8)) == 1


def test_the_prompt_holds_the_papers_inputs_and_the_reference_reaches_only_it() -> None:
    step = decision_steps(retail(), 3)[2]
    text = annotation_prompt(step, reference_of("retail", "0", None))[0]["content"]
    assert "You received your order #W2378156" in text  # the task's instruction
    assert "user: Clicky ones." in text  # the recent dialogue
    assert "The decision:\nassistant calls tool: get_order_details" in text
    assert 'exchange_delivered_order_items({"item_ids"' in text  # a reference action
    assert 'tool get_product_details returned: {"name": "Mechanical Keyboard"}' in text
    for name in ("profile", "tools", "policy", "computation", "history", "intent",
                 "preference"):
        assert f'"{name}"' in text
    # the reference reaches this prompt only: no agent, router or policy prompt imports it
    root = Path(__file__).resolve().parents[2] / "prour"
    sources = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.py")}
    assert [name for name, text in sources.items() if "reference_of" in text] == [
        "data/taxonomy.py"]
    assert sorted(name for name, text in sources.items()
                  if "prour.data.taxonomy import" in text) == ["cli/taxonomy.py", "data/steps.py"]


# ---- validation --------------------------------------------------------------------------------


def test_valid_annotations_pass_as_they_are() -> None:
    assert validate_annotation(FIND_USER) == FIND_USER
    assert validate_annotation(SWITCHES)["source"] == "preference"
    assert validate_annotation({**DONE, "source": None, "object": None, "evidence": None,
                                "outcome": None, "label": None}) == DONE


@pytest.mark.parametrize(("data", "said"), [
    ({**ORDER, "extra": 1}, "unexpected field(s) ['extra']"),
    ({k: v for k, v in ORDER.items() if k != "label"}, "missing field(s) ['label']"),
    ({**ORDER, "present": "yes"}, "`present` must be true or false"),
    ({**ORDER, "kind": "world"}, "`kind` must be one of epistemic, aleatoric, none"),
    ({**ORDER, "present": False}, "present is true exactly when kind is epistemic or aleatoric"),
    ({**DONE, "present": True}, "present is true exactly when kind is epistemic or aleatoric"),
    (annotation("epistemic", "preference", "x", "y"), ("an epistemic uncertainty lives on the "
     "world side: its source is one of profile, tools, policy, computation, history")),
    (annotation("aleatoric", "policy", "x", "y"), ("an aleatoric uncertainty lives on the user "
     "side: its source is one of intent, preference")),
    (annotation("epistemic", "weather", "x", "y"), "`source` must be one of"),
    ({**DONE, "source": "tools"}, "`source` must be null when kind is none"),
    ({**ORDER, "object": " "}, "`object` must name the case"),
    ({**ORDER, "evidence": 3}, "`evidence` must be a string"),
])
def test_a_wrong_annotation_is_refused_saying_why(data: dict, said: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        validate_annotation(data)
    assert said in str(caught.value)


def test_a_reviewers_correction_is_a_source_none_or_the_seven_fields() -> None:
    assert corrected_label("history") == Label("epistemic", "history")
    assert corrected_label("intent") == Label("aleatoric", "intent")
    assert corrected_label("none") == Label("none", None)
    assert corrected_label(SWITCHES) == Label("aleatoric", "preference",
                                              "product option preference")
    for wrong in ("clarify", 3, ["tools"]):
        with pytest.raises(ValueError):
            corrected_label(wrong)
    line = {"annotation": ORDER, "corrected": None}
    assert effective_label(line) == Label("epistemic", "tools", "order state check")
    assert effective_label({**line, "corrected": "none"}) == Label("none", None)
    assert effective_label({"annotation": None, "corrected": None}) is None
    assert effective_label({"annotation": None, "corrected": ""}) is None


# ---- annotation: retries, the labels file, resuming ----------------------------------------------


def _annotated(tmp_path: Path, llm: ScriptedLLM | None = None) -> tuple[Path, list[dict]]:
    path = tmp_path / "taxonomy" / "labels.jsonl"
    steps = decision_steps(retail(), 8) + decision_steps(airline(), 8)
    new = annotate(llm or ScriptedLLM(rules=rules()), steps,
                   TaxonomyConfig(annotator_attempts=2), path, chunk_size=3)
    return path, new


def test_each_step_gets_a_line_with_the_validated_reply_or_the_errors(tmp_path: Path) -> None:
    llm = ScriptedLLM(rules=rules())
    path, new = _annotated(tmp_path, llm)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == new
    assert {x["decision_id"]: (x["annotation"], x["attempts"]) for x in lines} == EXPECTED
    retried = next(x for x in lines if x["decision_id"] == "retail/0/s0/agent#2")
    assert retried["errors"] == [("missing field(s) ['source', 'object', 'evidence', 'outcome', "
                                 "'label']; expected exactly ['present', 'kind', 'source', "
                                 "'object', 'evidence', 'outcome', 'label']")]
    # the retry showed the annotator its own reply and what was wrong with it
    again = [r for r in llm.chat_log if "The decision:\nassistant calls tool: get_order_details"
             in r.messages[0]["content"]][-1]
    assert [m["role"] for m in again.messages] == ["user", "assistant", "user"]
    assert "missing field(s)" in again.messages[2]["content"]
    failed = next(x for x in lines if x["domain"] == "airline")
    assert failed["annotation"] is None and len(failed["raw"]) == 2
    assert all("lives on the user side" in e for e in failed["errors"])
    assert all(x["corrected"] is None for x in lines)
    assert failed["excerpt"].endswith(">>> assistant: Sure, to which date?")
    assert [(x["type"], x["tools"]) for x in lines][:3] == [
        ("tool_call", ["find_user_id_by_name_zip"]), ("response", []),
        ("tool_call", ["get_order_details", "get_product_details"])]


def test_a_rerun_asks_only_for_the_steps_not_labelled_yet(tmp_path: Path) -> None:
    path, _ = _annotated(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])  # a crash mid-line
    llm = ScriptedLLM(rules=rules())
    _, new = _annotated(tmp_path, llm)
    assert [x["decision_id"] for x in new] == list(EXPECTED)[2:]
    assert len(path.read_text().splitlines()) == 5
    _, none = _annotated(tmp_path, ScriptedLLM())  # nothing left: no request at all
    assert none == []


# ---- counts ------------------------------------------------------------------------------------


def _line(decision_id: str, domain: str, annotation_: dict | None, corrected=None) -> dict:
    return {"decision_id": decision_id, "domain": domain, "annotation": annotation_,
            "corrected": corrected}


def test_counts_per_source_and_side_are_the_hand_counted_ones() -> None:
    records = [
        _line("r#0", "retail", FIND_USER),  # profile
        _line("r#1", "retail", SWITCHES),  # preference
        _line("r#2", "retail", ORDER),  # tools
        _line("r#3", "retail", DONE),  # no uncertainty
        _line("r#4", "retail", None),  # no usable label
        _line("a#0", "airline", None, corrected="policy"),  # a reviewer's label
        _line("a#1", "airline", ORDER, corrected="none"),  # the reviewer overrules
        _line("a#2", "airline", DONE, corrected=annotation("aleatoric", "intent", "goal", "g")),
        _line("r#2", "retail", ORDER, corrected="computation"),  # a later line replaces r#2
    ]
    counts = count_labels(records)
    assert counts.decisions == 8 and counts.unusable == 1 and counts.without == 2
    assert dict(counts.by_source) == {"profile": 1, "preference": 1, "computation": 1,
                                      "policy": 1, "intent": 1}
    assert counts.events == 5 and counts.side("world") == 3 and counts.side("user") == 2
    assert counts.shares() == {"world": 60.0, "user": 40.0}
    assert {d: dict(c) for d, c in counts.by_domain.items()} == {
        "retail": {"profile": 1, "preference": 1, "computation": 1},
        "airline": {"policy": 1, "intent": 1}}
    assert dict(counts.domains) == {"retail": 5, "airline": 3}
    assert dict(counts.open_labels["preference"]) == {"product option preference": 1}
    assert "policy" not in counts.open_labels  # a bare source name carries no open label
    assert describe(counts) == ("8 decision steps: world 3 (profile 1, policy 1, computation 1), "
                                "user 2 (intent 1, preference 1), no uncertainty 2, no usable "
                                "label 1")


def test_the_papers_counts_give_its_shares() -> None:
    shares = side_shares(16947, 2075)  # A.1: 16,947 of 19,022 world-side, 2,075 user-side
    assert (round(shares["world"], 1), round(shares["user"], 1)) == (89.1, 10.9)
    assert side_shares(0, 0) is None


# ---- the approval ------------------------------------------------------------------------------


def test_approval_holds_the_labels_as_approved_and_no_later_change(tmp_path: Path) -> None:
    path, _ = _annotated(tmp_path)
    folder = path.parent
    assert not is_approved(folder)
    counts = approve(folder, "a test")
    assert is_approved(folder) and counts.unusable == 1 and counts.events == 3
    record = json.loads((folder / APPROVAL_FILE).read_text())
    assert record["by"] == "a test" and record["events"] == {"profile": 1, "preference": 1,
                                                              "tools": 1}
    assert drawn_from(folder)["approved"] is True
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[-1]["corrected"] = "intent"  # the review goes on: the approval no longer holds
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert not is_approved(folder) and drawn_from(folder)["approved"] is False
    lines[-1]["corrected"] = "clarify"  # not a source: refused, naming the line
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ValueError, match=r"labels.jsonl:5: decision 'airline/1/s0/agent#0': "
                                         r"unknown source 'clarify'"):
        approve(folder, "a test")
    with pytest.raises(ValueError, match="labels.jsonl:5"):
        read_labels(path)
    with pytest.raises(ValueError, match="no taxonomy labels yet"):
        approve(tmp_path / "elsewhere", "a test")
