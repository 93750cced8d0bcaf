"""``prour eval`` (methods on tau2 test splits, resumable) and ``prour report`` (tables, plots)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from prour.cli.recipe import RecipeOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import ModelConfig, Recipe


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _split(values: list[str] | None) -> list[str] | None:
    """Repeated options and comma-separated lists both work: ``--seeds 0,1 --seeds 2``."""
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


CheckpointOpt = typer.Option(
    None, "--checkpoint", help="Query generator checkpoint: an HF folder, a trainer output folder "
    "(newest step_N) or a merged verl checkpoint.")
StepsOpt = typer.Option(
    None, "--steps", help="Checkpoint sweep: evaluate these saved steps of the --checkpoint "
    "training folder into one run ('all' or numbers; repeat or comma list).")
MethodOpt = typer.Option(None, "--method", "-m", help="Method(s) to run (default: eval.methods).")
DomainsOpt = typer.Option(None, "--domains", help="Domains (repeat or comma list).")
MaxTasksOpt = typer.Option(None, "--max-tasks", help="First N tasks of each domain.")
SeedsOpt = typer.Option(None, "--seeds", help="Seeds (repeat or comma list).")
PolicyOpt = typer.Option(None, "--attention-policy",
                         help="Attention variants, e.g. no-ask, budgeted@2 (repeat or comma list).")
SweepOpt = typer.Option(
    None, "--sweep", help="Trade-off sweep (eval.sweep): KEY=V1,V2 for router.budget (none: "
    "unlimited) or router.every_n; repeat for both (every combination), into one run folder.")
ConcurrencyOpt = typer.Option(None, "--concurrency", help="Episodes run at the same time.")
OutOpt = typer.Option(None, "--out", help="Run folder (default <run_dir>/eval).")
ProgressOpt = typer.Option(True, "--progress/--no-progress", help="Show a progress bar.")


def eval_command(
    recipe: str = RecipeOpt,
    checkpoint: str | None = CheckpointOpt,
    steps: list[str] | None = StepsOpt,
    method: list[str] | None = MethodOpt,
    domains: list[str] | None = DomainsOpt,
    max_tasks: int | None = MaxTasksOpt,
    seeds: list[str] | None = SeedsOpt,
    attention_policy: list[str] | None = PolicyOpt,
    concurrency: int | None = ConcurrencyOpt,
    out: str | None = OutOpt,
    overrides: list[str] | None = SetOpt,
    progress: bool = ProgressOpt,
    sweep: list[str] | None = SweepOpt,
) -> None:
    """Evaluate methods on tau2; reruns finish the missing and the errored episodes. Exits 1 when
    more than eval.max_error_fraction of the episodes ended in an error. With --checkpoint the
    generator is a training checkpoint (the step it resolved to is printed and recorded); with
    --steps too, several saved steps of one training run are evaluated into one run folder."""
    from prour.cli.recipe import (
        hold_run_folder,
        preflight_or_exit,
        recipe_errors,
        resumable,
        saved_lines,
    )
    from prour.eval.arms import with_checkpoint
    from prour.eval.harness import EPISODES_FILE
    from prour.llm import retry
    from prour.llm.openai import retried_requests
    from prour.recipes import load_recipe

    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True, flags={
            "eval.methods": _split(method), "eval.domains": _split(domains),
            "eval.seeds": _split(seeds), "eval.attention_policies": _split(attention_policy),
            "eval.max_tasks": max_tasks, "eval.concurrency": concurrency,
            "eval.sweep": _sweep(sweep)})
    default_generator = _file_generator(recipe) if overrides or checkpoint else None
    checkpoints = _checkpoints(checkpoint, _split(steps))
    loaded = _served_generator(loaded, checkpoints)
    # every checkpoint is a local HF folder already: check the run with the first as generator
    preflight_or_exit(with_checkpoint(loaded, checkpoints[0].path) if checkpoints else loaded,
                      "eval")
    run_dir = Path(out) if out else loaded.resolved_run_dir() / "eval"
    saved = lambda: (f"{saved_lines(run_dir / EPISODES_FILE, 'episodes')}; rerun the same "
                     "`prour eval` to run only the missing ones")
    errored_before, retried_before = _errored_results(run_dir), retried_requests()
    requests_before = retry.snapshot()
    if os.environ.get("SLURM_ARRAY_TASK_ID"):
        # The tasks of one `prour slurm` eval array share the run folder by design, each on its
        # own seed x domain slice (appends are atomic); Slurm runs each slice once.
        with resumable(saved):
            results = _evaluate(loaded, run_dir, progress, default_generator, checkpoints)
    else:
        with hold_run_folder(run_dir), resumable(saved):
            results = _evaluate(loaded, run_dir, progress, default_generator, checkpoints)
    _print_summary(results, run_dir)
    _print_retries(results, errored_before if loaded.eval.retry_errors else set(),
                   retried_requests() - retried_before)
    for label, counts in retry.since(requests_before).items():  # served models: errors, retries
        typer.echo(f"requests to {label}: {counts.text()}")
    _check_errors(results, loaded.eval.max_error_fraction)


def _errored_results(run_dir: Path) -> set[str]:
    """Keys of the episodes whose latest result line in ``run_dir`` is an error."""
    from prour.eval.harness import RESULTS_FILE, load_result_lines

    path = run_dir / RESULTS_FILE
    lines = load_result_lines(path) if path.is_file() else {}
    return {key for key, line in lines.items() if line.get("error")}


def _print_retries(results: list[dict[str, Any]], errored_before: set[str], requests: int) -> None:
    """One line, as collect's: the errored episodes of an earlier run this one ran again, the
    requests retried after a transient backend error (not hidden), and the episodes still
    errored."""
    from prour.eval.harness import result_key

    keys = {result_key(line["key"]) for line in results}
    errored = sum(bool(line["error"]) for line in results)
    typer.echo(f"retried: {len(errored_before & keys)} errored episode(s) of an earlier run, "
               f"{requests} request(s) after a transient backend error; {errored} episode(s) "
               "still errored")


def _sweep(entries: list[str] | None) -> dict[str, list[int | None]] | None:
    """``--sweep router.budget=1,2`` entries as the eval.sweep mapping; exit 2 on a bad entry."""
    if not entries:
        return None
    out: dict[str, list[int | None]] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        try:
            if not sep or not text:
                raise ValueError
            out[key.strip()] = [None if v.strip().lower() in ("none", "null", "inf") else
                                int(v) for v in text.split(",")]
        except ValueError:
            _fail(f"--sweep {entry!r}: write KEY=V1,V2 (integers; none for unlimited), e.g. "
                  "--sweep router.budget=1,2")
    return out


def _check_errors(results: list[dict[str, Any]], max_fraction: float) -> None:
    """Exit 1 when too many episodes errored (the run measured nothing)."""
    from prour.eval.harness import TooManyErrors, check_errors

    try:
        check_errors(results, max_fraction)
    except TooManyErrors as exc:
        _fail(str(exc), code=1)


def _file_generator(path: str) -> ModelConfig | None:
    """``models.generator`` as the recipe file writes it (before ``--set`` and ``--checkpoint``):
    report rows name the generator where a run swapped it."""
    from prour.config import ConfigError
    from prour.recipes import load_recipe

    try:
        return load_recipe(path).models.get("generator")
    except ConfigError:  # valid only with its overrides: no default to compare with
        return None


def _checkpoints(checkpoint: str | None, steps: list[str] | None) -> list[Any]:
    """The checkpoints to evaluate (none: the recipe's generator); exit 2 naming the problem."""
    from prour.eval.arms import checkpoint_generators

    if checkpoint is None:
        if steps:
            _fail("--steps chooses saved steps of a training folder: add --checkpoint DIR")
        return []
    try:
        return checkpoint_generators(checkpoint, steps)
    except (OSError, ValueError) as exc:
        _fail(f"--checkpoint {checkpoint}: {exc}")


@contextmanager
def _endpoint_errors() -> Iterator[None]:
    """Exit 2 with the message of an endpoints file that lacks eval's served generator."""
    from prour.cluster.endpoints import EndpointsError

    try:
        yield
    except EndpointsError as exc:
        _fail(str(exc))


def _served_generator(loaded: Recipe, checkpoints: list[Any]) -> Recipe:
    """The recipe eval runs: under ``eval.generator_backend: vllm`` its generator is the server
    of the checkpoint (without ``--checkpoint``: of the ``hf`` generator's folder) that the
    endpoints file lists (one server, one checkpoint: a ``--steps`` sweep of several is
    refused). Each served model is held at its own ``max_num_seqs`` by the queue
    (:mod:`prour.eval.queue`), so ``eval.concurrency`` is no longer lowered to the smallest."""
    from prour.cluster.recipe import (
        connect_served_generator,
        generator_folder,
        serves_generator,
    )

    if serves_generator(loaded):
        if len(checkpoints) > 1:
            _fail(f"--steps: eval.generator_backend is vllm, and one server serves one "
                  f"checkpoint ({len(checkpoints)} chosen); sweep steps with --set "
                  f"eval.generator_backend=hf or evaluate one --checkpoint at a time")
        folder = checkpoints[0].path if checkpoints else generator_folder(loaded)
        with _endpoint_errors():
            loaded = connect_served_generator(loaded, folder)
        typer.echo(f"generator: served by vLLM at {loaded.models['generator'].base_url} "
                   f"({folder})")
    _print_limits(loaded)
    return loaded


def _print_limits(loaded: Recipe) -> None:
    """One line: the queue's episodes at once overall and per model (exit 2 on a bad
    ``eval.max_in_flight`` key)."""
    from prour.eval.methods import eval_roles
    from prour.eval.queue import lane_limits

    try:
        limits = lane_limits(loaded, eval_roles(loaded.eval))
    except ValueError as exc:
        _fail(str(exc))
    capped = [f"{lane} {limit}" for lane, limit in limits.items()
              if limit < loaded.eval.concurrency]
    typer.echo(f"queue: {loaded.eval.concurrency} episodes at once (eval.concurrency)"
               + (f"; per model: {', '.join(capped)} (serve.models.<id>.max_num_seqs, "
                  "eval.max_in_flight)" if capped else ""))


def _announce(checkpoint: Any) -> None:
    typer.echo(f"generator: {checkpoint.label} ({checkpoint.path})")


def _evaluate(loaded: Recipe, run_dir: Path, progress: bool,
              default_generator: ModelConfig | None = None,
              checkpoints: list[Any] | None = None) -> list[dict[str, Any]]:
    """Run the evaluation (resumable; every checkpoint of a sweep) and close its clients."""
    from prour.eval.harness import Evaluation, evaluate_checkpoints

    try:
        if checkpoints:
            return evaluate_checkpoints(loaded, run_dir, checkpoints, progress, _announce,
                                        default_generator)
        evaluation = Evaluation(loaded, run_dir, progress=progress,
                                default_generator=default_generator)
        try:
            return evaluation.run()
        finally:
            evaluation.close()
    except (ValueError, LookupError) as exc:
        _fail(str(exc))


def _print_summary(results: list[dict[str, Any]], run_dir: Path) -> None:
    """Episodes, successes, errors and cut episodes per method/variant (the report has the real
    statistics)."""
    from prour.env.trajectory import is_cut

    groups: dict[str, list[dict[str, Any]]] = {}
    for line in results:
        groups.setdefault(line["key"][3], []).append(line)
    for name, lines in groups.items():
        solved = sum(line["success"] for line in lines)
        errors = sum(line["error"] for line in lines)
        cut = sum(is_cut(line["termination"]) for line in lines)
        typer.echo(f"{name}: {len(lines)} episodes, {solved} solved, {errors} errors, "
                   f"{cut} cut at env.max_steps")
    typer.echo(f"results: {run_dir}")


def register(app: typer.Typer) -> None:
    """Add ``eval`` to the ``prour`` app."""
    app.command("eval")(eval_command)
