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
RunsArg = typer.Argument(..., help="Run folder(s) written by `prour eval` or `prour import "
                         "tau2`, or training output folders (holding metrics.jsonl) for the "
                         "training report.")
ReportOutOpt = typer.Option(None, "--out", help="Report folder (default RUN/report).")
AttentionOpt = typer.Option(False, "--attention", help="Add the attention-protocol tables.")
BaselineOpt = typer.Option(None, "--baseline", help="System the others are compared with.")
AccountingOpt = typer.Option(None, "--accounting", help="Attention cost accounting.")
LamOpt = typer.Option(None, "--lam", help="λ of U = R − λ·A.")
BootOpt = typer.Option(10_000, "--n-boot", help="Bootstrap draws of the intervals.")
BurdenPairsOpt = typer.Option(
    0, "--burden-pairs", help="Human burden study: export N equal-count conversation pairs to "
    "OUT/burden/ (pairs.jsonl for annotators, pairs_key.jsonl kept from them). Needs --attention.")
AnnotationsOpt = typer.Option(
    None, "--annotations", help="Human burden study: annotators' answers (JSONL of pair_id, "
    "choice a/b/same) on pairs exported before; adds their agreement with the cost ranking.")


PaperRunDirOpt = typer.Option(
    None, "--run-dir", help="The run folder whose training metrics, router evidence and "
    "trade-off sweeps the paper section (REPORT/paper/index.html) reads; default: the run_dir "
    "of the (first) eval folder's recipe.resolved.yaml.")
PosthocOpt = typer.Option(
    False, "--posthoc-uncertainty", help="Figure 6 for baselines: run the run's decomposer "
    "(its recipe.resolved.yaml) over the first 16 decisions of each episode without AU/EU of "
    "its own, cached resumably in RUN/posthoc_uncertainty.jsonl.")
PosthocRecipeOpt = typer.Option(
    None, "--posthoc-recipe", help="With --posthoc-uncertainty: the recipe whose models.decomposer "
    "(and router thresholds, which route an imported run's turns) the pass uses, for runs "
    "without their own recipe.resolved.yaml, such as `prour import tau2` folders.")


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


def report_command(
    runs: list[str] = RunsArg,
    out: str | None = ReportOutOpt,
    attention: bool = AttentionOpt,
    baseline: str | None = BaselineOpt,
    accounting: str | None = AccountingOpt,
    lam: float | None = LamOpt,
    n_boot: int = BootOpt,
    burden_pairs: int = BurdenPairsOpt,
    annotations: str | None = AnnotationsOpt,
    posthoc: bool = PosthocOpt,
    posthoc_recipe: str | None = PosthocRecipeOpt,
    run_dir: str | None = PaperRunDirOpt,
) -> None:
    """Markdown tables (Pass@1 with intervals, pass^k, turns, cost) and PNG plots, and the
    paper's tables and figures beside the run's (REPORT/paper/index.html); a training output
    folder (metrics.jsonl, no results.jsonl) gets the training report instead."""
    from prour.eval.harness import RESULTS_FILE
    from prour.eval.paper_report import write_paper_report
    from prour.eval.report import write_report
    from prour.train.report import is_training_folder

    _refuse_tau2_files(runs)
    training = [r for r in runs if is_training_folder(r) and not (Path(r) / RESULTS_FILE).exists()]
    evaluations = [r for r in runs if r not in training]
    if training and evaluations and out:
        _fail("--out takes one kind of report: pass the training folders and the evaluation "
              "runs in separate `prour report` calls")
    for run in training:
        training_report(run, out if len(training) == 1 else None)
    if not evaluations:
        return
    if posthoc_recipe and not posthoc:
        _fail("--posthoc-recipe belongs to the post-hoc pass; add --posthoc-uncertainty")
    if posthoc:
        _posthoc(evaluations, posthoc_recipe)
    try:
        written = write_report(evaluations, out, attention=attention, baseline=baseline,
                               n_boot=n_boot, accounting=accounting, lam=lam,
                               burden_pairs=burden_pairs, annotations=annotations)
        paper = write_paper_report(evaluations, written["markdown"].parent, run_dir, n_boot)
    except OSError as exc:
        _report_disk_failure(exc)
        from prour.cli.failures import complete_from_records

        _fail(complete_from_records(str(exc), *evaluations))
    except ValueError as exc:
        from prour.cli.failures import complete_from_records

        _fail(complete_from_records(str(exc), *evaluations))
    for name, path in written.items():
        typer.echo(f"{name}: {path}")
    typer.echo("\n".join(paper.lines))


def posthoc_command(
    run: str = typer.Argument(..., metavar="RUN", help="An eval run folder (`prour eval`'s)."),
    recipe: str = RecipeOpt,
    overrides: list[str] | None = SetOpt,
    progress: bool = ProgressOpt,
) -> None:
    """Figure 6 for the baselines: the recipe's decomposer measures AU/EU at the first 16
    decisions of each episode of RUN whose method records none of its own, appended to
    RUN/posthoc_uncertainty.jsonl (a rerun measures only what is missing; `prour report RUN`
    draws the curves)."""
    from prour.cli.failures import backend_failures
    from prour.cli.recipe import hold_run_folder, recipe_errors, resumable, saved_lines
    from prour.config import ConfigError
    from prour.eval.posthoc import POSTHOC_FILE, posthoc_uncertainty
    from prour.recipes import load_recipe

    if not (Path(run) / "episodes.jsonl").is_file():
        _fail(f"{run} holds no episodes.jsonl: run `prour eval` into it first")
    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True)
    path = Path(run) / POSTHOC_FILE
    saved = lambda: (f"{saved_lines(path, 'post-hoc decisions')}; rerun the same command to "
                     "measure only the missing ones")
    with hold_run_folder(run), resumable(saved), backend_failures(loaded, "posthoc", run):
        try:
            measured = posthoc_uncertainty(run, loaded, progress=progress)
        except (OSError, ValueError, LookupError, ConfigError) as exc:
            _fail(f"posthoc on {run}: {exc}")
    typer.echo(f"post-hoc AU/EU: {len(measured)} episode(s) in {path}")


def _posthoc(runs: list[str], recipe: str | None) -> None:
    """The post-hoc decomposer pass over each run's episodes without AU/EU (resumable); with
    ``recipe``, that recipe's models for runs without a saved one."""
    from prour.config import ConfigError
    from prour.eval.posthoc import POSTHOC_FILE, posthoc_uncertainty
    from prour.provenance import RECIPE_FILE
    from prour.recipes import load_recipe

    for run in runs:
        try:
            loaded = None
            if recipe and not (Path(run) / RECIPE_FILE).is_file():
                loaded = load_recipe(recipe, endpoints=True)
            measured = posthoc_uncertainty(run, loaded)
        except (OSError, ValueError, LookupError, ConfigError) as exc:
            _fail(f"--posthoc-uncertainty on {run}: {exc}")
        typer.echo(f"post-hoc AU/EU: {len(measured)} episode(s) in {Path(run) / POSTHOC_FILE}")


def _report_disk_failure(exc: OSError) -> None:
    """A report folder on a read-only or full disk: the disk's one line (exit 1), with the
    report's own way out (--out); returns for any other error."""
    from prour.cli.failures import FAILED_EXIT, disk_failure_line

    line = disk_failure_line(exc)
    if line is not None:
        _fail(f"{line}; or write the report elsewhere with `prour report ... --out DIR`",
              FAILED_EXIT)


def _refuse_tau2_files(runs: list[str]) -> None:
    """A tau2 results file given as a run, or a run folder holding only such files (neither eval
    results nor imported trajectories): one line naming `prour import tau2`."""
    from prour.env.trajectory import is_tau2_results, misplaced_message
    from prour.eval.harness import RESULTS_FILE
    from prour.eval.imported import is_imported_run

    for run in runs:
        path = Path(run)
        if path.is_file() and is_tau2_results(path):
            _fail(misplaced_message(path))
        if path.is_dir() and not (path / RESULTS_FILE).exists() and not is_imported_run(path):
            for candidate in sorted(path.glob("*.json")):
                if is_tau2_results(candidate):
                    _fail(misplaced_message(candidate))


def training_report(output_dir: str, out: str | None) -> None:
    """Write the training report of one training output folder and print its files."""
    import json

    from prour.train.report import share_line, write_training_report

    try:
        written = write_training_report(output_dir, out)
    except OSError as exc:
        _report_disk_failure(exc)
        _fail(str(exc))
    except ValueError as exc:
        _fail(str(exc))
    for name, path in written.items():
        typer.echo(f"{name}: {path}")
    line = share_line(json.loads(written["json"].read_text())["time"])
    if line:  # each phase's share of the step time (the report's time table)
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add ``eval``, ``posthoc`` and ``report`` to the ``prour`` app."""
    app.command("eval")(eval_command)
    app.command("posthoc")(posthoc_command)
    app.command("report")(report_command)
