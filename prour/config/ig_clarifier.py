"""The IG-Clarifier baseline's own training run (Deng et al., 2026), as settings over a recipe.

The paper's Table 1 baseline *learns* its clarification questions. Its public code
(github.com/Trailblazerss/Information-Gain-Clarifier, read for reference only) trains a clarifier
with DAPO (GRPO advantages, dual-clip PPO, no KL) on dialogue states whose reward target is the
user's intent summary; its reward is computed in a patch of verl's trainer: the extracted
question is answered by a user simulator that knows the hidden instruction, and the reward is the
per-token MEAN log-probability the policy itself gives the intent summary with the
``Agent: question / User: answer`` turn minus without it. An output from which no question is
extracted (``NO``, and every output its parser cannot read a question from) earns 0.

Its training states are its own, chosen without prour's router: the public code's data
(``data/train.parquet``, 2,140 rows, and ``val.parquet``, 536) holds dialogue states of
τ-bench retail trajectories, each with the task's normalized instruction
(``ground_truth_clean``) as target; every state there ends right after a tool result, the point
of a dialogue where their collection's clarifier hook ran. prour reads that code as "every point
of a trajectory where the agent could ask instead of acting" and takes every decision state of
the same trajectories prour's generator trains on (the first ``data.max_decisions`` of each
usable trajectory, ``data.states: every``, :func:`prour.data.extract.every_state_instances`),
since the baseline decides at every agent decision at evaluation. No decomposer call, no
threshold and no routing label reaches that set: changing ``router.*`` changes none of its rows.

In prour's terms the reward is the information-gain reward on clarify rows (target G*, the
normalized goal), ``reward.aggregation: mean``, ``reward.invalid_penalty: 0`` and no attention
term. Everything else (the generator's initial weights, DAPO's optimiser and batch settings, the
strict user as the answering simulator, the train/validation split by task, the prompt budget)
is the run's own recipe, so the baseline trains on the same backbone with the same budget as
prour's generator. The Prour paper reimplements its baselines "on the Qwen3-8B backbone"
(A.2.1); for IG-Clarifier, whose clarifier is a trained policy, that would be an 8B policy,
which the paper's 2 x 80 GiB node cannot train beside the 8B responder (recipes/paper.yaml says
so, with the dry run that prints the plan), so it starts from the generator's Qwen3-1.7B. :data:`SETTINGS` is the one place those settings live:
``recipes/ig-clarifier.yaml`` is paper.yaml with them, and the chain's ``extract-ig-clarifier``,
``train-ig-clarifier`` and ``export-ig-clarifier`` steps apply them to any recipe as ``--set``
items.

What differs from the public code: states are taken before every agent decision, not only after
tool results (so replies to the user are included; their transcript also shows the teacher's
earlier questions, as prour's histories do); the prompt is prour's clarify template and belief
prompt (:mod:`prour.rollout.query`, :mod:`prour.rewards.belief`), not theirs; their fixed
rollout selection (6 of 8, questions first) is ``train.rollout.keep`` as prour's.
"""

from __future__ import annotations

import json
from typing import Any

NAME = "ig-clarifier"

# Where its checkpoints go, relative to run_dir like train.output_dir: beside prour's folder, not
# in it (a rerun of prour's train clears its whole output_dir).
OUTPUT_DIR = f"checkpoints-{NAME}"

# Its own dataset, relative to run_dir like data.dataset_dir: beside prour's.
DATASET_DIR = f"data/dataset-{NAME}"

SETTINGS: dict[str, Any] = {
    "data.states": "every",                # every decision state, target G*, no decomposer
    "data.dataset_dir": DATASET_DIR,
    "train.train_file": f"{DATASET_DIR}/train.parquet",
    "train.val_file": f"{DATASET_DIR}/validation.parquet",
    "train.modes": ["clarify"],            # states with an intent-summary (G*) target only
    "reward.aggregation": "mean",          # per-token mean log-prob, with minus without
    "reward.invalid_penalty": 0.0,         # no question extracted: 0, as for NO
    "reward.attention.lambda": 0.0,        # no attention term in their reward
    "train.output_dir": OUTPUT_DIR,
}


def setting_items() -> list[str]:
    """:data:`SETTINGS` as ``--set`` items (``key=<JSON value>``, which the recipe loader reads
    as YAML)."""
    return [f"{key}={json.dumps(value)}" for key, value in SETTINGS.items()]
