"""``prour train --recipe R [--backend local|verl] [--dry-run] [--resume]``, ``train export`` and
``train report``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prour.cli.recipe import RecipeOrNoneOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.train import TrainConfig
    from prour.train.local import RewardFactory

train_app = typer.Typer(help="DAPO training of the query generator (paper A.2.1).")

TargetOpt = typer.Option(None, "--target", help="Output folder (default: <output_dir>/step_N).")
OutputDirArg = typer.Argument(..., help="Training output folder (train.output_dir).")
ReportOutOpt = typer.Option(None, "--out", help="Report folder (default OUTPUT_DIR/report).")


def _load(recipe: str | None, overrides: list[str] | None, backend: str | None) -> tuple[Recipe, TrainConfig]:
    """Recipe (``--backend`` is ``train.backend``) and its train section; exit 2 naming the key,
    or naming checkpoints of this run found where an older prour put them."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe
    from prour.train.checkpoint import old_checkpoints
    from prour.train.recipe import train_section

    if recipe is None:
        typer.echo("error: --recipe is required", err=True)
        raise typer.Exit(2)

    with recipe_errors():
        loaded = load_recipe(recipe, overrides, flags={"train.backend": backend}, endpoints=True)
        cfg = train_section(loaded)
    moved = old_checkpoints(cfg.output_dir, loaded.run_dir, loaded.name)
    if moved:
        typer.echo(f"error: {moved}", err=True)
        raise typer.Exit(2)
    return loaded, cfg


def _logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )


@train_app.callback(invoke_without_command=True)
def train(
    ctx: typer.Context,
    recipe: str | None = RecipeOrNoneOpt,
    backend: str = typer.Option(
        None, "--backend", help="local (one process) or verl (Ray, FSDP, vLLM)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan (verl: the full command) and stop."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest finished checkpoint."
    ),
    overrides: list[str] = SetOpt,
) -> None:
    """Train ``models.generator`` with the recipe's ``train`` section."""
    if ctx.invoked_subcommand is not None:
        return
    from prour.cli.recipe import (
        hold_run_folder,
        preflight_or_exit,
        preflight_problems,
        resumable,
    )

    loaded, cfg = _load(recipe, overrides, backend)
    _logging()
    run = _run_verl if cfg.backend == "verl" else _run_local
    if dry_run:  # the plan, its run-time estimate, then what this node lacks for it
        run(loaded, cfg, dry_run, resume)
        _estimate(loaded, cfg)
        if preflight_problems(loaded, "train/train"):
            raise typer.Exit(2)
        return
    preflight_or_exit(loaded, "train/train")
    out = Path(cfg.output_dir)
    layout = "verl" if fsdp_checkpoints(cfg) else "local"
    with hold_run_folder(out), resumable(lambda: saved_checkpoint(out, layout)):
        run(loaded, cfg, dry_run, resume)  # one trainer per output_dir


def _estimate(loaded: Recipe, cfg: TrainConfig) -> None:
    """Print the dry-run's run-time estimate (:mod:`prour.estimate`); a broken rates file is
    named and skipped, never a reason to stop the dry-run."""
    from prour.estimate import train_estimate

    try:
        lines = train_estimate(loaded, cfg)
    except ValueError as exc:
        lines = [f"estimate (train): none ({exc})"]
    typer.echo("\n".join(lines))


def fsdp_checkpoints(cfg: TrainConfig) -> bool:
    """Whether training saves verl's ``global_step_N`` FSDP shards (else ``step_N`` Hugging Face
    folders: the local trainer, and verl's CPU rehearsal)."""
    return cfg.backend == "verl" and cfg.verl.engine != "cpu_rehearsal"


def saved_checkpoint(out: Path, backend: str) -> str:
    """What an interrupted training kept: its newest checkpoint and how a rerun resumes."""
    from prour.train.checkpoint import latest_checkpoint, latest_verl_step

    step = latest_verl_step(out) if backend == "verl" else latest_checkpoint(out)
    if step is None:
        return f"no checkpoint saved yet in {out} (train.save_every); a rerun starts over"
    name = f"global_step_{step}" if backend == "verl" else Path(step).name
    return (f"newest checkpoint {out / name}, metrics in {out / 'metrics.jsonl'}; rerun with "
            "--resume to continue from it")


def recipe_reward(recipe: Recipe) -> RewardFactory:
    """The recipe's information-gain reward around a given belief scorer (the local trainer's
    live policy, or its sampler): the components' builder makes the responders."""

    def build(policy_llm: Any) -> Any:
        from prour.build import Builder
        from prour.train.reward import info_gain_reward

        return info_gain_reward(Builder(recipe, {"generator": policy_llm}))

    return build


def _run_local(recipe: Recipe, cfg: TrainConfig, dry_run: bool, resume: bool) -> None:

    out = Path(cfg.output_dir)
    if dry_run:
        typer.echo(
            f"local backend: {cfg.total_steps} steps x {cfg.states_per_step} states x "
            f"{cfg.rollout.n} samples (keep {cfg.rollout.keep}); checkpoints every "
            f"{cfg.save_every} steps in {out}"
        )
        return
    from prour.train.local import LocalTrainer
    from prour.train.metrics import FailedAsksError

    try:
        trainer = LocalTrainer(recipe, reward_factory=recipe_reward(recipe))
        last = trainer.run(resume=resume)
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except FailedAsksError as exc:  # the responders are down: the step was not trained on
        typer.echo(f"error: {exc}; {saved_checkpoint(out, 'local')}", err=True)
        raise typer.Exit(1) from None
    if trainer.untrained:
        typer.echo(f"lacking: {cfg.train_file} holds no training state (extract routed none to "
                   f"clarify or verify): no update was made; {last} is the initial policy, "
                   "untrained, so that export and eval still run")
        return
    typer.echo(f"checkpoint: {last}\nmetrics: {out / 'metrics.jsonl'}\n"
               f"training curves: prour train report {out}")


def _run_verl(recipe: Recipe, cfg: TrainConfig, dry_run: bool, resume: bool) -> None:
    from prour.cluster.gpu_plan import gpu_plan
    from prour.train.checkpoint import latest_verl_step
    from prour.train.verl_backend import launch, no_training_state, prepare_verl_run

    lacking = no_training_state(cfg)
    if lacking is not None:  # verl cannot read it: do what the local trainer does
        _save_untrained_verl(recipe, cfg, lacking, dry_run)
        return
    if cfg.verl.engine == "cpu_rehearsal":
        _rehearse(recipe, cfg, dry_run)
        return
    memory = gpu_plan(recipe, "train")  # trainer + its responders on this node (GPU memory)
    run = prepare_verl_run(recipe, cfg, write=not dry_run, resume=resume)
    if dry_run or not memory.fits:
        typer.echo(run.shell() if dry_run else "", nl=dry_run)
        typer.echo(memory.text(), err=not memory.fits)
        if not memory.fits:
            raise typer.Exit(2)
        return
    if not resume and latest_verl_step(run.output_dir) is not None:
        typer.echo(
            f"error: {run.output_dir} already holds verl checkpoints; pass --resume or use a new "
            "train.output_dir",
            err=True,
        )
        raise typer.Exit(2)
    raise typer.Exit(launch(run))


def _save_untrained_verl(recipe: Recipe, cfg: TrainConfig, lacking: str, dry_run: bool) -> None:
    """An empty train file under the verl backend: the initial policy becomes the final step
    (as the local trainer saves it), verl is not launched, and the run says what it lacked."""
    from prour.train.checkpoint import step_dir
    from prour.train.verl_backend import save_untrained

    if dry_run:
        typer.echo(f"verl backend: {lacking} (extract routed none to clarify or verify): `prour "
                   f"train` would save the initial policy as "
                   f"{step_dir(cfg.output_dir, cfg.total_steps)}, untrained, without launching "
                   "verl")
        return
    try:
        last = save_untrained(recipe, cfg, lacking)
    except (FileNotFoundError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"lacking: {lacking} (extract routed none to clarify or verify): no update was "
               f"made and verl was not launched; {last} is the initial policy, untrained, so "
               "that export and eval still run")


def _rehearse(recipe: Recipe, cfg: TrainConfig, dry_run: bool) -> None:
    """``train.verl.engine: cpu_rehearsal``: verl's trainer code on CPU, one policy rank per
    Ray node, resuming from the newest ``step_N`` (:func:`prour.train.verl_ext.rehearsal.
    rehearse`)."""
    from prour.config.train import actor_dp_size

    out = Path(cfg.output_dir)
    if dry_run:
        typer.echo(f"verl CPU rehearsal: {cfg.total_steps} steps, {actor_dp_size(cfg.verl)} policy "
                   f"rank(s) on Ray (one per node), checkpoints step_N in {out}")
        return
    from prour.train.metrics import FailedAsksError
    from prour.train.verl_ext.rehearsal import RankLostError, rehearse

    try:
        last = rehearse(recipe, cfg)
    except RankLostError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except FailedAsksError as exc:  # the responders are down: verl's sampler stopped the step
        typer.echo(f"error: {exc}; {saved_checkpoint(out, 'local')}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"checkpoint: {last}\nmetrics: {out / 'metrics.jsonl'}")


@train_app.command("export")
def export(
    recipe: str | None = RecipeOrNoneOpt,
    step: int = typer.Option(None, "--step", help="verl step to convert (default: the newest)."),
    target: Path = TargetOpt,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the verl.model_merger command (or the local folder) only."
    ),
    overrides: list[str] = SetOpt,
) -> None:
    """Write a saved checkpoint of the run as a Hugging Face folder (what `prour eval` loads).

    verl (FSDP shards) is merged into ``<output_dir>/step_N``; a local ``step_N`` already is one,
    so it is checked (and copied to ``--target`` without the trainer state).
    """
    import shlex

    from prour.train.checkpoint import export_hf
    from prour.train.verl_backend import ExportError, export_checkpoint

    _recipe, cfg = _load(recipe, overrides, None)
    out = Path(cfg.output_dir)
    try:
        if fsdp_checkpoints(cfg):
            command, folder = export_checkpoint(out, step, target, dry_run=dry_run)
        else:
            source = export_hf(out, step)
            folder = source if dry_run or target is None else export_hf(out, step, target)
            command = []
    except (FileNotFoundError, ExportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if dry_run and command:
        typer.echo(shlex.join(command))
    elif dry_run:
        copy = f"; would copy it without the trainer state to {target}" if target else ""
        typer.echo(f"{folder} is a Hugging Face folder already{copy}")
    else:
        typer.echo(f"exported: {folder}")


@train_app.command("report")
def report(
    output_dir: Path = OutputDirArg,
    out: Path = ReportOutOpt,
) -> None:
    """Plot a training run's metrics.jsonl (local or verl): reward by mode, sample kinds,
    prior/posterior, entropy, clip fraction, grad norm, lr, tokens/s; PNGs and markdown."""
    from prour.cli.eval import training_report

    training_report(str(output_dir), str(out) if out else None)


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")
