"""The demo's learning part: a few minutes of CPU training that visibly raise the reward.

What a tiny model can and cannot do here, stage by stage:

* it cannot hold a conversation or normalize a goal, so its own episodes give no usable states;
  training uses **oracle-replay states** instead (:mod:`prour.demo.states`, a named fallback);
* the warm start teaches it to answer ``NO`` at such early states (it asks only before database
  changes), so a **query-format pass** (:func:`query_format_pass`) fine-tunes a copy of it for a
  few steps on the training states' own query prompts, answered ``YES [QUESTION]…[/QUESTION]``
  with a short question naming words of the user's request. The pass stops as soon as
  :data:`PASS_TARGET` of the model's samples are well-formed (checked every few steps, so the
  start does not depend on how long the warm start ran): the rest of its samples are invalid,
  and learning to avoid them is left to RL;
* training is then ``prour train`` itself with :data:`TRAIN_OVERRIDES`: the local trainer, the
  real information-gain reward (the warm-started tiny model as strict user, prior and posterior
  by the live policy, mean log-prob per target token as in the paper recipe). The reward rises
  as the policy writes well-formed questions instead of invalid text (−1 each) and questions
  whose answers raise its belief in the goal;
* it cannot solve tau2 tasks: the evaluation after training shows that, for every method.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DOMAINS = ("retail", "airline")
TASKS_PER_DOMAIN = 4
DECISIONS_PER_TASK = 1
PASS_ROUND = 5  # pass steps between two checks of the well-formed share
PASS_MAX_STEPS = 80
PASS_ROWS = 4
PASS_LR = 3e-3
PASS_TARGET = 0.25  # stop once this share of samples is well-formed: RL learns the rest
CHECK_SAMPLES = 4
QUESTIONS_PER_STATE = 4

TRAIN_OVERRIDES = {
    "train.total_steps": 48,
    "train.states_per_step": 2,
    "train.save_every": 12,
    "train.rollout.n": 6,
    # every sample reaches the update: keeping valid questions first (the paper's 6 of 8) would
    # drop the last invalid samples, and their −1, once most samples are valid
    "train.rollout.keep": 6,
    "train.rollout.max_response_tokens": 48,
    "train.optim.lr": 3.0e-4,
    "reward.aggregation": "mean",
}
"""``--set`` overrides of the demo's ``prour train`` (besides the state file and the models)."""

WINDOW = 5  # steps averaged at each end of the run for "first" and "last" reward

_STOP = frozenset(
    ["i", "im", "i'm", "my", "me", "the", "a", "an", "to", "and", "or", "of", "for", "in", "on", "at", "is", "it", "its", "that", "this", "with", "want", "would", "like", "have", "has", "be", "am", "was", "were", "do", "did", "can", "could", "you", "your", "we", "our", "so", "but", "if"]
)
_QUESTIONS = ("Which {span}?", "What about {span}?", "Which {span} exactly?")


def request_question(history: Sequence[dict[str, Any]], rng: random.Random) -> str:
    """A short question naming two words of the user's latest message, from a content word."""
    user = [m.get("content") or "" for m in history if m.get("role") == "user"]
    words = re.findall(r"[\w#'-]+", user[-1] if user else "")
    spans = [words[i : i + 2] for i in range(len(words) - 1) if words[i].lower() not in _STOP]
    span = " ".join(rng.choice(spans)) if spans else "your request"
    return rng.choice(_QUESTIONS).format(span=span)


def pass_examples(instances: Sequence[Any], rng: random.Random) -> list[Any]:
    """Query-format examples of the training states (see the module doc)."""
    from prour.demo.corpus import SFTExample

    out = []
    for inst in instances:
        for _ in range(QUESTIONS_PER_STATE):
            question = request_question(inst.history, rng)
            answer = f"YES [QUESTION]{question}[/QUESTION]"
            out.append(SFTExample("query_clarify", inst.prompt, _assistant(answer),
                                  enable_thinking=True))
    return out


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def query_format_pass(
    model_dir: str | Path, out_dir: str | Path, instances: Sequence[Any], seed: int = 0,
    target: float = PASS_TARGET, lr: float = PASS_LR,
) -> tuple[Path, float]:
    """Fine-tune a copy of the model at ``model_dir`` into ``out_dir`` (module doc) in rounds of
    :data:`PASS_ROUND` steps until its samples on the states' prompts (at the training
    temperature) are well-formed in at least ``target`` of the cases, or :data:`PASS_MAX_STEPS`;
    returns the folder and the last measured share."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prour.demo.training import encode_example, torch_threads, train_replies
    from prour.demo.warmstart import save_beside_base

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    rng = random.Random(f"query-format-pass:{seed}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    encoded = [encode_example(tokenizer, e, 512) for e in pass_examples(instances, rng)]
    share, steps = 0.0, 0
    with torch_threads(1):
        while steps < PASS_MAX_STEPS:
            batches = [[[rng.choice(encoded)] for _ in range(PASS_ROWS)]
                       for _ in range(PASS_ROUND)]
            train_replies(model, batches, tokenizer.pad_token_id, lr, seed + steps)
            steps += PASS_ROUND
            share = well_formed_share(model, tokenizer, instances, seed + steps)
            if share >= target:
                break
    out_dir.mkdir(parents=True, exist_ok=True)
    save_beside_base(model, model_dir, out_dir)
    return out_dir, share


def well_formed_share(model: Any, tokenizer: Any, instances: Sequence[Any], seed: int) -> float:
    """Share of :data:`CHECK_SAMPLES` samples per state's query prompt (temperature 0.8, thinking
    on, :data:`TRAIN_OVERRIDES`' response budget) that parse as a question or ``NO``."""
    import torch

    from prour.llm.chat import encode, render_chat
    from prour.rollout.query import parse_query

    budget = TRAIN_OVERRIDES["train.rollout.max_response_tokens"]
    good = total = 0
    torch.manual_seed(seed)
    for inst in instances:
        ids = torch.tensor([encode(tokenizer, render_chat(tokenizer, inst.prompt, None, True))])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.8, top_p=1.0,
                                 top_k=0, max_new_tokens=budget,
                                 num_return_sequences=CHECK_SAMPLES,
                                 pad_token_id=tokenizer.pad_token_id)
        for row in out[:, ids.shape[1]:]:
            text = tokenizer.decode(row, skip_special_tokens=True)
            good += parse_query(text).kind != "invalid"
            total += 1
    return good / total


def prepare(model_dir: str | Path, run_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Write the oracle-replay states and the query-format pass under ``run_dir/learning``."""
    from prour.demo.states import oracle_states, write_states

    root = Path(run_dir) / "learning"
    instances = oracle_states(model_dir, DOMAINS, TASKS_PER_DOMAIN, DECISIONS_PER_TASK, seed)
    states = write_states(instances, root / "train.parquet")
    policy, share = query_format_pass(model_dir, root / "policy-start", instances, seed)
    return {"states": states, "policy": policy, "well_formed": share}


def train_overrides(prepared: dict[str, Any]) -> list[str]:
    """The ``--set`` items of the demo's train stage: the states, the pass's model as the policy,
    and :data:`TRAIN_OVERRIDES`."""
    items = {
        "train.train_file": str(Path(prepared["states"]).resolve()),
        "models.generator.path": str(Path(prepared["policy"]).resolve()),
        **TRAIN_OVERRIDES,
    }
    return [f"{key}={value}" for key, value in items.items()]


def reward_rise(records: Sequence[dict[str, Any]], window: int = WINDOW) -> dict[str, Any]:
    """Mean reward over the first and the last ``window`` steps of metrics.jsonl records (and of
    the very first and last step), and how many steps scored a valid question by prior and
    posterior."""
    rewards = [r["reward_mean"] for r in records if r.get("reward_mean") is not None]
    if len(rewards) < 2 * window:
        raise ValueError(f"{len(rewards)} steps with a reward; the rise needs {2 * window}")
    scored = [r for r in records if r.get("n_valid") and r.get("prior_mean") is not None
              and r.get("post_mean") is not None]
    first = sum(rewards[:window]) / window
    last = sum(rewards[-window:]) / window
    return {"first": first, "last": last, "rise": last - first, "first_step": rewards[0],
            "last_step": rewards[-1], "steps": len(records), "steps_with_ig": len(scored)}
