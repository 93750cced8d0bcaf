"""The study's report from its folder: each grid's result lines (the latest line of each
episode the grid plans), the axes' names in the paper, the second judge's rows and the header
that says what was run on which tasks and what was not run, handed to the ask-less report
(:mod:`prour.eval.attention.study_report`), written to ``<run_dir>/study/report/ask-less/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prour.eval.harness import result_key
from prour.eval.study import grid_lines, grid_plan, grid_scope, study_dir, study_of

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.eval.attention.study_items import StudyData

REPORT_FOLDER = Path("report") / "ask-less"
NOT_RUN = ("Not run: Ambiguous WebShop and Ambiguous BrowseComp-Plus, the paper's other two "
           "domains (its Tables 3, 19, 21 and the WebShop columns of Tables 29-36). No package "
           "ships their data and none can be downloaded on the machines prour runs on; a user "
           "who has a domain registers it with the recipe's `plugins` key (docs/ask-less.md). "
           "The paper's averages over four domains are set beside means over three.")


def study_header(recipe: Recipe, grids: dict[str, list[dict]]) -> list[str]:
    """What the report opens with: the task set of each grid, how many of its planned episodes
    have a result, the judge and its unscored requests, and what the study does not run."""
    from prour.eval.attention.splits import SPLIT_NAMES

    lines = [f"Study {recipe.name!r}: {study_dir(recipe)}"]
    for grid in study_of(recipe).grids:
        ids, split, seeds = grid_scope(recipe, grid)
        planned = sum(map(len, grid_plan(recipe, grid).values()))
        drawn = " (the ask-less paper's Table 6 split, drawn by prour's seeded rule: " \
                "prour/eval/attention/splits.py)" if split in SPLIT_NAMES.values() else ""
        tasks = ", ".join(f"{d} {len(t)}" for d, t in ids.items())
        lines.append(f"Grid {grid}: task set {split}{drawn}: {tasks}; seeds {seeds}; "
                     f"{len(grids[grid])} of {planned} planned episodes have a result")
    episodes = {result_key(line["key"]): line for g in grids.values() for line in g}  # shared once
    requests = [r for line in episodes.values()
                for r in (line.get("attention") or {}).get("requests", [])]
    unscored = sum(r.get("value") is None or r.get("reading_effort") is None for r in requests)
    judge = recipe.models.get("judge")
    name = (judge.model or judge.path or judge.backend) if judge is not None else "none"
    lines.append(f"Judge: models.judge ({name}); {unscored} of {len(requests)} delivered "
                 "request(s) carry no judge score (shown as missing, never as 0)")
    lines.append(NOT_RUN)
    return lines


def study_data(recipe: Recipe) -> StudyData:
    """The report's input from the study folder and the recipe."""
    from prour.config.attention import AttentionConfig
    from prour.eval.attention.second_judge import read_rows
    from prour.eval.attention.study_items import StudyData
    from prour.eval.attention.validation_files import SECOND_JUDGE

    study, folder = study_of(recipe), study_dir(recipe)
    grids = grid_lines(recipe, folder)
    attention = recipe.eval.attention or AttentionConfig()
    names = {axis: {value: spec.paper for value, spec in values.items()}
             for axis, values in study.axes.items()}
    return StudyData(grids=grids, backbones=names.get("backbone", {}),
                     simulators=names.get("simulator", {}),
                     second_judge=read_rows(folder / SECOND_JUDGE),
                     accounting=attention.accounting, lam=attention.lam,
                     weights=attention.weights, header=study_header(recipe, grids),
                     validation=folder / "validation")


def write_study_report(recipe: Recipe, n_boot: int) -> tuple[list[str], Path]:
    """Write the report; (the lines the terminal prints, the HTML page)."""
    from prour.eval.attention.study_report import write_ask_less_report

    out = study_dir(recipe) / REPORT_FOLDER
    files = write_ask_less_report(study_data(recipe), out, n_boot)
    return files["summary"].read_text().splitlines(), files["index"]
