"""What an evaluation's run folder records about how its results were made: ``run.json``, the
settings that make results comparable (a rerun with other settings is refused, naming the keys
that differ), and ``provenance.json`` beside the resolved recipe (endpoints, seeds, arms, task
counts, generator, checkpoint and question writers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.config import ModelConfig, Recipe, run_path
from prour.files import write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.train import RolloutSettings
    from prour.eval.arms import GeneratorCheckpoint

RUN_FILE = "run.json"
_MODEL_IDENTITY = ("backend", "path", "model", "script", "dtype", "max_model_len")
"""Model-config fields that change outputs (a server's URL or timeouts do not)."""
_NOT_SETTINGS = ("methods", "seeds", "domains", "tasks", "max_tasks", "concurrency", "max_in_flight",
                 "retry_errors", "max_error_fraction", "attention_policies", "protocol",
                 "sweep", "tradeoff")  # sweep points are in the arm keys (router marks the
# swept keys); eval.tradeoff is the chain's sweep steps', each into its own folder


def run_settings(recipe: Recipe, rollout: RolloutSettings,
                 checkpoint: GeneratorCheckpoint | None = None) -> dict[str, Any]:
    """What must match for two runs' results to sit in one folder; ``rollout``: the query
    generator's decoding, ``checkpoint``: the training checkpoint the generator loads."""
    cfg = recipe.eval
    models = {role: model.model_dump(mode="json", include=set(_MODEL_IDENTITY))
              for role, model in sorted(recipe.models.items())}
    if checkpoint is not None:  # its steps differ by arm (the key); the run is the same
        models["generator"]["path"] = checkpoint.root
    eval_part = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in _NOT_SETTINGS}
    reward = recipe.reward
    decoding = {"train.rollout.max_response_tokens": rollout.max_response_tokens,
                "train.rollout.enable_thinking": rollout.enable_thinking,
                "reward.verifier_max_steps": reward.verifier_max_steps,
                "reward.responder_temperature": reward.responder_temperature,
                "reward.responder_max_tokens": reward.responder_max_tokens}
    if cfg.generator_temperature is None:
        decoding["train.rollout.temperature"] = rollout.temperature
    router = recipe.router.model_dump(mode="json")
    for key in cfg.sweep:  # each point's value is in the arm's key and result lines
        router[key.split(".", 1)[1]] = "swept"
    return {"models": models, "eval": eval_part, "env": recipe.env.model_dump(mode="json"),
            "decoding": decoding, "router": router}


def check_run_dir(run_dir: Path, settings: dict[str, Any]) -> None:
    """Refuse to mix results of different settings in one folder (names the keys); else write
    ``settings`` to its ``run.json``."""
    path = run_dir / RUN_FILE
    if path.is_file():
        stored = _stored_paths(json.loads(path.read_text()).get("settings", {}))
        differ = sorted(_diff_keys(stored, settings))
        if differ:
            raise ValueError(
                f"{run_dir} holds results made with other settings (differing: "
                f"{', '.join(differ[:8])}); use another --out folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"settings": settings}, indent=2, sort_keys=True) + "\n")


def same_model(a: ModelConfig | None, b: ModelConfig | None) -> bool:
    """Whether two model configs give the same outputs (their identity fields agree)."""
    if a is None or b is None:
        return a is b
    fields = set(_MODEL_IDENTITY)
    return a.model_dump(include=fields) == b.model_dump(include=fields)


def write_run_provenance(run_dir: Path, recipe: Recipe, arms: list[str],
                         task_counts: dict[str, int], generator: str | None,
                         checkpoint: GeneratorCheckpoint | None,
                         sweep_steps: list[int | None] | None) -> None:
    """The resolved recipe and ``provenance.json`` of an evaluation: its arms' keys, the number
    of tasks per domain, the swapped generator's name (None: the recipe's default) and the
    checkpoint and sweep steps it evaluates, besides what every stage records."""
    from prour.eval.methods import question_writer
    from prour.provenance import write_provenance

    cfg = recipe.eval
    endpoints = {role: model.base_url or model.path or model.script
                 for role, model in recipe.models.items()}
    write_provenance(run_dir, recipe, extra={
        "seeds": cfg.seeds, "endpoints": endpoints, "arms": arms, "domains": cfg.domains,
        "split": cfg.split, "protocol": cfg.protocol, "task_counts": task_counts,
        "generator": generator or "default",
        "checkpoint": checkpoint.record() if checkpoint else None,
        "checkpoint_steps": sweep_steps,
        "question_writers": {m: question_writer(m, recipe.models) for m in cfg.methods}})


# Path keys among the settings. A run folder of an older prour stored them as the recipe wrote
# them, relative to the working directory (their base then); taken from there they compare with
# today's absolute paths, so that such a folder still resumes.
_SETTING_PATHS = (("router", "thresholds_file"), ("router", "calibration", "dev_states"),
                  ("router", "calibration", "test_states"), ("router", "calibration", "out_dir"),
                  ("eval", "attention", "cache_dir"))


def _stored_paths(stored: dict[str, Any]) -> dict[str, Any]:
    """``stored`` settings with their relative path values taken from the working directory."""
    out = json.loads(json.dumps(stored))
    for *parents, key in _SETTING_PATHS:
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(key), str):
            node[key] = run_path(node[key], Path.cwd(), "")
    return out


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two nested mappings differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return [k for key in keys for k in _diff_keys(a.get(key), b.get(key),
                                                       f"{prefix}{key}.")]
    return [] if a == b else [prefix.rstrip(".")]
