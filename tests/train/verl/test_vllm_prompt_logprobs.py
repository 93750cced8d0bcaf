"""Scoring through verl's vLLM rollout server equals HF log-probs (real vLLM, CPU venv).

The reward's score requests go through prour's ``RolloutServerLLM`` (``SCORE_SAMPLING``,
``target_logprobs``) to verl 0.9.1's own ``vLLMHttpServer.generate`` (executed from verl's
installed source by ``verl_vllm_server.py`` in the vLLM venv, over vLLM's ``AsyncLLM`` with
prefix caching on, as verl's rollout config sets it). The expectation is the tiny model's
float32 HF log-probs of the same ids, computed here.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from train_helpers import paper_like

from prour.llm import chat as chat_rules
from prour.llm.base import ChatRequest, SamplingParams, ScoreRequest
from prour.train.verl_ext.logic import RolloutServerLLM

pytestmark = pytest.mark.vllm

SERVER_SCRIPT = Path(__file__).with_name("verl_vllm_server.py")
TINY_MAX_MODEL_LEN = 2048
"""The tiny model's engine length (the paper recipe's 8192 exceeds its position embeddings)."""
TOLERANCE = 1e-5

# Long enough that the rendered context fills whole KV-cache blocks (a prefix-cache hit needs one).
CONTEXT = [
    {
        "role": "system",
        "content": "You are a retail customer-service agent. Before acting, check the order, "
        "the item and the payment method with the user; never guess an order number. "
        "Refunds go back to the original payment method within five business days; "
        "exchanges keep the same product type and need the new item's id. "
        "Ask one question at a time and confirm every change before making it.",
    },
    {"role": "user", "content": "Hi, the boots I ordered last week are too small for me."},
]
TARGET = "I want to exchange the boots from order #W1003 for a larger size."


def rollout_config(tmp_path: Path, model_dir: Path) -> dict[str, Any]:
    """The rollout-config values verl's ``generate`` and engine read, from prour's composed verl
    config turned into verl's ``RolloutConfig`` as its server does (``omega_conf_to_dataclass``)."""
    from verl.utils.config import omega_conf_to_dataclass

    from prour.train.verl_backend import compose_verl_config, prepare_verl_run

    recipe, cfg = paper_like(tmp_path, model_dir)
    config = compose_verl_config(prepare_verl_run(recipe, cfg).overrides)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    return {
        **{
            key: getattr(rollout, key)
            for key in (
                "response_length",
                "prompt_length",
                "full_determinism",
                "seed",
                "enable_rollout_routing_replay",
                "enable_prefix_caching",
                "logprobs_mode",
            )
        },
        "repetition_penalty": rollout.get("repetition_penalty", 1.0),
        "ignore_eos": rollout.get("ignore_eos", False),
        "mtp": {"enable": rollout.mtp.enable, "enable_rollout": rollout.mtp.enable_rollout},
        "max_model_len": TINY_MAX_MODEL_LEN,
    }


class VerlVLLMServer:
    """``verl_vllm_server.py`` in the vLLM venv: one request at a time over its stdin/stdout."""

    def __init__(self, python: Path, model_dir: Path, scratch: Path):
        import verl

        self.log = scratch / "server.log"
        env = {
            **os.environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine worker inside the engine process
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
            "VLLM_LOGGING_STREAM": "ext://sys.stderr",
            "HF_HUB_OFFLINE": "1",
        }
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [str(python), str(SERVER_SCRIPT), str(Path(verl.__file__).parent), str(model_dir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        self.lock = threading.Lock()
        self.outputs: list[Any] = []

    def start(self, config: dict[str, Any]) -> None:
        self._send(config)
        self._read("READY")

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        with self.lock:
            self._send({"prompt_ids": prompt_ids, "sampling_params": sampling_params})
            output = SimpleNamespace(
                prompt_ids=list(prompt_ids), **json.loads(self._read("RESULT"))
            )
            self.outputs.append(output)
            return output

    def _send(self, payload: dict[str, Any]) -> None:
        self.process.stdin.write(json.dumps(payload) + "\n")
        self.process.stdin.flush()

    def _read(self, tag: str) -> str:
        for line in self.process.stdout:
            if line.startswith(tag):
                return line[len(tag) :].strip()
        tail = self.log.read_text()[-3000:]
        raise RuntimeError(f"verl_vllm_server.py ended before {tag}; its log ends:\n{tail}")

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def server(vllm_python: Path, tiny_model_dir: Path, tmp_path: Path) -> Iterator[VerlVLLMServer]:
    served = VerlVLLMServer(vllm_python, tiny_model_dir, tmp_path)  # imports vLLM meanwhile
    try:
        served.start(rollout_config(tmp_path, tiny_model_dir))
        yield served
    finally:
        served.close()


@pytest.fixture
def rollout_llm(server: VerlVLLMServer, tiny_model_dir: Path) -> Iterator[RolloutServerLLM]:
    """prour's adapter over the server, its calls on an event loop of their own (as in verl)."""
    from transformers import AutoTokenizer

    async def generate(prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        return await asyncio.to_thread(server.generate, prompt_ids, sampling_params)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield RolloutServerLLM(generate, AutoTokenizer.from_pretrained(tiny_model_dir), loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def hf_target_logprobs(
    model_dir: Path, context_ids: list[int], target_ids: list[int]
) -> list[float]:
    """Log-probs of the target tokens after the context, by the tiny model in float32 HF."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context_ids + target_ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    n = len(context_ids)
    return [float(logp[n + k - 1, token]) for k, token in enumerate(target_ids)]


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_scores_through_verls_vllm_server_equal_hf(server, rollout_llm, tiny_model_dir):
    request = ScoreRequest(context=CONTEXT, target=TARGET, enable_thinking=False)
    context_ids, target_ids = chat_rules.score_ids(rollout_llm.tokenizer, request)
    expected = hf_target_logprobs(tiny_model_dir, context_ids, target_ids)

    (first,) = rollout_llm.score([request])
    # a rollout call on the scored context: its prefix is now in vLLM's cache and is read back
    rollout_llm.chat(
        [
            ChatRequest(
                messages=CONTEXT, sampling=SamplingParams(max_tokens=2), enable_thinking=False
            )
        ]
    )
    (second,) = rollout_llm.score([request])

    score_1, rollout, score_2 = server.outputs
    assert score_1.prompt_ids == score_2.prompt_ids == context_ids + target_ids
    assert rollout.prompt_ids == context_ids
    assert rollout.extra_fields["num_cached_tokens"] > 0  # the cache holds the scored prefix
    for output in (score_1, score_2):
        assert len(output.token_ids) == 1  # max_tokens=1 reached vLLM
        assert len(output.extra_fields["prompt_logprobs"]) == len(output.prompt_ids)
        # vLLM 0.32 does not read the prefix cache for prompt-log-prob requests, so a repeated
        # scoring call still computes every prompt position (and none is missing from its list)
        assert output.extra_fields["num_cached_tokens"] == 0
    diffs = [max_abs_diff(result.token_logprobs, expected) for result in (first, second)]
    print(f"max |vLLM - HF| per token: first call {diffs[0]:.3g}, cached prefix {diffs[1]:.3g}")
    assert diffs[0] <= TOLERANCE and diffs[1] <= TOLERANCE
