"""The tests' one way to teach the tiny model a few fixed replies: the demo's fine-tune
(:func:`prour.demo.warmstart.fine_tune`) on the same examples in every step."""

from __future__ import annotations

from pathlib import Path


def learned_by_heart(model_dir: Path, out_dir: Path, examples: list, steps: int,
                     max_tokens: int = 512, lr: float = 5e-3, seed: int = 0) -> Path:
    """The tiny model fine-tuned on ``examples`` (SFTExample), all of them in each of ``steps``
    steps, each cut to ``max_tokens``, saved in ``out_dir``."""
    from transformers import AutoTokenizer

    from prour.demo.training import encode_example
    from prour.demo.warmstart import fine_tune

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [[encode_example(tokenizer, example, max_tokens)] for example in examples]
    out_dir.mkdir(parents=True, exist_ok=True)
    fine_tune(Path(model_dir), out_dir, [rows] * steps, lr, seed)
    return out_dir
