"""Each step's servers sized to the node (prour.cluster.sizing) against numbers worked out by hand.

The paper's node: 2 x 80 GiB; a derived share stops at 95% of a GPU (76 GiB). Qwen3-8B:
8,190,735,360 bf16 parameters = 15.26 GiB, KV 2 x 36 layers x 8 heads x 128 x 2 B = 147,456 B a
token; Qwen3-1.7B (the exported generator, IG-Clarifier's checkpoint): 1,720,574,976 parameters =
3.20 GiB, KV 2 x 28 x 8 x 128 x 2 B = 114,688 B a token. vLLM's reserve 1.5 GiB and a CUDA
context 0.5 GiB per process and GPU are the plan's own estimates.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from prour.cluster.gpu_plan import gpu_plan, step_sizing
from prour.cluster.sizing import equal_token_split, floor_share, kv_tokens, sequence_slots
from prour.recipes import load_recipe
from prour.stages import get_step

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"
GIB = 2**30
W8 = 8_190_735_360 * 2 / GIB  # 15.26 GiB
W17 = 1_720_574_976 * 2 / GIB  # 3.20 GiB
KV8, KV17 = 147_456, 114_688
USABLE, RESERVE, CONTEXT = 0.95 * 80, 1.5, 0.5


def share(gib: float) -> float:
    """Hundredths of 80 GiB, rounded down."""
    return math.floor(gib / 80 * 100 + 1e-9) / 100


def tokens(share_: float, weights: float, kv_bytes: int) -> int:
    return math.floor((share_ * 80 - weights - RESERVE) * GIB / kv_bytes)


def paper(tmp_path: Path, *items: str):
    return load_recipe(PAPER, [f"run_dir={tmp_path / 'run'}", *items], cluster=True)


def test_the_arithmetic() -> None:
    """75.5 of 80 GiB is 0.94375: 0.94; 0.57 x 80 is 45.6 GiB, so 45.6 GiB is still 0.57 (no
    float shaving off a hundredth); 1 GiB of KV cache at 147,456 B a token holds 7,281 tokens,
    on each of two tensor-parallel GPUs 14,563; 7,281 tokens of 4,096-token requests is one
    request, of 8,192 tokens still one (never none); 30 GiB split between the 8B and the 1.7B
    so each caches as many tokens: 30 x 147,456 / 262,144 = 16.875 and 13.125 GiB."""
    assert floor_share(75.5, 80) == 0.94
    assert floor_share(0.57 * 80, 80) == 0.57
    assert kv_tokens(1.0, KV8) == 7_281 and kv_tokens(1.0, KV8, 2) == 14_563
    assert sequence_slots(7_281, 4_096) == 1 and sequence_slots(7_281, 8_192) == 1
    assert sequence_slots(425_573, 4_096) == 103
    assert equal_token_split(30.0, [KV8, KV17]) == pytest.approx([16.875, 13.125])


def test_the_eval_step_fills_both_gpus(tmp_path: Path) -> None:
    """eval: GPU 1 holds the 8B alone: (76 - 0.5) / 80 = 0.94375 -> 0.94, i.e. 75.2 - 15.26 -
    1.5 = 58.44 GiB of KV cache, 425,573 tokens, 103 requests of 4,096 tokens (context_tokens).
    GPU 0 holds IG-Clarifier in process (3.20 + 0.5 GiB), the exported generator and a second 8B
    replica: their KV pool is 76 - 3.70 - 2 x 0.5 - (15.26 + 1.5) - (3.20 + 1.5) = 49.83 GiB,
    204,119 tokens each; the 8B's (15.26 + 1.5 + 28.03) / 80 = 0.560 -> 0.55, 48 requests; the
    generator's (3.20 + 1.5 + 21.80) / 80 = 0.331 -> 0.33, 64 requests of 1,400 + 1,760 tokens."""
    sizing = step_sizing(paper(tmp_path), get_step("eval"))
    alone = share(USABLE - CONTEXT)
    pool = USABLE - (W17 + CONTEXT) - 2 * CONTEXT - (W8 + RESERVE) - (W17 + RESERVE)
    each = pool * GIB / (KV8 + KV17)
    beside = share(W8 + RESERVE + each * KV8 / GIB)
    generator = share(W17 + RESERVE + each * KV17 / GIB)
    assert (alone, beside, generator) == (0.94, 0.55, 0.33)
    eight = sizing.instances["Qwen/Qwen3-8B"]
    assert [(i.spec.gpus, i.spec.gpu_memory_utilization) for i in eight] == [([1], alone),
                                                                           ([0], beside)]
    seqs = [tokens(alone, W8, KV8) // 4096, tokens(beside, W8, KV8) // 4096]
    assert seqs == [103, 48]
    assert [i.spec.max_num_seqs for i in eight] == seqs and sizing.slots("Qwen/Qwen3-8B") == 151
    (gen,) = sizing.instances["exported-generator"]
    assert (gen.spec.gpus, gen.spec.gpu_memory_utilization) == ([0], generator)
    assert gen.spec.max_num_seqs == tokens(generator, W17, KV17) // 3160 == 64
    text = gpu_plan(paper(tmp_path), "eval").text()
    assert ("serving (eval) Qwen/Qwen3-8B x2 replicas: GPU 1 at 0.94 (derived), 58.4 GiB KV cache "
            "= 425,573 tokens, 103 at once (derived); GPU 0 at 0.55 (derived)") in text
    assert ("151 requests in flight at 4,096 tokens each (serve.models.Qwen/Qwen3-8B."
            "context_tokens, assumed until a run's results record its requests)") in text
    assert ("64 requests in flight at 3,160 tokens each (data.max_prompt_tokens 1,400 + "
            "train.rollout.max_response_tokens 1,760)") in text


def test_no_replica_beside_the_trainer(tmp_path: Path) -> None:
    """train: verl holds 12.82 GiB of FSDP state, the 0.2 rollout (16 GiB) and two contexts on
    each GPU; the 8B on GPU 1 gets (76 - 29.82 - 0.5) / 80 = 0.571 -> 0.57, 51 requests; no
    copy goes to GPU 0 beside the trainer, though it has the room."""
    sizing = step_sizing(paper(tmp_path), get_step("train"))
    trainer = 1_720_574_976 * 16 / 2 / GIB + 16 + 1.0
    (eight,) = sizing.instances["Qwen/Qwen3-8B"]
    assert eight.spec.gpus == [1] and eight.spec.gpu_memory_utilization == share(
        USABLE - trainer - CONTEXT) == 0.57
    assert eight.spec.max_num_seqs == tokens(0.57, W8, KV8) // 4096 == 51


def test_collection_puts_an_8b_copy_beside_each_half_of_the_32b(tmp_path: Path) -> None:
    """collect: the 32B keeps its pinned 0.5 on both GPUs (40 + 0.5 GiB each); an 8B copy goes
    on each GPU in the rest: (76 - 40.5 - 0.5) / 80 = 0.4375 -> 0.43; the 32B's max_num_seqs
    stays vLLM's (no context recorded for it), the plan saying one full-length sequence fits."""
    recipe = paper(tmp_path)
    sizing = step_sizing(recipe, get_step("collect-retail"))
    assert [(i.spec.gpus, i.spec.gpu_memory_utilization)
            for i in sizing.instances["Qwen/Qwen3-8B"]] == [([1], 0.43), ([0], 0.43)]
    assert share(USABLE - 40.5 - CONTEXT) == 0.43
    (big,) = sizing.instances["Qwen/Qwen3-32B"]
    assert (big.spec.gpu_memory_utilization, big.spec.max_num_seqs) == (0.5, None)
    assert "max_num_seqs left to vLLM (1 sequence(s) of max_model_len 32,768 fit" in \
        gpu_plan(recipe, "collect").text()
    plan = gpu_plan(recipe, "collect")
    assert plan.fits and plan.warnings == []
    assert plan.total(0) == pytest.approx(0.43 * 80 + 0.5 + 40.5)


def test_a_number_of_replicas_that_does_not_fit_is_named(tmp_path: Path) -> None:
    """Three copies of the 8B on a two-GPU node: room for two."""
    plan = gpu_plan(paper(tmp_path, "serve.models.Qwen/Qwen3-8B.replicas=3"), "normalize")
    assert any(p.startswith("serve.models.Qwen/Qwen3-8B.replicas: 3 asked, room for 2")
               for p in plan.problems), plan.text()


def test_a_pinned_share_keeps_its_size_and_one_copy(tmp_path: Path) -> None:
    """Without size_per_step the 8B keeps 0.45 in eval and, its share fixed, replicas auto adds
    no copy; its requests are still counted from its KV cache: 0.45 x 80 - 15.26 - 1.5 =
    19.24 GiB, 140,127 tokens, 34 requests of 4,096 tokens."""
    sizing = step_sizing(paper(tmp_path, "serve.models.Qwen/Qwen3-8B.size_per_step=false"),
                         get_step("eval"))
    (eight,) = sizing.instances["Qwen/Qwen3-8B"]
    assert (eight.spec.gpu_memory_utilization, eight.share_from) == (0.45, "pinned")
    assert eight.spec.max_num_seqs == tokens(0.45, W8, KV8) // 4096 == 34


def test_a_runs_own_results_give_the_tokens_a_request_reaches(tmp_path: Path) -> None:
    """Two finished episodes whose agent sent 10 requests of 50,000 prompt tokens in all and
    generated 1,000 tokens in 10 sequences: 5,000 + 100 = 5,100 tokens a request, more than the
    user's (8,000 / 8 + 80 / 8 = 1,010), so the 8B's GPU 1 copy runs 425,573 // 5,100 = 83."""
    recipe = paper(tmp_path)
    results = tmp_path / "run" / "eval" / "results.jsonl"
    results.parent.mkdir(parents=True)
    tokens_ = {"agent.requests": 5, "agent.prompt": 25_000, "agent.sequences": 5,
               "agent.completion": 500, "user.requests": 4, "user.prompt": 4_000,
               "user.sequences": 4, "user.completion": 40}
    results.write_text("".join(json.dumps(
        {"key": ["retail", task, 0, "base"], "method": "base", "error": False,
         "model_tokens": tokens_}) + "\n" for task in ("1", "2")))
    sizing = step_sizing(recipe, get_step("eval"))
    assert sizing.contexts["Qwen/Qwen3-8B"] == (
        5_100, f"mean tokens per agent request, 10 requests in {results}")
    assert sizing.instances["Qwen/Qwen3-8B"][0].spec.max_num_seqs == 425_573 // 5_100 == 83
