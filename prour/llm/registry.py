"""Backends chosen by name (``models.<role>.backend``); each is imported only when used."""

from __future__ import annotations

from collections.abc import Callable

from prour.config import ModelConfig
from prour.llm.base import LLM
from prour.registry import Registry


def _build_hf(cfg: ModelConfig) -> LLM:
    from prour.llm.hf import HFLLM

    return HFLLM(cfg.path, device=cfg.device, dtype=cfg.dtype, max_model_len=cfg.max_model_len)


def _build_openai(cfg: ModelConfig) -> LLM:
    from prour.llm.openai import OpenAILLM

    if not cfg.base_url:
        raise ValueError(
            f"openai model {cfg.model!r} has no base_url: set it in the recipe, or start "
            f"`prour serve --recipe R` (it writes the endpoints file the recipe reads)"
        )
    return OpenAILLM(
        base_url=cfg.base_url,
        model=cfg.model,
        api_key_env=cfg.api_key_env,
        max_concurrency=cfg.max_concurrency,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
    )


def _build_scripted(cfg: ModelConfig) -> LLM:
    from prour.llm.scripted import scripted_from_config

    return scripted_from_config(cfg.script)


BACKENDS: Registry[Callable[[ModelConfig], LLM]] = Registry(
    "backend", {"hf": _build_hf, "openai": _build_openai, "scripted": _build_scripted}
)


def build_llm(cfg: ModelConfig) -> LLM:
    """Instantiate the backend named by ``cfg.backend``; unknown names list the valid ones."""
    return BACKENDS.get(cfg.backend)(cfg)
