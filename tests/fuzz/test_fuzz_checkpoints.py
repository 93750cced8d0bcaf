"""Fuzzing the checkpoint-folder readers (fuzz_readers.READERS: checkpoints): trainer output
folders of local ``step_N`` and verl ``global_step_N`` folders holding any subset of a
checkpoint's files, with manifests (``checkpoint_files.json``) of any JSON, sizes that lie, and
names that leave the folder. resolve_checkpoint, checkpoint_steps, select_checkpoints and
export_hf give a folder or one ValueError / FileNotFoundError naming the folder, never another
exception. Examples per test: 25 in CI (profile ``ci``), 200 under the ``full`` marker
(tests/fuzz/conftest.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from fuzz_readers import check_library
from hypothesis import given
from hypothesis import strategies as st
from jsonl_inputs import JSON_VALUES

FOLDERS = ("step_1", "step_2", "step_x", "step_01", "global_step_3", "global_step_4", ".tmp-step_5",
           "huggingface", "actor", "actor/huggingface")
FILES = ("trainer_state.pt", "config.json", "model.safetensors", "pytorch_model.bin.index.json",
         "tokenizer_config.json", "untrained.json", "model_world_size_1_rank_0.pt",
         "actor/model_world_size_1_rank_0.pt", "actor/huggingface/config.json")
MANIFEST = st.one_of(
    st.none(), JSON_VALUES,
    st.dictionaries(st.sampled_from(["config.json", "model.safetensors", "gone.bin", "../x",
                                     "", "/etc/passwd", "a\x00b", "config.json/x"]),
                    st.one_of(st.integers(-1, 3), st.just(2), st.text(max_size=3),
                              st.booleans()), max_size=3),
    st.just("not json {"))
TREE = st.lists(st.tuples(st.sampled_from(FOLDERS), st.sets(st.sampled_from(FILES), max_size=5),
                          MANIFEST), max_size=4)
STEPS = st.sampled_from([["all"], ["1"], ["x"], ["1", "3"], ["2"], [""]])


def _build(root: Path, tree: list[tuple]) -> None:
    for folder, files, manifest in tree:
        where = root / folder
        where.mkdir(parents=True, exist_ok=True)
        for name in files:
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            if not (where / name).is_dir():
                (where / name).write_text("{}")
        if manifest is not None:
            text = manifest if isinstance(manifest, str) and manifest.startswith("not json") \
                else json.dumps(manifest)
            (where / "checkpoint_files.json").write_text(text)


def test_checkpoint_folders_resolve_or_are_named(fuzz, tmp_path: Path) -> None:
    from prour.train.checkpoint import (
        checkpoint_steps,
        export_hf,
        resolve_checkpoint,
        select_checkpoints,
    )

    @fuzz
    @given(TREE, STEPS, st.one_of(st.none(), st.integers(0, 4)), st.booleans())
    def run(tree: list[tuple], steps: list[str], step: int | None, as_file: bool) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            root = Path(folder) / "train"
            if as_file:
                root.write_text("not a folder")
            else:
                root.mkdir()
                _build(root, tree)
            found: Any = check_library(lambda: resolve_checkpoint(root), [root])
            if not isinstance(found, Exception):
                assert (found / "config.json").is_file()
            check_library(lambda: checkpoint_steps(root), [root])
            check_library(lambda: select_checkpoints(root, steps), [root, "--steps"])
            check_library(lambda: export_hf(root, step), [root])

    run()
