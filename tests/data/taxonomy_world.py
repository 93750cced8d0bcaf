"""Two hand-built trajectories for the taxonomy tests (a retail one on tau2 retail task 0, an
airline one on airline task 1) and a scripted annotator whose reply to each decision step is
written out below, so that every count the tests expect is counted here by hand."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from prour.env.trajectory import StepRecord, Trajectory


def _call(cid: str, name: str, **arguments: str) -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _steps(messages: list[dict], kinds: list) -> list[StepRecord]:
    """A step per message (None: the system prompt has none); a kind may carry its meta."""
    out = []
    for index, kind in enumerate(kinds):
        if kind is None:
            continue
        meta = {}
        if isinstance(kind, tuple):
            kind, meta = kind
        extra = {}
        if kind == "tool_result":
            extra = {"requestor": "assistant", "tool_name": messages[index]["name"],
                     "tool_call_id": messages[index]["tool_call_id"]}
        elif kind == "agent_tool_call":
            extra = {"requestor": "assistant"}
        out.append(StepRecord(kind=kind, message_index=index, meta=meta, **extra))
    return out


def retail() -> Trajectory:
    """Messages 0-12; the agent's own decisions are messages 3 (one call), 5 (a question), 7 (two
    calls, two results after it) and 12 (a reply). Not decisions: the greeting (1) and the
    teacher's question (10)."""
    messages = [
        {"role": "system", "content": "policy"},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "I want to exchange a keyboard."},
        {"role": "assistant", "content": "", "tool_calls": [_call(
            "c1", "find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi",
            zip="19122")]},
        {"role": "tool", "tool_call_id": "c1", "name": "find_user_id_by_name_zip",
         "content": "yusuf_rossi_9620"},
        {"role": "assistant", "content": "Which switches do you prefer?"},
        {"role": "user", "content": "Clicky ones."},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("c2", "get_order_details", order_id="#W2378156"),
            _call("c3", "get_product_details", product_id="1656367028")]},
        {"role": "tool", "tool_call_id": "c2", "name": "get_order_details",
         "content": '{"status": "delivered"}'},
        {"role": "tool", "tool_call_id": "c3", "name": "get_product_details",
         "content": '{"name": "Mechanical Keyboard"}'},
        {"role": "assistant", "content": "May I ask which colour you like?"},
        {"role": "user", "content": "Black."},
        {"role": "assistant", "content": "Done."},
    ]
    kinds = [None, ("agent_message", {"greeting": True}), "user_message", "agent_tool_call",
             "tool_result", "agent_message", "user_message", "agent_tool_call", "tool_result",
             "tool_result", ("agent_message", {"teacher_query": {"question": "colour?"}}),
             "user_message", "agent_message"]
    return Trajectory(domain="retail", task_id="0", seed=0, agent="agent", user="user",
                      messages=messages, steps=_steps(messages, kinds),
                      termination="user_stop", reward=0.0)


def airline() -> Trajectory:
    """One decision: the agent's question at message 2."""
    messages = [{"role": "system", "content": "policy"},
                {"role": "user", "content": "Change my flight to a later one."},
                {"role": "assistant", "content": "Sure, to which date?"}]
    return Trajectory(domain="airline", task_id="1", seed=0, agent="agent", user="user",
                      messages=messages,
                      steps=_steps(messages, [None, "user_message", "agent_message"]),
                      termination="user_stop", reward=0.0)


def annotation(kind: str, source: str | None, obj: str = "", label: str = "") -> dict:
    present = kind != "none"
    return {"present": present, "kind": kind, "source": source, "object": obj,
            "evidence": "what the dialogue shows" if present else "", "outcome":
            "resolved" if present else "", "label": label}


FIND_USER = annotation("epistemic", "profile", "the customer's user id", "user id lookup")
SWITCHES = annotation("aleatoric", "preference", "switch type", "product option preference")
ORDER = annotation("epistemic", "tools", "the order's status", "order state check")
DONE = annotation("none", None)
# the airline step: an aleatoric kind with a world-side source, which never validates
WRONG_SIDE = annotation("aleatoric", "tools", "new date", "date")

# decision id -> (its labels line's annotation after annotation, attempts it took)
EXPECTED = {
    "retail/0/s0/agent#0": (FIND_USER, 1),
    "retail/0/s0/agent#1": (SWITCHES, 1),
    "retail/0/s0/agent#2": (ORDER, 2),  # the first reply lacks fields: asked again
    "retail/0/s0/agent#3": (DONE, 1),
    "airline/1/s0/agent#0": (None, 2),  # annotator_attempts 2, both replies rejected
}


def rules() -> list[tuple[str, object]]:
    """(pattern, reply) per decision step, matched in the annotator's prompt."""
    return [
        (r"The decision:\nassistant calls tool: find_user_id_by_name_zip", json.dumps(FIND_USER)),
        (r"The decision:\nassistant: Which switches", json.dumps(SWITCHES)),
        (r"The decision:\nassistant calls tool: get_order_details",
         ['```json\n{"present": true, "kind": "epistemic"}\n```', json.dumps(ORDER)]),
        (r"The decision:\nassistant: Done\.", json.dumps(DONE)),
        (r"The decision:\nassistant: Sure, to which date", json.dumps(WRONG_SIDE)),
    ]


def write_rules(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"rules": [{"pattern": p, "reply": r} for p, r in rules()]}))
    return path


def write_trajectories(path: Path, *trajectories: Trajectory) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t.to_json() + "\n" for t in trajectories))
    return path
