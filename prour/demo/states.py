"""The demo's training states when the tiny model's own conversations carry none (a named fallback).

A tiny model cannot hold a coherent conversation as task agent and user simulator, nor rewrite a
task instruction as a goal: the states that ``collect → normalize → extract`` build from its own
episodes have noise for a history and text like ``NO`` for a goal, so no question can raise the
policy's belief in them. The fallback, called **oracle-replay states**, builds clarify states
from *train-split* tau2 tasks instead:

* history: the agent's view before each early decision of the task's oracle replay
  (:func:`prour.demo.transcripts.replay`: reference actions, first-person opening request);
* target G*: the rule-based first-person rewrite of the task instruction
  (:attr:`prour.demo.transcripts.TaskText.normalized_goal`, the warm start's stand-in normalizer).

Everything downstream is the real pipeline: the rows have the extract stage's schema, the query
prompt is :func:`prour.rollout.query.query_prompt`, and ``prour train`` scores the policy's
questions with the information-gain reward (strict user, prior and posterior by the policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

FALLBACK_NAME = "oracle-replay states"
FALLBACK_REASON = (
    "a tiny model cannot hold a conversation or normalize a goal, so the states of its own "
    "episodes carry no target a question could inform; training uses clarify states of oracle "
    "replays of train tasks with rule-rewritten goals"
)


def oracle_states(
    tokenizer_path: str | Path,
    domains: Sequence[str],
    tasks_per_domain: int,
    decisions: int,
    seed: int = 0,
) -> list[Any]:
    """Clarify :class:`~prour.data.schema.Instance` objects of the first ``decisions``
    decisions of ``tasks_per_domain`` seeded train tasks per domain (target: the rewritten goal);
    token counts with the policy's tokenizer at ``tokenizer_path``."""
    from prour.data.schema import Instance, tool_traffic_hash
    from prour.data.truncate import PolicyTokens
    from prour.demo.transcripts import corpus_task_ids, replay
    from prour.rollout.query import PROMPTS_VERSION, query_prompt

    tokens = PolicyTokens(tokenizer_path)
    out = []
    for domain in domains:
        for task_id in corpus_task_ids(domain, "train", seed, tasks_per_domain):
            text, _, points = replay(domain, task_id)
            for point in points[:decisions]:
                prompt = query_prompt("clarify", point.history)
                out.append(
                    Instance(
                        mode="clarify", domain=domain, task_id=task_id,
                        trajectory_id=f"{domain}/{task_id}/oracle", step=point.index,
                        history=point.history, prompt=prompt, target=text.normalized_goal,
                        au=0.0, eu=0.0, total=0.0, truncated=False, dropped_messages=0,
                        prompt_tokens=tokens.chat(prompt),
                        target_tokens=max(1, tokens.text(text.normalized_goal)),
                        decomposer_calls=0, prompts_version=PROMPTS_VERSION,
                        env_history=[], db_hash=tool_traffic_hash(domain, task_id, []),
                    )
                )
    return out


def write_states(instances: Sequence[Any], path: str | Path) -> Path:
    """Write the instances as a training parquet (the extract stage's row schema)."""
    from prour.data.dataset import write_rows

    return write_rows([inst.to_row(i) for i, inst in enumerate(instances)], path)
