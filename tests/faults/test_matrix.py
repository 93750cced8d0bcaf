"""The fault matrix (tests/faults/matrix.py) names only tests that exist, fills every cell, and
its table is the one on the Reliability page of the docs (docs/reliability.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import matrix  # tests/faults/ is on the path: its conftest folder

ROOT = Path(__file__).resolve().parents[2]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_named_test_exists_and_every_cell_says_what_it_is():
    for command in matrix.COMMANDS:
        assert set(matrix.MATRIX[command]) == set(matrix.FAULTS), command  # every cell filled
        for fault in matrix.FAULTS:
            cell = matrix.cell(command, fault)
            assert bool(cell.tests) + bool(cell.na) + bool(cell.gap) == 1, (command, fault)
            for tier, name in cell.tests:
                assert tier in {"CI", "full", "slurm"}, (command, fault, tier)
                path, function = name.split("::")
                assert function.startswith("test_") and function in _functions(ROOT / path), name


def test_each_command_family_has_a_cell_in_ci():
    for command in matrix.COMMANDS:
        marks = {matrix.cell(command, fault).mark for fault in matrix.FAULTS}
        assert "CI" in marks, (command, marks)


def test_the_docs_hold_the_printed_table():
    page = (ROOT / "docs" / "reliability.md").read_text()
    assert matrix.table().split("\n\n")[0] in page, "run `python tests/faults/matrix.py` and " \
        "put its table in docs/reliability.md"
