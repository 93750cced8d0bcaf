"""tau2-bench adapter: domains and splits, fresh environments, tool schemas and read-only toolsets,
agents, user simulators, the episode runner, trajectory records and scoring with tau2's evaluator.

Names are re-exported lazily (``from prour.env import run_episode``), so importing one submodule
such as :mod:`prour.env.domains` does not pull in the rest.
"""

from __future__ import annotations

from prour.registry import lazy_exports

_EXPORTS = {
    "prour.env.domains": ("DOMAINS", "SPLITS", "load_tasks", "get_task", "domain_policy"),
    "prour.env.environment": (
        "make_env",
        "tool_schemas",
        "user_tool_schemas",
        "read_only_tool_names",
        "tool_types",
        "execute_tool_call",
        "db_hash",
    ),
    "prour.env.trajectory": (
        "Trajectory",
        "StepRecord",
        "read_jsonl",
        "read_trajectories",
        "agent_view",
        "user_view",
    ),
    "prour.env.scoring": ("score_episode",),
    "prour.env.agents": (
        "Agent",
        "AgentTurn",
        "TaskView",
        "LLMAgent",
        "OracleAgent",
        "build_agent",
        "register_agent",
    ),
    "prour.env.users": (
        "UserSimulator",
        "UserTurn",
        "LLMUser",
        "ScriptedUser",
        "OracleUser",
        "build_user",
        "register_user",
    ),
    "prour.env.runner": ("EpisodeJob", "run_episode", "run_episodes"),
    "prour.files": ("append_jsonl",),
}
__all__ = [
    "DOMAINS",
    "SPLITS",
    "Agent",
    "AgentTurn",
    "EpisodeJob",
    "LLMAgent",
    "LLMUser",
    "OracleAgent",
    "OracleUser",
    "ScriptedUser",
    "StepRecord",
    "TaskView",
    "Trajectory",
    "UserSimulator",
    "UserTurn",
    "agent_view",
    "append_jsonl",
    "build_agent",
    "build_user",
    "db_hash",
    "domain_policy",
    "execute_tool_call",
    "get_task",
    "load_tasks",
    "make_env",
    "read_jsonl",
    "read_only_tool_names",
    "read_trajectories",
    "register_agent",
    "register_user",
    "run_episode",
    "run_episodes",
    "score_episode",
    "tool_schemas",
    "tool_types",
    "user_tool_schemas",
    "user_view",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
