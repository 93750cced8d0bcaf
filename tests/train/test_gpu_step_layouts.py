"""benchmarks/gpu_step.py's update variants (CPU, tiny shape): each times the same update, so
every variant's gradient norm on the same batch equals the baseline's."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_update_variant_computes_the_baseline_gradient() -> None:
    gs = _script()
    args = argparse.Namespace(samples=4, prompt=6, response=12, mixed=True)
    assert [r for _, r in gs.sample_lengths(args)] == [3, 6, 9, 12]
    device = torch.device("cpu")
    norms = {}
    assert {"fused_logprob", "packed_exact", "fused_packed_exact"} <= gs.VARIANTS.keys()
    for name, options in gs.VARIANTS.items():
        if name in gs.CUDA_ONLY:
            continue
        model = gs.build_model("tiny", device, 32, train=True)  # seeded: the same weights
        gs.set_checkpointing(model, options.get("checkpointing", True))
        batch = gs.make_batch(model.config.vocab_size, args, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6,
                                      fused=bool(options.get("fused")))
        budget = 2 * (args.prompt + args.response) if options.get("budget") else None
        norms[name] = gs.dapo_update(model, optimizer, batch, gs.torch_policy_loss,
                                     options.get("packing", False), budget,
                                     exact=options.get("exact", False),
                                     fused_logprob=options.get("fused_logprob", False))
    assert norms["baseline"] > 0
    for name, norm in norms.items():
        assert norm == pytest.approx(norms["baseline"], rel=1e-5), name
