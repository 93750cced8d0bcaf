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
    assert matrix.flaky_table().split("\n\n")[0] in page, "run `python tests/faults/matrix.py`" \
        " and put its flaky-server table in docs/reliability.md"


def test_every_flaky_server_cell_names_tests_that_exist_and_each_row_has_one_in_ci():
    for command in matrix.FLAKY_COMMANDS:
        assert set(matrix.FLAKY[command]) == set(matrix.FLAKY_FAULTS), command
        for fault in matrix.FLAKY_FAULTS:
            cell = matrix.FLAKY[command][fault]
            assert cell.tests and not cell.na and not cell.gap, (command, fault)  # each a test
            for tier, name in cell.tests:
                assert tier in {"CI", "full"}, (command, fault, tier)
                path, function = name.split("::")
                function = function.split("[")[0]  # a parametrized test's case
                assert function.startswith("test_") and function in _functions(ROOT / path), name
        marks = {matrix.FLAKY[command][fault].mark for fault in matrix.FLAKY_FAULTS}
        assert "CI" in marks, (command, marks)


def test_each_command_family_runs_the_installed_prour_in_a_ci_cell():
    """The CI cells stand for users at the terminal: each family has one whose test module starts
    the installed console script (tests/installed_prour.py), not ``python -m prour.cli.main``."""
    for command in matrix.COMMANDS:
        modules = {name.split("::")[0] for fault in matrix.FAULTS
                   for tier, name in matrix.cell(command, fault).tests if tier == "CI"}
        assert any("installed_prour" in (ROOT / path).read_text() for path in modules), (
            command, sorted(modules))
