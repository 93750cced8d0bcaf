"""verl 0.9.1's ``vLLMHttpServer.generate`` over a real vLLM engine, run by the vLLM venv's python.

verl itself is not installed in the vLLM venv, so its code is read from the project venv's
installed files (``argv[1]``: the ``verl`` package folder) and executed here: ``generate`` (the
``vLLMHttpServer`` method that turns a rollout request's ``sampling_params`` dict into vLLM
``SamplingParams`` and the output into a ``TokenOutput``), ``extract_prompt_logprobs``,
``normalize_token_ids``, ``qwen2_5_vl_dedup_image_tokens`` and ``TokenOutput``, verbatim. The
engine is vLLM's ``AsyncLLM``, as in verl's server. ``argv[2]`` is the model folder.

Protocol, one JSON object per line: stdin's first line is the rollout config (the values
``generate`` reads), each later line ``{"prompt_ids": [...], "sampling_params": {...}}``; for
each, stdout gets ``RESULT <TokenOutput as JSON>``. ``READY`` follows engine start-up.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
import sys
import types
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.v1.engine.async_llm import AsyncLLM

# verl's module-level definition, file -> names taken from it
VERL_DEFINITIONS = {
    "workers/rollout/vllm_rollout/vllm_async_server.py": ("vLLMHttpServer.generate",),
    "workers/rollout/vllm_rollout/utils.py": (
        "extract_prompt_logprobs",
        "VLLM_LORA_INT_ID",
        "VLLM_LORA_NAME",
        "VLLM_LORA_PATH",
    ),
    "utils/tokenizer/tokenizer.py": ("normalize_token_ids",),
    "workers/rollout/utils.py": ("qwen2_5_vl_dedup_image_tokens",),
    "workers/rollout/replica.py": ("TokenOutput",),
}


class RLInsightLogger:
    """verl's tracer when tracing is off (its ``trace_state`` then only yields)."""

    @staticmethod
    @contextlib.contextmanager
    def trace_state(state_name: str, **labels: Any):
        yield


def _definition(tree: ast.Module, dotted: str) -> ast.stmt:
    """The top-level statement (or class member, ``Class.member``) named ``dotted``."""
    body, node = tree.body, None
    for part in dotted.split("."):
        node = next((n for n in body if part in _names(n)), None)
        if node is None:
            raise LookupError(f"{dotted} not found in verl's source")
        body = getattr(node, "body", [])
    return node


def _names(node: ast.stmt) -> set[str]:
    """The names a statement defines (a def, a class or a plain assignment)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def load_verl(verl_dir: Path) -> dict[str, Any]:
    """verl's definitions, executed in one namespace with the names they use from vLLM.

    The namespace is a registered module's: pydantic resolves ``TokenOutput``'s annotations there.
    """
    module = types.ModuleType("verl_definitions")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace.update(
        {
            "Any": Any,
            "Optional": Optional,
            "BaseModel": BaseModel,
            "np": np,
            "SamplingParams": SamplingParams,
            "TokensPrompt": TokensPrompt,
            "LoRARequest": LoRARequest,
            "RequestOutput": RequestOutput,
            "RLInsightLogger": RLInsightLogger,
            "logger": logging.getLogger("verl"),
        }
    )
    for relative, names in VERL_DEFINITIONS.items():
        path = verl_dir / relative
        tree = ast.parse(path.read_text(), filename=str(path))
        nodes = [_definition(tree, name) for name in names]
        code = compile(ast.Module(nodes, type_ignores=[]), str(path), "exec")
        exec(code, namespace)  # noqa: S102 - verl's own installed source, the point of the test
    return namespace


class RolloutConfig(dict):
    """The rollout config values ``generate`` reads, by attribute and by ``get``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def server(engine: AsyncLLM, config: dict[str, Any]) -> SimpleNamespace:
    """The attributes of a ``vLLMHttpServer`` that ``generate`` reads (one plain replica)."""

    async def admitted(request_id: str) -> None:
        return None

    return SimpleNamespace(
        engine=engine,
        config=RolloutConfig(config, mtp=SimpleNamespace(**config["mtp"])),
        replica_rank=0,
        global_steps=None,
        model_config=SimpleNamespace(processor=None),
        lora_as_adapter=False,
        _disaggregation_role=None,
        _pd_decode_peers=None,
        _admitting=0,
        _park_until_admitted=admitted,
        _warned_missing_spec_decode_stats=False,
    )


async def serve(verl_dir: Path, model_dir: Path) -> None:
    verl = load_verl(verl_dir)
    config = json.loads(sys.stdin.readline())
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(model_dir),
            dtype="float32",
            max_model_len=config["max_model_len"],
            enable_prefix_caching=config["enable_prefix_caching"],
            logprobs_mode=config["logprobs_mode"],
            seed=config["seed"],
            enforce_eager=True,
            distributed_executor_backend="uni",
        )
    )
    this = server(engine, config)
    print("READY", flush=True)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            output = await verl["generate"](
                this,
                prompt_ids=request["prompt_ids"],
                sampling_params=request["sampling_params"],
                request_id=uuid.uuid4().hex,
            )
            print("RESULT " + output.model_dump_json(), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1]), Path(sys.argv[2])))
