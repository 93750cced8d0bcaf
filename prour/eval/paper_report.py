"""Writes the paper section of ``prour report`` (:func:`write_paper_report`): the items of
:mod:`prour.eval.paper` and :mod:`prour.eval.paper_taxonomy`, their figures
(:mod:`prour.eval.paper_plots`), ``table1.md``, ``table5.md`` and ``table6.md``,
``summary.txt`` (what ``prour report`` prints) and ``index.html``, one ``<section>`` per
table or figure with the run's numbers beside the paper's, the source of every paper value and
what the run lacks. The page needs no server and loads nothing but the PNGs beside it (relative
links); every text is HTML-escaped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prour.eval.markdown import table as markdown_table
from prour.eval.paper import (
    INDEX_FILE,
    PAPER_DIR,
    SUMMARY_FILE,
    Item,
    PaperValue,
    RunEvidence,
    figure4_item,
    figure6_item,
    figure7_item,
    paper_note,
    read_router_evidence,
    sweep_item,
    table1_item,
    table6_item,
)
from prour.eval.paper_study import study_items, study_runs
from prour.eval.paper_taxonomy import figure2_item, read_taxonomy, table5_item
from prour.eval.run_evidence import locate
from prour.eval.systems import load_systems, summarize
from prour.eval.viewer import contents, esc, page
from prour.eval.viewer import table as html_table
from prour.files import write_atomic

EXTRA_STYLE = """
section{border-top:2px solid #ccc;margin-top:2em;padding-top:.5em}
img{max-width:100%;border:1px solid #ddd}
.missing{color:#a33}.paper{font-style:italic;color:#444}
q{font-family:ui-monospace,monospace;font-size:85%}
"""


def _sources(values: Sequence[PaperValue]) -> list[list[str]]:
    """Rows (value, where, claim, the paper's words) of an item's paper values."""
    return [[v.shown(), v.source, v.claim, f'"{v.phrase}"'] for v in values]


def _missing_lines(item: Item) -> list[str]:
    return [f"- missing: {line}" for line in item.missing] or ["Nothing missing."]


def item_markdown(item: Item) -> str:
    """A table item's markdown file: the table, its notes, what is missing, the sources."""
    lines = [f"# {item.title}", ""]
    if paper_note(item.key):
        lines += [f"Paper: {paper_note(item.key)}", ""]
    lines += [*markdown_table(item.header, item.rows), ""]
    lines += [*(f"{note}" for note in item.notes), ""] if item.notes else []
    lines += [*_missing_lines(item), "", "## The paper's values", ""]
    lines += markdown_table(["Value", "Where", "Claim", "The paper's words"],
                            _sources(item.paper))
    return "\n".join(lines) + "\n"


def summary_lines(items: Sequence[Item], index: Path) -> list[str]:
    """What ``prour report`` prints: a line per row and per missing input, per item."""
    lines = [f"The paper beside this run: {index}"]
    for item in items:
        lines.append(item.title)
        lines += [f"  {line}" for line in item.text]
        lines += [f"  {note}" for note in item.notes if note.startswith(("dev mix",
                                                                          "posterior"))]
        lines += [f"  missing: {line}" for line in item.missing]
    return lines


def _section(item: Item) -> str:
    """One ``<section id=KEY>``: the paper's note, the figure, the table, what is missing and
    where each paper value comes from."""
    parts = [f'<section id="{esc(item.key)}"><h2>{esc(item.title)}</h2>']
    if paper_note(item.key):
        parts.append(f'<p class="paper">Paper: {esc(paper_note(item.key))}</p>')
    if item.file.endswith(".png"):
        parts.append(f'<p><img src="{esc(item.file)}" alt="{esc(item.title)}"></p>')
    parts.append(html_table(item.header, [[esc(c) for c in row] for row in item.rows],
                            f"{item.key}-table"))
    parts += [f"<p>{esc(note)}</p>" for note in item.notes]
    if item.missing:
        parts.append('<ul class="missing">' + "".join(
            f"<li>missing: {esc(line)}</li>" for line in item.missing) + "</ul>")
    else:
        parts.append("<p>Nothing missing.</p>")
    parts.append("<h3>The paper's values</h3>")
    parts.append(html_table(["Value", "Where", "Claim", "The paper's words"],
                            [[esc(v.shown()), esc(v.source), esc(v.claim),
                              f"<q>{esc(v.phrase)}</q>"] for v in item.paper]))
    files = [item.file] + ([item.file.replace(".png", ".json")] if item.file.endswith(".png")
                           else [])
    parts.append('<p class="meta">Files: ' + ", ".join(
        f'<a href="{esc(f)}">{esc(f)}</a>' for f in files) + "</p></section>\n")
    return "".join(parts)


def index_page(items: Sequence[Item], evidence: RunEvidence) -> str:
    """The whole page: where the evidence came from, a contents list, one section per item."""
    run = evidence.run_dir or f"unknown ({evidence.problem})"
    head = [f"<h1>{esc('The Prour paper beside this run')}</h1>",
            f'<p class="meta">eval folder {esc(evidence.eval_dir)} · run folder {esc(run)}</p>',
            *(f'<p class="meta">{esc(note)}</p>' for note in evidence.notes),
            ("<p>Each table and figure shows this run's numbers next to the values the paper's "
             "text states (drawn as black stars or dotted lines labelled <em>paper</em>); the "
             "cells of the paper's own tables are not in our copy of it.</p>"),
            contents((i.key, i.title) for i in items)]
    return page("The paper beside the run", ["\n".join(head), "\n", *(_section(i) for i in items)],
                EXTRA_STYLE)


def write_pages(items: Sequence[Item], evidence: RunEvidence, out: Path,
                ) -> tuple[dict[str, Path], list[str]]:
    """Write the table files, ``summary.txt`` and ``index.html`` into ``out``; returns the
    files by name (the figures' PNGs, written before, included) and the printed lines."""
    files: dict[str, Path] = {}
    for item in items:
        files[f"paper_{item.key}"] = out / item.file
        if item.file.endswith(".md"):
            write_atomic(out / item.file, item_markdown(item))
    index = out / INDEX_FILE
    write_atomic(index, index_page(items, evidence))
    lines = summary_lines(items, index)
    write_atomic(out / SUMMARY_FILE, "\n".join(lines) + "\n")
    files["paper_summary"] = out / SUMMARY_FILE
    files["paper_index"] = index
    return files, lines


@dataclass
class PaperReport:
    """What :func:`write_paper_report` wrote and the lines it prints."""

    folder: Path
    files: dict[str, Path]
    lines: list[str]

    @property
    def index(self) -> Path:
        return self.files["paper_index"]


def write_paper_report(run_dirs: Sequence[str | Path], report_dir: str | Path,
                       run_dir: str | Path | None = None, n_boot: int = 10_000,
                       ci: float = 0.95) -> PaperReport:
    """Write ``<report_dir>/paper/``: Table 1 of the eval folders' systems, the other items
    (Table 5 and Figure 2 from the taxonomy's approved labels) from the run folder of the first
    one's saved recipe (or ``run_dir``)."""
    from prour.eval import paper_plots

    systems = load_systems(run_dirs)
    main = [s for s in systems if s.sweep is None]
    evidence = locate(run_dirs[0], run_dir)
    out = Path(report_dir) / PAPER_DIR
    out.mkdir(parents=True, exist_ok=True)
    data, problem = read_router_evidence(evidence)
    table1 = table1_item(main, [summarize(s, n_boot, ci) for s in main])
    figure4, records = figure4_item(evidence)
    paper_plots.plot_training(records, figure4, out / figure4.file)
    figure5, budget = sweep_item("budget", systems, evidence)
    paper_plots.plot_sweep(budget, "budget", figure5, out / figure5.file)
    figure6, curves = figure6_item(main, evidence.eval_dir)
    paper_plots.plot_uncertainty(curves, figure6, out / figure6.file)
    figure7, drawn = figure7_item(data, problem)
    paper_plots.plot_router_f1(drawn, figure7, out / figure7.file)
    figure8, every = sweep_item("every_n", systems, evidence)
    paper_plots.plot_sweep(every, "every_n", figure8, out / figure8.file)
    taxonomy = read_taxonomy(evidence)
    figure2, shares = figure2_item(taxonomy)
    paper_plots.plot_sources(shares, taxonomy.record, figure2, out / figure2.file)
    study = study_items(study_runs(evidence), n_boot)  # Tables 2, 3, 4 and 7
    items = [table1, *study[:3], figure2, table5_item(taxonomy), table6_item(data, problem),
             study[3], figure4, figure5, figure6, figure7, figure8]
    files, lines = write_pages(items, evidence, out)
    return PaperReport(out, files, lines)
