"""recipes/ig-clarifier.yaml: IG-Clarifier's own training run (prour.config.ig_clarifier).

The recipe is paper.yaml with the one settings table the chain also applies; `prour train` with
it trains the tiny generator 3 steps on the clarify states of its own dataset only, into its own
folder; its reward is 0 for NO and for an output without a question, and for a question the
per-token mean log-prob difference of G* with minus without the exchange, recomputed here with
transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_helpers import instance_rows
from typer.testing import CliRunner

from prour.cli.main import app
from prour.config.ig_clarifier import DATASET_DIR, OUTPUT_DIR, SETTINGS, setting_items
from prour.recipes import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
IG = RECIPES / "ig-clarifier.yaml"


def tiny_sets(model: Path, run_dir: Path) -> list[str]:
    """The tiny model as generator and strict user, the local backend, 3 short steps."""
    role = json.dumps({"backend": "hf", "path": str(model), "device": "cpu", "dtype": "float32",
                       "max_model_len": 4096})
    return [f"run_dir={run_dir}", f"models.generator={role}", f"models.strict_user={role}",
            "train.backend=local", "train.device=cpu", "train.dtype=float32",
            "train.states_per_step=1", "train.total_steps=3", "train.save_every=3",
            "train.rollout.n=2", "train.rollout.keep=2", "train.rollout.max_response_tokens=12",
            "train.rollout.enable_thinking=false", "train.ppo.epochs=1",
            "train.optim.warmup_steps=0", "reward.responder_max_tokens=8"]


def test_the_recipe_is_paper_with_the_chains_settings():
    own = load_recipe(IG).model_dump(mode="json")
    applied = load_recipe(RECIPES / "paper.yaml", [*setting_items(), "run_dir=runs/paper"])
    applied = applied.model_dump(mode="json")
    assert own.pop("name") == "ig-clarifier" and applied.pop("name") == "paper"
    assert own == applied
    assert own["train"]["modes"] == ["clarify"] and own["reward"]["invalid_penalty"] == 0.0
    assert own["train"]["output_dir"].endswith(OUTPUT_DIR) and SETTINGS["train.modes"] == ["clarify"]


def write_rows(path: Path) -> None:
    """Two clarify states and one verify state (target: a canonical tool call)."""
    from prour.data.dataset import write_rows as write

    rows = instance_rows(3)
    extra = rows[2]["extra_info"]
    rows[2]["extra_info"] = {**extra, "mode": "verify"}
    rows[2]["reward_model"] = {**rows[2]["reward_model"], "ground_truth": json.dumps(
        {"arguments": {"order_id": "#W1002"}, "name": "get_order_details"},
        sort_keys=True, separators=(",", ":"))}
    write(rows, path)


def test_prour_train_with_the_recipe_trains_clarify_states_into_its_own_folder(
        tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    for split in ("train", "validation"):
        write_rows(run_dir / DATASET_DIR / f"{split}.parquet")  # its own rows, not prour's
    result = CliRunner().invoke(app, ["train", "--recipe", str(IG),
                                      *(p for s in tiny_sets(tiny_model_dir, run_dir)
                                        for p in ("--set", s)),
                                      # one file's rows on both sides: a deliberate shared task
                                      "--set", "protocol.on_breach=warn"])
    assert result.exit_code == 0, result.output
    out = run_dir / OUTPUT_DIR
    assert (out / "step_3" / "config.json").is_file() and not (run_dir / "checkpoints").exists()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    # 3 steps of 1 state visit all 3 rows of a file once: every one was a clarify state (the
    # verify row was left out, and nothing asked for the verifier, which has no server here)
    assert all(line["reward_mean_clarify"] is not None for line in lines), lines
    assert all(line["reward_mean_verify"] is None for line in lines), lines


@pytest.fixture(scope="module")
def ig_reward(tiny_model_dir, tmp_path_factory):
    from prour.build import Builder
    from prour.llm.scripted import dump_script
    from prour.train.reward import info_gain_reward

    run_dir = tmp_path_factory.mktemp("ig")
    script = run_dir / "strict_user.json"  # the answer is fixed; the beliefs are the tiny model's
    dump_script(script, [], default="It is order #W1000, and I want it refunded to my card.")
    user = json.dumps({"backend": "scripted", "script": str(script)})
    recipe = load_recipe(IG, [*tiny_sets(tiny_model_dir, run_dir), f"models.strict_user={user}"])
    builder = Builder(recipe)
    return info_gain_reward(Builder(recipe, {"generator": builder.llm("generator")}))


def mean_logprob(model, tokenizer, messages, target: str) -> float:
    """The mean log-prob of ``target``'s tokens after the chat prompt of ``messages``."""
    context = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                            enable_thinking=False)
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    tgt = tokenizer(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + tgt])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits[len(ctx) - 1:-1], dim=-1)
    return logprobs[torch.arange(len(tgt)), torch.tensor(tgt)].mean().item()


def test_the_reward_is_zero_without_a_question_and_the_mean_logprob_gain_with_one(
        ig_reward, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prour.data.schema import state_from_row
    from prour.rewards.belief import belief_prompt

    state = state_from_row(instance_rows(1)[0])
    question = "Which order do you want to return?"
    no, ask, broken = ig_reward.score_group(
        state, ["NO", f"YES [QUESTION]{question}[/QUESTION]", "YES [QUESTION][/QUESTION]"])
    assert (no.kind, no.reward) == ("none", 0.0)
    assert (broken.kind, broken.reward) == ("invalid", 0.0)  # paper.yaml's -1 is not IG's
    assert ask.kind == "ask" and not ask.failed
    assert ask.answer == "It is order #W1000, and I want it refunded to my card."
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prior = mean_logprob(model, tokenizer, belief_prompt("clarify", state.history), state.target)
    post = mean_logprob(model, tokenizer,
                        belief_prompt("clarify", state.history, question, ask.answer),
                        state.target)
    assert ask.reward == pytest.approx(post - prior, abs=1e-4)
    assert ask.reward != pytest.approx(0.0, abs=1e-6)  # the exchange moved the belief
