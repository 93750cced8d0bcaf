"""Checkpoints: atomic writes, unfinished saves ignored, kill -9 then --resume continues exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from train_helpers import instance_rows

from prour.train import checkpoint as ckpt


class _Model:
    """Stand-in with the save interface of a transformers model / tokenizer."""

    def __init__(self, payload: str):
        self.payload = payload

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / f"{self.payload}.txt").write_text(self.payload)


def _state(step: int) -> dict:
    return {"step": step, "rng": ckpt.rng_state()}


def test_save_is_complete_and_replaces_an_older_copy(tmp_path):
    folder = ckpt.save_checkpoint(tmp_path, 3, _Model("model"), _Model("tok"), _state(3))
    assert folder == tmp_path / "step_3"
    assert sorted(p.name for p in folder.iterdir()) == [
        ckpt.MANIFEST_FILE, "model.txt", "tok.txt", ckpt.STATE_FILE]
    again = ckpt.save_checkpoint(tmp_path, 3, _Model("model2"), _Model("tok"), _state(3))
    assert sorted(p.name for p in again.iterdir()) == [
        ckpt.MANIFEST_FILE, "model2.txt", "tok.txt", ckpt.STATE_FILE]
    assert [p.name for p in tmp_path.iterdir()] == ["step_3"]  # nothing left beside it


def test_a_save_that_dies_leaves_no_checkpoint(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, _Model("m"), _Model("t"), _state(1))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, 2, _Model("m"), _Model("t"), _state(2))
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


def test_unfinished_folders_are_never_loaded(tmp_path):
    ckpt.save_checkpoint(tmp_path, 2, _Model("m"), _Model("t"), _state(2))
    (tmp_path / ".tmp-step_3-abc").mkdir()  # what a kill -9 during a save leaves behind
    (tmp_path / ".tmp-step_3-abc" / "model.safetensors").write_bytes(b"half")
    (tmp_path / "step_4").mkdir()  # a folder without the trainer state is not a checkpoint
    (tmp_path / "step_x").mkdir()
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [2]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_2"
    assert ckpt.remove_temporaries(tmp_path) == [tmp_path / ".tmp-step_3-abc"]
    with pytest.raises(FileNotFoundError, match="not a finished checkpoint"):
        ckpt.load_trainer_state(tmp_path / "step_4")


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    first = torch.rand(3)
    ckpt.restore_rng(state)
    assert torch.equal(torch.rand(3), first)


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, _Model("m"), _Model("t"), _state(step))
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [2, 3]


class _Files:
    """Stand-in whose ``save_pretrained`` writes the named files (a model's or tokenizer's)."""

    def __init__(self, *names: str):
        self.names = names

    def save_pretrained(self, folder: Path) -> None:
        for name in self.names:
            (Path(folder) / name).write_text("{}")


@pytest.mark.parametrize("index", ["model.safetensors.index.json", "pytorch_model.bin.index.json"])
def test_a_sharded_checkpoint_is_found_and_exported(tmp_path, index):
    """transformers saves a large model as shards plus an index (``.bin`` ones when safetensors
    is off); both kinds are a Hugging Face folder to evaluation and to ``prour train export``."""
    shard = index.replace(".index.json", "").replace(".", "-00001-of-00002.", 1)
    model = _Files("config.json", index, shard)
    folder = ckpt.save_checkpoint(tmp_path / "run", 4, model, _Files("tokenizer_config.json"),
                                  _state(4))
    assert ckpt.resolve_checkpoint(tmp_path / "run") == folder
    assert ckpt.select_checkpoints(tmp_path / "run", ["all"]) == {4: folder}
    assert ckpt.export_hf(tmp_path / "run") == folder
    copied = ckpt.export_hf(tmp_path / "run", target=tmp_path / "hf")
    assert sorted(p.name for p in copied.iterdir()) == sorted(
        ["config.json", index, shard, "tokenizer_config.json"])


def test_export_names_what_a_step_lacks(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1, _Files("config.json", "model-00001-of-00002.safetensors"),
                         _Files("vocab.json"), _state(1))
    message = ("no tokenizer_config.json, weights (model.safetensors or "
               "model.safetensors.index.json or pytorch_model.bin or pytorch_model.bin.index.json)")
    with pytest.raises(FileNotFoundError, match=re.escape(message)):
        ckpt.export_hf(tmp_path)


def test_latest_verl_step_needs_the_actor_folder(tmp_path):
    assert ckpt.latest_verl_step(tmp_path / "missing") is None
    assert ckpt.latest_verl_step(tmp_path) is None
    for name in ("global_step_3/actor", "global_step_5/actor", "global_step_7", "step_9",
                 "global_step_x/actor"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "global_step_8").write_text("")  # a file, not a step folder
    assert ckpt.latest_verl_step(tmp_path) == 5  # 7 has no actor/ (verl did not finish it)


# ---- kill -9 during `prour train`, then --resume --------------------------------------------


def _recipe_file(tmp_path: Path, name: str, model_dir: Path, data_file: Path) -> Path:
    tiny = {"backend": "hf", "path": str(model_dir), "device": "cpu", "dtype": "float32"}
    recipe = {
        "name": name,
        "seed": 5,
        "run_dir": str(tmp_path / "runs" / name),
        "models": {"generator": tiny, "strict_user": tiny},
        "train": {
            "backend": "local",
            "train_file": str(data_file),
            "val_file": None,
            "states_per_step": 2,
            "total_steps": 4,
            "save_every": 1,
            "output_dir": str(tmp_path / "ckpt" / name),
            "device": "cpu",
            "dtype": "float32",
            "gradient_checkpointing": False,
            "rollout": {"n": 3, "keep": 2, "max_response_tokens": 8},
            "optim": {"lr": 1e-3, "warmup_steps": 2},
            "ppo": {"epochs": 2},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _train(recipe: Path, *extra: str, **more_env: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **more_env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "prour.cli.main", "train", "--recipe", str(recipe), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_during_a_save(proc: subprocess.Popen, out: Path, timeout: float = 600) -> str:
    """SIGKILL the trainer while it writes its second checkpoint (or right after, if quick)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        saving = (
            [p for p in out.glob(".tmp-step_*") if not p.name.startswith(".tmp-step_1-")]
            if out.exists()
            else []
        )
        if saving or (out / "step_2").exists():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return "mid-save" if saving else "after step 2"
        time.sleep(0.005)
    raise AssertionError(f"the trainer ended before it could be killed:\n{proc.communicate()[0]}")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_kill_minus_nine_then_resume_matches_an_uninterrupted_run(tiny_model_dir, tmp_path):
    from prour.data.dataset import write_rows

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    reference = _train(_recipe_file(tmp_path, "whole", tiny_model_dir, data))
    killed_recipe = _recipe_file(tmp_path, "killed", tiny_model_dir, data)
    out = tmp_path / "ckpt" / "killed"
    when = _kill_during_a_save(_train(killed_recipe), out)
    finished_before = [s for s, _ in ckpt.complete_checkpoints(out)]
    assert finished_before and max(finished_before) < 4, when
    with open(out / "metrics.jsonl", "a") as handle:  # a metrics line cut by the kill
        handle.write('{"step": 9, "loss')

    resumed = _train(killed_recipe, "--resume")
    log = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, log
    assert reference.wait(timeout=600) == 0, reference.communicate()[0]

    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3, 4]
    assert not list(out.glob(".tmp-*"))
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["start_step"] == max(finished_before)
    assert provenance["resumed_from"].endswith(f"step_{max(finished_before)}")
    ours, theirs = _weights(out / "step_4"), _weights(tmp_path / "ckpt" / "whole" / "step_4")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), (
        "resumed run diverged from the uninterrupted one"
    )


def test_a_second_trainer_refuses_then_resume_takes_over_the_dead_ones_lock(tiny_model_dir,
                                                                            tmp_path):
    """A paused trainer holds its output_dir (even a --resume is refused); after its kill -9,
    --resume takes the lock over and continues from the newest checkpoint."""
    from prour.data.dataset import write_rows
    from prour.runlock import LOCK_FILE

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    recipe = _recipe_file(tmp_path, "locked", tiny_model_dir, data)
    out = tmp_path / "ckpt" / "locked"
    first = _train(recipe)
    deadline = time.time() + 600
    while ckpt.latest_checkpoint(out) is None and time.time() < deadline:
        assert first.poll() is None, first.communicate()[0]
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)  # alive and holding output_dir
    try:
        second = _train(recipe, "--resume")
        refused = second.communicate(timeout=300)[0]
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert second.returncode == 2, refused
    errors = [line for line in refused.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"pid {first.pid} " in errors[0], refused
    assert f"prour train --recipe {recipe}" in errors[0] and str(out) in errors[0]
    finished_before = [s for s, _ in ckpt.complete_checkpoints(out)]
    assert finished_before and max(finished_before) < 4 and (out / LOCK_FILE).exists()

    resumed = _train(recipe, "--resume")
    log = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, log
    assert f"taking over the lock of {out} from a dead process (pid {first.pid} " in log
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3, 4]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert json.loads((out / "provenance.json").read_text())["start_step"] == max(finished_before)
    assert not (out / LOCK_FILE).exists()


# ---- a checkpoint damaged after its save; a disk that fills during one ------------------------


def _local_trainer(model_dir: Path, out: Path, steps: int):
    from prour.config import ModelConfig, Recipe
    from prour.config.train import TrainConfig
    from prour.train.local import LocalTrainer
    from prour.train.reward import VerifiableFormatReward

    cfg = TrainConfig.model_validate({
        "states_per_step": 2, "total_steps": steps, "save_every": 1, "output_dir": str(out),
        "device": "cpu", "dtype": "float32", "rollout": {"n": 2, "keep": 2,
                                                         "max_response_tokens": 6},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "weight_decay": 0.0}, "ppo": {"epochs": 1}})
    recipe = Recipe(name="t", seed=3,
                    models={"generator": ModelConfig(backend="hf", path=str(model_dir))})
    return LocalTrainer(recipe, cfg, reward_fn=VerifiableFormatReward(),
                        make_state=lambda row: row["extra_info"]["task_id"], rows=instance_rows(6))


@pytest.mark.parametrize("damaged", ["model.safetensors", ckpt.STATE_FILE])
def test_a_truncated_newest_checkpoint_is_skipped_and_resume_redoes_it_from_the_one_before(
        tiny_model_dir, tmp_path, damaged):
    """Three steps saved; the newest file cut in half afterwards: the newest complete step is 2,
    a resume starts there and writes step 3 again, equal to what the uninterrupted run saved."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    _local_trainer(tiny_model_dir, out, 3).run(progress=False)
    whole = {k: v.clone() for k, v in _weights(out / "step_3").items()}  # not the mmap
    path = out / "step_3" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "were saved" in ckpt.checkpoint_damage(out / "step_3")
    assert ckpt.latest_checkpoint(out) == out / "step_2"

    resumed = _local_trainer(tiny_model_dir, out, 3)
    resumed.run(resume=True, progress=False)
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["start_step"] == 2 and provenance["resumed_from"] == str(out / "step_2")
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3]
    assert ckpt.checkpoint_damage(out / "step_3") is None
    again = _weights(out / "step_3")
    diff = max((again[k] - whole[k]).abs().max().item() for k in whole)
    assert diff == 0.0, diff  # the same step 3 as before
    assert ckpt.load_trainer_state(out / "step_3")["step"] == 3
    AutoModelForCausalLM.from_pretrained(out / "step_3")  # loads
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # every step logged once


def test_a_disk_that_fills_during_a_save_leaves_the_previous_step_loadable(tiny_model_dir,
                                                                          tmp_path):
    """A real full disk (a tmpfs that holds one checkpoint of the tiny model, not two): the
    second save fails with ENOSPC, its staging folder is removed, step 1 is still the newest
    complete checkpoint and loads; a disk line names the file and the space."""
    import errno

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prour.cli.failures import disk_failure_line

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        state = {"step": 1, "rng": ckpt.rng_state(), "blob": torch.zeros(600_000)}
        ckpt.save_checkpoint(mount, 1, model, tokenizer, state)
        with pytest.raises(OSError) as failed:
            ckpt.save_checkpoint(mount, 2, model, tokenizer, {**state, "step": 2})
        assert failed.value.errno == errno.ENOSPC
        line = disk_failure_line(failed.value)  # safetensors' own error, as a disk error
        assert line is not None and f"cannot write {mount / 'step_2'}" in line, line
        assert f"no space left on the device ({mount})" in line, line
        assert sorted(p.name for p in mount.iterdir()) == ["step_1"]  # no staging left
        assert ckpt.latest_checkpoint(mount) == mount / "step_1"
        assert ckpt.load_trainer_state(mount / "step_1")["step"] == 1
        AutoModelForCausalLM.from_pretrained(mount / "step_1")
    finally:
        subprocess.run(["umount", str(mount)], check=True)
