"""The pages of the Ask-Less study report: an item's markdown file, ``index.html`` (one
``<section id=ITEM>`` per item) and ``report.json``. Text that comes from the run (backbone
names, variants, task ids, notes that name them) is escaped for each format: in markdown by
:func:`prour.eval.markdown.md` (``|``, ``<``, ``>``, ``&``; the tables escape their cells
themselves), in HTML through ``html.escape``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prour.eval.attention.study_items import StudyItem, Table
from prour.eval.attention.study_paper import shown
from prour.eval.markdown import jsonable, md
from prour.eval.markdown import table as markdown_table
from prour.eval.viewer import contents, esc, page
from prour.eval.viewer import table as html_table

PAPER_HEADER = ["Value", "Source", "The paper's row (cell)", "Column", "Id"]
EXTRA_STYLE = """
section{border-top:2px solid #ccc;margin-top:2em;padding-top:.5em}
img{max-width:100%;border:1px solid #ddd}
.missing{color:#a33}.paper{font-style:italic;color:#444}.meta{color:#666;font-size:90%}
"""


def _paper_rows(values: Sequence[Any]) -> list[list[str]]:
    return [[shown(v), v.source, v.cell, v.column, v.id] for v in values]


def _md_table(table: Table) -> list[str]:
    lines = [f"## {md(table.caption)}", ""] if table.caption else []
    return [*lines, *markdown_table(table.header, table.rows), ""]


def item_markdown(item: StudyItem, file: str) -> str:
    """One markdown file of an item: its tables (those kept in ``file``), notes, what is missing
    and the paper values it shows, each with its source and cell."""
    own = [t for t in item.tables if (t.file or item.file) == file]
    lines = [f"# {md(item.title)}", ""]
    if item.paper_note:
        lines += [f"Paper: {md(item.paper_note)}", ""]
    for table in own:
        lines += _md_table(table)
    if file == item.file and len(item.files()) > 1:
        lines += ["Tables:", "", *(f"- [{md(t.caption)}]({md(t.file)})" for t in item.tables
                                   if t.file and t.file != file), ""]
    lines += [*(f"{md(note)}" + "\n" for note in item.notes)]
    lines += [*(f"- missing: {md(m)}" for m in item.missing)] or ["Nothing missing."]
    values = [v for t in own for v in t.paper] if file != item.file else item.paper
    lines += ["", "## The paper's values used", ""]
    lines += markdown_table(PAPER_HEADER, _paper_rows(values)) \
        if values else ["None: the paper prints no value for this item in our copy."]
    return "\n".join(lines) + "\n"


def _html_table(table: Table, key: str, n: int) -> str:
    caption = f"<h3>{esc(table.caption)}</h3>" if table.caption else ""
    return caption + html_table(table.header, [[esc(c) for c in row] for row in table.rows],
                                f"{key}-table-{n}")


def _section(item: StudyItem) -> str:
    """One ``<section id=KEY>``: title, the paper's note, the figure, the tables, the notes,
    what is missing and the paper values with their sources."""
    parts = [f'<section id="{esc(item.key)}"><h2>{esc(item.title)}</h2>']
    if item.paper_note:
        parts.append(f'<p class="paper">Paper: {esc(item.paper_note)}</p>')
    if item.figure:
        parts.append(f'<p><img src="{esc(item.file)}" alt="{esc(item.title)}"></p>')
    parts += [_html_table(t, item.key, i) for i, t in enumerate(item.tables)]
    parts += [f"<p>{esc(note)}</p>" for note in item.notes]
    if item.missing:
        parts.append('<ul class="missing">' + "".join(
            f"<li>missing: {esc(m)}</li>" for m in item.missing) + "</ul>")
    else:
        parts.append("<p>Nothing missing.</p>")
    parts.append("<h3>The paper's values</h3>")
    parts.append(html_table(PAPER_HEADER, [[esc(c) for c in row]
                                           for row in _paper_rows(item.paper)])
                 if item.paper else "<p>None: the paper prints no value for this item in our "
                                    "copy.</p>")
    parts.append('<p class="meta">Files: ' + ", ".join(
        f'<a href="{esc(f)}">{esc(f)}</a>' for f in item.files()) + "</p></section>\n")
    return "".join(parts)


def index_page(items: Sequence[StudyItem], header: Sequence[str]) -> str:
    """The whole page: the header lines, a contents list, one section per item."""
    head = ["<h1>Ask Less, Ask Better: the paper beside this study</h1>",
            *(f'<p class="meta">{esc(line)}</p>' for line in header),
            ("<p>Each table sets this study's numbers beside the values the paper prints (rows "
             "or columns marked <em>paper</em>; \"–\" where it prints none); each figure draws "
             "the paper's points hollow and dashed where its tables give them.</p>"),
            contents((i.key, i.title) for i in items)]
    return page("Ask Less, Ask Better beside the study",
                ["\n".join(head), "\n", *(_section(i) for i in items)], EXTRA_STYLE)


def report_json(items: Sequence[StudyItem], data: Any, n_boot: int, ci: float,
                ) -> dict[str, Any]:
    """Every computed number by item, with its files, notes, what is missing and the paper
    values it shows."""
    return jsonable({
        "header": list(data.header),
        "settings": {"accounting": data.accounting, "lam": data.lam,
                     "weights": data.weights.model_dump(), "n_boot": n_boot, "ci": ci,
                     "grids": {g: len(lines) for g, lines in data.grids.items()}},
        "items": {item.key: {"title": item.title, "files": item.files(), "data": item.data,
                             "notes": item.notes, "missing": item.missing,
                             "paper": [{"id": v.id, "text": v.text, "source": v.source,
                                        "cell": v.cell, "column": v.column}
                                       for v in item.paper]}
                  for item in items}})
