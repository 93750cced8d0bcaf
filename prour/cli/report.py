"""``prour report RUN ...``: the evaluation report of eval runs (and the paper's tables and
figures beside it), or the training report of training output folders."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


RunsArg = typer.Argument(..., help="Run folder(s) written by `prour eval` or `prour import "
                         "tau2`, or training output folders (holding metrics.jsonl) for the "
                         "training report.")
ReportOutOpt = typer.Option(None, "--out", help="Report folder (default RUN/report).")
AttentionOpt = typer.Option(False, "--attention", help="Add the attention-protocol tables.")
BaselineOpt = typer.Option(None, "--baseline", help="System the others are compared with.")
ACCOUNTINGS = ("messages", "atomic", "effort", "full", "full+exempt")  # eval.attention.accounting


def _lam(value: float | None) -> float | None:
    """``--lam``: a finite λ >= 0 (checked as the options parse, before any run is read)."""
    import math

    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"λ must be a finite number >= 0, got {value}")
    return value


def _accounting(value: str | None) -> str | None:
    if value is not None and value not in ACCOUNTINGS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(ACCOUNTINGS)}")
    return value


AccountingOpt = typer.Option(None, "--accounting", callback=_accounting,
                             help=f"Attention cost accounting: {', '.join(ACCOUNTINGS)}.")
LamOpt = typer.Option(None, "--lam", callback=_lam, help="λ of U = R − λ·A (finite, >= 0).")
BootOpt = typer.Option(10_000, "--n-boot", min=1, help="Bootstrap draws of the intervals (>= 1).")
BurdenPairsOpt = typer.Option(
    0, "--burden-pairs", min=0, help="Human burden study: export N equal-count conversation pairs to "
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
    _say_skipped(written["json"])
    typer.echo("\n".join(paper.lines))


def _say_skipped(report_json: Path) -> None:
    """A warning naming how many result lines the report left out, and the first."""
    import json

    skipped = json.loads(report_json.read_text()).get("skipped_lines") or []
    if skipped:
        typer.echo(f"warning: skipped {len(skipped)} result line(s) the report cannot read "
                   f"(first {skipped[0]}); {report_json.with_suffix('.md').name} lists them",
                   err=True)


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
    data = json.loads(written["json"].read_text())
    if data["skipped_lines"]:  # said here too: a warning of the log may not reach the terminal
        typer.echo(f"warning: skipped {len(data['skipped_lines'])} metrics line(s) that hold no "
                   f"step record (first {data['skipped_lines'][0]}); the report lists them",
                   err=True)
    line = share_line(data["time"])
    if line:  # each phase's share of the step time (the report's time table)
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add ``report`` to the ``prour`` app."""
    app.command("report")(report_command)
