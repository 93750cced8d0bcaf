"""Markdown that quotes run text safely: :func:`md` escapes text, :func:`table` builds a table
and escapes every cell. Text in a markdown report may come from a run (model names, methods,
variants, task ids, messages, imported files, paths): a name holding ``<script>`` must stay text
and a ``|`` must never split a table cell. Every markdown writer (the evaluation, attention,
study, paper, training and dataset reports) builds its tables here and passes run text through
:func:`md`; none escapes on its own. Kept at the package root, beside :mod:`prour.files`, so
that every stage may use it (:mod:`prour.eval.markdown` re-exports it for the reports)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def md(text: Any) -> str:
    """``text`` safe in a markdown paragraph or table cell: ``&``, ``<`` and ``>`` as HTML
    entities (no tag a renderer would run or hide), ``|`` as ``\\|`` (a cell never splits),
    line breaks as spaces (a table row stays one line); None is empty."""
    value = "" if text is None else str(text)
    value = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return value.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def table_row(cells: Sequence[Any]) -> str:
    """One markdown table line, ``| a | b |``, every cell escaped (:func:`md`)."""
    return "| " + " | ".join(md(c) for c in cells) + " |"


def table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table: header, rule, one line per row; cells are given as plain text (numbers
    or run text alike) and escaped here, never before."""
    rule = "| " + " | ".join(["---"] * len(header)) + " |"
    return [table_row(header), rule, *(table_row(r) for r in rows)]
