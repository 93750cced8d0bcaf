"""Prompts of the standard task agent and the tau-bench style user simulator (prour's wording).

Changing any text here changes behaviour: bump :data:`PROMPTS_VERSION`, which every trajectory
records.
"""

from __future__ import annotations

PROMPTS_VERSION = "env-1"

GREETING = "Hi! How can I help you today?"
"""The agent's fixed opening line (tau2 starts every conversation with one)."""

USER_STOP = "###STOP###"
USER_TRANSFER = "###TRANSFER###"
USER_OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
USER_STOP_TOKENS: tuple[str, ...] = (USER_STOP, USER_TRANSFER, USER_OUT_OF_SCOPE)
AGENT_STOP = "###STOP###"

AGENT_SYSTEM_TEMPLATE = """\
<instructions>
You work as a customer service agent. Help the customer while following the policy below to the \
letter.
On every turn you do exactly one of two things: write a message to the customer, or call one or \
more tools. Never do both in the same turn.
Tool arguments must be valid JSON matching the tool's parameters. Change records only when the \
policy allows it.
</instructions>
<policy>
{policy}
</policy>"""

USER_RULES = """\
# Playing the customer

You are acting as a customer who has contacted a customer service agent. Make the conversation \
feel real, and stay inside the scenario given at the end.

## How to behave
- Write one message per turn, the way a person types in a chat.
- Give information only when the conversation needs it: answer what the agent asks for and let \
the rest come out later.
- Use only facts from the scenario. Anything the scenario does not state is unknown to you; say \
you do not know rather than inventing it.
- Put things in your own words instead of copying the scenario text.
- Keep to the scenario's goals and persona from start to finish.
"""

USER_TOOL_RULES = """\
## Your own tools
- You have tools that act on your side (your phone, your account). Use one only when the agent \
asks you to do something, or when you need it to answer the agent's question.
- In one turn either call tools or write to the agent, never both. The agent sees only your \
messages, not your tool calls or their results.
- Report what a tool returned; never guess or make up a result. If a call fails, fix it and try \
again.
- If the agent asks for several actions at once, say you can do one at a time and ask which \
comes first.
"""

USER_ENDING_RULES = """\
## Ending the conversation
- Once the scenario's goal has been reached, reply with {stop} alone to end the conversation.
- If the agent hands you over to a human agent, reply with {transfer} (only after the agent has \
clearly said so).
- If the scenario does not tell you enough to go on, reply with {out_of_scope}.
"""

USER_SYSTEM_TEMPLATE = """\
{rules}
<scenario>
{scenario}
</scenario>"""


def agent_system_prompt(policy: str) -> str:
    """The standard agent's system prompt: short instructions, then the domain policy."""
    return AGENT_SYSTEM_TEMPLATE.format(policy=policy.strip())


def user_system_prompt(scenario: str, with_tools: bool) -> str:
    """The user simulator's system prompt: behaviour rules, tool rules if any, the scenario."""
    ending = USER_ENDING_RULES.format(
        stop=USER_STOP, transfer=USER_TRANSFER, out_of_scope=USER_OUT_OF_SCOPE
    )
    rules = USER_RULES + ("\n" + USER_TOOL_RULES if with_tools else "") + "\n" + ending
    return USER_SYSTEM_TEMPLATE.format(rules=rules, scenario=scenario.strip())


def prompts_hash() -> str:
    """A short sha256 of the agent's and the user simulator's prompt texts, as this code builds
    them (for a placeholder policy and scenario). Trajectories record it; extraction compares it
    between trajectories and with the code's."""
    import hashlib

    texts = (agent_system_prompt("{policy}"), user_system_prompt("{scenario}", with_tools=False),
             user_system_prompt("{scenario}", with_tools=True), GREETING)
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
