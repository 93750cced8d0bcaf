"""``prour serve`` (start the recipe's frozen-model servers) and ``prour endpoints`` (read them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prour.cli.recipe import RecipeOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

EndpointsOpt = typer.Option(
    None,
    "--endpoints",
    help="Endpoints file to write/read (default: the recipe's endpoints_file, else "
    "<run_dir>/endpoints.json). Train and eval read the recipe's one.",
)


def _load(recipe: str, overrides: list[str] | None) -> Recipe:
    """Load the recipe with its serve/slurm sections; exit 2 naming the dotted key on an error."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe

    with recipe_errors():
        return load_recipe(recipe, overrides, cluster=True)


def _print_servers(record: dict[str, Any]) -> None:
    for model_id, server in (record.get("servers") or {}).items():
        roles = ", ".join(server.get("roles") or []) or "(no role)"
        gpus = server.get("gpus")
        where = ",".join(map(str, gpus)) if gpus is not None else "inherited"
        typer.echo(
            f"{model_id}: {server['base_url']}  pid {server.get('pid')}  GPUs {where}  roles: {roles}"
        )


def serve(
    recipe: str = RecipeOpt,
    overrides: list[str] | None = SetOpt,
    roles: str | None = typer.Option(
        None, "--roles", help="Comma-separated roles; start only the servers they use."
    ),
    endpoints: Path | None = EndpointsOpt,
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print each server's command, roles and GPUs and the GPU memory plan; start nothing.",
    ),
) -> None:
    """Start a vLLM server per frozen model of the recipe, publish endpoints, hold until Ctrl-C."""
    import logging
    import threading

    from prour import interrupt
    from prour.cli.recipe import preflight_or_exit, preflight_problems
    from prour.cluster.serve import ServeError
    from prour.cluster.serve import serve as run_serve

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    loaded = _with_eval_generator(_load(recipe, overrides))
    wanted = [r.strip() for r in roles.split(",") if r.strip()] if roles else None
    if dry_run:  # the servers and their memory plan, then what this node lacks for them
        fits = _dry_run(loaded, wanted)
        if preflight_problems(_serving_only(loaded, wanted), "serve"):
            raise typer.Exit(2)
        if not fits:
            raise typer.Exit(1)
        return
    preflight_or_exit(_serving_only(loaded, wanted), "serve")
    stop = threading.Event()  # set by the first SIGINT/SIGTERM; a second kills the servers

    def ready(record: dict[str, Any]) -> None:
        _print_servers(record)
        if record.get("servers"):
            typer.echo("serving; stop with Ctrl-C or SIGTERM")

    try:
        with interrupt.interruptible(lambda: "the servers were being stopped", stop=stop):
            path = run_serve(loaded, stop, roles=wanted, endpoints=endpoints, on_ready=ready)
    except ServeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"endpoints: {path}")


def _with_eval_generator(loaded: Recipe) -> Recipe:
    """The recipe with eval's generator among its servers under ``eval.generator_backend:
    vllm`` (the exported checkpoint; a recipe without training: ``models.generator``'s folder),
    once export has written it; before that it is left out, and said so."""
    from prour.cluster.recipe import serves_generator
    from prour.stages import get_step

    if not serves_generator(loaded):
        return loaded
    export = get_step("export")
    if loaded.train is not None and not export.is_done(loaded):
        folder = export.writes(loaded)[0].path.parent
        typer.echo(f"eval.generator_backend is vllm, but {folder} is not exported yet: its "
                   f"server is left out (serve again once `prour train export` has run)",
                   err=True)
        return loaded
    return get_step("eval").served_recipe(loaded)


def _serving_only(loaded: Recipe, roles: list[str] | None) -> Recipe:
    """The recipe as ``--roles`` serves it: ``serve.models`` holds only those roles' servers, so
    preflight checks their weights and memory plan and no other server's."""
    if not roles:
        return loaded
    from prour.cluster.serve import ServeError, plan_servers

    try:
        plans = plan_servers(loaded, roles)
    except ServeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    serve = loaded.serve.model_copy(update={"models": {p.model_id: p.spec for p in plans}})
    return loaded.model_copy(update={"serve": serve})


def _dry_run(loaded: Recipe, roles: list[str] | None) -> bool:
    """Print what `prour serve` would start; False when its memory plan does not fit, exit 1 when
    it would refuse otherwise. A model without local weights shows its id (preflight names it)."""
    import shlex

    from prour.cluster.gpu_plan import gpu_plan
    from prour.cluster.serve import ServeError, plan_servers, vllm_server

    try:
        plans = plan_servers(loaded, roles)
        servers = [(plan, vllm_server(plan, loaded.serve.python, loaded.models_dir, strict=False))
                   for plan in plans]
    except ServeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for plan, server in servers:
        gpus = ",".join(map(str, plan.spec.gpus)) if plan.spec.gpus is not None else "inherited"
        port = "" if plan.spec.port else " (a free port, chosen at start)"
        typer.echo(
            f"{plan.model_id}: roles {', '.join(plan.roles)}; GPUs {gpus}; "
            f"http://{plan.advertised_host}:{server.port}/v1{port}\n  {shlex.join(server.command())}"
        )
    memory = [gpu_plan(loaded, "serve", {plan.model_id: plan.spec for plan, _ in servers})]
    if loaded.train is not None and loaded.train.backend == "verl" and loaded.serve.colocate_train:
        memory.append(gpu_plan(loaded, "train"))
    for plan in memory:
        typer.echo(plan.text())
    return all(plan.fits for plan in memory)


def endpoints(
    recipe: str = RecipeOpt,
    overrides: list[str] | None = SetOpt,
    file: Path | None = EndpointsOpt,
    wait: float = typer.Option(
        0.0, "--wait", help="Seconds to wait for the servers to be ready (0: do not wait)."
    ),
) -> None:
    """Print the endpoints `prour serve` published for this recipe; optionally wait for them."""
    from prour.cluster.endpoints import (
        EndpointsError,
        endpoints_path,
        read_endpoints,
        wait_for_endpoints,
    )

    loaded = _load(recipe, overrides)
    path = file or endpoints_path(loaded)
    try:
        record = wait_for_endpoints(path, wait) if wait > 0 else read_endpoints(path)
    except EndpointsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if record is None:
        from prour.recipes import prour_command

        typer.echo(f"error: {path} does not exist; start the servers with "
                   f"`{prour_command(loaded, 'serve')}`", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(record, indent=2))
    if record["status"] != "ready":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``endpoints`` to the top-level app."""
    app.command("serve")(serve)
    app.command("endpoints")(endpoints)
