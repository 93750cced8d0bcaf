"""Scripted models for evaluation tests on real tau2 retail / airline tasks.

Every role answers from the dialogue it is shown, deterministically:

- agent: calls its domain's argument-free READ tool once, asks the user one discretionary
  question after the tool result, then closes ("Your request is complete.");
- user: opens, answers questions, stops when the agent says the request is complete;
- decomposer (K = 2 readings, L = 2 actions): the state decides the route through real AU/EU
  values. Before any tool result or clarify question the two readings ("exchange" / "return")
  prefer different actions (AU ≈ 0.487 → clarify); afterwards, until a verification was added,
  one reading keeps two candidates (EU ≈ 0.206 → verify); then one candidate (act);
- generator: YES with a fixed clarify question / verify query;
- verifier: one READ tool call, then an answer citing a value the tool returned;
- router (LLM-router ablation): clarify / verify / act in the same states;
- judge and classifier: valid strict JSON.

Tasks retail 65 and airline 26 need no write and no message: any normal ending scores 1.
Retail 5 and airline 2 need writes: these episodes score 0.

The replay world (:func:`replay_llms`, end of the module) solves any task: its agent replays the
task's reference actions and its decomposer routes clarify on a schedule.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from prour.llm.scripted import ScriptedLLM, register_script

Message = dict[str, Any]

READ_TOOL = {"retail": "list_all_product_types", "airline": "list_all_airports"}
CLARIFY_Q = "Which color would you like for the replacement?"
VERIFY_Q = "Which product types or airports does the system list?"
QUESTION = "I looked it up. Could you tell me which item you mean?"
CLOSING = "Thank you. Your request is complete."
GATE_REPLY = "Understood, I will continue without asking. Your request is complete."
OPENING = "Hi, I need help with an item from my order."
ANSWER = "I am not sure, just go ahead."
CLARIFY_ANSWER = "The blue one, please."
RESPOND = '{"tool": "respond", "arguments": {}}'
TAU_AU, TAU_EU = 0.3, 0.1
HIGH, LOW = -0.1, -3.0
SOLVABLE = {"retail": ["5", "65"], "airline": ["2", "26"]}  # first fails, second succeeds
TASKS = [f"{domain}:{task}" for domain, ids in SOLVABLE.items() for task in ids]


def domain_of(messages: list[Message]) -> str:
    system = messages[0].get("content", "") if messages else ""
    return "airline" if "Airline Agent Policy" in system else "retail"


def tool_call(name: str, arguments: dict[str, Any] | None = None) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments or {}})}</tool_call>'


def agent_reply(messages: list[Message]) -> str:
    """The task agent (module docstring)."""
    last = messages[-1]
    calls = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    if last.get("role") == "system" and len(messages) > 1:
        return GATE_REPLY
    if last.get("role") == "tool":
        return QUESTION
    if calls == 0:
        return tool_call(READ_TOOL[domain_of(messages)])
    return CLOSING


def user_reply(messages: list[Message]) -> str:
    """The simulated user: its view has the agent as ``user`` (roles flipped)."""
    said = messages[-1].get("content", "") if messages else ""
    if "complete" in said:
        return "###STOP###"
    if CLARIFY_Q in said:
        return CLARIFY_ANSWER
    if said.rstrip().endswith("?") and "How can I help" not in said:
        return ANSWER
    return OPENING


def _history(prompt: str) -> str:
    match = re.search(r"Conversation so far:\n(.*?)(?:\n\nAssume|\n\nThe customer's goal|\Z)",
                      prompt, re.DOTALL)
    return match.group(1) if match else prompt


def state_of(history: str) -> str:
    """``clarify`` / ``verify`` / ``act``: what the scripted decomposer and router lead to."""
    if CLARIFY_Q not in history and " returned: " not in history:
        return "clarify"
    if "[Verification]" not in history:
        return "verify"
    return "act"


def read_action(prompt: str) -> str:
    name = "list_all_airports" if "list_all_airports" in prompt else "list_all_product_types"
    return json.dumps({"tool": name, "arguments": {}})


def _text(messages: list[Message]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


_CLARIFY_STATE = r"(?s)^(?!.*(?:Which color would you like| returned: ))"
_VERIFY_STATE = r"(?s)^(?!.*\[Verification\])(?=.*(?: returned: |Which color would you like))"


def decomposer_llm() -> ScriptedLLM:
    """Goals, actions and scores that realise the routes of :func:`state_of`."""

    def by_reading(messages: list[Message]) -> str:
        prompt = _text(messages)
        return RESPOND if "exchange" in prompt.split("goal is:")[-1] else read_action(prompt)

    airports, products = (json.dumps({"tool": t, "arguments": {}})
                          for t in ("list_all_airports", "list_all_product_types"))
    rules = [
        (_CLARIFY_STATE + r".*goal, in one sentence:",
         ["I want to exchange an item.", "I want to return an item."]),
        (r"goal, in one sentence:", "I want to exchange an item."),
        (_CLARIFY_STATE + r".*Propose one plausible next action", by_reading),
        (_VERIFY_STATE + r"(?=.*list_all_airports).*Propose one", [airports, RESPOND]),
        (_VERIFY_STATE + r".*Propose one", [products, RESPOND]),
        (r"Propose one plausible next action", RESPOND),
    ]
    return ScriptedLLM(rules=rules, scorer=score_action)


def score_action(context: str, target: str) -> list[float]:
    """High log-likelihood when the action fits the reading: respond ↔ exchange, read ↔ return."""
    goal = context.split("goal is:")[-1].split("\n")[0]
    respond = target.startswith('{"arguments":{},"tool":"respond"}')
    return [HIGH if respond == ("exchange" in goal) else LOW]


def expected_uncertainty(state: str) -> tuple[float, float]:
    """(AU, EU) the scripted decomposer must produce in each state, computed by hand."""
    hi, lo = math.exp(HIGH), math.exp(LOW)
    p = hi / (hi + lo)
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    if state == "clarify":  # two readings, mirror-image distributions, mean (1/2, 1/2)
        return math.log(2) - h, h
    if state == "verify":  # one reading twice, two candidates
        return 0.0, h
    return 0.0, 0.0


def generator_llm(clarify: str | None = None, verify: str | None = None) -> ScriptedLLM:
    clarify = clarify or f"<think>The colour is open.</think>YES [QUESTION]{CLARIFY_Q}[/QUESTION]"
    verify = verify or f"YES [QUESTION]{VERIFY_Q}[/QUESTION]"
    return ScriptedLLM(rules=[(r"must ask the user something", clarify),
                              (r"A separate Verifier", verify)])


def verifier_reply(messages: list[Message]) -> str:
    """The verifier: one READ call, then an answer naming the tool and a value it returned."""
    last = messages[-1]
    if last.get("role") != "tool":
        prompt = _text(messages)
        name = "list_all_airports" if "Airline Agent Policy" in prompt else \
            "list_all_product_types"
        return tool_call(name)
    data = json.loads(last["content"])
    value = next(iter(data.values())) if isinstance(data, dict) else data[0]["iata"]
    return f"{last['name']} returned {value}."


def verifier_llm() -> ScriptedLLM:
    """One READ call, then an answer naming the tool and a value it returned."""
    return ScriptedLLM(rules=[(r".", verifier_reply)])


def router_llm() -> ScriptedLLM:
    def reply(messages: list[Message]) -> str:
        mode = state_of(_history(_text(messages)))
        return json.dumps({"mode": mode, "rationale": "scripted"})

    return ScriptedLLM(rules=[(r"You decide the next mode", reply)])


JUDGEMENT = {"goal_clarity": 4, "single_ask": 5, "answer_effort": 4, "actionability": 5,
             "conciseness": 3, "needed": True, "not_in_context": True, "not_lookup": False,
             "precise": True, "value": 6}
JUDGED_EFFORT = float(sum(5 - JUDGEMENT[k] for k in
                          ("goal_clarity", "single_ask", "answer_effort", "actionability",
                           "conciseness")))


def _label(messages: list[Message]) -> str:
    """Classifier replies: the heuristic's label of the message, as strict JSON."""
    from prour.eval.attention.classifier import heuristic_classify

    message = _text(messages).split("[Message to label]\n")[-1].strip()
    found = heuristic_classify(message)
    return json.dumps({"label": found.label, "atomic_questions": found.atomic_questions})


def judge_llm() -> ScriptedLLM:
    """Judge replies: the same valid judgment for every request (r = 4, v = 6); request labels
    for the classifier."""
    return ScriptedLLM(rules=[(r"\[Request to judge\]", json.dumps(JUDGEMENT)),
                              (r"\[Message to label\]", _label)])


SCRIPTS = {
    "eval-agent": lambda: ScriptedLLM(rules=[(r".", agent_reply)]),
    "eval-user": lambda: ScriptedLLM(rules=[(r".", user_reply)]),
    "eval-decomposer": decomposer_llm,
    "eval-generator": generator_llm,
    "eval-verifier": verifier_llm,
    "eval-router": router_llm,
    "eval-judge": judge_llm,
}


def register_scripts() -> None:
    for name, factory in SCRIPTS.items():
        register_script(name, factory)


def scripted_llms() -> dict[str, ScriptedLLM]:
    """One fresh scripted backend per role."""
    return {role: SCRIPTS[f"eval-{role}"]() for role in
            ("agent", "user", "decomposer", "generator", "verifier", "router", "judge")}


def recipe(run_dir: str, **eval_section: Any) -> dict[str, Any]:
    """A recipe mapping with every role scripted and routing thresholds set."""
    models = {role: {"backend": "scripted", "script": f"eval-{role}"} for role in
              ("agent", "user", "decomposer", "generator", "verifier", "router", "judge")}
    return {
        "name": "eval-test",
        "run_dir": run_dir,
        "models": models,
        "env": {"max_steps": 16},
        "router": {"n_interpretations": 2, "n_actions": 2, "tau_au": TAU_AU, "tau_eu": TAU_EU,
                   "tool_detail": "brief"},
        "train": {"rollout": {"max_response_tokens": 64}},  # the generator's, evaluation too
        "eval": {"seeds": [0], "domains": ["retail", "airline"], "tasks": TASKS, "concurrency": 2,
                 **eval_section},
    }


# ---- a replay world: the agent replays a task's reference actions, asking on a schedule --------
#
# The agent calls the task's reference (assistant) actions one per turn, then closes with the
# task's communicate_info, so the episode scores 1 when it ends normally. The decomposer routes
# clarify right after the agent's n-th tool result for n in ``ask_after`` (two readings that
# prefer different actions, AU ≈ 0.487 as above) and act everywhere else (one reading, one
# candidate); the generator asks CLARIFY_Q, which :func:`user_reply` answers.


def replay_agent_llm(domain: str, task_id: str) -> ScriptedLLM:
    """The task agent that replays ``domain``/``task_id``'s reference actions, then closes."""
    return ScriptedLLM(rules=[(r".", replay_reply(domain, task_id))])


def replay_reply(domain: str, task_id: str) -> Callable[[list[Message]], str]:
    """The replay agent's reply to a prompt (see :func:`replay_agent_llm`)."""
    from prour.env.domains import get_task

    criteria = get_task(domain, task_id).evaluation_criteria
    actions = [a for a in criteria.actions if a.requestor == "assistant"]
    closing = " ".join(["All done.", *(criteria.communicate_info or []), CLOSING])

    def reply(messages: list[Message]) -> str:
        done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if done < len(actions):
            return tool_call(actions[done].name, dict(actions[done].arguments))
        return closing

    return reply


def asks_now(history: str, ask_after: tuple[int, ...]) -> bool:
    """Whether the scheduled decomposer routes clarify: the history ends with the result of the
    agent's n-th tool call, n in ``ask_after``."""
    lines = history.rstrip().splitlines()
    calls = sum(1 for line in lines if line.startswith("assistant calls tool: "))
    return bool(lines) and lines[-1].startswith("tool ") and calls in ask_after


def scheduled_decomposer_llm(ask_after: tuple[int, ...]) -> ScriptedLLM:
    """Readings and scores that route clarify exactly where :func:`asks_now` says, else act."""
    readings = itertools.cycle(["I want to exchange an item.", "I want to return an item."])

    def goal(messages: list[Message]) -> str:  # K = 2 samples per decision: one of each
        asking = asks_now(_history(_text(messages)), ask_after)
        return next(readings) if asking else "I want to exchange an item."

    def action(messages: list[Message]) -> str:
        prompt = _text(messages)
        return RESPOND if "exchange" in prompt.split("goal is:")[-1] else read_action(prompt)

    return ScriptedLLM(rules=[(r"goal, in one sentence:", goal),
                              (r"Propose one plausible next action", action)],
                       scorer=score_action)


def replay_llms(domain: str, task_id: str, ask_after: tuple[int, ...]) -> dict[str, ScriptedLLM]:
    """Every role of the replay world for one task (others as in :func:`scripted_llms`)."""
    llms = scripted_llms()
    llms["agent"] = replay_agent_llm(domain, task_id)
    llms["decomposer"] = scheduled_decomposer_llm(ask_after)
    return llms


# ---- a planned world: the route of every decision is planted -----------------------------------
#
# The replay agent of each domain's task (one task per domain, told apart by the policy in the
# agent's system prompt) and a decomposer / LLM router that route decision d as ``plan[d]``
# ("act" past the plan's end). Decision d is the agent's (d+1)-th turn: the decisions already in
# a prompt's history are the agent's tool calls and messages, less the greeting and verification
# notes. A clarify decision has two readings preferring different actions (AU ≈ 0.487), a verify
# decision one reading with two candidates (AU = 0, EU ≈ 0.206), an act decision one candidate.

_HISTORY_ENDS = ("\n\nAssume the customer's goal", "\n\nThe customer's goal",
                 "\n\nAnswer with strict JSON", "\n\nLook at what", "\n\nYour decision:")


def history_of(prompt: str) -> str:
    """The dialogue part of a decomposer, generator or router prompt."""
    text = prompt.split("Conversation so far:\n", 1)[-1]
    for end in _HISTORY_ENDS:
        text = text.split(end, 1)[0]
    return text


def decision_index(history: str) -> int:
    """Agent decisions already taken in ``history`` (see the section comment)."""
    said = (line for line in history.splitlines() if line.startswith("assistant: "))
    calls = sum(1 for line in history.splitlines() if line.startswith("assistant calls tool: "))
    return calls + sum(1 for line in said if line != f"assistant: {GREETING}"
                       and not line.startswith(f"assistant: {NOTE}"))


def planned_route(plan: dict[str, list[str]], messages: list[Message]) -> str:
    """The planted route of the decision a prompt is made for."""
    prompt = _text(messages)
    routes = plan[domain_of_prompt(prompt)]
    index = decision_index(history_of(prompt))
    return routes[index] if index < len(routes) else "act"


PLANNED_OPENING = {domain: f"{OPENING} It is about my {domain} booking."
                   for domain in ("retail", "airline")}


def domain_of_prompt(prompt: str) -> str:
    """The domain the planned user named when opening (every role's prompt shows the opening)."""
    [domain] = [d for d, opening in PLANNED_OPENING.items() if opening in prompt]
    return domain


def planned_decomposer_llm(plan: dict[str, list[str]]) -> ScriptedLLM:
    """Readings, actions and scores realising ``plan`` (section comment); K = L = 2."""
    readings = itertools.cycle(["I want to exchange an item.", "I want to return an item."])
    candidates = itertools.cycle(["read", RESPOND])

    def goal(messages: list[Message]) -> str:  # one of each reading per clarify decision
        return next(readings) if planned_route(plan, messages) == "clarify" \
            else "I want to exchange an item."

    def action(messages: list[Message]) -> str:
        prompt = _text(messages)
        route = planned_route(plan, messages)
        if route == "clarify":
            return RESPOND if "exchange" in prompt.split("goal is:")[-1] else read_action(prompt)
        if route == "verify":  # both candidates under the one reading, L = 2 samples each
            candidate = next(candidates)
            return read_action(prompt) if candidate == "read" else candidate
        return RESPOND

    return ScriptedLLM(rules=[(r"goal, in one sentence:", goal),
                              (r"Propose one plausible next action", action)],
                       scorer=score_action)


def planned_router_llm(plan: dict[str, list[str]]) -> ScriptedLLM:
    """The LLM router naming the planted route."""

    def reply(messages: list[Message]) -> str:
        return json.dumps({"mode": planned_route(plan, messages), "rationale": "planted"})

    return ScriptedLLM(rules=[(r"You decide the next mode", reply)])


def planned_agent_llm(tasks: dict[str, str]) -> ScriptedLLM:
    """The replay agent of ``tasks[domain]`` for whichever domain's policy the prompt carries."""
    replies = {domain: replay_reply(domain, task_id) for domain, task_id in tasks.items()}
    return ScriptedLLM(rules=[(r".", lambda messages: replies[domain_of(messages)](messages))])


def planned_user_llm(tasks: dict[str, str]) -> ScriptedLLM:
    """:func:`user_reply`, opening with its task's domain (found from the scenario it plays)."""
    from prour.env.domains import get_task

    reasons = {domain: str(get_task(domain, task_id).user_scenario.instructions.reason_for_call)[:40]
               for domain, task_id in tasks.items()}

    def reply(messages: list[Message]) -> str:
        said = user_reply(messages)
        if said != OPENING:
            return said
        [domain] = [d for d, reason in reasons.items() if reason in _text(messages)]
        return PLANNED_OPENING[domain]

    return ScriptedLLM(rules=[(r".", reply)])


def planned_llms(tasks: dict[str, str], plan: dict[str, list[str]]) -> dict[str, ScriptedLLM]:
    """Every role of the planned world (others as in :func:`scripted_llms`)."""
    llms = scripted_llms()
    llms["user"] = planned_user_llm(tasks)
    llms["agent"] = planned_agent_llm(tasks)
    llms["decomposer"] = planned_decomposer_llm(plan)
    llms["router"] = planned_router_llm(plan)
    return llms


# ---- tau2's view of a stored transcript (for recomputations) ----------------------------------

GREETING = "Hi! How can I help you today?"  # tau2's first agent message, never a step
NOTE = "[Verification]"  # agent notes start so; never sent to the user or tau2


def talk(messages: list[dict]) -> list[dict]:
    """The messages tau2 exchanges: no system prompt, no greeting, no verification note."""
    out = [m for m in messages if m["role"] != "system"]
    if out and out[0]["role"] == "assistant" and out[0].get("content") == GREETING:
        out = out[1:]
    return [m for m in out if not (m["role"] == "assistant"
                                   and (m.get("content") or "").startswith(NOTE))]


def counted_steps(messages: list[dict]) -> int:
    """tau2's steps: one per agent or user message, one per batch of tool results."""
    steps, previous = 0, None
    for message in talk(messages):
        if message["role"] != "tool" or previous != "tool":
            steps += 1
        previous = message["role"]
    return steps
