"""``prour slurm submit | status``: the pipeline as chained Slurm jobs, and where it stands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prour.cli.recipe import RecipeOpt, SetOpt
from prour.stages import stage_names

if TYPE_CHECKING:  # pragma: no cover
    from prour.cluster.gpu_plan import GpuPlan
    from prour.cluster.jobs import RunStatus
    from prour.config import Recipe

slurm_app = typer.Typer(help="Submit the pipeline to Slurm and follow it.", no_args_is_help=True)


StagesOpt = typer.Option(
    None,
    "--stages",
    help=f"Comma-separated stages, run in pipeline order: {', '.join(stage_names())} (default: "
    "the whole chain, up to the review gate until the labels are approved).",
)
ApproveOpt = typer.Option(
    None, "--approve-labels", help="Approve the reviewed calibration labels and submit the rest "
    "of the chain (stages already complete are not submitted again).",
)
RerunStaleOpt = typer.Option(
    False, "--rerun-stale", help="Let each job rerun the steps made with other recipe values "
    "(`prour run --rerun-stale`); without it a job with a stale step fails naming it.",
)
BaseModelOpt = typer.Option(
    False, "--base-model", help="Evaluate the untrained models.generator (eval without a "
    "checkpoint made by train).",
)
DryRunOpt = typer.Option(
    False, "--dry-run", help="Print the sbatch commands and scripts; submit nothing."
)
RunDirOpt = typer.Option(
    None, "--run-dir", help="Run folder for scripts, logs and outputs (default: the recipe's)."
)
CheckpointOpt = typer.Option(
    None,
    "--checkpoint",
    help="Checkpoint the eval stage evaluates (a trainer output folder or a Hugging Face "
    "folder; default: train.output_dir).",
)
RunArg = typer.Argument(..., help="Run folder holding slurm_jobs.json (or the file itself).")
TailOpt = typer.Option(15, "--tail", help="Log lines shown for a failed stage.")


def _dry_run_preflight(loaded: Recipe, stages: list[str]) -> None:
    """The submitted stages' preflight, as a run of them, printed as warnings: the node that
    submits is not the one that runs (its GPUs, mounts and venv may differ), and each job runs
    its stage's checks on its own node before its first step, failing there."""
    from prour.preflight import preflight
    from prour.stages import get_stage

    checked = [stage for stage in stages if get_stage(stage).preflight]
    for problem in preflight(loaded, checked, whole_run=True, skip=("gpus",)):
        typer.echo(f"warning: preflight on this node: {problem.line()}", err=True)


@slurm_app.command("submit")
def submit(
    recipe: str = RecipeOpt,
    stages: str | None = StagesOpt,
    approve_labels: bool | None = ApproveOpt,
    dry_run: bool = DryRunOpt,
    run_dir: Path | None = RunDirOpt,
    checkpoint: str | None = CheckpointOpt,
    base_model: bool = BaseModelOpt,
    rerun_stale: bool = RerunStaleOpt,
    overrides: list[str] | None = SetOpt,
) -> None:
    """Submit the recipe's chain as dependent jobs, each running `prour run --only STAGE`.

    Each job serves the models its steps call on its own node and skips what is done. Until the
    calibration labels are approved the chain stops at the review gate; `--approve-labels`
    submits the rest. ``--set slurm.*`` items shape the jobs; the other ``--set`` items reach
    every stage.
    """
    from prour.cluster.jobs import SubmitError, dry_run_text
    from prour.cluster.jobs import submit as submit_jobs
    from prour.cluster.slurm import RenderError, SubmitRequest, plan_submission
    from prour.config import ConfigError
    from prour.recipes import load_recipe

    items = list(overrides or [])
    try:
        folder = run_dir.resolve() if run_dir else None
        loaded = load_recipe(recipe, [*items, *([f"run_dir={folder}"] if folder else [])],
                             cluster=True)
        request = SubmitRequest(
            Path(recipe).resolve(),
            [s.strip() for s in stages.split(",")] if stages is not None else None,
            folder or loaded.resolved_run_dir(),
            items,
            Path.cwd(),
            checkpoint,
            bool(approve_labels),
            base_model,
            rerun_stale,
        )
        submission = plan_submission(loaded, request)
    except (ConfigError, RenderError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    plans = submission.plans
    memory = _memory_plans(loaded, [plan.stage for plan in plans])
    if dry_run:
        typer.echo(dry_run_text(submission, loaded), nl=False)
        for plan in memory:
            typer.echo(plan.text())
    if not all(plan.fits for plan in memory):
        if not dry_run:
            typer.echo("\n".join(p.text() for p in memory if not p.fits), err=True)
        typer.echo("error: the recipe's models do not fit the node's GPUs (see the plan)", err=True)
        raise typer.Exit(2)
    if dry_run:
        _dry_run_preflight(loaded, [plan.stage for plan in plans])
        return
    for plan in plans:
        for note in plan.notes:
            typer.echo(f"note: {plan.stage}: {note}", err=True)
    try:
        manifest = submit_jobs(loaded, request, submission)
    except SubmitError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for entry in manifest["stages"]:
        after = f"  (after {entry['depends_on']})" if entry["depends_on"] else ""
        typer.echo(f"{entry['stage']}: job {entry['job_id']}{after}  log {entry['log']}")
    typer.echo(f"manifest: {request.run_dir / 'slurm_jobs.json'}")
    if submission.gate:
        typer.echo(f"the chain stops at the review gate ({plans[-1].stage}): its job ends there "
                   f"and its log names the labels to review; then approve and continue with:\n"
                   f"  {submission.gate}")


def _memory_plans(recipe: Recipe, stages: list[str]) -> list[GpuPlan]:
    """GPU memory plans of the submitted stages' jobs (prour.cluster.gpu_plan): each job holds
    the servers of the roles its steps call, the trainer, and the models it loads in process.
    Jobs on no GPU are left out."""
    from prour.cluster.gpu_plan import gpu_plan, has_plan

    plans = []
    for stage in filter(has_plan, stages):
        plan = gpu_plan(recipe, stage)
        if plan.n_gpus:
            plans.append(plan)
    return plans


@slurm_app.command("status")
def status(run_dir: Path = RunArg, tail: int = TailOpt) -> None:
    """Say how each submitted stage stands, which one failed, and where its log is."""
    from prour.cluster.jobs import load_manifest, summarize

    try:
        manifest = load_manifest(run_dir)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    report = summarize(manifest)
    _print_report(report, tail)
    if report.failed is not None:
        raise typer.Exit(1)


def _print_report(report: RunStatus, tail: int) -> None:
    """A table of units, then every failed unit with its log and cause, the stages they kept from
    running, and the tail of the first one's log."""
    from prour.cluster.jobs import failure_cause
    from prour.cluster.vllm_server import log_tail

    manifest = report.manifest
    typer.echo(
        f"run {manifest['run_dir']} (recipe {manifest['name']}, submitted "
        f"{manifest['submitted']}; states from {report.source})"
    )
    typer.echo(f"{'unit':<28} {'job':<10} {'state':<12} {'exit':<5} log")
    for unit in report.units:
        code = "-" if unit.exit_code is None else str(unit.exit_code)
        why = f"  [{unit.reason}]" if unit.reason else ""
        typer.echo(f"{unit.label:<28} {unit.job:<10} {unit.state:<12} {code:<5} {unit.log}{why}")
    failed = report.failed
    if report.at_gate:
        gate = next((u for u in reversed(report.units) if u.state == "COMPLETED"), None)
        where = f" (the labels to review and their counts: {gate.log})" if gate else ""
        typer.echo(f"waiting at the review gate{where}; approve and continue with:\n"
                   f"  {report.at_gate}")
        return
    if failed is None:
        typer.echo("all stages done" if report.finished else "no failure so far")
        return
    for unit in report.failures:  # each with its log and cause; the first one's tail below
        code = "-" if unit.exit_code is None else unit.exit_code
        typer.echo(
            f"failed stage: {unit.stage} ({unit.label}, job {unit.job}, state "
            f"{unit.state}, exit code {code})"
        )
        typer.echo(f"log: {unit.log}")
        cause = failure_cause(Path(unit.log))
        if cause:
            typer.echo(f"cause: {cause}")
    if report.never_ran:
        typer.echo(f"never ran: {', '.join(report.never_ran)}")
    text = log_tail(Path(failed.log), tail)
    if text:
        typer.echo(f"--- last {tail} lines of {failed.log}\n{text}")
