"""Fuzzing the dataset readers (fuzz_readers.READERS: dataset, dataset-rows): parquet split files
whose rows have a field set to any value (the column typed as written, or as Arrow infers it),
a column dropped, no rows, or whose bytes are cut or overwritten. ``prour data stats`` gives the
card or one error line naming the file (and the row); read_rows and state_from_row give rows or
one ValueError naming the file or row. Examples per test: 25 in CI (profile ``ci``), 200 under
the ``full`` marker (tests/fuzz/conftest.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fuzz_readers import check_cli, check_library, invoke
from hypothesis import given
from hypothesis import strategies as st
from jsonl_inputs import NAMES

from prour.data.schema import EXTRA_INFO, ROW_SCHEMA, state_id_of


def row(index: int, mode: str, domain: str, task: str) -> dict[str, Any]:
    """A row as `prour extract` writes it (prour.data.schema's row checks all pass)."""
    target = '{"arguments":{},"tool":"list_all_product_types"}' if mode == "verify" else "goal"
    return {"prompt": [{"role": "user", "content": "What next?"}],
            "data_source": f"prour/{domain}",
            "reward_model": {"style": "rule", "ground_truth": target},
            "extra_info": {"index": index, "state_id": state_id_of("t1", index, mode),
                           "mode": mode, "domain": domain, "task_id": task,
                           "trajectory_id": "t1", "step": index, "history": "[]",
                           "env_history": "[]", "db_hash": "0" * 64, "au": 0.1, "eu": 0.2,
                           "total": 0.30000000000000004, "truncated": False,
                           "dropped_messages": 0, "prompt_tokens": 10, "target_tokens": 3,
                           "decomposer_calls": 1, "prompts_version": "v1",
                           "schema_version": 2}}


FIELDS = tuple(ROW_SCHEMA.names) + tuple(f"extra_info.{name}" for name in EXTRA_INFO.names)
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True),
                   st.text(max_size=8), st.sampled_from(['[{"role": "tool"}]', "{", "[1]",
                                                         '[{"role": "a", "tool_calls": "x"}]']),
                   st.lists(st.integers(0, 3), max_size=2))
CHANGE = st.one_of(st.none(), st.none(),
                   st.tuples(st.just("set"), st.sampled_from(FIELDS), VALUES),
                   st.tuples(st.just("drop"), st.sampled_from(FIELDS)))
ROWS = st.lists(st.tuples(st.sampled_from(["clarify", "verify"]),
                          st.sampled_from(["retail", "airline"]), st.sampled_from(NAMES[:4]),
                          CHANGE), max_size=5)
DAMAGE = st.one_of(st.none(), st.none(), st.tuples(st.just("cut"), st.floats(0, 1)),
                   st.tuples(st.just("overwrite"), st.floats(0, 1), st.binary(min_size=1,
                                                                               max_size=8)))


def _apply(record: dict[str, Any], change: Any) -> dict[str, Any]:
    if change is None:
        return record
    *parents, last = change[1].split(".")
    node = record
    for part in parents:
        node = node[part]
    if change[0] == "drop":
        node.pop(last, None)
    else:
        node[last] = change[2]
    return record


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows typed by the row schema where they fit it, else as Arrow infers them."""
    try:
        return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        try:
            return pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return pa.Table.from_pylist([{"text": json.dumps(r, default=str)} for r in rows])


def _write(path: Path, specs: list[tuple], damage: Any) -> None:
    rows = [_apply(row(i, mode, domain, task), change)
            for i, (mode, domain, task, change) in enumerate(specs)]
    sink = pa.BufferOutputStream()
    pq.write_table(_table(rows) if rows else pa.Table.from_pylist([], schema=ROW_SCHEMA), sink)
    data = sink.getvalue().to_pybytes()
    if damage is not None and damage[0] == "cut":
        data = data[:int(len(data) * damage[1])]
    elif damage is not None:
        at = int(len(data) * damage[1])
        data = data[:at] + damage[2] + data[at + len(damage[2]):]
    path.write_bytes(data)


def test_data_stats_on_fuzzed_parquet(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(ROWS, DAMAGE, st.booleans(), ROWS)
    def run(train: list[tuple], damage: Any, both: bool, validation: list[tuple]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            dataset = Path(folder) / "dataset"
            dataset.mkdir()
            _write(dataset / "train.parquet", train, damage)
            if both:
                _write(dataset / "validation.parquet", validation, None)
            result = invoke("data", "stats", dataset)
            if check_cli(result, [dataset]) is None:
                card = json.loads((dataset / "card.json").read_text())
                assert sum(s["rows"] for s in card["splits"].values()) == \
                    len(train) + (len(validation) if both else 0)  # every row counted
                assert "<script" not in (dataset / "card.md").read_text()

    run()


def test_rows_and_reward_states_are_read_or_named(fuzz, tmp_path: Path) -> None:
    from prour.data.dataset import read_rows
    from prour.data.schema import state_from_row

    @fuzz
    @given(ROWS, DAMAGE)
    def run(specs: list[tuple], damage: Any) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            path = Path(folder) / "train.parquet"
            _write(path, specs, damage)
            rows = check_library(lambda: read_rows(path), [path])
            if isinstance(rows, Exception):
                return
            assert len(rows) == len(specs)
            for one in rows:
                check_library(lambda one=one: state_from_row(one), ["dataset row"])

    run()
