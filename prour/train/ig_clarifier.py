"""The IG-Clarifier baseline's own training run (Deng et al., 2026), as settings over a recipe.

The paper's Table 1 baseline *learns* its clarification questions. Its public code
(github.com/Trailblazerss/Information-Gain-Clarifier, read for reference only) trains a clarifier
with DAPO (GRPO advantages, dual-clip PPO, no KL) on dialogue states whose reward target is the
user's intent summary; its reward is computed in a patch of verl's trainer: the extracted
question is answered by a user simulator that knows the hidden instruction, and the reward is the
per-token MEAN log-probability the policy itself gives the intent summary with the
``Agent: question / User: answer`` turn minus without it. An output from which no question is
extracted (``NO``, and every output its parser cannot read a question from) earns 0.

In prour's terms that is the information-gain reward on clarify states only (their target is
G*, the normalized goal; verify states' targets are tool calls, which its data has none of),
``reward.aggregation: mean``, ``reward.invalid_penalty: 0`` and no attention term. Everything
else (the generator's initial weights, DAPO's optimiser and batch settings, the strict user as
the answering simulator) is the run's own recipe, so the baseline trains on the same backbone
with the same budget as prour's generator. :data:`SETTINGS` is the one place those settings
live: ``recipes/ig-clarifier.yaml`` is paper.yaml with them, and the chain's
``train-ig-clarifier`` step applies them to any recipe as ``--set`` items.

Simplified against the public code: the belief prompt is prour's clarify belief prompt
(:mod:`prour.rewards.belief`), not theirs; states come from prour's extraction (the clarify
rows of ``train.train_file``) rather than their parquet; their fixed rollout selection (6 of 8,
questions first) is ``train.rollout.keep`` as prour's.
"""

from __future__ import annotations

import json
from typing import Any

NAME = "ig-clarifier"

# Where its checkpoints go, relative to run_dir like train.output_dir: beside prour's folder, not
# in it (a rerun of prour's train clears its whole output_dir).
OUTPUT_DIR = f"checkpoints-{NAME}"

SETTINGS: dict[str, Any] = {
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
