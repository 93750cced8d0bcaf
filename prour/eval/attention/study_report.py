"""The Ask-Less study report: every table and figure of the paper that a study reproduces, each
with the run's numbers beside the paper's published values, written under one folder.

Input is a :class:`~prour.eval.attention.study_items.StudyData` (the study's result lines by grid, the paper's names of its
backbones and simulator regimes, the second judge's scores, the cost settings, the header lines);
:func:`write_ask_less_report` computes the items (:mod:`study_tables`, :mod:`study_grids`,
:mod:`study_figures`, Table 12 from :mod:`prour.eval.attention.validation`) and writes, per
item, its markdown file or PNG (with the sidecar JSON of :mod:`prour.plots`), then
``summary.txt`` (what the terminal shows), ``report.json`` (every computed number) and
``index.html`` (one ``<section id=ITEM>`` per item, every text HTML-escaped, images linked
relative). What the study lacks for an item is said in its file and section; nothing unmeasured
reads 0. The statistics (paired parent-task bootstrap, equal-cost mixtures) are described in
:mod:`prour.eval.attention.study_panel`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from prour.eval.attention.study_items import StudyData, StudyItem, Table
from prour.files import write_atomic

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.txt"
REPORT_FILE = "report.json"
INDEX_FILE = "index.html"
ITEMS = ("table3", "figure3", "table5", "table7", "table8", "table13", "table14", "figure4",
         "figure5", "figure6", "figure7", "figure8", "backbones", "table17", "table25",
         "table12")


# ---- Table 12 (another module computes it) -----------------------------------------------------


def table12_item(data: StudyData, n_boot: int, ci: float) -> StudyItem:
    """Table 12 from :func:`prour.eval.attention.validation.table12_section` (its markdown
    tables become this item's tables, its other lines its notes)."""
    from prour.eval.attention.paper_values import published
    from prour.eval.attention.study_items import new_item

    item = new_item("table12", "table12.md")
    item.paper = published("table12")
    try:
        from prour.eval.attention.validation import table12_section
    except ImportError as exc:  # the validation module is written beside this one
        item.missing.append(f"Table 12 is computed by prour.eval.attention.validation."
                            f"table12_section, which cannot be imported here ({exc})")
        return item
    study = data.validation.parent if data.validation is not None else None
    lines, found = table12_section(data.second_judge, n_boot=n_boot, ci=ci, study=study)
    item.tables, notes = parse_markdown(lines)
    item.data = found
    if found.get("status") == "scored":
        item.notes, item.text = notes, notes[:1]
    else:
        item.missing += notes
    return item


def parse_markdown(lines: Sequence[str]) -> tuple[list[Table], list[str]]:
    """Markdown lines → their tables (header, rows; ``\\|`` unescaped) and their other text
    (headings dropped, ``**bold**`` kept as text)."""
    tables, notes, block = [], [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            cells = [[c.strip().replace("\\|", "|") for c in split_row(row)] for row in block]
            tables.append(Table(cells[0], cells[2:]))
            block = []
        if line.strip() and not line.startswith("#"):
            notes.append(line.strip().strip("*"))
    return tables, notes


def split_row(row: str) -> list[str]:
    """Cells of a markdown table row, honouring ``\\|`` inside a cell."""
    cells, cell, escaped = [], "", False
    for ch in row.strip()[1:-1]:
        if ch == "|" and not escaped:
            cells.append(cell)
            cell = ""
        else:
            cell += ch
        escaped = ch == "\\" and not escaped
    return [*cells, cell]


# ---- computing the items -----------------------------------------------------------------------


def compute_items(data: StudyData, out: Path, n_boot: int, ci: float) -> list[StudyItem]:
    """Every item, figures drawn into ``out`` as they are computed."""
    from prour.eval.attention import study_figures as figures
    from prour.eval.attention import study_grids as grids
    from prour.eval.attention import study_plots as plots
    from prour.eval.attention import study_tables as tables
    from prour.eval.attention.study_items import Study

    study = Study.of(data, n_boot, ci)
    drawing = {"figure3": (figures.figure3_item, plots.plot_figure3),
               "figure4": (figures.figure4_item, plots.plot_figure4),
               "figure5": (figures.figure5_item, plots.plot_figure5),
               "figure6": (figures.figure6_item, plots.plot_figure6),
               "figure7": (figures.figure7_item, plots.plot_figure7),
               "figure8": (figures.figure8_item, plots.plot_figure8)}
    computing = {"table3": tables.table3_item, "table5": tables.table5_item,
                 "table13": tables.table13_item, "table14": tables.table14_item,
                 "backbones": tables.backbones_item, "table7": grids.table7_item,
                 "table8": grids.table8_item, "table17": grids.table17_item,
                 "table25": grids.table25_item}
    items = []
    for key in ITEMS:
        if key in drawing:
            item, drawn = drawing[key][0](study)
            drawing[key][1](drawn, item, out / item.file)
        elif key == "table12":
            item = table12_item(data, n_boot, ci)
        else:
            item = computing[key](study)
        items.append(item)
    return items


# ---- writing -----------------------------------------------------------------------------------


def write_ask_less_report(data: StudyData, out: Path, n_boot: int = 2000,
                          ci: float = 0.95) -> dict[str, Path]:
    """Write the report into ``out``; returns item → file (per-backbone tables as
    ``backbone_<value>``, and ``summary``, ``report``, ``index``)."""
    from prour.eval.attention.study_pages import index_page, item_markdown, report_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = compute_items(data, out, n_boot, ci)
    files: dict[str, Path] = {}
    for item in items:
        files[item.key] = out / item.file
        for name in item.files():
            if name.endswith(".md"):
                write_atomic(out / name, item_markdown(item, name))
                if name != item.file:
                    files[name[:-3]] = out / name
    header = [*data.header, *(f"Note: {n}" for n in study_notes(data))]
    write_atomic(out / INDEX_FILE, index_page(items, header))
    lines = summary_lines(items, out / INDEX_FILE, header)
    write_atomic(out / SUMMARY_FILE, "\n".join(lines) + "\n")
    write_atomic(out / REPORT_FILE, json.dumps(report_json(items, data, n_boot, ci), indent=1,
                                               ensure_ascii=False) + "\n")
    files.update(summary=out / SUMMARY_FILE, report=out / REPORT_FILE, index=out / INDEX_FILE)
    return files


def study_notes(data: StudyData) -> list[str]:
    """What the report pools that a reader should know: grids (other than ``table25``, which
    splits them) whose lines ran under several simulator regimes or several eval methods."""
    from prour.eval.attention.study_panel import axis_value

    notes = []
    for grid, lines in data.grids.items():
        simulators = sorted({axis_value(x, "simulator") or "(none)" for x in lines})
        methods = sorted({str(x.get("method")) for x in lines})
        if grid != "table25" and len(simulators) > 1:
            notes.append(f"grid {grid} ran under simulators {', '.join(simulators)}: its means "
                         "pool them")
        if len(methods) > 1:
            notes.append(f"grid {grid} holds the methods {', '.join(methods)}: its means pool "
                         "them")
    return notes


def summary_lines(items: Sequence[StudyItem], index: Path,
                  header: Sequence[str] = ()) -> list[str]:
    """What the terminal prints: the header, then per item its title, key numbers (the
    paper's beside them) and what is missing."""
    lines = [*header, f"The Ask-Less paper beside this study: {index}"]
    for item in items:
        lines.append(f"{item.title} ({item.file})")
        lines += [f"  {line}" for line in item.text]
        lines += [f"  missing: {line}" for line in item.missing]
    return lines
