"""Warm start of the tiny model: a short supervised pass so that the CPU pipeline sees valid outputs.

A random tiny Qwen3 writes noise, so every parser downstream would see only invalid outputs and
every reward would be flat. The warm start builds a small supervised corpus from *train-split*
tau2 tasks (never the test split, where evaluation runs; :mod:`prour.demo.corpus`) and fine-tunes
the tiny model on it for a few hundred steps on CPU (:mod:`prour.demo.training`):

* oracle transcripts: each task's reference actions replayed through the episode runner; the agent
  turns (``<tool_call>`` blocks and replies) and the user turns are targets;
* the decomposer: first-person goal readings derived from the task instruction (a stand-in for
  pretraining, allowed here and nowhere else) and candidate actions as canonical JSON: the next
  reference action or another tool of the domain with arguments built from its schema;
* the query generator: ``NO`` or ``YES [QUESTION]…[/QUESTION]`` naming a value of the dialogue,
  some after a short think block. Verify says YES before a READ lookup, clarify says YES before a
  WRITE call (the user confirms consequential changes), so the answers carry some signal;
* strict-user replies, verifier tool calls and grounded final answers, normalized goals, belief
  targets and annotator labels.

The result is a standard Hugging Face folder with ``prour_warmstart.json`` (arguments, corpus
stats, loss curve); a folder built from the same base model and arguments is reused, like
:func:`prour.demo.tiny.build_tiny_model`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prour.demo.corpus import DEFAULT_TASKS_PER_DOMAIN, build_corpus
from prour.demo.folders import build_folder, refuse_non_folder, save_quietly
from prour.demo.prompts import prompt_fingerprint
from prour.demo.tiny import MARKER_FILE as TINY_MARKER_FILE
from prour.demo.training import Row, RowPacker, loss_summary, torch_threads, train_replies
from prour.demo.transcripts import check_split
from prour.env.domains import DOMAINS
from prour.files import write_atomic

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MARKER_FILE = "prour_warmstart.json"
DEFAULT_STEPS = 300


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    domains: Sequence[str] = DOMAINS,
    split: str = "train",
    tasks_per_domain: int | None = DEFAULT_TASKS_PER_DOMAIN,
    rows_per_step: int = 1,
    row_tokens: int = 2048,
    example_tokens: int = 256,
    lr: float = 1e-2,
    threads: int | None = 1,
) -> Path:
    """Fine-tune the tiny model at ``model_dir`` on the synthetic corpus; returns ``out_dir``.

    A folder already built from the same base model and arguments is returned as it is.
    """
    check_split(split)
    if steps < 0 or rows_per_step < 1 or not 64 <= example_tokens <= row_tokens:
        raise ValueError(
            "warm start needs steps >= 0, rows_per_step >= 1 and 64 <= example_tokens <= "
            f"row_tokens; got {steps}, {rows_per_step}, {example_tokens}, {row_tokens}"
        )
    model_dir = Path(model_dir).expanduser().resolve()
    args = {
        "format_version": FORMAT_VERSION,
        "base": _base_digest(model_dir),
        "prompts": prompt_fingerprint(),
        "steps": steps,
        "seed": seed,
        "domains": list(domains),
        "split": split,
        "tasks_per_domain": tasks_per_domain,
        "rows_per_step": rows_per_step,
        "row_tokens": row_tokens,
        "example_tokens": example_tokens,
        "lr": lr,
        "threads": threads,
    }
    return build_folder(
        Path(out_dir).expanduser().resolve(),
        MARKER_FILE,
        args,
        lambda folder: _write_warm(model_dir, folder, args),
        "warm-started model",
        key="args",
    )


def fine_tune(
    model_dir: Path, out_dir: Path, batches: Sequence[Sequence[Row]], lr: float, seed: int
) -> list[float]:
    """Train the model at ``model_dir`` on ``batches`` (loss on reply tokens) and save it, with
    the base folder's tokenizer and config files, into ``out_dir``; the loss of every step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    losses = train_replies(model, batches, tokenizer.pad_token_id, lr, seed)
    save_beside_base(model, model_dir, out_dir)
    return losses


def save_beside_base(model: Any, model_dir: Path, out_dir: Path) -> None:
    """Save ``model`` into ``out_dir`` with the tokenizer and config files of ``model_dir``."""
    for path in model_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != TINY_MARKER_FILE:
            shutil.copy2(path, out_dir / path.name)
    save_quietly(model, out_dir)


def _write_warm(model_dir: Path, folder: Path, args: dict[str, Any]) -> None:
    """Build the corpus, train, and save model, tokenizer and marker into ``folder``."""
    from transformers import AutoTokenizer

    start = time.perf_counter()
    with torch_threads(args["threads"]):
        corpus = build_corpus(
            args["domains"], args["split"], args["seed"], args["tasks_per_domain"]
        )
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        packer = RowPacker(
            corpus, tokenizer, args["example_tokens"], args["row_tokens"], args["seed"]
        )
        batches = packer.batches(args["steps"], args["rows_per_step"])
        train_start = time.perf_counter()
        losses = fine_tune(model_dir, folder, batches, args["lr"], args["seed"])
        train_seconds = time.perf_counter() - train_start
    rows = [row for batch in batches for row in batch]
    stats = {
        "corpus": corpus.stats(),
        "examples_by_kind": dict(sorted(packer.used.items())),
        "distinct_examples": len(packer.encoded),
        "rows": len(rows),
        "reply_tokens": sum(n for row in rows for _, n in row),
        "row_tokens": sum(len(ids) for row in rows for ids, _ in row),
        "loss": loss_summary(losses),
        "loss_curve": [round(x, 4) for x in losses],
        "train_seconds": round(train_seconds, 2),
        "total_seconds": round(time.perf_counter() - start, 2),
    }
    write_atomic(folder / MARKER_FILE, json.dumps({"args": args, "stats": stats}, indent=1) + "\n")
    logger.info(
        "warm start: %d steps, loss %.3f -> %.3f, %.0fs (train %.0fs)",
        len(losses),
        stats["loss"].get("first_mean", float("nan")),
        stats["loss"].get("last_mean", float("nan")),
        stats["total_seconds"],
        train_seconds,
    )


def _base_digest(model_dir: Path) -> str:
    """Hash of the base model's weights, config and tokenizer files."""
    digest = hashlib.sha256()
    names = ["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    names += sorted(p.name for p in model_dir.glob("*.safetensors"))
    for name in names:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\x00" + path.read_bytes())
    return digest.hexdigest()[:16]


# The position limit of the tiny model the CPU recipes use: tau2's retail policy and tool schemas
# alone are ~9k tiny-tokenizer tokens, so 16k leaves room for the dialogue (RoPE: only the limit
# in config.json changes, no weights).
TINY_MAX_POSITION = 16384


def prepare_tiny_model(path: str | Path, *, warm: bool = True, seed: int = 0,
                       steps: int = DEFAULT_STEPS) -> Path:
    """The tiny Qwen3 at ``path`` (``prour tiny-model``) with :data:`TINY_MAX_POSITION`
    positions: built beside it as ``<path>-base`` and warm-started into ``path``, or, without the
    warm start, built into ``path`` itself. A folder built with the same arguments is reused."""
    from prour.demo.tiny import build_tiny_model

    path = Path(path).expanduser().resolve()
    refuse_non_folder(path, "tiny model")  # before <path>-base is built beside it
    if not warm:
        return build_tiny_model(path, seed=seed, max_position=TINY_MAX_POSITION)
    base = build_tiny_model(path.parent / f"{path.name}-base", seed=seed,
                            max_position=TINY_MAX_POSITION)
    return warm_start(base, path, seed=seed, steps=steps)
