"""``prour view``: a run folder as a static HTML site (:mod:`prour.eval.viewer`)."""

from __future__ import annotations

from pathlib import Path

import typer


def view_command(
    run: str = typer.Argument(..., help="Run folder: an evaluation's (episodes.jsonl, "
                              "results.jsonl) or one of trajectories (collect, import tau2)."),
    out: str | None = typer.Option(None, "--out", help="Folder for the site (default RUN/view)."),
) -> None:
    """Write an HTML page per episode (conversation, decisions with AU/EU, route, query, answer
    and attention cost, tau2's reward breakdown) and an index of methods × tasks; open index.html
    in a browser (no server, nothing loaded from outside). Evaluation computes no information
    gain (a training reward), so the pages show none."""
    from prour.env.trajectory import is_tau2_results, misplaced_message
    from prour.eval.viewer import write_site

    path = Path(run)
    if path.is_file():
        message = misplaced_message(path) if is_tau2_results(path) else \
            f"{path}: is a file; pass the run folder that holds it"
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(2)
    try:
        index = write_site(path, out, say=lambda note: typer.echo(f"warning: {note}", err=True))
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    pages = len(list(index.parent.glob("episode-*.html")))
    typer.echo(f"{index} ({pages} episode pages)")


def register(app: typer.Typer) -> None:
    """Add ``view`` to the ``prour`` app."""
    app.command("view")(view_command)
