"""``prour reward probe``: score one hand-written query on one dataset row, to inspect the reward."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prour.cli.recipe import RecipeOrNoneOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

reward_app = typer.Typer(help="Inspect the information-gain reward.", no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


REWARD_ROLES = ("generator", "strict_user", "verifier")


def _probe_recipe(path: str | None, overrides: list[str], model_path: str | None) -> Recipe:
    """The recipe whose generator, strict user and verifier score the probe: ``--model`` for all
    three, else the recipe's roles (a missing responder role uses ``models.generator``)."""
    from prour.build import missing_roles
    from prour.cli.recipe import recipe_errors
    from prour.config import ModelConfig, Recipe
    from prour.recipes import load_recipe

    if path is None and model_path is None:
        _fail("give --recipe (models.generator, models.strict_user, models.verifier) or "
              "--model PATH")
    with recipe_errors():
        loaded = load_recipe(path, overrides, endpoints=True) if path else Recipe(name="probe")
    if model_path:
        cfg = ModelConfig(backend="hf", path=model_path, dtype="float32", device="cpu")
        models = {**loaded.models, **dict.fromkeys(REWARD_ROLES, cfg)}
        return loaded.model_copy(update={"models": models})
    for line in missing_roles(loaded.models, {"`prour reward` (the policy that scores it)":
                                              ["generator"]}):
        _fail(line)
    defaults = dict.fromkeys(REWARD_ROLES, loaded.models["generator"])
    return loaded.model_copy(update={"models": {**defaults, **loaded.models}})


def _read_row(dataset: Path, row: int) -> dict[str, Any]:
    import pandas as pd

    if not dataset.is_file():
        _fail(f"dataset not found: {dataset}")
    frame = pd.read_parquet(dataset)
    if not 0 <= row < len(frame):
        _fail(f"--row {row} is out of range: {dataset} has {len(frame)} rows (0..{len(frame) - 1})")
    return frame.iloc[row].to_dict()


def _as_output(query: str) -> str:
    """A bare question becomes ``YES [QUESTION]…[/QUESTION]``; formatted outputs are kept."""
    text = query.strip()
    if text == "NO" or "[QUESTION]" in text.upper() or text.startswith("<think>"):
        return query
    return f"YES [QUESTION]{text}[/QUESTION]"


DatasetOpt = Annotated[Path, typer.Option("--dataset", help="Parquet of training states.")]
RowOpt = Annotated[int, typer.Option("--row", help="Row index in the dataset.")]
QueryOpt = Annotated[str, typer.Option("--query", help="A question, or a full generator output.")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="HF folder used for all three roles.")
]


@reward_app.command("probe")
def probe(
    dataset: DatasetOpt,
    row: RowOpt,
    query: QueryOpt,
    recipe: str | None = RecipeOrNoneOpt,
    model: ModelOpt = None,
    overrides: list[str] | None = SetOpt,
) -> None:
    """Print the responder's answer, ℓ_prior, ℓ_post and R for one query on one state
    (``--recipe`` for its models and reward section, or ``--model`` for all three roles)."""
    from prour.build import Builder
    from prour.data.schema import state_from_row
    from prour.train.reward import info_gain_reward

    loaded = _probe_recipe(recipe, list(overrides or []), model)
    try:
        state = state_from_row(_read_row(dataset, row))
    except ValueError as exc:
        _fail(f"{dataset} row {row}: {exc}")
    builder = Builder(loaded)  # roles on one model share one backend
    sample = info_gain_reward(builder).score_group(state, [_as_output(query)])[0]
    _print(state.mode, state.state_id, sample)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _print(mode: str, state_id: str, sample: Any) -> None:
    typer.echo(f"state:    {state_id} ({mode})")
    typer.echo(f"kind:     {sample.kind}" + (f" ({sample.reason})" if sample.reason else ""))
    typer.echo(f"question: {sample.question or '-'}")
    typer.echo(f"answer:   {sample.answer or '-'}")
    typer.echo(f"l_prior:  {_number(sample.prior)}")
    typer.echo(f"l_post:   {_number(sample.post)}")
    typer.echo(
        f"R:        {_number(sample.reward)}" + (" (failed: excluded)" if sample.failed else "")
    )
    typer.echo(f"target tokens: {sample.n_target_tokens}")
