"""``prour train report``: the plots and tables of a training run's metrics."""

from __future__ import annotations

from pathlib import Path

import typer

OutputDirArg = typer.Argument(..., help="Training output folder (train.output_dir).")
ReportOutOpt = typer.Option(None, "--out", help="Report folder (default OUTPUT_DIR/report).")


def report(
    output_dir: Path = OutputDirArg,
    out: Path = ReportOutOpt,
) -> None:
    """Plot a training run's metrics.jsonl (local or verl): reward by mode, sample kinds,
    prior/posterior, entropy, clip fraction, grad norm, lr, tokens/s; PNGs and markdown."""
    from prour.cli.report import training_report

    training_report(str(output_dir), str(out) if out else None)


def register(train_app: typer.Typer) -> None:
    """Add ``report`` to the ``prour train`` group."""
    train_app.command("report")(report)
