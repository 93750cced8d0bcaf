"""``prour demo``: the whole pipeline on the embedded smoke recipe, on CPU, with tiny local models.

tiny model (+ warm start), then the chain as ``prour run`` walks it (:mod:`prour.runner`; for
smoke.yaml: collect → normalize → extract → train → export → eval → report, the rest skipped),
with the demo's additions as the runner's hooks around steps: data stats after extract, the
learning states and query-format pass before train, the training report after it. Each step is
the same ``prour`` command a user would type, run in a child process so that the demo shows
exactly what the commands print; the demo stops at the first one that fails, and a second demo
skips what is done. Training runs on the oracle-replay
states, a named fallback for what the tiny model cannot do (:mod:`prour.demo.learning`); the
summary prints the first and last mean reward and says what a tiny model cannot do.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer

from prour.cli.recipe import RecipeOrNoneOpt, SetOpt
from prour.stages import command_values

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"

WarmOpt = typer.Option(
    True, "--warm-start/--no-warm-start", help="Warm-start the tiny model (well-formed outputs)."
)


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
        import os
        import shutil

        staging = path.with_name(f".{path.name}.copying")  # a crash leaves no half copy to reuse
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(base, staging)
        os.rename(staging, path)
    typer.echo(f"-- tiny model done in {time.perf_counter() - start:.0f} s")


def demo(
    recipe: str | None = RecipeOrNoneOpt, warm: bool = WarmOpt,
    overrides: list[str] | None = SetOpt,
) -> None:
    """Run the whole pipeline on tiny local models (CPU) and print where its outputs are
    (``--recipe`` defaults to the embedded smoke recipe, recipes/smoke.yaml)."""
    from prour.cli.recipe import recipe_errors
    from prour.cli.run import run_chain
    from prour.recipes import load_recipe
    from prour.runner import RunOptions

    recipe = recipe or str(DEFAULT_RECIPE)

    sets = [part for item in overrides or [] for part in ("--set", item)]
    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True)
    if loaded.train is None:
        typer.echo(f"error: {recipe}: train: the demo recipe needs a `train` section", err=True)
        raise typer.Exit(2)
    paths = {Path(m.path) for m in loaded.models.values() if m.backend == "hf" and m.path}
    for path in sorted(paths):
        _tiny_model(path, warm, loaded.seed)
    dataset = Path(loaded.data.dataset_dir)
    checkpoints = Path(command_values(loaded)["checkpoints"])
    eval_dir = Path(command_values(loaded)["eval_dir"])
    code = run_chain(RunOptions(  # the chain as `prour run` walks it, the demo's additions around
        recipe_path=recipe, overrides=list(overrides or []), hooks=DEMO_ADDITIONS,
        continue_command=["prour", "demo", "--recipe", recipe, *sets]))
    if code != 0:
        typer.secho(f"demo stopped (exit {code}); rerun `prour demo` to resume", fg="red",
                    err=True)
        raise typer.Exit(code)
    _summary(checkpoints)
    typer.secho("\nprour demo finished", bold=True)
    typer.echo(f"  trajectories: {loaded.data.trajectories}")
    typer.echo(f"  dataset:      {dataset}")
    typer.echo(f"  checkpoints:  {checkpoints}")
    typer.echo(f"  metrics:      {checkpoints / 'metrics.jsonl'}")
    typer.echo(f"  training curve: {checkpoints / 'report'}")
    typer.echo(f"  eval results: {eval_dir / 'results.jsonl'}")
    typer.echo(f"  report:       {_report_dir(loaded)}")


def _dataset_card(loaded: Any) -> None:
    _stage("dataset card", ["data", "stats", loaded.data.dataset_dir])


def _training_report(loaded: Any) -> None:
    _stage("training report", ["train", "report", command_values(loaded)["checkpoints"]])


def _learning_states(loaded: Any) -> list[str]:
    """Write the oracle-replay states and the query-format pass; the train step's arguments
    (``--resume`` and the --set items that point training at them)."""
    from prour.demo import learning
    from prour.demo.states import FALLBACK_NAME, FALLBACK_REASON

    typer.secho(f"\n== learning states: {FALLBACK_NAME} (fallback) + query-format pass", bold=True)
    typer.echo(f"   why: {FALLBACK_REASON}")
    start = time.perf_counter()
    prepared = learning.prepare(loaded.models["generator"].path, loaded.resolved_run_dir(),
                                loaded.seed)
    typer.echo(f"-- learning states done in {time.perf_counter() - start:.0f} s: "
               f"{prepared['states']}, policy start {prepared['policy']}")
    return ["--resume",
            *(part for item in learning.train_overrides(prepared) for part in ("--set", item))]


def _report_dir(loaded: Any) -> Path:
    """The demo's report folder: where the chain's report step writes it (RUN/eval/report)."""
    return Path(command_values(loaded)["eval_dir"]) / "report"


def _trained_steps(loaded: Any) -> list[str]:
    """Export the demo's training as it ran (its step count), whatever ran it before."""
    from prour.demo.learning import TRAIN_OVERRIDES

    return [part for key in ("train.total_steps", "train.save_every")
            for part in ("--set", f"{key}={TRAIN_OVERRIDES[key]}")]


# What the demo adds around a step of the chain: (before: the step's extra arguments, after).
DEMO_ADDITIONS: dict[str, tuple[Any, Any]] = {
    "extract": (None, _dataset_card),
    "train": (_learning_states, _training_report),
    "export": (_trained_steps, None),
}


def _summary(checkpoints: Path) -> None:
    """First and last mean reward of training, and what a tiny model cannot do."""
    from prour.demo.learning import WINDOW, reward_rise
    from prour.train.report import read_metrics

    rise = reward_rise(read_metrics(checkpoints))
    typer.secho("\nwhat the demo shows", bold=True)
    typer.echo(f"  training: first step's mean reward {rise['first_step']:+.3f}, last step's "
               f"{rise['last_step']:+.3f}")
    typer.echo(
        f"  smoothed: mean reward {rise['first']:+.3f} over the first {WINDOW} steps -> "
        f"{rise['last']:+.3f} over the last {WINDOW} (rise {rise['rise']:+.3f}); "
        f"{rise['steps_with_ig']} of {rise['steps']} steps asked valid questions scored by "
        "information gain (prior and posterior)"
    )
    typer.echo(
        "  what a tiny model cannot do: solve tau2 tasks (expect 0 successes for every method), "
        "hold a conversation or normalize a goal (training runs on oracle-replay states, a "
        "fallback), or ask from the warm start alone (a query-format pass precedes training); "
        "the reward rises mostly as invalid outputs give way to well-formed questions, and the "
        "information gain per question stays small"
    )


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the ``prour`` app."""
    app.command("demo")(demo)
