"""The training half of the dry-runs' run-time estimates: seconds per step and total hours of a
training, from the run's own ``metrics.jsonl`` when its folder has one, else from the rates
recorded under ``benchmarks/results`` (:data:`RATES_FILE` names each rate and the raw result file
it is read from, or the public source a rate prour has not measured is assumed from).
:mod:`prour.estimate` adds the evaluation and the chain's other steps.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.train import TrainConfig

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RATES_FILE = RESULTS_DIR / "rates.json"

# Per-phase seconds of a step as metrics name them (prour.train.metrics.PHASE_KEYS), and the
# local trainer's earlier three phases, which runs written before those keys carry.
EARLIER_PHASE_KEYS = (("rollout", "time_rollout_s"), ("reward", "time_reward_s"),
                      ("update", "time_update_s"))


@dataclass(frozen=True)
class Rate:
    """One recorded rate: its number, unit, what it times, where it comes from, the shape it
    was measured at (sample and token counts) for scaling to a recipe's shape, and whether it
    was measured (read from a benchmark result) or is a stated assumption."""

    value: float
    unit: str
    what: str
    source: str
    shape: Mapping[str, int]
    measured: bool
    model: str | None = None  # the served model a tokens/s rate is of (a server's throughput)


def _dig(data: Mapping[str, Any], dotted: str, where: Path) -> float:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ValueError(f"{where}: no key {dotted!r} (missing {part!r})")
        node = node[part]
    try:
        return float(node)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {dotted} is {node!r}, not a number") from None


def recorded_rates(path: Path = RATES_FILE) -> dict[str, Rate]:
    """The rates of ``rates.json``: an entry with ``file`` and ``key`` reads its number from
    that raw benchmark result (beside the rates file); one with ``value`` states an assumption
    and its ``source``. A missing file gives ``{}``; a broken one raises ValueError naming it."""
    if not path.exists():
        return {}
    try:
        entries = json.loads(path.read_text())["rates"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a rates file ({exc})") from None
    if not isinstance(entries, dict):
        raise ValueError(  # noqa: TRY004 - a bad file, reported like the others
            f"{path}: rates is a {type(entries).__name__}, not a mapping of names to entries")
    rates = {}
    for name, entry in entries.items():
        where = f"{path}: rates.{name}"
        if not isinstance(entry, dict):
            raise ValueError(  # noqa: TRY004 - a bad file, reported like the others
                f"{where}: {entry!r} is not an entry (give file + key, or value)")
        if "file" in entry:
            raw = path.parent / entry["file"]
            if not raw.exists():
                raise ValueError(f"{where}.file: {raw} does not exist")
            try:
                data = json.loads(raw.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{raw}: not JSON ({exc}); named by {where}.file") from None
            value = _dig(data, entry["key"], raw)
            source = f"benchmarks/results/{entry['file']} {entry['key']}"
        elif isinstance(entry.get("value"), (int, float)):
            value, source = float(entry["value"]), entry.get("source", "stated in rates.json")
        else:
            raise ValueError(f"{where}: give file + key, or a numeric value")
        rates[name] = Rate(value, entry.get("unit", ""), entry.get("what", name), source,
                           entry.get("shape", {}), measured="file" in entry,
                           model=entry.get("model"))
    return rates


def seconds_text(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds < 100 else f"{seconds:,.0f} s"


def hours_text(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


def _median(records: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def train_from_metrics(records: Sequence[Mapping[str, Any]], total_steps: int,
                       where: Path) -> list[str] | None:
    """The estimate from a previous run's step metrics (median seconds of each phase over its
    steps); None when no step recorded its time."""
    from prour.train.metrics import PHASE_KEYS, PHASES, STEP_TIME_KEY

    step_s = _median(records, STEP_TIME_KEY)
    if step_s is None:
        return None
    timed = [r for r in records if isinstance(r.get(STEP_TIME_KEY), (int, float))]
    done = max(int(r.get("step", 0)) for r in timed)
    named = [(p.replace("_", " "), key) for p, key in zip(PHASES, PHASE_KEYS)]
    if not any(key in r for r in timed for _, key in named):
        named = list(EARLIER_PHASE_KEYS)
    phases = [(label, s) for label, key in named if (s := _median(timed, key)) is not None]
    # medians of the phases need not add up to the median step: listed beside it, not as a sum
    split = ("; median of each phase: " + ", ".join(f"{label} {seconds_text(s)}" for label, s in phases)
             if phases else "")
    return [
        f"estimate (train): from this run's metrics, {where}: median of {len(timed)} step(s)",
        f"  per step: {seconds_text(step_s)}{split}",
        (f"  total: {hours_text(step_s * total_steps)} for {total_steps:,} steps; "
         f"{hours_text(step_s * max(total_steps - done, 0))} left after step {done}"),
        "  assumes: later steps take as long as the measured ones (same recipe and machine)",
    ]


def _token_scale(rate: Rate, prompt: int, response: int) -> float:
    """Tokens per sample in the recipe over those of the measurement (1.0 without a shape)."""
    measured = rate.shape.get("prompt_tokens", 0) + rate.shape.get("response_tokens", 0)
    return (prompt + response) / measured if measured else 1.0


def train_from_rates(cfg: TrainConfig, prompt_tokens: int,
                     rates: Mapping[str, Rate]) -> list[str]:
    """The estimate from the recorded benchmark rates: generation (every sample generated to
    ``train.rollout.max_response_tokens``), prior + posterior scoring, and the update (epochs x
    states x kept samples, each as costly as one sample of the measured optimizer step). Under
    verl the update is split over its data-parallel GPUs and the rollouts over its vLLM
    engines, at the assumed vLLM rate where rates.json has one."""
    parts = _rate_parts(cfg, prompt_tokens, rates)
    if parts is None:
        return [("estimate (train): no recorded rates (benchmarks/results/rates.json is missing "
                "or lacks update, generate and score rates) and no metrics of a previous run")]
    update, score = rates["update_s_per_optimizer_step"], rates["score_s_per_8_contexts"]
    gen = parts["rate"]
    n, keep, response = cfg.rollout.n, cfg.rollout.keep, cfg.rollout.max_response_tokens
    states, epochs = cfg.states_per_step, cfg.ppo.epochs
    opt_steps = epochs * (states // cfg.ppo.mini_batch_states)
    generation_s, score_s, update_s = parts["generation"], parts["score"], parts["update"]
    step_s, low_s, steps = parts["step"], parts["low"], cfg.total_steps
    dp, engines = int(parts["dp"]), int(parts["engines"])
    overlap = cfg.overlap != "off"
    vllm = gen is not rates.get("generate_tokens_per_s")
    total = (f"  total: {hours_text(step_s * steps)} for {steps:,} steps (update alone "
             f"{hours_text(update_s * steps)}, generation alone {hours_text(generation_s * steps)})")
    if cfg.backend == "verl":  # vLLM rollouts: the low end leaves generation out
        high = "generation at the assumed vLLM rate" if vllm else \
            "generation at the hf backend's rate"
        total = (f"  total: between {hours_text(low_s * steps)} (update and scoring "
                 f"alone) and {hours_text(step_s * steps)} ({high}) for {steps:,} steps")
    split = f" / {dp} data-parallel GPUs" if dp > 1 else ""
    on = f" per vLLM engine x {engines} engines (train.verl GPUs / tensor parallel)" \
        if engines > 1 else ""
    lines = [
        ("estimate (train): from recorded benchmark rates (an estimate, not a measurement of "
         "this recipe)"),
        (f"  per step: {seconds_text(step_s)} = max(generation {seconds_text(generation_s)} + prior and posterior "
         f"{seconds_text(score_s)}, update {seconds_text(update_s)}) with train.overlap {cfg.overlap} (the first "
         "step in full)" if overlap else
         f"  per step: {seconds_text(step_s)} = generation {seconds_text(generation_s)} + prior and posterior "
         f"{seconds_text(score_s)} + update {seconds_text(update_s)}"),
        total,
        (f"  update: {opt_steps} optimizer steps/step ({epochs} epochs x {states} states / "
         f"{cfg.ppo.mini_batch_states} per mini-batch) of "
         f"{cfg.ppo.mini_batch_states * keep} kept samples each, "
         f"{update.value:.2f} s per {update.shape.get('samples', 1)} samples on one GPU{split}; "
         f"{update.what}; {update.source}"),
        (f"  generation: {states} states x {n} samples x {response:,} tokens at "
         f"{gen.value:,.1f} tokens/s{on} ({'measured' if gen.measured else 'assumed'}: "
         f"{gen.what}; {gen.source})"),
        (f"  prior and posterior: {states} x ({n} posterior + 1 prior) contexts at {score.value:.2f} s "
         f"per {score.shape.get('contexts', 8)}; {score.what}; {score.source}"),
        ("  assumes: every sample runs to max_response_tokens and every prompt to "
         f"data.max_prompt_tokens ({prompt_tokens:,}); time is linear in samples and tokens; "
         + (f"the {dp} data-parallel GPUs split the update evenly (no communication counted); "
            if dp > 1 else "one GPU (more data-parallel GPUs are not credited); ")
         + "responder calls (strict user, verifier) and waiting are not counted: no tokens "
         "per step are recorded for them"),
    ]
    if cfg.backend == "verl" and not vllm:
        lines.append("  assumes: verl generates with vLLM, whose rate is not recorded: the "
                     "hf-backend generation above bounds it from above")
    if overlap:
        lines.append(f"  assumes: train.overlap {cfg.overlap} samples and scores step k + 1 "
                     "(on a frozen copy of the policy) while step k updates, and the two do not "
                     "slow each other: a lower bound where they share one GPU")
    return lines


def _parallel(cfg: TrainConfig) -> tuple[int, int]:
    """(data-parallel GPUs of the update, vLLM rollout engines) of verl on GPUs; (1, 1) else."""
    verl = cfg.verl
    if cfg.backend != "verl" or verl.engine == "cpu_rehearsal":
        return 1, 1
    gpus = verl.nnodes * verl.n_gpus_per_node
    return (max(1, gpus // verl.ulysses_sequence_parallel_size),
            max(1, gpus // verl.tensor_parallel_size))


def _rate_parts(cfg: TrainConfig, prompt_tokens: int,
                rates: Mapping[str, Rate]) -> dict[str, Any] | None:
    """Seconds of a step from the recorded rates: generation, scoring, update, the step (with
    ``train.overlap``, its mean over the run) and its low end (verl: generation left out); the
    generation rate used (``rate``: verl's assumed vLLM rate when recorded, else the hf one),
    the update's data-parallel GPUs (``dp``) and the rollout's engines (``engines``)."""
    update, gen = rates.get("update_s_per_optimizer_step"), rates.get("generate_tokens_per_s")
    score = rates.get("score_s_per_8_contexts")
    if update is None or gen is None or score is None:
        return None
    n, keep, response = cfg.rollout.n, cfg.rollout.keep, cfg.rollout.max_response_tokens
    states, epochs = cfg.states_per_step, cfg.ppo.epochs
    dp, engines = _parallel(cfg)
    vllm = rates.get("vllm_rollout_tokens_per_s") if cfg.backend == "verl" else None
    rate = vllm if vllm is not None else gen
    per_sample = update.value / update.shape.get("samples", 1)
    update_s = (epochs * states * keep * per_sample * _token_scale(update, prompt_tokens, response)
                / dp)
    generation_s = states * n * response / (rate.value * (engines if rate is vllm else 1))
    score_s = states * (n + 1) * score.value / score.shape.get("contexts", 8)
    step_s = generation_s + score_s + update_s
    low_s = update_s + score_s  # verl: generation at vLLM's rate, taken as nothing
    if cfg.overlap != "off":  # the next step samples and scores while this one updates
        step_s = _overlapped(generation_s + score_s, update_s, cfg.total_steps)
        low_s = _overlapped(score_s, update_s, cfg.total_steps)
    return {"generation": generation_s, "score": score_s, "update": update_s, "step": step_s,
            "low": low_s if cfg.backend == "verl" else step_s, "rate": rate,
            "dp": dp, "engines": engines if rate is vllm else 1}


def train_seconds(recipe: Recipe, cfg: TrainConfig,
                  rates: Mapping[str, Rate] | None = None) -> tuple[float, float] | None:
    """(low, high) seconds the training has left, as :func:`train_estimate` says: the run's own
    median step times the steps not yet done, else the recorded rates' total; None: no rate."""
    from prour.train.metrics import METRICS_FILE, STEP_TIME_KEY
    from prour.train.report import read_metrics

    out = Path(cfg.output_dir)
    if (out / METRICS_FILE).exists():
        records = read_metrics(out)
        step_s = _median(records, STEP_TIME_KEY)
        if step_s is not None:
            done = max(int(r.get("step", 0)) for r in records
                       if isinstance(r.get(STEP_TIME_KEY), (int, float)))
            left = step_s * max(cfg.total_steps - done, 0)
            return left, left
    parts = _rate_parts(cfg, recipe.data.max_prompt_tokens,
                        recorded_rates() if rates is None else rates)
    if parts is None:
        return None
    return parts["low"] * cfg.total_steps, parts["step"] * cfg.total_steps


def _overlapped(sample_s: float, update_s: float, steps: int) -> float:
    """Mean seconds per step when each step's sampling runs during the previous update: the
    first step samples then updates, each later one takes the longer of the two."""
    if steps <= 0:
        return sample_s + update_s
    return (sample_s + update_s + (steps - 1) * max(sample_s, update_s)) / steps


def train_estimate(recipe: Recipe, cfg: TrainConfig, rates: Mapping[str, Rate] | None = None,
                   ) -> list[str]:
    """The training estimate of the dry-run: from the run's own metrics when ``train.output_dir``
    has any, else from the recorded rates."""
    from prour.train.metrics import METRICS_FILE
    from prour.train.report import read_metrics

    out = Path(cfg.output_dir)
    if (out / METRICS_FILE).exists():
        lines = train_from_metrics(read_metrics(out), cfg.total_steps, out / METRICS_FILE)
        if lines is not None:
            return lines
    rates = recorded_rates() if rates is None else rates
    return train_from_rates(cfg, recipe.data.max_prompt_tokens, rates)
