"""Scripted models for the data-stage tests, on real tau2 retail train tasks.

The conversation every episode follows (whatever the task): the user opens; the agent looks up
Yusuf Rossi's user id; the teacher asks "Which order ...?" and the user names #W2378156; the agent
reads that order; the teacher says NO; the agent wraps up; the user stops.

The scripted decomposer's scorer is built so that the three decision states of each episode get
known routes under the paper's thresholds (τ_AU, τ_EU) = (0.25, 0.20):
- before any tool result: every goal reading finds the 3 candidates equally likely → EU = ln 3,
  AU = 0 → verify;
- after the teacher's question: each of the two goal readings prefers another candidate, the
  readings alternate over K = 5 samples → p̄ = (0.6, 0.4, 0) → AU ≈ H(0.6, 0.4) = 0.673 → clarify;
- after the order details came back: all readings prefer ``respond`` → AU ≈ EU ≈ 0 → act.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from prour.llm.scripted import ScriptedLLM

FIND_CALL = {"name": "find_user_id_by_name_zip",
             "arguments": {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}}
ORDER_CALL = {"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}
QUESTION = "Which order would you like me to look at?"
WRAP_UP = "Your order has been reviewed. Anything else?"
OPENING = "Hi, I am Yusuf Rossi with zip 19122. I want to check an order."
ANSWER = "It is order #W2378156."
THRESHOLDS = (0.25, 0.20)


def tool_call(call: dict) -> str:
    return f"<tool_call>{json.dumps(call)}</tool_call>"


AGENT_RULES = [
    {"pattern": r"tool get_order_details returned", "reply": WRAP_UP},
    {"pattern": r"tool find_user_id_by_name_zip returned", "reply": tool_call(ORDER_CALL)},
]
USER_RULES = [
    {"pattern": r"user: Which order[^\n]*\Z", "reply": ANSWER},
    {"pattern": r"Anything else\?[^\n]*\Z", "reply": "###STOP###"},
]
TEACHER_RULES = [
    {"pattern": r"find_user_id_by_name_zip returned: [^\n]*\n\nLook at",
     "reply": f"YES [QUESTION]{QUESTION}[/QUESTION]"},
]


def agent_llm() -> ScriptedLLM:
    return ScriptedLLM([(r["pattern"], r["reply"]) for r in AGENT_RULES],
                       default=tool_call(FIND_CALL))


def user_llm() -> ScriptedLLM:
    return ScriptedLLM([(r["pattern"], r["reply"]) for r in USER_RULES], default=OPENING)


def teacher_llm() -> ScriptedLLM:
    return ScriptedLLM([(r["pattern"], r["reply"]) for r in TEACHER_RULES], default="NO")


def write_script_files(folder: Path) -> dict[str, Path]:
    """The agent, user and teacher scripts as rule files for ``backend: scripted`` recipes."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for role, rules, default in (("agent", AGENT_RULES, tool_call(FIND_CALL)),
                                 ("user", USER_RULES, OPENING), ("teacher", TEACHER_RULES, "NO")):
        files[role] = folder / f"{role}.yaml"
        files[role].write_text(yaml.safe_dump({"rules": rules, "default": default}))
    return files


GOALS = ["I want to exchange items of my order.", "I want to know my order status."]
CANDIDATES = [
    json.dumps({"tool": "respond", "arguments": {}}),
    json.dumps({"tool": "get_order_details", "arguments": {"order_id": "#W2378156"}}),
    json.dumps({"tool": "find_user_id_by_name_zip", "arguments": FIND_CALL["arguments"]}),
]
CANONICAL = [json.dumps(json.loads(c), sort_keys=True, separators=(",", ":")) for c in CANDIDATES]


def route_scorer(context: str, target: str) -> list[float]:
    """Summed log-likelihood of a candidate: 0 for the preferred one, -10 for the others."""
    candidate = target.removesuffix("<|im_end|>")
    goal = context.rsplit("Assume the customer's goal is: ", 1)[1].split("\n", 1)[0]
    if "get_order_details returned" in context:
        best = CANONICAL[0]
    elif QUESTION in context:
        best = CANONICAL[1] if "exchange" in goal else CANONICAL[2]
    else:
        return [-1.0]
    return [0.0 if candidate == best else -10.0]


def decomposer_llm() -> ScriptedLLM:
    return ScriptedLLM(
        rules=[(r"The customer's goal, in one sentence:", GOALS),
               (r"Propose one plausible next action", CANDIDATES)],
        scorer=route_scorer,
    )


def normalizer_llm(extra: str = "") -> ScriptedLLM:
    """A faithful normalizer: 'You are' → 'My name is', the rest kept (plus ``extra``)."""

    def reply(messages: list[dict]) -> str:
        text = messages[-1]["content"].rsplit("Instructions:", 1)[1].rsplit("Rewritten:", 1)[0]
        goal = " ".join(text.replace("You are", "My name is").replace("You ", "I ").split())
        return (goal + " " + extra).strip()

    return ScriptedLLM(rules=[(r"Rewritten:", reply)])
