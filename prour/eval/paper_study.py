"""The Prour paper's generalization tables from a run's study (``<run_dir>/study``, the grids
``table2``, ``table3``, ``table4``, ``table7`` of recipes/paper.yaml's ``study`` section), each
beside the numbers the paper's text states (:data:`prour.eval.paper.VALUES_FILE`).

Every row is the Pass@1 and the interaction steps of one system (a method in one study cell)
computed from the study's result lines exactly as Table 1's are (:func:`prour.eval.systems.
summarize`); a cell the study did not run (a grid left out, an endpoint without its key) is said
in words, never shown as 0. Table 4 names its task set (τ³-bench, ``tau3``) and its exclusions;
Table 7 the thresholds each block routes with, read from the run's thresholds file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.eval.metrics import AVERAGE, STEP_KINDS
from prour.eval.paper import Item, _f, _pass_cell, paper_value
from prour.eval.systems import System, SystemSummary, summarize

STUDY_ITEMS = ("table2", "table3", "table4", "table7")


@dataclass(frozen=True)
class StudyRuns:
    """What the items read: each grid's result lines, the axes' paper names, the study's
    folder and the thresholds it routed with (model id -> (τ_AU, τ_EU))."""

    grids: dict[str, list[dict[str, Any]]]
    names: dict[str, dict[str, str | None]]  # axis -> value -> the paper's name
    folder: Path
    thresholds: dict[str, tuple[float, float]]
    problem: str | None = None  # why there is no study to read (None: there is)


def _system(lines: list[dict[str, Any]], label: str, folder: Path) -> System:
    return System("study", lines[0]["method"], lines[0].get("variant"), list(lines), label,
                  folder)


def _pick(lines: Sequence[dict[str, Any]], method: str, **axes: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["method"] == method
            and all((line.get("axes") or {}).get(a) == v for a, v in axes.items())]


def _row(lines: list[dict[str, Any]], label: str, domains: Sequence[str], folder: Path,
         n_boot: int) -> tuple[list[str], SystemSummary | None]:
    """A run row: label, Pass@1 per domain and average, steps; ``not run`` without lines."""
    if not lines:
        return [label, "this run", "not run", *["–"] * (len(domains) + 4)], None
    summary = summarize(_system(lines, label, folder), n_boot)
    steps = [_f(summary.steps[k]) for k in (*STEP_KINDS, "total")]
    return [label, "this run", *(_pass_cell(summary, d) for d in [*domains, AVERAGE]),
            *steps], summary


def _paper(item: str, row: str, domains: Sequence[str], **where: str | None) -> list[str]:
    """The paper's row under a run row: the numbers its text states, "–" for the others."""
    cell = lambda metric, domain: (v.text if (v := paper_value(
        item, metric=metric, domain=domain, **where)) else "–")
    return [row, "paper", *(cell("pass_at_1", d) for d in [*domains, AVERAGE]),
            "–", "–", "–", cell("steps", AVERAGE)]


def _header(domains: Sequence[str], first: str) -> list[str]:
    return [first, "Source", *domains, "Average", "Act", "Clarify", "Verify", "Total steps"]


def _domains(lines: Sequence[dict[str, Any]], default: Sequence[str]) -> list[str]:
    present = list(dict.fromkeys(line["domain"] for line in lines))
    return present or list(default)


def _missing_grid(item: Item, runs: StudyRuns, grid: str) -> bool:
    """Say what is missing when the grid has no lines; True when there is nothing to show."""
    if runs.problem:
        item.missing.append(runs.problem)
    elif not runs.grids.get(grid):
        item.missing.append(f"the study has no result lines in grid `{grid}` (recipes/"
                            f"paper.yaml's study.grids.{grid}; `prour run` runs it in the "
                            "study step)")
    return bool(item.missing)


def _name(runs: StudyRuns, axis: str, value: str) -> str:
    return runs.names.get(axis, {}).get(value) or value


def _text(item: Item, row: list[str], paper: list[str]) -> None:
    average = row[-5]
    item.text.append(f"{row[0]}: average Pass@1 {average} | paper: {paper[-5]} %")


def table2_item(runs: StudyRuns, n_boot: int) -> Item:
    """Prour with each query generator, the task agent, decomposer and thresholds fixed."""
    grid = runs.grids.get("table2", [])
    domains = _domains(grid, ("retail", "airline"))
    item = Item("table2", header=_header(domains, "Query generator"))
    if _missing_grid(item, runs, "table2"):
        return item
    for value in dict.fromkeys(line["axes"]["generator"] for line in grid):
        name = _name(runs, "generator", value)
        row, _ = _row(_pick(grid, "prour", generator=value), name, domains, runs.folder, n_boot)
        paper = _paper("table2", name, domains, model=name)
        item.rows += [row, paper]
        _text(item, row, paper)
    _unrun(item, runs, "generator", {line["axes"]["generator"] for line in grid})
    return item


def _agents_by_generator(item: Item, runs: StudyRuns, grid: list[dict[str, Any]],
                         base: Callable[[str], list[dict[str, Any]]], base_label: str,
                         domains: Sequence[str], n_boot: int) -> None:
    """Per agent value: the base agent's row (``base(agent)``'s lines), then Prour with each
    generator value, each beside the paper's row (model: the agent, label: the generator)."""
    for agent in dict.fromkeys(line["axes"]["agent"] for line in grid):
        agent_name = _name(runs, "agent", agent)
        item.rows.append(_row(base(agent), f"{agent_name} / {base_label}", domains,
                              runs.folder, n_boot)[0])
        for generator in dict.fromkeys(line["axes"]["generator"] for line in grid):
            generator_name = _name(runs, "generator", generator)
            label = f"{agent_name} / {generator_name}"
            row, _ = _row(_pick(grid, "prour", agent=agent, generator=generator), label,
                          domains, runs.folder, n_boot)
            paper = _paper(item.key, label, domains, model=agent_name, label=generator_name)
            item.rows += [row, paper]
            _text(item, row, paper)


def table3_item(runs: StudyRuns, n_boot: int) -> Item:
    """Each agent backbone: the base agent, Prour with the prompted and the trained generator."""
    grid = runs.grids.get("table3", [])
    domains = _domains(grid, ("retail", "airline"))
    item = Item("table3", header=_header(domains, "Agent / query generator"))
    if _missing_grid(item, runs, "table3"):
        return item
    base = runs.grids.get("table3-base", [])
    _agents_by_generator(item, runs, grid, lambda agent: _pick(base, "base", agent=agent),
                         "none (base agent)", domains, n_boot)
    item.notes.append("The base agent calls no query generator: its rows are grid "
                      "`table3-base`'s, one run of each agent.")
    _unrun(item, runs, "agent", {line["axes"]["agent"] for line in grid})
    return item


def table4_item(runs: StudyRuns, n_boot: int) -> Item:
    """Every method on τ³-bench's tasks, modules and thresholds as on τ-bench."""
    from prour.env.domains import task_set_note

    grid = runs.grids.get("table4", [])
    domains = _domains(grid, ("retail", "airline", "telecom"))
    item = Item("table4", header=_header(domains, "Method"))
    if _missing_grid(item, runs, "table4"):
        return item
    for method in dict.fromkeys(line["method"] for line in grid):
        row, summary = _row(_pick(grid, method), method, domains, runs.folder, n_boot)
        paper = _paper("table4", method, domains, method=method)
        item.rows += [row, paper]
        _text(item, row, paper)
        if summary is not None and summary.unscored:
            item.notes.append(f"{method}: {summary.unscored} episode(s) unscored (a task whose "
                              "check is a natural-language assertion needs a judge: `prour "
                              "nl-assertions STUDY_DIR --recipe R`); they count 0 in Pass@1")
    for split in sorted({line.get("split") for line in grid} - {None}):
        for domain in domains:
            note = task_set_note(domain, split)
            if note:
                item.notes.append(f"Task set: {note}.")
    return item


def table7_item(runs: StudyRuns, n_boot: int) -> Item:
    """GLM-4-32B as agent and decomposer: each block's thresholds, each query generator."""
    grid = runs.grids.get("table7", [])
    domains = _domains(grid, ("retail", "airline"))
    item = Item("table7", header=_header(domains, "Thresholds / query generator"))
    if _missing_grid(item, runs, "table7"):
        return item
    base = runs.grids.get("table7-base", [])  # routes with no thresholds: one run for both
    _agents_by_generator(item, runs, grid, lambda agent: _pick(base, "base"),
                         "none (base agent, no thresholds)", domains, n_boot)
    item.notes += [f"Thresholds stored for {model}: τ_AU {au:.2f}, τ_EU {eu:.2f}"
                   for model, (au, eu) in sorted(runs.thresholds.items())]
    return item


def _unrun(item: Item, runs: StudyRuns, axis: str, present: set[str]) -> None:
    """The axis values the paper's table has that the grid did not run (a missing key)."""
    for value, name in runs.names.get(axis, {}).items():
        if value not in present and paper_value(item.key, metric="pass_at_1", domain=AVERAGE,
                                                model=name) is not None:
            item.missing.append(f"{name} ({axis}={value}): no episode in the study (an "
                                "endpoint without its key is left out: the study step's log "
                                "names it)")


ITEM_BUILDERS: dict[str, Callable[[StudyRuns, int], Item]] = {
    "table2": table2_item, "table3": table3_item, "table4": table4_item, "table7": table7_item}


def study_runs(evidence: Any) -> StudyRuns:
    """The study of the run folder a report reads (:class:`prour.eval.run_evidence.RunEvidence`:
    its recipe's study section, its folder moved with ``--run-dir``); a StudyRuns with
    ``problem`` when the run has none."""
    from prour.config.study import STUDY_FOLDER
    from prour.eval.study import grid_lines
    from prour.router.thresholds import thresholds_path

    recipe = evidence.recipe
    if recipe is None or recipe.study is None:
        return StudyRuns({}, {}, Path("."), {}, evidence.problem or "the run's recipe has no "
                         "`study` section (recipes/paper.yaml's study runs Tables 2, 3, 4 and 7)")
    folder = evidence.run_dir / STUDY_FOLDER
    if not (folder / "results.jsonl").is_file():
        return StudyRuns({}, {}, folder, {}, f"{folder} holds no results.jsonl: `prour run` "
                         "runs the study step after eval" + ("" if recipe.study.run else
                                                            " (study.run is false)"))
    names = {axis: {value: spec.paper for value, spec in values.items()}
             for axis, values in recipe.study.axes.items()}
    return StudyRuns(grid_lines(recipe, folder), names, folder,
                     _thresholds(evidence.path(thresholds_path(recipe))))


def _thresholds(path: Path) -> dict[str, tuple[float, float]]:
    """Model id -> the pair the run's thresholds file stores (empty: no file)."""
    from prour.router.thresholds import ThresholdStore

    store = ThresholdStore(path)
    return {model: (store.get(model).tau_au, store.get(model).tau_eu) for model in store.read()}


def study_items(runs: StudyRuns, n_boot: int) -> list[Item]:
    return [build(runs, n_boot) for build in ITEM_BUILDERS.values()]
