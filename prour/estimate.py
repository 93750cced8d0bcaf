"""Run-time estimates the dry-runs print before launch (``prour train --dry-run``, ``prour run
--dry-run``): seconds per training step and total hours, and evaluation hours per method.

Rates come from what was measured: a previous run's own metrics when its folder has them (the
training ``metrics.jsonl``, the evaluation ``results.jsonl``), else the rates recorded under
``benchmarks/results`` (:data:`RATES_FILE` names each rate and the raw result file it is read
from). Every line names its source and what it assumes; the numbers are estimates, not promises.
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

RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
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
                           entry.get("shape", {}), measured="file" in entry)
    return rates


def _s(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds < 100 else f"{seconds:,.0f} s"


def _h(seconds: float) -> str:
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
    split = ("; median of each phase: " + ", ".join(f"{label} {_s(s)}" for label, s in phases)
             if phases else "")
    return [
        f"estimate (train): from this run's metrics, {where}: median of {len(timed)} step(s)",
        f"  per step: {_s(step_s)}{split}",
        (f"  total: {_h(step_s * total_steps)} for {total_steps:,} steps; "
         f"{_h(step_s * max(total_steps - done, 0))} left after step {done}"),
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
    states x kept samples, each as costly as one sample of the measured optimizer step)."""
    parts = _rate_parts(cfg, prompt_tokens, rates)
    if parts is None:
        return [("estimate (train): no recorded rates (benchmarks/results/rates.json is missing "
                "or lacks update, generate and score rates) and no metrics of a previous run")]
    update, gen = rates["update_s_per_optimizer_step"], rates["generate_tokens_per_s"]
    score = rates["score_s_per_8_contexts"]
    n, keep, response = cfg.rollout.n, cfg.rollout.keep, cfg.rollout.max_response_tokens
    states, epochs = cfg.states_per_step, cfg.ppo.epochs
    opt_steps = epochs * (states // cfg.ppo.mini_batch_states)
    generation_s, score_s, update_s = parts["generation"], parts["score"], parts["update"]
    step_s, low_s, steps = parts["step"], parts["low"], cfg.total_steps
    overlap = cfg.overlap != "off"
    total = (f"  total: {_h(step_s * steps)} for {steps:,} steps (update alone "
             f"{_h(update_s * steps)}, generation alone {_h(generation_s * steps)})")
    if cfg.backend == "verl":  # vLLM rollouts: only the hf rate is recorded, an upper bound
        total = (f"  total: between {_h(low_s * steps)} (update and scoring "
                 f"alone) and {_h(step_s * steps)} (generation at the hf backend's rate) for "
                 f"{steps:,} steps")
    lines = [
        ("estimate (train): from recorded benchmark rates (an estimate, not a measurement of "
         "this recipe)"),
        (f"  per step: {_s(step_s)} = max(generation {_s(generation_s)} + prior and posterior "
         f"{_s(score_s)}, update {_s(update_s)}) with train.overlap {cfg.overlap} (the first "
         "step in full)" if overlap else
         f"  per step: {_s(step_s)} = generation {_s(generation_s)} + prior and posterior "
         f"{_s(score_s)} + update {_s(update_s)}"),
        total,
        (f"  update: {opt_steps} optimizer steps/step ({epochs} epochs x {states} states / "
         f"{cfg.ppo.mini_batch_states} per mini-batch) of "
         f"{cfg.ppo.mini_batch_states * keep} kept samples each, "
         f"{update.value:.2f} s per {update.shape.get('samples', 1)} samples; {update.what}; "
         f"{update.source}"),
        (f"  generation: {states} states x {n} samples x {response:,} tokens at "
         f"{gen.value:,.1f} tokens/s; {gen.what}; {gen.source}"),
        (f"  prior and posterior: {states} x ({n} posterior + 1 prior) contexts at {score.value:.2f} s "
         f"per {score.shape.get('contexts', 8)}; {score.what}; {score.source}"),
        ("  assumes: every sample runs to max_response_tokens and every prompt to "
         f"data.max_prompt_tokens ({prompt_tokens:,}); time is linear in samples and tokens; one "
         "GPU (more data-parallel GPUs are not credited); responder calls (strict user, "
         "verifier) and waiting are not counted: no rate is recorded for them"),
    ]
    if cfg.backend == "verl":
        lines.append("  assumes: verl generates with vLLM, whose rate is not recorded: the "
                     "hf-backend generation above bounds it from above")
    if overlap:
        lines.append(f"  assumes: train.overlap {cfg.overlap} samples and scores step k + 1 "
                     "(on a frozen copy of the policy) while step k updates, and the two do not "
                     "slow each other: a lower bound where they share one GPU")
    return lines


def _rate_parts(cfg: TrainConfig, prompt_tokens: int,
                rates: Mapping[str, Rate]) -> dict[str, float] | None:
    """Seconds of a step from the recorded rates: generation, scoring, update, the step (with
    ``train.overlap``, its mean over the run) and its low end (verl: generation left out)."""
    update, gen = rates.get("update_s_per_optimizer_step"), rates.get("generate_tokens_per_s")
    score = rates.get("score_s_per_8_contexts")
    if update is None or gen is None or score is None:
        return None
    n, keep, response = cfg.rollout.n, cfg.rollout.keep, cfg.rollout.max_response_tokens
    states, epochs = cfg.states_per_step, cfg.ppo.epochs
    per_sample = update.value / update.shape.get("samples", 1)
    update_s = epochs * states * keep * per_sample * _token_scale(update, prompt_tokens, response)
    generation_s = states * n * response / gen.value
    score_s = states * (n + 1) * score.value / score.shape.get("contexts", 8)
    step_s = generation_s + score_s + update_s
    low_s = update_s + score_s  # verl: generation at vLLM's unrecorded rate, taken as nothing
    if cfg.overlap != "off":  # the next step samples and scores while this one updates
        step_s = _overlapped(generation_s + score_s, update_s, cfg.total_steps)
        low_s = _overlapped(score_s, update_s, cfg.total_steps)
    return {"generation": generation_s, "score": score_s, "update": update_s, "step": step_s,
            "low": low_s if cfg.backend == "verl" else step_s}


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


def _eval_tasks(recipe: Recipe) -> dict[str, int]:
    """Tasks per domain the evaluation runs (as the harness selects them)."""
    from prour.eval.protocol import eval_task_ids

    return {domain: len(eval_task_ids(recipe, domain)) for domain in recipe.eval.domains}


def _episode_seconds(results: Path) -> dict[str, list[float]]:
    """Seconds of each finished episode in a previous ``results.jsonl``, by method: the last line
    of each key (a rerun replaces its errored attempt, as in the report), errored ones left out
    (they end early, and a rerun runs them again); lines cut by a kill are skipped."""
    from prour.eval.harness import load_result_lines

    by_method: dict[str, list[float]] = {}
    if not results.exists():
        return by_method
    for row in load_result_lines(results).values():
        if isinstance(row.get("seconds"), (int, float)) and row.get("method") \
                and not row.get("error"):
            by_method.setdefault(row["method"], []).append(float(row["seconds"]))
    return by_method


@dataclass
class EvalTotals:
    """An eval step's estimate: its lines and its two totals in seconds (None: no rate)."""

    lines: list[str]
    queue_s: float | None
    after_s: float | None


def _lanes(recipe: Recipe) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """The queue's lanes as ``prour eval`` holds them (:mod:`prour.eval.queue`): lane -> limit,
    and method -> its lanes; a generator eval serves with vLLM counts as that server."""
    from prour.cluster.recipe import serves_generator, with_served_generator
    from prour.eval.methods import eval_roles, method_roles
    from prour.eval.queue import lane_limits
    from prour.llm.registry import lane_name

    if serves_generator(recipe):
        recipe = with_served_generator(recipe, recipe.models["generator"].path or "")
    cfg = recipe.eval
    limits = lane_limits(recipe, eval_roles(cfg))
    lanes = {m: tuple(dict.fromkeys(lane_name(recipe.models[r])
                                    for a in cfg.variants() for r in method_roles(cfg, m, a)
                                    if r in recipe.models))
             for m in cfg.methods}
    return limits, lanes


def eval_totals(recipe: Recipe, rates: Mapping[str, Rate] | None = None,
                step: str = "eval", folder: Path | None = None) -> EvalTotals:
    """The evaluation estimate, one method after another and through one queue.

    Episodes per method: arms (sweep points x attention variants) x tasks x seeds. Seconds per
    episode: the median of the method's finished episodes in ``<folder>/results.jsonl`` (default
    ``<run_dir>/eval``; a trade-off sweep's folder, else the main eval's) when it has some, else
    the recorded rate. One method after another: each method alone holds its models at their
    smallest in-flight limit. One queue: every method at once, as long as the busiest limit
    allows (``eval.concurrency`` over all, each model's own over the methods that call it); where
    a previous run of the folder recorded its queue (``queue.jsonl``), its achieved concurrency
    (mean episodes in flight) replaces that bound."""
    from prour.eval.harness import RESULTS_FILE, arm_points
    from prour.eval.queue import achieved, read_sessions

    cfg = recipe.eval
    tasks = _eval_tasks(recipe)
    n_tasks, seeds, conc = sum(tasks.values()), len(cfg.seeds), cfg.concurrency
    main_dir = Path(recipe.resolved_run_dir()) / "eval"
    run_dir = folder if folder is not None else main_dir
    main, results = main_dir / RESULTS_FILE, run_dir / RESULTS_FILE
    measured = {**_episode_seconds(main), **_episode_seconds(results)} if results != main \
        else _episode_seconds(main)
    rate = (recorded_rates() if rates is None else rates).get("eval_episode_s")
    limits, lanes = _lanes(recipe)
    per_task = ", ".join(f"{d} {n}" for d, n in tasks.items())
    capped = ", ".join(f"{lane} {n}" for lane, n in limits.items() if n < conc)
    lines = [(f"estimate ({step}): {len(cfg.methods)} methods x {n_tasks} tasks ({per_task}) x "
              f"{seeds} seeds x seconds per episode / episodes at once (eval.concurrency {conc}"
              + (f"; per model: {capped}" if capped else "") + ")")]
    work: dict[str, float] = {}
    after, sources = 0.0, set()
    for method in cfg.methods:
        episodes = len(arm_points(cfg, method)) * len(cfg.variants()) * n_tasks * seeds
        if measured.get(method):
            episode_s = statistics.median(measured[method])
            source = f"median of {len(measured[method])} in " \
                     f"{results if _episode_seconds(results).get(method) else main}"
        elif rate is not None:
            source = "measured" if rate.measured else "assumed"
            episode_s = rate.value
            sources.add(f"{source}: {rate.what}; {rate.source}")
        else:
            lines.append(f"  {method}: {episodes:,} episodes, no episode rate recorded")
            continue
        alone = min([conc, *(limits.get(lane, conc) for lane in lanes[method])])
        work[method] = episodes * episode_s
        after += work[method] / alone
        lines.append(f"  {method}: {episodes:,} episodes x {_s(episode_s)} ({source}) / {alone} "
                     f"= {_h(work[method] / alone)} alone")
    if not work:
        lines.append("  total: none (no episode rate)")
        return EvalTotals(lines, None, None)
    bounds = {"eval.concurrency": sum(work.values()) / conc}
    for lane, limit in limits.items():
        bounds[lane] = sum(w for m, w in work.items() if lane in lanes[m]) / limit
    busiest = max(bounds, key=bounds.__getitem__)
    queue_s = bounds[busiest]
    sessions = read_sessions(run_dir)
    found = achieved(sessions)
    if found is not None and found[0] > 0:
        queue_s = sum(work.values()) / found[0]
        why = (f"at the {found[0]:.1f} episodes in flight a previous run achieved "
               f"({found[2]:,} episodes, {found[1]:.1f}/min; {run_dir / 'queue.jsonl'})")
    else:
        held = conc if busiest == "eval.concurrency" else limits[busiest]
        why = (f"all methods at once, bound by {busiest} at {held} in flight")
    lines.append(f"  total: {_h(queue_s)} through one queue ({why}); {_h(after)} one method "
                 "after another")
    lines += [f"  episode seconds {s}" for s in sorted(sources)]
    lines.append("  assumes: an episode takes the seconds above at any number in flight up to "
                 "the limits (the servers keep up); the queue keeps the busiest limit full")
    return EvalTotals(lines, queue_s, after)


def eval_estimate(recipe: Recipe, rates: Mapping[str, Rate] | None = None,
                  step: str = "eval", folder: Path | None = None) -> list[str]:
    """The lines of :func:`eval_totals`."""
    return eval_totals(recipe, rates, step, folder).lines


def study_totals(recipe: Recipe, rates: Mapping[str, Rate] | None = None) -> EvalTotals:
    """The study's estimate (:func:`prour.cluster.study.study_estimate`) at the recorded
    ``eval_episode_s`` rate where the study folder has no episode of a cell yet."""
    from prour.cluster.study import study_estimate

    rate = (recorded_rates() if rates is None else rates).get("eval_episode_s")
    source = None if rate is None else \
        f"{'measured' if rate.measured else 'assumed'}: {rate.what}; {rate.source}"
    lines, seconds = study_estimate(recipe, rate.value if rate else None, source)
    return EvalTotals(lines, seconds, seconds)


def _ig_train_estimate(recipe: Recipe) -> list[str]:
    """The ``train-ig-clarifier`` step's training estimate: the recipe with IG-Clarifier's
    settings (its own output folder, so its own metrics), labelled by that step."""
    from prour.stages import ig_recipe

    ig = ig_recipe(recipe)
    return [line.replace("estimate (train)", "estimate (train-ig-clarifier)", 1)
            for line in train_estimate(ig, ig.train)]


def _runs(recipe: Recipe, name: str) -> bool:
    """Whether a run of this recipe keeps step ``name`` (neither it nor its stage skips it)."""
    from prour.stages import get_step, stage_of

    step = get_step(name)
    return stage_of(step).skip(recipe) is None and (step.skip is None or step.skip(recipe) is None)


def chain_estimates(recipe: Recipe, step_names: Sequence[str]) -> list[str]:
    """The estimates ``prour run --dry-run`` prints for the steps it would run: training (the
    ``train`` step, with a ``train`` section; ``train-ig-clarifier``, the second training run
    when eval.methods has ig-clarifier) and evaluation (the ``eval`` step and the trade-off
    sweeps), then the chain's total: the trainings plus the eval steps through one queue (each
    eval step is one queue; the steps run one after another). A broken rates file is named in
    place of the numbers."""
    from prour.stages import TRADEOFF_NAMES, get_step, ig_recipe, tradeoff_recipe
    from prour.step import tradeoff_dir

    lines: list[str] = []
    ig_skipped = get_step("train-ig-clarifier").skip(recipe)  # the stage table's own rule
    sweeps = [(f"eval-{name.replace('_', '-')}", name) for name in TRADEOFF_NAMES]
    trains = (("train", recipe.train is not None,
               lambda: (train_estimate(recipe, recipe.train),
                        train_seconds(recipe, recipe.train))),
              ("train-ig-clarifier", ig_skipped is None,
               lambda: (_ig_train_estimate(recipe),
                        train_seconds(ig_recipe(recipe), ig_recipe(recipe).train))))
    evals = (("eval", _runs(recipe, "eval"), lambda: eval_totals(recipe)),
             ("study", _runs(recipe, "study"), lambda: study_totals(recipe)),
             *((step, get_step(step).skip(recipe) is None,
                lambda step=step, name=name: eval_totals(
                    tradeoff_recipe(recipe, name), step=step,
                    folder=tradeoff_dir(recipe, name)))
               for step, name in sweeps))
    train_low = train_high = queue = after = 0.0
    counted: list[str] = []
    missing: list[str] = []
    for name, applies, make in trains:
        if name in step_names and applies:
            try:
                more, seconds = make()
            except ValueError as exc:
                lines.append(f"estimate ({name}): none ({exc})")
                missing.append(name)
                continue
            lines += more
            if seconds is None:
                missing.append(name)
            else:
                train_low, train_high = train_low + seconds[0], train_high + seconds[1]
                counted.append(name)
    eval_steps: list[str] = []
    for name, applies, make in evals:
        if name in step_names and applies:
            try:
                totals = make()
            except ValueError as exc:
                lines.append(f"estimate ({name}): none ({exc})")
                missing.append(name)
                continue
            lines += totals.lines
            if totals.queue_s is None or totals.after_s is None:
                missing.append(name)
            else:
                queue, after = queue + totals.queue_s, after + totals.after_s
                eval_steps.append(name)
    if counted or eval_steps:
        span = _h(train_low + queue) if train_low == train_high else \
            f"between {_h(train_low + queue)} and {_h(train_high + queue)}"
        trained = (f"training {_h(train_low)}" if train_low == train_high else
                   f"training {_h(train_low)} to {_h(train_high)}")
        lines.append(
            f"estimate (chain): {span} = {trained} ({', '.join(counted) or 'none'}) + "
            f"evaluation {_h(queue)} through one queue ({', '.join(eval_steps) or 'none'}; "
            f"{_h(after)} one method after another)"
            + (f"; not counted: {', '.join(missing)} (no rate)" if missing else "")
            + "; collection, calibration and extraction are not estimated")
    return lines
