"""Model shapes and the memory constants the GPU plan and the sizing share.

A model's shape (layers, hidden size, KV heads, head size, vocabulary, parameters) comes from a
local folder's ``config.json`` when there is one, else from :data:`KNOWN_MODELS`, the hub configs
of the paper's models. The reserves below are estimates, marked as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}  # auto: Qwen3's bfloat16
VLLM_RESERVE_GIB = 1.5  # per vLLM instance and GPU: activations, sampler, CUDA graphs (estimate)
CUDA_CONTEXT_GIB = 0.5  # per process and GPU (estimate)
TIGHT_FRACTION = 0.05  # a plan within 5% of a GPU's memory fits, with a warning


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder-only transformer."""

    params: int
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Key and value of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def shape_from_config(cfg: dict[str, Any]) -> ModelShape:
    """Shape and parameter count of a Qwen3/Llama-style dense model from its ``config.json``
    (attention with separate q/k/v/o projections, gated MLP, RMS norms, q/k norms)."""
    hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab, ffn = int(cfg["vocab_size"]), int(cfg["intermediate_size"])
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads) + 2 * head_dim
    per_layer = attention + 3 * hidden * ffn + 2 * hidden
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    params = layers * per_layer + embeddings + hidden
    return ModelShape(params, layers, hidden, kv_heads, head_dim, vocab)


def _qwen3(hidden: int, layers: int, heads: int, ffn: int, tied: bool) -> ModelShape:
    return shape_from_config(
        {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "intermediate_size": ffn,
            "tie_word_embeddings": tied,
        }
    )


# The paper's models, from their config.json on the Hugging Face hub (Qwen/Qwen3-*): 1.72 B,
# 8.19 B and 32.76 B parameters, matching the model cards' 1.7B / 8.2B / 32.8B; and the model of
# recipes/gpu-smoke.yaml, 0.60 B (card: 0.6B, 0.44B without the embeddings).
KNOWN_MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen3-0.6B": _qwen3(1024, 28, 16, 3072, tied=True),
    "Qwen/Qwen3-1.7B": _qwen3(2048, 28, 16, 6144, tied=True),
    "Qwen/Qwen3-8B": _qwen3(4096, 36, 32, 12288, tied=False),
    "Qwen/Qwen3-32B": _qwen3(5120, 64, 64, 25600, tied=False),
}


def model_shape(model_id: str, path: str | None = None) -> ModelShape | None:
    """The shape from ``path``'s (or a local ``model_id``'s) config.json, else the known table
    (also for a config without the sizes or not JSON, e.g. a stand-in folder: then the size is
    unknown)."""
    for candidate in (path, model_id):
        if candidate and (Path(candidate) / "config.json").is_file():
            try:  # a config.json that is not JSON (ValueError) or not a mapping: size unknown
                cfg = json.loads((Path(candidate) / "config.json").read_text())
                return shape_from_config(cfg.get("text_config", cfg))
            except (AttributeError, KeyError, TypeError, ValueError):
                break
    return KNOWN_MODELS.get(model_id) or (KNOWN_MODELS.get(path) if path else None)
