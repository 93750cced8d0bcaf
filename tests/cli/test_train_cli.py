"""``prour train``: batch arithmetic refused at load; dry runs print the command, write nothing, and
name what this node lacks for the run (exit 2), as the run itself would before its first step."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from prour.cli.main import app

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"


def test_cli_refuses_at_load_and_dry_run_prints_the_verl_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a node without GPUs
    monkeypatch.delenv("PROUR_MODELS_DIR", raising=False)
    runner = CliRunner()
    bad = runner.invoke(
        app, ["train", "--recipe", str(PAPER), "--dry-run", "--set", "train.rollout.keep=9"]
    )
    assert bad.exit_code == 2
    assert "train.rollout.keep: keeps 9 samples per state but only 8 are sampled" in bad.output
    out = tmp_path / "out"
    ok = runner.invoke(
        app, ["train", "--recipe", str(PAPER), "--dry-run", "--set", f"train.output_dir={out}"]
    )
    assert "-m verl.trainer.main_ppo" in ok.output and "actor_rollout_ref.rollout.n=6" in ok.output
    assert not out.exists()  # a dry run writes nothing
    # No Qwen3-1.7B weights and no GPUs on a CPU test machine: the dry run says so and exits 2.
    assert ok.exit_code == 2 and "error: weights: model 'Qwen/Qwen3-1.7B'" in ok.output
    assert "error: gpus: GPUs visible: 0, needed: 2" in ok.output
    local = runner.invoke(app, ["train", "--recipe", str(PAPER), "--backend", "local", "--dry-run"])
    assert "2010 steps x 16 states x 8 samples (keep 6)" in local.output
    assert local.exit_code == 2 and "error: weights: model 'Qwen/Qwen3-1.7B'" in local.output


def test_export_of_local_checkpoints(tmp_path):
    """A local step_N already is a Hugging Face folder: export names the newest (or --step),
    copies it to --target without the trainer state, and says what is missing otherwise."""
    out = tmp_path / "out"
    for step in (1, 2):
        folder = out / f"step_{step}"
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
            (folder / name).write_text(f"{name} of step {step}")
        (folder / "trainer_state.pt").write_bytes(b"state")
    (out / "step_3").mkdir()  # unfinished: no trainer state
    runner = CliRunner()
    base = ["train", "export", "--recipe", str(PAPER), "--set", "train.backend=local",
            "--set", f"train.output_dir={out}"]
    newest = runner.invoke(app, base)
    assert newest.exit_code == 0 and newest.output == f"exported: {out / 'step_2'}\n"
    target = tmp_path / "hf"
    copied = runner.invoke(app, [*base, "--step", "1", "--target", str(target)])
    assert copied.exit_code == 0 and copied.output == f"exported: {target}\n"
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer_config.json"
    ]
    assert (target / "model.safetensors").read_text() == "model.safetensors of step 1"
    missing = runner.invoke(app, [*base, "--step", "3"])
    assert missing.exit_code == 2 and f"no finished step_3 under {out} (steps: 1, 2)" in missing.output
    (out / "step_2" / "model.safetensors").unlink()
    broken = runner.invoke(app, base)
    assert broken.exit_code == 2
    assert f"{out / 'step_2'} is not a Hugging Face folder: no weights (model.safetensors" in (
        broken.output
    )
