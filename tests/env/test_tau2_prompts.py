"""The standard agent and the user simulator prompt as tau2's own LLMAgent and UserSimulator do:
both are built here from the installed tau2 (litellm comes with the dev install) for the same task,
and what prour's agent and user send to their model is compared with what tau2's would send."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network call at litellm import

from prour.config import EnvConfig
from prour.env import prompts
from prour.env.agents import LLMAgent
from prour.env.domains import DOMAINS, load_tasks, tau2_environment
from prour.env.runner import run_episode
from prour.env.users import LLMUser
from prour.llm.scripted import ScriptedLLM


@pytest.fixture(scope="module")
def litellm() -> None:
    """tau2's agent, user and orchestrator modules import litellm (the dev extra brings it; a
    skip, which fails CI's run, where it is missing: `make install-dev`)."""
    pytest.importorskip("litellm", reason="tau2's LLMAgent/UserSimulator need litellm: "
                        "make install-dev (the dev extra pins it)")


def _tau2_agent_and_user(domain: str, task):
    """tau2's LLMAgent and UserSimulator for ``task``, built the way tau2's run.py builds them."""
    from tau2.agent.llm_agent import LLMAgent as Tau2Agent
    from tau2.user.user_simulator import UserSimulator as Tau2User

    env = tau2_environment(domain)
    agent = Tau2Agent(tools=env.get_tools(), domain_policy=env.get_policy())
    try:
        user_tools = env.get_user_tools()
    except ValueError:  # tau2's run.py: a domain without user tools gives the user none
        user_tools = None
    user = Tau2User(tools=user_tools, instructions=str(task.user_scenario))
    return agent, user


@pytest.mark.parametrize("domain", DOMAINS)
def test_agent_and_user_prompts_are_tau2s(domain: str, litellm: None) -> None:
    task = load_tasks(domain)[0]
    agent_llm = ScriptedLLM(replies=["Could you tell me more?", "Thanks."])
    user_llm = ScriptedLLM(replies=["I need help with my account.", "###STOP###"])
    env = EnvConfig()
    traj = run_episode(domain, task, LLMAgent(agent_llm, env), LLMUser(user_llm, env), limits=env)
    assert traj.termination == "user_stop", traj.termination

    tau2_agent, tau2_user = _tau2_agent_and_user(domain, task)
    agent_system = tau2_agent.get_init_state().system_messages[0].content
    agent_tools = [tool.openai_schema for tool in tau2_agent.tools]
    for request in agent_llm.chat_log:
        assert request.messages[0] == {"role": "system", "content": agent_system}
        assert request.tools == agent_tools  # same schemas, in tau2's order
    assert traj.messages[0] == {"role": "system", "content": agent_system}

    user_system = tau2_user.get_init_state().system_messages[0].content
    user_tools = [tool.openai_schema for tool in tau2_user.tools] if tau2_user.tools else None
    for request in user_llm.chat_log:
        assert request.messages[0] == {"role": "system", "content": user_system}
        assert request.tools == user_tools
    assert str(task.user_scenario) in user_system
    # telecom's user has device tools and gets tau2's tool guidelines; the others do not
    assert (user_tools is not None) == (domain == "telecom")
    assert prompts.user_guidelines(user_tools is not None) in user_system


def test_greeting_and_stop_tokens_are_tau2s(litellm: None) -> None:
    from tau2.data_model.message import UserMessage
    from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
    from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER
    from tau2.user.user_simulator import UserSimulator as Tau2User

    from prour.env.users import is_stop

    assert prompts.greeting() == DEFAULT_FIRST_AGENT_MESSAGE.content
    assert prompts.USER_STOP_TOKENS == (STOP, TRANSFER, OUT_OF_SCOPE)
    for text in ("Thanks! ###STOP###", "###TRANSFER###", "ok ###OUT-OF-SCOPE###", "all good", ""):
        assert is_stop(text) == Tau2User.is_stop(UserMessage(role="user", content=text)), text


def test_prompts_hash_follows_tau2s_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    from prour.demo.prompts import prompt_fingerprint

    before, warm_before = prompts.prompts_hash(), prompt_fingerprint()
    assert before == prompts.prompts_hash()
    real = prompts.user_guidelines

    monkeypatch.setattr(prompts, "user_guidelines", lambda tools: real(tools) + "\nOne more rule.")
    assert prompts.prompts_hash() != before  # a new tau2 wording is a new hash
    assert prompt_fingerprint() != warm_before  # and the demo's warm-started model is rebuilt


def test_tau2_text_names_the_file_when_the_constant_is_gone() -> None:
    with pytest.raises(RuntimeError, match=r"llm_agent\.py: tau2 no longer defines NO_SUCH_TEXT"):
        prompts.tau2_text("tau2.agent.llm_agent", "NO_SUCH_TEXT")


def test_the_cli_and_an_episode_run_without_litellm() -> None:
    """prour reads tau2's texts without importing litellm or tau2's agent/user modules: `prour
    --help`, the prompts and a scripted episode leave them unloaded (litellm is only for this
    file's comparison with tau2's own classes)."""
    import json
    import subprocess
    import sys

    probe = """
import json, sys
from prour.cli.main import app
try:
    app(["--help"])
except SystemExit:
    pass
from prour.config import EnvConfig
from prour.env import prompts
from prour.env.agents import LLMAgent
from prour.env.domains import get_task
from prour.env.runner import run_episode
from prour.env.users import LLMUser
from prour.llm.scripted import ScriptedLLM
prompts.prompts_hash()
env = EnvConfig()
traj = run_episode("retail", get_task("retail", "5"), LLMAgent(ScriptedLLM(default="Hello."), env),
                   LLMUser(ScriptedLLM(default="###STOP###"), env), limits=env)
print(json.dumps([traj.termination, sorted(sys.modules)]))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    termination, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert termination == "user_stop"
    assert "Usage" in out.stdout  # the help was printed
    unwanted = {"litellm", "tau2.agent.llm_agent", "tau2.user.user_simulator",
                "tau2.orchestrator.orchestrator", "tau2.utils.llm_utils"}
    assert not unwanted & set(loaded), sorted(unwanted & set(loaded))
