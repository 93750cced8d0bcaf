"""The warm-start corpus: supervised examples built from oracle transcripts of train tasks.

Every prompt is rendered by the function the pipeline itself uses (agent and user prompts,
decomposer prompts, query-generator prompts, belief prompts, strict user, verifier, goal
normalizer, annotator), so the formats match exactly; only the targets are synthetic
(:mod:`prour.demo.targets`, :mod:`prour.demo.actions`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prour.demo.examples import DomainContext, SFTExample, domain_context, plain_reply
from prour.demo.state_examples import point_examples
from prour.demo.transcripts import TaskText, corpus_task_ids, replay
from prour.env.domains import DOMAINS

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.trajectory import Trajectory

logger = logging.getLogger(__name__)

DEFAULT_TASKS_PER_DOMAIN = 12


def transcript_examples(traj: Trajectory, ctx: DomainContext, text: TaskText) -> list[SFTExample]:
    """Per task: the user simulator's turns (opening rewritten) and the normalized goal."""
    from prour.data.normalize import goal_prompt
    from prour.env.prompts import user_system_prompt
    from prour.env.trajectory import user_view
    from prour.env.users import flip_roles

    view = user_view(traj.messages, traj.steps)
    system = {"role": "system", "content": user_system_prompt(text.scenario, bool(ctx.user_tools))}
    out = []
    for j, message in enumerate(view):
        if message.get("role") == "user":
            reply = flip_roles([message])[0]
            out.append(
                SFTExample(
                    "user", [system, *flip_roles(view[:j])], reply, tools=ctx.user_tools or None
                )
            )
    out.append(SFTExample("normalize", goal_prompt(text.instruction),
                          plain_reply(text.normalized_goal)))
    return out


@dataclass
class Corpus:
    """Examples by kind, plus what they were built from."""

    examples: dict[str, list[SFTExample]] = field(default_factory=dict)
    tasks: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, items: Sequence[SFTExample], domain: str, task_id: str) -> None:
        """File examples under their kind, labelled with the task they come from."""
        for item in items:
            labelled = dataclasses.replace(item, domain=domain, task_id=task_id)
            self.examples.setdefault(item.kind, []).append(labelled)

    def stats(self) -> dict[str, Any]:
        """Tasks and example counts, as the warm-started folder records them."""
        return {
            "tasks": {d: len(ids) for d, ids in self.tasks.items()},
            "task_ids": self.tasks,
            "examples": {k: len(v) for k, v in sorted(self.examples.items())},
            "build_seconds": round(self.seconds, 2),
        }


def build_corpus(
    domains: Sequence[str] = DOMAINS,
    split: str = "train",
    seed: int = 0,
    tasks_per_domain: int | None = DEFAULT_TASKS_PER_DOMAIN,
) -> Corpus:
    """The synthetic supervised corpus from oracle replays of (a seeded subset of) train tasks."""
    start = time.perf_counter()
    corpus = Corpus()
    for domain in domains:
        ids = corpus_task_ids(domain, split, seed, tasks_per_domain)
        corpus.tasks[domain] = ids
        replays = {task_id: replay(domain, task_id) for task_id in ids}
        ctx = domain_context(domain, [p for _, _, points in replays.values() for p in points])
        for task_id, (text, traj, points) in replays.items():
            rng = random.Random(f"warmstart-corpus:{seed}:{domain}:{task_id}")
            corpus.add(transcript_examples(traj, ctx, text), domain, task_id)
            for point in points:
                corpus.add(point_examples(point, ctx, text, rng), domain, task_id)
        logger.info("warm-start corpus: %s, %d tasks", domain, len(ids))
    corpus.seconds = time.perf_counter() - start
    return corpus
