"""Setups that used to end in a traceback (issue #23 item 7) end in one line naming the cause and
the fix, and the fix a line prints runs as printed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_error(result, code: int, *fragments: str) -> str:
    """Exit ``code`` without a traceback, with exactly one ``error:`` line holding the fragments."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("value", ["[unclosed", "{a: 1", "it's: [x"])
def test_a_set_value_that_is_not_yaml_names_the_item_and_the_quoting_that_passes(value):
    """The line names the --set item and its key; the quoted form it prints, run as printed,
    loads the text unchanged."""
    item = f"name={value}"
    line = one_error(invoke("validate", str(SMOKE), "--set", item), 2,
                     f"--set {item!r}", "name:", "not valid YAML")
    fix = shlex.split(line.split("quote it: ")[1])
    assert fix[0] == "--set"
    result = invoke("validate", str(SMOKE), *fix)
    assert result.exit_code == 0, result.output
    from prour.recipes import load_recipe

    assert load_recipe(SMOKE, fix[1:]).name == value
