"""An episode with the in-process tiny model as the task agent runs to its step limit."""

from __future__ import annotations

from pathlib import Path

from prour.config import EnvConfig
from prour.env.agents import LLMAgent
from prour.env.domains import get_task
from prour.env.runner import run_episode
from prour.env.users import ScriptedUser


def test_tiny_hf_agent_runs_to_the_step_limit(tiny_model_dir: Path) -> None:
    from prour.llm.hf import HFLLM

    # The retail policy and tool schemas take ~9k tokens of the tiny tokenizer; the tiny model's
    # rotary positions extend past its nominal 4096, and noise is all it writes anyway.
    llm = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=12288)
    agent = LLMAgent(llm, EnvConfig(agent_temperature=0.0, agent_max_tokens=16))
    user = ScriptedUser(lambda messages: "Could you check my order, please?")
    steps: list[str] = []
    traj = run_episode(
        "retail",
        get_task("retail", "5"),
        agent,
        user,
        limits=EnvConfig(max_steps=4, max_errors=50),
        on_step=lambda step, message: steps.append(step.kind),
    )
    assert traj.errors == []
    assert traj.termination == "max_steps"
    assert traj.reward == 0.0
    turns = traj.steps_of("agent_message", "agent_tool_call", "user_message", "user_tool_call")
    assert len(turns) == 1 + 4  # the fixed greeting, then two user and two agent turns
    agent_turns = [
        s for s in traj.steps_of("agent_message", "agent_tool_call") if not s.meta.get("greeting")
    ]
    assert len(agent_turns) == 2
    assert all(s.seconds > 0 and s.meta["completion_tokens"] >= 1 for s in agent_turns)
    assert all(s.meta["prompt_tokens"] > 5000 for s in agent_turns)  # the policy reached the model
    assert steps == [s.kind for s in traj.steps]
    assert traj.agent_model == str(tiny_model_dir) and traj.seconds > 0
