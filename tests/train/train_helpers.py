"""Helpers of the training tests: instance rows, and a warm start that makes the format likely."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

GOOD = (
    "YES [QUESTION]Which size do you want?[/QUESTION]",
    "YES [QUESTION]Which order is it?[/QUESTION]",
)
BAD = (
    "YES Which size?",
    "yes [question]Which order is it?[/question]",
    "Maybe later.",
    "YES [QUESTION][/QUESTION]",
    "Which size do you want?",
)
PROMPT = "Ask me one question."


@functools.cache
def initial_hash(task_id: str) -> str:
    """DB hash of a retail task before any tool call."""
    from prour.data.schema import tool_traffic_hash

    return tool_traffic_hash("retail", task_id, [])


def instance_rows(n: int, prompt: str = PROMPT) -> list[dict[str, Any]]:
    """Dataset rows (the data stage's schema) with a short prompt, so tiny-model steps stay fast."""
    from prour.data.schema import Instance

    history = [{"role": "user", "content": "hi"}]
    return [
        Instance(
            mode="clarify", domain="retail", task_id=str(i), trajectory_id=f"retail/{i}/s0/t",
            step=0, history=history, prompt=[{"role": "user", "content": prompt}],
            target=f"I want to return order #W{1000 + i}.", au=0.4, eu=0.1, total=0.5,
            truncated=False, dropped_messages=0, prompt_tokens=16, target_tokens=8,
            decomposer_calls=3, prompts_version="test", env_history=[],
            db_hash=initial_hash(str(i)),
        ).to_row(i)
        for i in range(n)
    ]


def warm_start(
    model_dir: Path,
    out_dir: Path,
    good_share: int = 2,
    bad_share: int = 8,
    steps: int = 25,
    seed: int = 0,
) -> Path:
    """Supervised pass so the tiny model answers the prompt with a mix of well-formed and broken
    outputs (about good_share : bad_share); RL then has something to reinforce."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    targets = [GOOD[i % len(GOOD)] for i in range(good_share)] + [
        BAD[i % len(BAD)] for i in range(bad_share)
    ]
    seqs, starts = [], []
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    for target in targets:
        p_ids = tokenizer.encode(prompt, add_special_tokens=False)
        t_ids = tokenizer.encode(target + "<|im_end|>", add_special_tokens=False)
        seqs.append(p_ids + t_ids)
        starts.append(len(p_ids))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    for row, (seq, start) in enumerate(zip(seqs, starts)):
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, start : len(seq)] = torch.tensor(seq[start:])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        loss = model(
            input_ids=ids,
            attention_mask=(labels != -100) | (ids != tokenizer.pad_token_id),
            labels=labels,
        ).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
