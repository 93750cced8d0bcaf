"""In evaluation the task agent and the user simulator decode as the recipe's ``env`` section
says: every chat request the scripted backends (the recording doubles) receive carries it."""

from __future__ import annotations

from pathlib import Path

from eval_world import recipe, scripted_llms

from prour.build import Builder
from prour.config import Recipe
from prour.eval.harness import Evaluation


def test_the_evaluated_agent_and_user_decode_at_the_recipes_env_values(tmp_path: Path) -> None:
    data = recipe(str(tmp_path), methods=["base"], tasks=["retail:5"], domains=["retail"])
    data["env"].update(agent_temperature=0.3, agent_max_tokens=300, user_temperature=0.6,
                       user_max_tokens=200)
    loaded = Recipe.model_validate(data)
    backends = scripted_llms()
    evaluation = Evaluation(loaded, tmp_path / "run", progress=False,
                            builder=Builder(loaded, backends))
    try:
        [result] = evaluation.run()
    finally:
        evaluation.close()
    assert result["method"] == "base"
    agent, user = backends["agent"].chat_log, backends["user"].chat_log
    assert agent and user, "the episode made no agent or no user request"
    assert {(r.sampling.temperature, r.sampling.max_tokens) for r in agent} == {(0.3, 300)}
    assert {(r.sampling.temperature, r.sampling.max_tokens) for r in user} == {(0.6, 200)}
