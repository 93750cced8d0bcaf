"""A recipe's decoding values reach the model requests they set, on every path that builds the
component: ``env.agent_temperature`` in collection (``prour collect``), in ``prour episode run``
and in registry-built agents; ``reward.responder_max_tokens`` in the strict user's requests
(training's responders). The scripted backend is the recording double: it keeps every
ChatRequest it is sent, sampling included. (Evaluation: tests/eval/test_decoding_from_recipe.py.)
"""

from __future__ import annotations

from pathlib import Path

import data_scripts as scripts
import yaml
from typer.testing import CliRunner

from prour.build import Builder
from prour.cli.main import app
from prour.config import EnvConfig, Recipe
from prour.env.agents import TaskView, build_agent
from prour.env.users import build_user
from prour.llm.base import ChatRequest
from prour.llm.scripted import ScriptedLLM, register_script, scripted_from_config
from prour.train.reward import build_responders

TEMPERATURE = 0.3  # differs from env.agent_temperature's default and from every other default


def recording(name: str, make: type[ScriptedLLM] | object) -> list[ScriptedLLM]:
    """Register script ``name``; every backend a recipe builds from it is kept in the list."""
    built: list[ScriptedLLM] = []

    def factory() -> ScriptedLLM:
        llm = make()  # type: ignore[operator]
        built.append(llm)
        return llm

    register_script(name, factory)
    return built


def requests(backends: list[ScriptedLLM]) -> list[ChatRequest]:
    return [request for llm in backends for request in llm.chat_log]


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_collection_agent_decodes_at_the_recipes_temperature(tmp_path: Path) -> None:
    files = scripts.write_script_files(tmp_path / "scripts")
    agents = recording("decoding-collect-agent", lambda: scripted_from_config(str(files["agent"])))
    models = {role: {"backend": "scripted", "script": str(files[role])} for role in
              ("user", "teacher")}
    models["agent"] = {"backend": "scripted", "script": "decoding-collect-agent"}
    recipe = {"name": "decoding", "run_dir": str(tmp_path / "run"), "models": models,
              "env": {"max_steps": 8},
              "data": {"num_trajectories": 1, "trial_seeds": [0], "max_tasks": 1,
                       "concurrency": 1}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    invoke("collect", "--recipe", str(path), "--no-progress", "--set",
           f"env.agent_temperature={TEMPERATURE}")
    sent = requests(agents)
    assert sent, "the collection's agent made no request"
    assert {r.sampling.temperature for r in sent} == {TEMPERATURE}
    assert {r.sampling.max_tokens for r in sent} == {EnvConfig().agent_max_tokens}


def _episode(*options: str) -> list[ChatRequest]:
    agents = recording("decoding-episode-agent", lambda: ScriptedLLM(default="How can I help?"))
    invoke("episode", "run", "--domain", "retail", "--task", "5", "--agent", "llm",
           "--backend", "scripted", "--model", "decoding-episode-agent", "--user", "scripted",
           "--user-reply", "I want to return a lamp.", *options)
    return requests(agents)


def test_prour_episode_agent_decodes_at_the_given_temperature() -> None:
    sent = _episode("--agent-temperature", str(TEMPERATURE))
    assert sent and {r.sampling.temperature for r in sent} == {TEMPERATURE}


def test_prour_episode_agent_decodes_at_the_env_sections_temperature_by_default() -> None:
    """Without the option the agent decodes at env.agent_temperature (the paper's 0.01), not
    at a default of the command's own."""
    sent = _episode()
    assert sent and {r.sampling.temperature for r in sent} == {EnvConfig().agent_temperature}
    assert EnvConfig().agent_temperature == 0.01


def test_registry_built_agent_and_user_decode_as_their_env_section() -> None:
    env = EnvConfig(agent_temperature=TEMPERATURE, agent_max_tokens=33, user_temperature=0.7,
                    user_max_tokens=44)
    agent_llm, user_llm = ScriptedLLM(default="Hello."), ScriptedLLM(default="Hi.")
    agent = build_agent("llm", llm=agent_llm, env=env)
    agent.reset("retail", TaskView("retail", "5", "policy", seed=2))
    agent.act([{"role": "user", "content": "hi"}], [])
    user = build_user("llm", llm=user_llm, env=env)
    user.respond([{"role": "assistant", "content": "How can I help?"}], [])
    [agent_request], [user_request] = agent_llm.chat_log, user_llm.chat_log
    assert (agent_request.sampling.temperature, agent_request.sampling.max_tokens) == (
        TEMPERATURE, 33)
    assert (user_request.sampling.temperature, user_request.sampling.max_tokens) == (0.7, 44)


def test_the_strict_users_requests_carry_reward_responder_max_tokens() -> None:
    users = recording("decoding-strict-user", lambda: ScriptedLLM(default="My order is #W1."))
    recipe = Recipe.model_validate({
        "name": "decoding",
        "models": {"strict_user": {"backend": "scripted", "script": "decoding-strict-user"}},
        "reward": {"responder_max_tokens": 77, "responder_temperature": 0.2}})
    responders = build_responders(Builder(recipe))
    assert responders.strict_user.answer_many("I want my order.", ["Which order?", "When?"]) == [
        "My order is #W1.", "My order is #W1."]
    sent = requests(users)
    assert len(sent) == 2
    assert {(r.sampling.max_tokens, r.sampling.temperature) for r in sent} == {(77, 0.2)}
