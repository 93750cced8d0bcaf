"""A checkpoint sweep: the step folders of a tiny local training run evaluated in one resumable
run (``prour eval --checkpoint DIR --steps all``), one report row per step, and the
success-versus-training-step plot read back."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from eval_world import recipe, register_scripts
from plot_check import read_plot
from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.trajectory import read_jsonl
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE
from prour.train.checkpoint import checkpoint_step, select_checkpoints

TRAIN_NAME = "sweep-train"
STEPS = [1, 2, 3]


@pytest.fixture(scope="module")
def training_run(tiny_model_dir, tmp_path_factory) -> Path:
    """Three steps of the local trainer on the tiny model (format reward), saved after each."""
    import torch

    from prour.config import ModelConfig, Recipe
    from prour.config.train import TrainConfig
    from prour.train.local import LocalTrainer
    from prour.train.reward import VerifiableFormatReward

    out = tmp_path_factory.mktemp("sweep") / "checkpoints"
    cfg = TrainConfig.model_validate({
        "states_per_step": 2, "total_steps": len(STEPS), "save_every": 1, "output_dir": str(out),
        "device": "cpu", "dtype": "float32",
        "rollout": {"n": 3, "keep": 3, "max_response_tokens": 6},
        "optim": {"lr": 1e-3, "warmup_steps": 0}, "ppo": {"epochs": 1}})
    train_recipe = Recipe(name=TRAIN_NAME, seed=1,
                          models={"generator": ModelConfig(backend="hf", path=str(tiny_model_dir))})
    rows = [{"prompt": [{"role": "user", "content": "Ask me one question."}]}] * 4
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        LocalTrainer(train_recipe, cfg, reward_fn=VerifiableFormatReward(),
                     make_state=lambda row: row, rows=rows).run(progress=False)
    finally:
        torch.set_num_threads(threads)
    return out


def _eval(tmp_path: Path, run: Path, *args: str) -> str:
    register_scripts()
    data = recipe(str(tmp_path), methods=["base", "clarify-only"], domains=["retail"],
                  tasks=["5", "65"])
    data["train"] = {"rollout": {"max_response_tokens": 8, "enable_thinking": False}}
    del data["models"]["generator"]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(app, ["eval", "--recipe", str(path), "--out", str(run),
                                      "--no-progress", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_steps_are_found_and_named(training_run, tmp_path):
    chosen = select_checkpoints(training_run, ["all"])
    assert list(chosen) == STEPS and all(checkpoint_step(f) == s for s, f in chosen.items())
    assert list(select_checkpoints(training_run, ["3", "1"])) == [1, 3]
    with pytest.raises(ValueError, match="no checkpoint of step 7; saved steps: 1, 2, 3"):
        select_checkpoints(training_run, ["7"])
    verl = tmp_path / "verl"  # verl steps: one exported by `prour train export`, one not
    for step in (4, 5):
        (verl / f"global_step_{step}" / "actor").mkdir(parents=True)
        (verl / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"")
    shutil.copytree(training_run / "step_1", verl / "step_5")
    assert select_checkpoints(verl, ["5"]) == {5: verl / "step_5"}
    assert checkpoint_step(verl / "global_step_4" / "actor" / "huggingface") == 4
    with pytest.raises(ValueError, match="prour train export --recipe RECIPE --step 4"):
        select_checkpoints(verl, ["all"])  # every folder is resolved before any episode runs


def test_sweep_gives_one_row_per_step_and_a_success_vs_step_plot(training_run, tmp_path):
    run = tmp_path / "run"
    output = _eval(tmp_path, run, "--checkpoint", str(training_run), "--steps", "all")
    for step in STEPS:  # each checkpoint's resolved step is printed
        assert f"generator: {TRAIN_NAME} step {step} ({training_run / f'step_{step}'})" in output
    lines = list(read_jsonl(run / RESULTS_FILE))
    swept = [line for line in lines if line["method"] == "clarify-only"]
    assert sorted(line["checkpoint"]["step"] for line in swept) == [1, 1, 2, 2, 3, 3]
    assert {line["checkpoint"]["name"] for line in swept} == {TRAIN_NAME}
    assert {line["generator"] for line in swept} == {f"{TRAIN_NAME} step {s}" for s in STEPS}
    base = [line for line in lines if line["method"] == "base"]
    assert [(line["generator"], line["checkpoint"]) for line in base] == [(None, None)] * 2

    report = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(report), "--n-boot", "200"])
    assert result.exit_code == 0, result.output
    markdown = (report / "report.md").read_text()
    section = markdown.split("## Pass@1 (%) by training step")[1].split("\n## ")[0]
    rows = [[c.strip() for c in r.strip("|").split("|")]
            for r in section.splitlines() if r.startswith("| ")][2:]
    expected = {s: 100 * statistics.fmean(line["score"] for line in swept
                                          if line["checkpoint"]["step"] == s) for s in STEPS}
    assert [r[:3] for r in rows] == [["clarify-only", TRAIN_NAME, str(s)] for s in STEPS]
    assert [r[3].split(" [")[0] for r in rows] == [f"{expected[s]:.2f}" for s in STEPS]
    assert f"| clarify-only (generator {TRAIN_NAME} step 2) |" in markdown  # main table label

    plot = read_plot(report / "success_vs_training_step.png")
    curve = plot["series"][f"clarify-only ({TRAIN_NAME})"]
    assert curve["x"] == STEPS
    assert curve["y"] == pytest.approx([expected[s] for s in STEPS])
    assert all(lo <= y <= hi for lo, y, hi in zip(curve["low"], curve["y"], curve["high"]))
    base = plot["series"]["base"]
    assert base["reference"] and base["y"][0] == pytest.approx(
        100 * statistics.fmean(line["score"] for line in lines if line["method"] == "base"))
    assert plot["axes"][0]["xlabel"].startswith("training step")


def test_sweep_resumes_and_a_single_checkpoint_joins_it(training_run, tmp_path):
    run = tmp_path / "run"
    _eval(tmp_path, run, "--checkpoint", str(training_run), "--steps", "1,3")
    episodes = (run / EPISODES_FILE).read_text().splitlines()
    assert len(episodes) == 2 + 2 * 2  # base once, clarify-only at steps 1 and 3
    output = _eval(tmp_path, run, "--checkpoint", str(training_run))  # the newest: step 3
    assert f"generator: {TRAIN_NAME} step 3 (" in output
    assert (run / EPISODES_FILE).read_text().splitlines() == episodes  # nothing rerun
    _eval(tmp_path, run, "--checkpoint", str(training_run), "--steps", "all")
    lines = list(read_jsonl(run / RESULTS_FILE))
    assert len((run / EPISODES_FILE).read_text().splitlines()) == len(episodes) + 2  # step 2
    assert sorted(line["checkpoint"]["step"] for line in lines if line["checkpoint"]) == \
        [1, 1, 2, 2, 3, 3]


def test_steps_without_a_checkpoint_are_refused():
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"
    result = CliRunner().invoke(app, ["eval", "--recipe", str(smoke), "--steps", "all"])
    assert result.exit_code == 2 and "add --checkpoint DIR" in result.output
