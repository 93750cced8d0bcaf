"""Backends chosen by name (``models.<role>.backend``); each is imported only when used."""

from __future__ import annotations

from collections.abc import Callable

from prour.config import ModelConfig
from prour.llm.base import LLM
from prour.registry import Registry


def _build_hf(cfg: ModelConfig, models_dir: str | None, key: str | None) -> LLM:
    from prour.llm.hf import HFLLM
    from prour.llm.weights import local_weights

    path = local_weights(cfg.path, models_dir, key)  # never a download: one line when missing
    return HFLLM(path, device=cfg.device, dtype=cfg.dtype, max_model_len=cfg.max_model_len)


def _build_openai(cfg: ModelConfig, models_dir: str | None, key: str | None) -> LLM:
    from prour.llm.openai import OpenAILLM

    if not cfg.base_url:
        where = f"{key.removesuffix('.path')}.base_url" if key else "its base_url"
        raise ValueError(
            f"openai model {cfg.model!r} has no base_url: set {where} in the recipe, or serve "
            f"it (prour serve, run on this recipe, writes the endpoints file the recipe reads)"
        )
    return OpenAILLM(
        base_url=cfg.base_url,
        model=cfg.model,
        api_key_env=cfg.api_key_env,
        api_key_file=cfg.api_key_file,
        max_concurrency=client_concurrency(cfg),
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        replicas=cfg.replica_urls,
        retry_budget_s=cfg.retry_budget_s,
        label=key.split(".")[1] if key and key.startswith("models.") else None,
    )


def client_concurrency(cfg: ModelConfig) -> int:
    """Requests an ``openai`` client keeps in flight: ``max_concurrency``, raised to the
    requests its server's copies run at once where the endpoints file gives them
    (``server_slots``), so that a server sized to run more is not held below it by the client.
    The eval queue holds each model at the lower of its limits (:mod:`prour.eval.queue`)."""
    return max(cfg.max_concurrency, cfg.server_slots or 0)


def _build_scripted(cfg: ModelConfig, models_dir: str | None, key: str | None) -> LLM:
    from prour.llm.scripted import scripted_from_config

    return scripted_from_config(cfg.script)


BACKENDS: Registry[Callable[[ModelConfig, str | None, str | None], LLM]] = Registry(
    "backend", {"hf": _build_hf, "openai": _build_openai, "scripted": _build_scripted}
)


def lane_name(cfg: ModelConfig) -> str:
    """What a model's requests share (a lane of the evaluation's queue, :mod:`prour.eval.queue`):
    a served model at its URL, or the in-process or scripted model."""
    if cfg.backend == "openai":
        return f"{cfg.model} at {cfg.base_url}" if cfg.base_url else str(cfg.model)
    if cfg.backend == "hf":
        return f"{cfg.path} (in process)"
    return f"{cfg.script or cfg.backend} ({cfg.backend})"


def build_llm(cfg: ModelConfig, models_dir: str | None = None, key: str | None = None) -> LLM:
    """Instantiate the backend named by ``cfg.backend``; unknown names list the valid ones.

    ``hf`` weights are found locally (:func:`prour.llm.weights.local_weights`: the path, the
    recipe's ``models_dir`` / ``$PROUR_MODELS_DIR``, the HF cache); ``key`` names the recipe key
    in the one-line error of a missing model."""
    return BACKENDS.get(cfg.backend)(cfg, models_dir, key)
