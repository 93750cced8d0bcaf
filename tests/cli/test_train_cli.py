"""``prour train``: batch arithmetic refused at load, dry runs print the command and write nothing."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from prour.cli.main import app

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"


def test_cli_refuses_at_load_and_dry_run_prints_the_verl_command(tmp_path):
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
    assert ok.exit_code == 0, ok.output
    assert "-m verl.trainer.main_ppo" in ok.output and "actor_rollout_ref.rollout.n=6" in ok.output
    assert not out.exists()  # a dry run writes nothing
    local = runner.invoke(app, ["train", "--recipe", str(PAPER), "--backend", "local", "--dry-run"])
    assert local.exit_code == 0 and "2010 steps x 16 states x 8 samples (keep 6)" in local.output
