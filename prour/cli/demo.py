"""``prour demo``: the whole pipeline on the embedded smoke recipe, on CPU, with tiny local models.

tiny model (+ warm start) → collect → normalize → extract → data stats → train → eval → report.
Each stage is the same ``prour`` command a user would type, run in a child process so that the
demo shows exactly what the stage commands print; the demo stops at the first stage that fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import typer

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"

RecipeOpt = typer.Option(
    str(DEFAULT_RECIPE), "--recipe", help="Recipe to run (default: the embedded smoke recipe)."
)
WarmOpt = typer.Option(
    True, "--warm-start/--no-warm-start", help="Warm-start the tiny model (well-formed outputs)."
)
SetOpt = typer.Option(None, "--set", help="Recipe override key.sub=value (repeatable).")


def _stage(title: str, args: list[str]) -> float:
    """Run one ``prour`` command; exit the demo with its status if it fails."""
    typer.secho(f"\n== {title}: prour {' '.join(args)}", bold=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "prour.cli.main", *args], check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        typer.secho(f"demo stopped: `{title}` failed (exit {done.returncode})", fg="red", err=True)
        raise typer.Exit(done.returncode)
    typer.echo(f"-- {title} done in {seconds:.0f} s")
    return seconds


def _tiny_model(path: Path, warm: bool, seed: int) -> None:
    """Build the tiny Qwen3 (and warm-start it) where the recipe's models point."""
    from prour.demo.tiny import build_tiny_model
    from prour.demo.warmstart import warm_start

    if (path / "config.json").is_file():
        typer.echo(f"tiny model: reusing {path}")
        return
    typer.secho(f"\n== tiny model: {path} (warm start: {warm})", bold=True)
    start = time.perf_counter()
    base = build_tiny_model(path.parent / f"{path.name}-base", seed=seed, max_position=16384)
    if warm:
        warm_start(base, path, seed=seed)
    else:
        import shutil

        shutil.copytree(base, path)
    typer.echo(f"-- tiny model done in {time.perf_counter() - start:.0f} s")


def demo(
    recipe: str = RecipeOpt, warm: bool = WarmOpt, overrides: list[str] | None = SetOpt
) -> None:
    """Run the whole pipeline on tiny local models (CPU) and print where its outputs are."""
    from prour.cli.recipe import load_cli_recipe

    sets = [part for item in overrides or [] for part in ("--set", item)]
    loaded = load_cli_recipe(recipe, overrides)
    if loaded.train is None:
        typer.echo(f"error: {recipe}: train: the demo recipe needs a `train` section", err=True)
        raise typer.Exit(2)
    paths = {Path(m.path) for m in loaded.models.values() if m.backend == "hf" and m.path}
    for path in sorted(paths):
        _tiny_model(path, warm, loaded.seed)
    run_dir = loaded.resolved_run_dir()
    dataset = loaded.data.path("dataset_dir", run_dir)
    checkpoints = Path(loaded.train.output_dir.replace("${name}", loaded.name))
    _stage("collect", ["collect", "--recipe", recipe, *sets])
    _stage("normalize", ["normalize", "--recipe", recipe, *sets])
    _stage("extract", ["extract", "--recipe", recipe, *sets])
    _stage("dataset card", ["data", "stats", str(dataset)])
    _stage("train", ["train", "--recipe", recipe, "--resume", *sets])
    eval_dir = run_dir / "eval"
    _stage("eval", ["eval", "--recipe", recipe, "--checkpoint", str(checkpoints),
                    "--out", str(eval_dir), *sets])
    _stage("report", ["report", str(eval_dir), "--out", str(run_dir / "report")])
    typer.secho("\nprour demo finished", bold=True)
    typer.echo(f"  trajectories: {loaded.data.path('trajectories', run_dir)}")
    typer.echo(f"  dataset:      {dataset}")
    typer.echo(f"  checkpoints:  {checkpoints}")
    typer.echo(f"  metrics:      {checkpoints / 'metrics.jsonl'}")
    typer.echo(f"  eval results: {eval_dir / 'results.jsonl'}")
    typer.echo(f"  report:       {run_dir / 'report'}")


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the ``prour`` app."""
    app.command("demo")(demo)
