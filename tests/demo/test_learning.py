"""The demo's learning part on CPU: oracle-replay states, the query-format pass, and `prour train`'s
local trainer with the real information-gain reward, with the demo's own settings and seed.

Must show (issue 16): valid questions and non-null prior/posterior in most steps, and the mean
reward over the last steps at least 0.3 above the first steps. The starting model is the tiny
model after a short warm start (the demo's is longer; the learning part is the demo's own code).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.build import recipe_reward
from prour.data.dataset import read_rows
from prour.data.schema import state_from_row
from prour.demo import learning
from prour.demo.states import oracle_states
from prour.demo.transcripts import corpus_task_ids
from prour.recipes import load_recipe
from prour.rollout.query import query_prompt

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"


def test_oracle_states_are_train_clarify_states_with_the_rewritten_goal(tiny_model_dir: Path):
    from prour.demo.transcripts import replay

    instances = oracle_states(tiny_model_dir, ["retail"], 2, 1, seed=0)
    assert [i.task_id for i in instances] == corpus_task_ids("retail", "train", 0, 2)
    for inst in instances:
        text, _, points = replay("retail", inst.task_id)
        assert inst.mode == "clarify" and inst.target == text.normalized_goal
        assert inst.history == points[0].history and inst.prompt == query_prompt("clarify",
                                                                                inst.history)
        assert text.instruction not in json.dumps(inst.prompt)  # ground truth stays out
        assert inst.prompt_tokens > 0 and inst.target_tokens > 0


def test_request_question_names_words_of_the_users_message():
    import random

    history = [{"role": "assistant", "content": "Hi!"},
               {"role": "user", "content": "I want to cancel order #W123 for the blue kettle."}]
    question = learning.request_question(history, random.Random(0))
    words = history[1]["content"].replace(".", "").split()
    named = [q for q in question.rstrip("?").split() if q in words]
    assert len(named) >= 2 and question.endswith("?")


def test_reward_rise_reads_first_and_last_windows():
    records = [{"reward_mean": float(r), "n_valid": 1, "prior_mean": -1.0, "post_mean": -0.9}
               for r in (0, 0, 1, 1)]
    records[0]["prior_mean"] = None
    rise = learning.reward_rise(records, window=2)
    assert (rise["first"], rise["last"], rise["rise"]) == (0.0, 1.0, 1.0)
    assert (rise["first_step"], rise["last_step"]) == (0.0, 1.0)
    assert (rise["steps"], rise["steps_with_ig"]) == (4, 3)
    with pytest.raises(ValueError, match="needs 6"):
        learning.reward_rise(records, window=3)


def test_the_demos_training_raises_the_information_gain_reward(
    warm_tiny_model: Path, tmp_path: Path
):
    """The demo's train stage, in process: its states, policy start and overrides, seed 0."""
    from prour.train.local import LocalTrainer
    from prour.train.report import read_metrics

    prepared = learning.prepare(warm_tiny_model, tmp_path / "run", seed=0)
    assert prepared["well_formed"] >= learning.PASS_TARGET  # the pass stopped at its target
    rows = read_rows(prepared["states"])
    assert len(rows) == len(learning.DOMAINS) * learning.TASKS_PER_DOMAIN
    assert all(state_from_row(r).mode == "clarify" for r in rows)
    # every other role is the warm-started tiny model, as in the demo
    roles = ("generator", "strict_user", "verifier")
    sets = [f"models.{role}.path={warm_tiny_model}" for role in roles]
    sets += [*learning.train_overrides(prepared), f"train.output_dir={tmp_path / 'ckpt'}"]
    recipe = load_recipe(SMOKE, sets)
    assert recipe.models["generator"].path == str(prepared["policy"].resolve())
    assert recipe.models["strict_user"].path == str(warm_tiny_model)  # the frozen tiny model
    LocalTrainer(recipe, reward_factory=recipe_reward(recipe)).run()

    records = read_metrics(tmp_path / "ckpt")
    rise = learning.reward_rise(records)
    assert rise["steps"] == learning.TRAIN_OVERRIDES["train.total_steps"]
    assert rise["steps_with_ig"] > rise["steps"] / 2, "most steps must score questions by IG"
    assert rise["rise"] >= 0.3, f"mean reward {rise['first']:.3f} -> {rise['last']:.3f}"
    # the reward is the information-gain reward: asks carry ℓ_post − ℓ_prior, NO 0, invalid −1
    for r in records:
        assert r["n_failed"] == 0
        if r["n_valid"]:
            assert r["ig_mean"] is not None and r["prior_mean"] is not None
