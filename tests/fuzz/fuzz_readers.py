"""Every reader of user files the fuzzers drive, and the property each must keep.

The property: any input gives either a result or one error line naming the file, the line or
the dotted key; never a traceback, and never a record dropped in silence (a reader that skips a
line counts it and says so). A command is run as a user runs it: the real ``prour`` app through
typer's ``CliRunner`` (the installed script enters the same app through
``prour.cli.main:main``, whose only addition is the disk-failure guard); a library reader is
called directly, and its one error is an exception of the types it documents, whose message is
one line naming the file or key.

:data:`READERS` lists each reader with the command or function that runs it and the test
module that fuzzes it; ``test_every_reader_is_fuzzed`` in test_fuzz_options.py holds that list
to the test modules.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from typer.testing import CliRunner


@dataclass(frozen=True)
class Reader:
    """One reader of user files: what it reads, how the fuzzer runs it, where it is fuzzed."""

    name: str
    reads: str
    runs: str  # the CLI command or the library function the fuzzer calls
    module: str  # the test module under tests/fuzz/


READERS = (
    Reader("recipe", "a YAML recipe and the recipes it extends", "prour validate RECIPE",
           "test_fuzz_recipes"),
    Reader("overrides", "`--set key.sub=value` items laid over a recipe",
           "prour validate RECIPE --set ...", "test_fuzz_recipes"),
    Reader("results", "results.jsonl of an eval run", "prour report RUN",
           "test_fuzz_jsonl"),
    Reader("result-lines", "results.jsonl by key",
           "prour.eval.harness.load_result_lines", "test_fuzz_jsonl"),
    Reader("trajectories", "a trajectories / episodes JSONL (strict)", "prour score FILE",
           "test_fuzz_jsonl"),
    Reader("episodes", "an eval run's episodes.jsonl and results.jsonl (skipping)",
           "prour view RUN", "test_fuzz_jsonl"),
    Reader("trajectory-records", "a trajectories JSONL, raise and skip",
           "prour.env.trajectory.read_trajectories", "test_fuzz_jsonl"),
    Reader("metrics", "a training run's metrics.jsonl (local and verl lines)",
           "prour train report DIR", "test_fuzz_jsonl"),
    Reader("goals", "the normalized goals JSONL, error and skip",
           "prour.data.normalize.load_goals", "test_fuzz_jsonl"),
    Reader("dataset", "a dataset folder's train/validation parquet files",
           "prour data stats DIR", "test_fuzz_parquet"),
    Reader("dataset-rows", "one parquet split file and the reward state of its rows",
           "prour.data.dataset.read_rows, prour.data.schema.state_from_row",
           "test_fuzz_parquet"),
    Reader("tau2-results", "a tau2 results file (`tau2 run`'s JSON)",
           "prour import tau2 FILE --run-dir DIR", "test_fuzz_tau2"),
    Reader("checkpoints", "a trainer output folder (step_N, global_step_N, manifests, HF "
           "folders)", "prour.train.checkpoint.resolve_checkpoint, select_checkpoints, "
           "export_hf", "test_fuzz_checkpoints"),
    Reader("report-options", "`prour report` options (--n-boot, --lam, --accounting, "
           "--burden-pairs, --baseline)", "prour report RUN ...", "test_fuzz_options"),
    Reader("view-options", "`prour view` and `prour validation` options",
           "prour view RUN --out ..., prour validation table12 --n-boot ...",
           "test_fuzz_options"),
)


def invoke(*args: str) -> Any:
    """The real ``prour`` app on ``args``, exceptions kept in the result (not raised)."""
    from prour.cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def usage_error(result: Any) -> str | None:
    """Click's refusal of an option or argument (exit 2, ``Invalid value for '--x'``): the line
    naming it, or None."""
    if result.exit_code != 2:
        return None
    found = [line.strip(" │") for line in _lines(result.output)
             if "Invalid value for" in line or "No such option" in line]
    return found[0] if len(found) == 1 else None


def check_cli(result: Any, names: Iterable[str]) -> str | None:
    """The property on one command run. Returns None when it succeeded, else its one error
    line, which names one of ``names`` (a file, line or dotted key). Fails the test on a
    traceback, an uncaught exception, several error lines or an error that names none."""
    names = [str(n) for n in names]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("uncaught: " + "".join(traceback.format_exception(*result.exc_info)))
    assert "Traceback (most recent call last)" not in result.output, result.output
    if result.exit_code == 0:
        return None
    refused = usage_error(result)
    if refused is not None:
        assert any(n in refused for n in names), (names, refused)
        return refused
    errors = [line for line in _lines(result.output) if line.startswith("error: ")]
    assert len(errors) == 1, f"expected one error line, got:\n{result.output}"
    assert _lines(result.output)[-1] == errors[0], f"the error is not one line:\n{result.output}"
    assert any(n in errors[0] for n in names), (names, errors[0])
    return errors[0]


def check_library(call: Callable[[], Any], names: Iterable[str],
                  errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError),
                  ) -> Any:
    """The property on one library call: its result, or the documented error (returned, not
    raised) whose message is one line naming one of ``names``. Any other exception fails the
    test with its traceback."""
    try:
        return call()
    except errors as exc:
        text = str(exc)
        assert "\n" not in text, f"the error is not one line: {text!r}"
        assert any(str(n) in text for n in names), (list(map(str, names)), text)
        return exc


def nonblank_lines(data: bytes) -> int:
    """Lines of a JSONL file a reader reads (blank ones are not records)."""
    return sum(1 for line in data.split(b"\n") if line.strip())
