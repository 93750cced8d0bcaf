"""The decomposer's three prompts (goal reading, action sampling, action scoring; paper A.4.1),
in our own words.

Only the dialogue so far and the tool list go in: never the task instructions, the normalized
goal or reference actions. In the action and scoring prompts the instructions, tools and dialogue
come first and the goal interpretation last, so that the K prompts of one decision share all but
their last line: backends encode that prefix once (hf token trees, vLLM prefix caching).
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

_ROLE = (
    "You are a customer-service agent choosing your next move. Below you find the tools you can "
    "call, the conversation so far and, last, one reading of what the customer wants."
)

# Everything before the goal reading is the same for the K readings of one decision, so the K
# action prompts (and the K scoring contexts) share one long prefix; only the last line differs.
_TOOLS_AND_HISTORY = """
Tools you can call:
{tools}

Conversation so far:
{history}

Assume the customer's goal is: {goal}"""

ACTION_PROMPT = (
    _ROLE
    + """ Propose one plausible next action for that reading.
- One action only, never a list of options.
- For a tool call, use one tool name from the list and a complete arguments object that fits \
that tool's arguments.
- Copy ids, dates, amounts and other values exactly as the conversation or the goal gives them; \
never make up a value that neither of them contains.
- If the right move is to answer the customer without a tool, use the tool "respond" with an \
empty arguments object.
- Reply with a single JSON object and nothing else (no Markdown, no explanation), shaped like \
{{"tool": "<tool name>", "arguments": {{...}}}}.
"""
    + _TOOLS_AND_HISTORY
)

SCORE_PROMPT = (
    _ROLE
    + """ Write the most plausible next action for that reading as one JSON object whose only \
fields are "tool" and "arguments".
"""
    + _TOOLS_AND_HISTORY
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
