"""``prour collect | normalize | extract | data stats``: the data stage from tau2 tasks to parquet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # pragma: no cover
    from prour.data.pipeline import DataRecipe

data_app = typer.Typer(help="Inspect training datasets.", no_args_is_help=True)

RecipeOpt = typer.Option(..., "--recipe", "-r", help="Path to a YAML recipe.")
SetOpt = typer.Option(None, "--set", help="Override a recipe value: key.sub=value (repeatable).")
BadLineOpt = typer.Option(
    None, "--on-bad-line",
    help="Corrupt JSONL input lines: 'error' refuses the file, 'skip' reports and skips them "
         "(default: data.on_bad_line).",
)
ProgressOpt = typer.Option(True, "--progress/--no-progress", help="Show progress bars.")


def _recipe(path: str, overrides: list[str] | None, on_bad_line: str | None
            ) -> DataRecipe:
    """Load the recipe (exit 2 with the dotted key on an error) and apply ``--on-bad-line``."""
    from prour.config import ConfigError
    from prour.data.pipeline import load_data_recipe

    extra = list(overrides or [])
    if on_bad_line is not None:
        extra.append(f"data.on_bad_line={on_bad_line}")
    try:
        return load_data_recipe(path, extra)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _model(run: DataRecipe, role: str, command: str) -> Any:
    """The recipe's model config for ``role``, or exit naming the missing key."""
    if role not in run.recipe.models:
        typer.echo(f"error: `prour {command}` needs models.{role} in the recipe", err=True)
        raise typer.Exit(2)
    return run.recipe.models[role]


def _tasks(run: DataRecipe) -> list[Any]:
    from prour.env.domains import select_tasks

    cfg = run.data
    return select_tasks(cfg.domain, cfg.split, max_tasks=cfg.max_tasks)


def _report_skipped(path: Path, skipped: list[int]) -> None:
    if skipped:
        lines = ", ".join(f"{path}:{n}" for n in skipped)
        typer.echo(f"warning: skipped {len(skipped)} corrupt line(s): {lines}", err=True)


def collect(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
            progress: bool = ProgressOpt) -> None:
    """Run task agent + teacher + user episodes on the data split; resumable (reruns skip done)."""
    from prour.data.collect import EpisodeFactories, collect_trajectories, teacher_exchanges
    from prour.data.pipeline import record_provenance
    from prour.env.agents import LLMAgent
    from prour.env.users import LLMUser
    from prour.llm.registry import build_llm

    loaded = _recipe(recipe, overrides, None)
    cfg, env, run_dir = loaded.data, loaded.recipe.env, loaded.run_dir
    agent_llm = build_llm(_model(loaded, "agent", "collect"))
    user_llm = build_llm(_model(loaded, "user", "collect"))
    teacher_llm = build_llm(_model(loaded, "teacher", "collect")) if cfg.teacher else None
    factories = EpisodeFactories(
        make_agent=lambda: LLMAgent(
            agent_llm, temperature=env.agent_temperature, max_tokens=env.agent_max_tokens
        ),
        make_user=lambda: LLMUser(
            user_llm, temperature=env.user_temperature, max_tokens=env.user_max_tokens
        ),
        teacher=teacher_llm, cfg=cfg)
    out = cfg.path("trajectories", run_dir)
    record_provenance(loaded, "collect")
    trajs = collect_trajectories(_tasks(loaded), factories, cfg, out, progress=progress,
                                 max_steps=env.max_steps, max_errors=env.max_errors)
    rewards = [t.reward for t in trajs if t.reward is not None]
    errored = sum(t.termination == "error" for t in trajs)
    asked = sum(len(teacher_exchanges(t)) for t in trajs)
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    typer.echo(f"{len(trajs)} trajectories in {out}: mean reward {mean:.3f}, {errored} errored, "
               f"{asked} teacher question(s)")


def normalize(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
              on_bad_line: str | None = BadLineOpt) -> None:
    """Rewrite each task's instruction into the first-person goal G*; flags lost values."""
    from prour.data.normalize import normalize_tasks
    from prour.data.pipeline import record_provenance
    from prour.llm.registry import build_llm
    from prour.router.thresholds import decomposer_model_id

    loaded = _recipe(recipe, overrides, on_bad_line)
    cfg = loaded.data
    model = _model(loaded, "normalizer", "normalize")
    path = cfg.path("goals", loaded.run_dir)
    record_provenance(loaded, "normalize")
    goals = normalize_tasks(_tasks(loaded), cfg.domain, build_llm(model), path,
                            model=decomposer_model_id(model), max_tokens=cfg.normalizer_max_tokens,
                            on_bad_line=cfg.on_bad_line)
    flagged = [g for g in goals if g.flagged]
    for goal in flagged:
        lost = ", ".join(f"{m['kind']} {m['text']!r}" for m in goal.missing) or "empty goal"
        typer.echo(f"flag {goal.domain}/{goal.task_id}: missing {lost}")
    typer.echo(f"{len(goals)} goals in {path}; {len(flagged)} flagged")


def extract(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
            on_bad_line: str | None = BadLineOpt, progress: bool = ProgressOpt) -> None:
    """Split, route every state with the decomposer, and write train/validation parquet + card."""
    from prour.data.pipeline import run_extract

    loaded = _recipe(recipe, overrides, on_bad_line)
    _model(loaded, "decomposer", "extract")
    if not loaded.data.tokenizer:
        _model(loaded, "generator", "extract")
    try:
        result = run_extract(loaded, progress=progress)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    _report_skipped(result.trajectories_path, result.skipped_lines)
    if result.errors:
        typer.echo("schema check failed:\n" + "\n".join(result.errors[:20]), err=True)
        raise typer.Exit(1)
    rows = result.card["extraction"]["rows"]
    typer.echo(f"train {rows['train']} rows, validation {rows['validation']} rows in "
               f"{result.dataset_dir}")


@data_app.command("stats")
def stats(dataset_dir: str = typer.Argument(..., help="Folder with train/validation .parquet.")
          ) -> None:
    """Print the dataset card and write card.md and card.json next to the parquet files."""
    from prour.data.card import card_markdown, write_card

    try:
        card, json_path, md_path = write_card(dataset_dir)
    except FileNotFoundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(card_markdown(card))
    typer.echo(f"written: {md_path}, {json_path}")


def register(app: typer.Typer) -> None:
    """Add ``collect``, ``normalize``, ``extract`` and the ``data`` group to the main app."""
    app.command("collect")(collect)
    app.command("normalize")(normalize)
    app.command("extract")(extract)
    app.add_typer(data_app, name="data")
