"""The decomposer's three prompts (goal reading, action sampling, action scoring; paper A.4.1),
in our own words.

Only the dialogue so far and the tool list go in: never the task instructions, the normalized
goal or reference actions. The dialogue and tools come before the goal interpretation so that the
K prompts of one decision share their longest prefix (servers with prefix caching reuse it).
"""

from __future__ import annotations

GOAL_PROMPT = """\
Below is a conversation between a customer-service agent and a customer. Say what the customer \
is ultimately trying to get done, as one plausible reading of the conversation so far.

Guidelines:
- Give exactly one reading, in the customer's voice (first person), as one short sentence.
- Use only what the conversation shows; do not add facts it does not contain.
- Name the underlying aim instead of repeating the customer's words.
- If the conversation allows several readings, commit to one; do not list alternatives.
- Reply with that sentence and nothing else.

Conversation so far:
{history}

The customer's goal, in one sentence:"""

_ACTION_CONTEXT = """\
You are a customer-service agent choosing your next move.

Tools you can call:
{tools}

Conversation so far:
{history}

Assume the customer's goal is: {goal}
"""

ACTION_PROMPT = (
    _ACTION_CONTEXT
    + """
Propose one plausible next action for this goal.
- One action only, never a list of options.
- For a tool call, use one tool name from the list and a complete arguments object that fits \
that tool's arguments.
- Copy ids, dates, amounts and other values exactly as the conversation or the goal gives them; \
never make up a value that neither of them contains.
- If the right move is to answer the customer without a tool, use the tool "respond" with an \
empty arguments object.
- Reply with a single JSON object and nothing else (no Markdown, no explanation), shaped like \
{{"tool": "<tool name>", "arguments": {{...}}}}."""
)

SCORE_PROMPT = (
    _ACTION_CONTEXT
    + """
Write the most plausible next action for this goal as one JSON object whose only fields are \
"tool" and "arguments"."""
)


def goal_prompt(history: str) -> str:
    """Prompt that asks for one first-person reading of the customer's goal."""
    return GOAL_PROMPT.format(history=history or "(no messages yet)")


def action_prompt(history: str, tools: str, goal: str) -> str:
    """Prompt that asks for one next action as strict JSON, given one goal reading."""
    return ACTION_PROMPT.format(history=history or "(no messages yet)", tools=tools, goal=goal)


def score_prompt(history: str, tools: str, goal: str) -> str:
    """Context under which each canonical candidate action is scored by teacher forcing."""
    return SCORE_PROMPT.format(history=history or "(no messages yet)", tools=tools, goal=goal)
