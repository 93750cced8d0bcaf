"""Run-time estimates the dry-runs print before launch (``prour train --dry-run``, ``prour run
--dry-run``): seconds per training step and total hours, and evaluation hours per method.

Rates come from what was measured: a previous run's own metrics when its folder has them (the
training ``metrics.jsonl``, the evaluation ``results.jsonl``), else the rates recorded under
``benchmarks/results`` (:data:`RATES_FILE` names each rate and the raw result file it is read
from, or, for a rate prour has not measured, the public source it is assumed from: the
paper's episode time, a vLLM benchmark's tokens per second). Every line names its source and
what it assumes; the numbers are estimates, not promises.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.train.estimate import (
    Rate,
    hours_text,
    recorded_rates,
    seconds_text,
    train_estimate,
    train_seconds,
)

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


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


@dataclass(frozen=True)
class _Served:
    """A served model of the eval step: its lane, the requests its replicas run at once (None:
    vLLM's own), its replicas and the roles that call it."""

    lane: str
    slots: int | None
    replicas: int
    roles: tuple[str, ...]


def _lanes(recipe: Recipe, step: str = "eval") -> tuple[
        dict[str, int], dict[str, tuple[str, ...]], dict[str, _Served], dict[str, set[str]]]:
    """The queue's lanes as ``prour eval`` holds them (:mod:`prour.eval.queue`): lane -> limit,
    method -> its lanes, the served models with the requests their replicas run at once as the
    step sizes them (:func:`prour.cluster.gpu_plan.step_sizing`: what the endpoints file hands
    ``prour eval``), and method -> its roles; a generator eval serves with vLLM counts as that
    server."""
    from prour.cluster.gpu_plan import step_sizing
    from prour.cluster.recipe import serves_generator, with_served_generator
    from prour.eval.methods import eval_roles, method_roles
    from prour.eval.queue import lane_limits
    from prour.llm.registry import lane_name
    from prour.stages import get_step

    try:
        sizing = step_sizing(recipe, get_step(step))
    except (KeyError, ValueError):  # a step of no stage (a test's name): the recipe's own limits
        sizing = None
    if serves_generator(recipe):
        recipe = with_served_generator(recipe, recipe.models["generator"].path or "")
    models = dict(recipe.models)
    served: dict[str, _Served] = {}
    for role, model in recipe.models.items():
        model_id = str(model.model)
        if model.backend != "openai" or model.base_url or sizing is None \
                or model_id not in sizing.instances:
            continue
        slots = sizing.slots(model_id)
        if slots is not None:
            models[role] = model.model_copy(update={"server_slots": slots})
        known = served.get(model_id)
        served[model_id] = _Served(lane_name(model), slots, len(sizing.instances[model_id]),
                                   (*(known.roles if known else ()), role))
    recipe = recipe.model_copy(update={"models": models})
    cfg = recipe.eval
    limits = lane_limits(recipe, eval_roles(cfg))
    roles = {m: {r for a in cfg.variants() for r in method_roles(cfg, m, a) if r in recipe.models}
             for m in cfg.methods}
    lanes = {m: tuple(dict.fromkeys(lane_name(recipe.models[r])
                                    for a in cfg.variants() for r in method_roles(cfg, m, a)
                                    if r in recipe.models))
             for m in cfg.methods}
    return limits, lanes, served, roles


def _method_tokens(*paths: Path) -> dict[str, dict[str, Any]]:
    """Method -> role -> its tokens (:class:`prour.eval.results.RoleTokens`) over the finished
    episodes of the first of ``paths`` that records any for the method."""
    from prour.eval.harness import load_result_lines
    from prour.eval.results import role_tokens

    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        if not path.exists():
            continue
        by_method: dict[str, list[dict[str, Any]]] = {}
        for line in load_result_lines(path).values():
            by_method.setdefault(str(line.get("method")), []).append(line)
        for method, lines in by_method.items():
            tokens = role_tokens(lines)
            if tokens and method not in found:
                found[method] = tokens
    return found


def _throughput(served: Mapping[str, _Served], episodes: Mapping[str, int],
                roles: Mapping[str, set[str]], tokens: Mapping[str, Mapping[str, Any]],
                rates: Mapping[str, Rate],
                where: str) -> tuple[list[str], dict[str, float]]:
    """Each served model's bound on the evaluation: the tokens its roles generate per episode
    of each method (a run's own results) x the method's episodes, over the model's recorded
    vLLM rate x its replicas (each credited in full). Lines say what is missing instead."""
    lines: list[str] = []
    bounds: dict[str, float] = {}
    for model_id, info in served.items():
        rate = next((r for r in rates.values() if r.model == model_id), None)
        users = {m: roles[m] & set(info.roles) for m in episodes if roles[m] & set(info.roles)}
        if rate is None:
            lines.append(f"  throughput of {model_id}: not bounded (no vLLM rate of it is "
                         "recorded in benchmarks/results/rates.json)")
            continue
        lacking = [m for m in users if any(r not in tokens.get(m, {}) for r in users[m])]
        if lacking or not users:
            lines.append(f"  throughput of {model_id}: not bounded (no generated tokens per "
                         f"episode recorded for {', '.join(lacking) or 'any method'}: a run's "
                         "results.jsonl records them per role)")
            continue
        generated = sum(episodes[m] * sum(tokens[m][r].generated_per_episode for r in users[m])
                        for m in users)
        seconds = generated / (rate.value * info.replicas)
        bounds[model_id] = seconds
        lines.append(
            f"  throughput of {model_id}: {generated:,.0f} generated tokens ({where}) / "
            f"({rate.value:,.1f} tokens/s x {info.replicas} replica(s)) = {hours_text(seconds)} "
            f"({'measured' if rate.measured else 'assumed'}: {rate.what}; {rate.source})")
    return lines, bounds


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
    limits, lanes, served, roles = _lanes(recipe, step)
    per_task = ", ".join(f"{d} {n}" for d, n in tasks.items())
    capped = ", ".join(f"{lane} {n}" for lane, n in limits.items() if n < conc)
    lines = [(f"estimate ({step}): {len(cfg.methods)} methods x {n_tasks} tasks ({per_task}) x "
              f"{seeds} seeds x seconds per episode / episodes at once (eval.concurrency {conc}"
              + (f"; per model: {capped}" if capped else "") + ")")]
    work: dict[str, float] = {}
    counts: dict[str, int] = {}
    after, sources = 0.0, set()
    for method in cfg.methods:
        episodes = len(arm_points(cfg, method)) * len(cfg.variants()) * n_tasks * seeds
        counts[method] = episodes
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
        lines.append(f"  {method}: {episodes:,} episodes x {seconds_text(episode_s)} ({source}) / {alone} "
                     f"= {hours_text(work[method] / alone)} alone")
    if served:
        lines.append(f"  requests in flight at once per model, as {step} sizes its servers (the "
                     "GPU plan; the lower of these and eval.concurrency holds): " + ", ".join(
                         f"{model_id} {_slots(info)}" for model_id, info in served.items()))
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
    tokens = _method_tokens(results, main)
    where = f"per episode by role, from {results if results.exists() else main}"
    more, throughput = _throughput(served, {m: counts[m] for m in work}, roles, tokens,
                                   recorded_rates() if rates is None else rates, where)
    if throughput and max(throughput.values()) > queue_s:
        model_id = max(throughput, key=throughput.__getitem__)
        queue_s = after = max(after, throughput[model_id])
        why = f"bound by {model_id}'s token throughput, below"
    lines.append(f"  total: {hours_text(queue_s)} through one queue ({why}); {hours_text(after)} one method "
                 "after another")
    lines += more
    lines += [f"  episode seconds {s}" for s in sorted(sources)]
    lines.append("  assumes: an episode takes the seconds above at any number in flight up to "
                 "the limits, unless a server's token throughput bounds it (where tokens per "
                 "episode are recorded); the queue keeps the busiest limit full")
    return EvalTotals(lines, queue_s, after)


def _slots(info: _Served) -> str:
    copies = f" ({info.replicas} replicas)" if info.replicas > 1 else ""
    if info.slots is None:
        return f"at vLLM's own max_num_seqs{copies}"
    return f"{info.slots:,}{copies}"


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
        span = hours_text(train_low + queue) if train_low == train_high else \
            f"between {hours_text(train_low + queue)} and {hours_text(train_high + queue)}"
        trained = (f"training {hours_text(train_low)}" if train_low == train_high else
                   f"training {hours_text(train_low)} to {hours_text(train_high)}")
        lines.append(
            f"estimate (chain): {span} = {trained} ({', '.join(counted) or 'none'}) + "
            f"evaluation {hours_text(queue)} through one queue ({', '.join(eval_steps) or 'none'}; "
            f"{hours_text(after)} one method after another)"
            + (f"; not counted: {', '.join(missing)} (no rate)" if missing else "")
            + "; collection, calibration and extraction are not estimated")
    return lines
