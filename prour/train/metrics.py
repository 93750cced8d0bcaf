"""Per-step training metrics: always a JSONL file, and Weights & Biases when the recipe asks.

Both backends report a step's sampled outputs under the same names (:func:`sample_diagnostics`):
the local trainer as plain keys in ``metrics.jsonl`` (and wandb), verl with the prefix
``training/prour/`` in its step metrics. :mod:`prour.train.report` reads either.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from prour.config.train import WandbSettings
from prour.core.clock import (  # noqa: F401 - the step clock, still importable from here
    CALL_KEYS,
    PHASES,
    PhaseClock,
    clocking,
    current_clock,
    shared_seconds,
)
from prour.files import append_jsonl, write_atomic

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SEGMENT_PREFIX = "metrics.from_step_"


def segment_name(start_step: int) -> str:
    """The metrics file of a run resumed at ``start_step`` whose logger cannot append (verl)."""
    return f"{SEGMENT_PREFIX}{start_step}.jsonl"


PHASE_KEYS = tuple(f"time_{phase}_s" for phase in PHASES)
"""Every step's seconds per phase, in both backends' metrics (verl's under ``training/prour/``,
its ``timing_s/*`` keys mapped onto these); they sum to :data:`STEP_TIME_KEY`."""

STEP_TIME_KEY = "time_step_s"
"""A step's wall-clock seconds."""


def phase_metrics(
    seconds: Mapping[str, float], counts: Mapping[str, int], step_s: float
) -> dict[str, float | int]:
    """A step's :data:`PHASE_KEYS`, :data:`CALL_KEYS` and :data:`STEP_TIME_KEY`: every phase's
    seconds (0 when it did not run), ``waiting`` the step's seconds the others leave, so the
    phases sum to ``step_s``. Phases that add up to more than the step are an error."""
    measured = {p: float(seconds.get(p, 0.0)) for p in PHASES if p != "waiting"}
    waiting = step_s - sum(measured.values())
    if waiting < -1e-6 * max(step_s, 1.0):
        raise ValueError(
            f"phase seconds {measured} add up to more than the step's {step_s:.6f} s"
        )
    out: dict[str, float | int] = {f"time_{p}_s": v for p, v in measured.items()}
    out["time_waiting_s"] = max(waiting, 0.0)
    out[STEP_TIME_KEY] = step_s
    out.update({key: int(counts.get(key, 0)) for key in CALL_KEYS})
    return out


KINDS = ("ask", "none", "invalid")
MODES = ("clarify", "verify")


class ScoredSample(Protocol):
    """What the diagnostics read of one sampled output (a reward's sample or verl's info)."""

    kind: str
    failed: bool
    reward: float | None
    prior: float | None
    post: float | None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def failed_ask_fraction(samples: Sequence[ScoredSample]) -> float:
    """Share of the sampled questions (kind ``ask``) whose responder call or scoring failed."""
    asks = [s for s in samples if s.kind == "ask"]
    return sum(bool(s.failed) for s in asks) / len(asks) if asks else 0.0


class FailedAsksError(RuntimeError):
    """Too many of a step's questions could not be answered or scored."""


def check_failed_asks(samples: Sequence[ScoredSample], limit: float, states: int) -> None:
    """:class:`FailedAsksError` when the failed share of the step's questions (the responders'
    calls failed after their retries, or scoring did) exceeds ``train.max_failed_ask_fraction``:
    a responder that is down must stop the run, not train it on what is left. The verl sampler
    and the local trainer both apply it to every step."""
    fraction = failed_ask_fraction(samples)
    if fraction > limit:
        asks = sum(s.kind == "ask" for s in samples)
        raise FailedAsksError(
            f"{round(fraction * asks)} of {asks} sampled questions failed (responder or "
            f"scoring errors) over {states} states, more than "
            f"train.max_failed_ask_fraction={limit}; stopping training: check that the "
            "responder endpoints (models.strict_user, models.verifier) are up")


def sample_diagnostics(
    samples: Sequence[ScoredSample], modes: Sequence[str | None]
) -> dict[str, float | None]:
    """One step's sampled outputs (``modes[i]``: the belief mode of sample i's state):

    ``<kind>_fraction`` for ask / none / invalid, ``failed_fraction`` (responder or scoring
    failed), ``failed_ask_fraction`` (of the asks), ``reward_mean`` and ``reward_mean_<mode>``
    over the samples that got a reward (the paper's Figure 4 curves; None when a mode has none
    this step), and ``prior_mean`` / ``post_mean`` over the samples that carry them;
    ``ig_mean`` and ``attention_cost_mean``: the two terms of R = IG − λ·cost over the answered
    questions (the cost only with ``reward.attention`` on, else None).
    """
    n = len(samples)
    if not n:
        return {}
    out: dict[str, float | None] = {
        f"{kind}_fraction": sum(s.kind == kind for s in samples) / n for kind in KINDS
    }
    out["failed_fraction"] = sum(bool(s.failed) for s in samples) / n
    out["failed_ask_fraction"] = failed_ask_fraction(samples)
    scored = [(s, m) for s, m in zip(samples, modes) if not s.failed and s.reward is not None]
    out["reward_mean"] = _mean([float(s.reward) for s, _ in scored])
    for mode in MODES:
        out[f"reward_mean_{mode}"] = _mean([float(s.reward) for s, m in scored if m == mode])
    for name in ("prior", "post", "ig", "attention_cost"):
        out[f"{name}_mean"] = _mean(
            [v for s in samples if (v := getattr(s, name, None)) is not None]
        )
    return out


def _clean(value: Any) -> Any:
    """JSON-safe numbers (NaN and inf become None)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends one JSON object per step to ``<run_dir>/metrics.jsonl`` (one synced line each)."""

    def __init__(
        self,
        run_dir: str | Path,
        wandb: WandbSettings | None = None,
        *,
        run_name: str,
        config: Mapping[str, Any] | None = None,
    ):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wandb = (
            _start_wandb(wandb, run_name, Path(run_dir), config) if wandb and wandb.track else None
        )

    def truncate_after(self, step: int) -> int:
        """Drop lines of steps after ``step`` (written after the checkpoint a resume starts at)."""
        if not self.path.exists():
            return 0
        kept, dropped = [], 0
        for line in self.path.read_text().splitlines():
            try:
                record_step = json.loads(line).get("step", 0)
            except json.JSONDecodeError:  # a line cut by a kill: drop it
                dropped += 1
                continue
            if record_step <= step:
                kept.append(line)
            else:
                dropped += 1
        write_atomic(self.path, "".join(f"{line}\n" for line in kept))
        return dropped

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        append_jsonl(self.path, record)
        if self._wandb is not None:
            self._wandb.log(
                {k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step
            )

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def wandb_mode(settings: WandbSettings) -> str:
    """The mode wandb runs in: ``auto`` is online only when an API key is present."""
    if settings.mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if settings.mode == "online" and not os.environ.get("WANDB_API_KEY"):
        logger.warning("wandb mode 'online' without WANDB_API_KEY: logging offline instead")
        return "offline"
    return settings.mode


def _start_wandb(
    settings: WandbSettings, run_name: str, run_dir: Path, config: Mapping[str, Any] | None
) -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(
            "train.wandb.track is on but wandb is not installed: pip install 'prour[track]'"
        ) from exc
    return wandb.init(
        project=settings.project,
        entity=settings.entity,
        name=run_name,
        dir=str(run_dir),
        mode=wandb_mode(settings),
        config=dict(config or {}),
        resume="allow",
    )
