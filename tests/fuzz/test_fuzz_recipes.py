"""Fuzzing the recipe readers (fuzz_readers.READERS: recipe, overrides) through ``prour
validate``: the smoke recipe with keys set to values of any YAML type, dropped or added, its
text cut or spliced, an ``extends`` chain that breaks, a ``name`` that would leave ``runs/``, and
``--set`` items of any text. Each run is ``ok``, or its refusals are lines that each name the
recipe and a dotted key (``validate`` prints one line per problem; a recipe that does not load
is one line). Examples per test: 25 in CI (profile ``ci``), 200 under the ``full`` marker
(tests/fuzz/conftest.py)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_readers import invoke
from hypothesis import given
from hypothesis import strategies as st

from prour.config import read_recipe_data

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"
BASE = read_recipe_data(SMOKE)


def _paths(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key of the recipe mapping, sections and leaves."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out += [path, *_paths(value, path)]
    return out


PATHS = tuple(_paths(BASE))
YAML_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=True),
    st.text(max_size=10), st.sampled_from(["../up", "a/b", ".", "", "${name}", "<b>x</b>|y"]),
    st.lists(st.integers(-2, 5), max_size=3), st.dictionaries(st.text(max_size=5),
                                                              st.integers(), max_size=2))
CHANGES = st.lists(st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS), YAML_VALUES),
    st.tuples(st.just("drop"), st.sampled_from(PATHS)),
    st.tuples(st.just("add"), st.sampled_from(PATHS), YAML_VALUES),
    st.tuples(st.just("name"), st.sampled_from(["../escape", "a/../../b", ".", "..", "", "ok-1",
                                                "x\\y", "runs"]))), max_size=3)
TEXT = st.one_of(st.none(), st.tuples(st.just("cut"), st.floats(0, 1)),
                 st.tuples(st.just("splice"), st.floats(0, 1),
                           st.sampled_from(["\t- [", "{", ": :", "&a *a", "!!python/object:os.x",
                                            "extends: missing.yaml", "extends: recipe.yaml",
                                            "key: [unclosed", "\x00"])))
SET_ITEMS = st.lists(st.builds(
    lambda key, value: f"{key}={value}",
    st.one_of(st.sampled_from(PATHS), st.text(max_size=8)),
    st.one_of(st.sampled_from(["[", "{a: ", "*alias", "!!binary x", "3", "null", "-1", "1e999",
                               "'quoted'", "a: b"]), st.text(max_size=8))), max_size=3)


def _changed(changes: list[tuple]) -> dict[str, Any]:
    data = read_recipe_data(SMOKE)
    for change in changes:
        if change[0] == "name":
            data["name"] = change[1]
            continue
        *parents, last = change[1].split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if change[0] == "set":
            node[last] = change[2]
        elif change[0] == "drop":
            node.pop(last, None)
        elif isinstance(node.get(last), dict):
            node[last]["bogus_key"] = change[2]
    return data


def _text(data: dict[str, Any], text: Any) -> str:
    out = yaml.safe_dump(data, allow_unicode=True)
    if text is None:
        return out
    at = int(len(out) * text[1])
    return out[:at] if text[0] == "cut" else f"{out[:at]}\n{text[2]}\n{out[at:]}"


DOTTED = re.compile(r"(<file>|<yaml>|<root>|[A-Za-z_][\w*-]*(\.[\w*-]+)*): ")


def check_validate(result: Any, recipe: Path) -> None:
    """ok, or refusal lines that each name the recipe (or its ``extends`` file) and a key."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exc_info
    assert "Traceback (most recent call last)" not in result.output, result.output
    if result.exit_code == 0:
        assert "ok: " in result.output
        return
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors, result.output
    assert lines[-1] in errors, f"an error is not one line:\n{result.output}"
    for line in errors:
        assert DOTTED.search(line), line


@pytest.mark.slow  # ~40-60 s in CI on 2 cores
def test_validate_on_fuzzed_recipes(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(CHANGES, TEXT)
    def run(changes: list[tuple], text: Any) -> None:
        data = _changed(changes)
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            if isinstance(data.get("run_dir"), str) and "${name}" in data["run_dir"]:
                data["run_dir"] = f"{folder}/runs/${{name}}"
            recipe = Path(folder) / "recipe.yaml"
            recipe.write_text(_text(data, text))
            result = invoke("validate", recipe)
            check_validate(result, recipe)
            if any(c[0] == "name" and c[1] in ("../escape", "a/../../b", ".", "..", "")
                   for c in changes) and result.exit_code != 0 and text is None:
                assert "name: " in result.output or "error: " in result.output

    run()


def test_validate_with_fuzzed_set_items(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(SET_ITEMS)
    def run(items: list[str]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            data = read_recipe_data(SMOKE) | {"run_dir": f"{folder}/runs/${{name}}"}
            recipe = Path(folder) / "recipe.yaml"
            recipe.write_text(yaml.safe_dump(data))
            result = invoke("validate", recipe, *(part for item in items
                                                  for part in ("--set", item)))
            check_validate(result, recipe)

    run()


def test_a_name_that_leaves_runs_is_refused_at_its_key(tmp_path: Path) -> None:
    for name in ("../escape", "a/../../b", "..", ".", ""):
        data = read_recipe_data(SMOKE) | {"name": name}
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(yaml.safe_dump(data))
        result = invoke("validate", recipe)
        assert result.exit_code == 2, result.output
        line = result.output.strip().splitlines()[-1]
        assert line.startswith(f"error: {recipe}: name: ") and "under runs" in line, line
