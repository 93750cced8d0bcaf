"""Fuzzing the options of the report commands (fuzz_readers.READERS: report-options,
view-options): ``prour report`` with any --n-boot, --lam, --accounting, --burden-pairs and
--baseline, ``prour view`` with any --out, ``prour validation table12 / score`` with any --n-boot.
A value out of range is refused as the options parse, naming the option (before a run is read);
an accepted one gives a report whose Pass@1 cells are measured values. Examples per test: 25 in
CI (profile ``ci``), 200 under the ``full`` marker (tests/fuzz/conftest.py). This module also
holds fuzz_readers.READERS to the fuzz modules."""

from __future__ import annotations

import ast
import json
import math
import tempfile
from pathlib import Path
from typing import get_args

import pytest
from fuzz_readers import READERS, check_cli, invoke
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_jsonl import result_line

from prour.cli.report import ACCOUNTINGS
from prour.config.attention import AttentionConfig

HERE = Path(__file__).parent


def _run(folder: Path) -> Path:
    run = folder / "run"
    run.mkdir()
    lines = [result_line("retail", task, seed, method, float(task == "1"), False)
             for method in ("prour", "base") for task in ("1", "2") for seed in (0, 1)]
    (run / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


NUMBERS = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True).map(str),
                    st.sampled_from(["nan", "inf", "-inf", "-0", "1e400", "", "x", "0x10"]))
OPTIONS = st.lists(st.one_of(
    st.tuples(st.just("--n-boot"), NUMBERS), st.tuples(st.just("--lam"), NUMBERS),
    st.tuples(st.just("--accounting"), st.sampled_from([*ACCOUNTINGS, "Full", "none", ""])),
    st.tuples(st.just("--burden-pairs"), NUMBERS),
    st.tuples(st.just("--baseline"), st.sampled_from(["base", "prour", "nobody", "<x>|y"]))),
    max_size=3, unique_by=lambda o: o[0])


def _valid(option: str, value: str) -> bool | None:
    """Whether the value parses as the option's type (as typer parses it: pydantic's lax
    int / float) and lies in its range; None for an option without a range."""
    from pydantic import TypeAdapter, ValidationError

    kind = {"--lam": float, "--n-boot": int, "--burden-pairs": int}.get(option)
    if kind is None:
        return None
    try:
        number = TypeAdapter(kind).validate_python(value)
    except ValidationError:
        return False
    if option == "--lam":
        return math.isfinite(number) and number >= 0
    return number >= (1 if option == "--n-boot" else 0)


@pytest.mark.slow  # ~40-60 s in CI on 2 cores
def test_report_options_are_checked_as_they_parse(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(OPTIONS, st.booleans())
    def run(options: list[tuple[str, str]], attention: bool) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            run_dir = _run(Path(folder))
            argv = [part for pair in options for part in pair]
            argv += ["--attention"] if attention else []
            if not any(o == "--n-boot" for o, _ in options):
                argv += ["--n-boot", "20"]
            result = invoke("report", run_dir, *argv, "--out", Path(folder) / "report")
            names = [o for o, _ in options] + ["baseline", "burden", str(run_dir)]
            error = check_cli(result, names)
            bad = [o for o, v in options if _valid(o, v) is False]
            bad += [o for o, v in options if o == "--accounting" and v not in ACCOUNTINGS]
            if bad:  # refused as the options parse, naming one of them
                assert error is not None and "Invalid value for" in error, result.output
                assert any(f"'{o}'" in error for o in bad), error
                return
            if error is not None:  # a value in range that the run cannot use: named
                assert "baseline" in error or "burden" in error, error
                return
            markdown = (Path(folder) / "report" / "report.md").read_text()
            main = markdown.split("## Pass@1 (%) and interaction cost")[1].split("\n\n")[1]
            for row in main.splitlines()[2:]:  # in range, Pass@1 is measured: never "–"
                cells = [cell.strip() for cell in row.strip("|").split("|")]
                assert cells[1][:1].isdigit() and cells[2][:1].isdigit(), row

    run()


def test_view_out_and_validation_boot_options(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(st.sampled_from(["site", "file", "file/below", "", "run"]), NUMBERS,
           st.sampled_from(["table12", "score"]))
    def run(out: str, n_boot: str, command: str) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            base = Path(folder)
            (base / "file").write_text("a file")
            run_dir = _run(base)
            (run_dir / "episodes.jsonl").write_text("")
            result = invoke("view", run_dir, "--out", base / out if out else "")
            check_cli(result, [run_dir, base / out if out else run_dir, "--out"])
            argv = ["validation", command, *(["burden"] if command == "score" else []),
                    run_dir, "--n-boot", n_boot]
            result = invoke(*argv)
            if _valid("--n-boot", n_boot) is False:
                assert check_cli(result, ["--n-boot"]) is not None
                assert "Invalid value for '--n-boot'" in result.output
            else:  # in range: anything but a traceback (a study folder is missing here)
                assert result.exception is None or isinstance(result.exception, SystemExit), \
                    result.exc_info
                assert "Traceback (most recent call last)" not in result.output

    run()


def test_accountings_are_the_recipes() -> None:
    field = AttentionConfig.model_fields["accounting"]
    assert ACCOUNTINGS == get_args(field.annotation)


def test_every_reader_is_fuzzed() -> None:
    """Each listed reader names a fuzz module that exists and mentions it; each fuzz module's
    docstring names the readers it covers."""
    modules = {path.stem: path for path in HERE.glob("test_fuzz_*.py")}
    for reader in READERS:
        assert reader.module in modules, reader
        doc = ast.get_docstring(ast.parse(modules[reader.module].read_text())) or ""
        assert reader.name in doc, (reader.name, reader.module)
    covered = {reader.module for reader in READERS}
    assert covered == set(modules), set(modules) - covered
