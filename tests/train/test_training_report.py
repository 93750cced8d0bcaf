"""The training report: a tiny local run's metrics.jsonl and verl's file-logger lines become the
same curves (PNG + sidecar series read back), reward by mode as computed by hand from the
samples; the progress bar shows the latest reward."""

from __future__ import annotations

import io
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from plot_check import read_plot
from train_helpers import instance_rows

from prour.config import ModelConfig, Recipe
from prour.config.train import TrainConfig
from prour.llm.base import Completion
from prour.rewards.reward import SampleReward
from prour.rollout.query import parse_query
from prour.train.local import LocalTrainer
from prour.train.metrics import PHASES
from prour.train.report import (
    CURVES_PLOT,
    REWARD_PLOT,
    TIME_PLOT,
    _fmt,
    read_metrics,
    write_training_report,
)

STEPS = 3
SAMPLES_PER_STEP = 2 * 3  # states_per_step x rollout.n
MODES = ("clarify", "verify", "clarify", "verify")


class RecordingReward:
    """Deterministic rewards by text length, with prior/posterior; records (mode, reward, kind)
    of every sample so the test can compute the report's numbers itself."""

    def __init__(self) -> None:
        self.scored: list[tuple[str, float, str]] = []

    def score_group(self, state: Any, completions: Sequence[Completion]) -> list[SampleReward]:
        out = []
        for c in completions:
            reward = (len(c.text) % 7) / 7
            kind = parse_query(c.text).kind
            out.append(SampleReward(kind=kind, prior=-4.0, post=-4.0 + reward, reward=reward))
            self.scored.append((state, reward, kind))
        return out

    def policy_updated(self) -> None:
        """Cached priors would be dropped here; this reward caches nothing."""

    def by_step(self, per_step: int) -> list[list[tuple[str, float, str]]]:
        return [self.scored[i:i + per_step] for i in range(0, len(self.scored), per_step)]


def _rows() -> list[dict[str, Any]]:
    rows = instance_rows(len(MODES))
    for row, mode in zip(rows, MODES):
        row["extra_info"]["mode"] = mode
    return rows


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory) -> tuple[Path, RecordingReward]:
    """Three local training steps of the tiny model, a checkpoint after each."""
    out = tmp_path_factory.mktemp("train") / "run"
    cfg = TrainConfig.model_validate({
        "states_per_step": 2, "total_steps": STEPS, "save_every": 1, "output_dir": str(out),
        "device": "cpu", "dtype": "float32",
        "rollout": {"n": 3, "keep": 3, "max_response_tokens": 6},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "weight_decay": 0.0}, "ppo": {"epochs": 1}})
    recipe = Recipe(name="t", seed=3,
                    models={"generator": ModelConfig(backend="hf", path=str(tiny_model_dir))})
    reward = RecordingReward()
    trainer = LocalTrainer(recipe, cfg, reward_fn=reward, make_state=row_mode_state,
                           rows=_rows())
    trainer.run(progress=False)
    return out, reward


def row_mode_state(row: dict[str, Any]) -> str:
    return row["extra_info"]["mode"]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def test_report_series_equal_the_samples_by_mode(tiny_run, tmp_path):
    out, reward = tiny_run
    steps = reward.by_step(SAMPLES_PER_STEP)
    assert len(steps) == STEPS
    written = write_training_report(out, tmp_path / "report")
    drawn = read_plot(written["reward_plot"])["series"]["reward"]
    assert drawn["all"]["x"] == [1, 2, 3]
    for label, mode in (("all", None), ("clarify", "clarify"), ("verify", "verify")):
        expected = [_mean([r for m, r, _ in samples if mode in (None, m)]) for samples in steps]
        xs = [i + 1 for i, v in enumerate(expected) if v is not None]
        assert drawn[label]["x"] == xs
        assert drawn[label]["y"] == pytest.approx([v for v in expected if v is not None])
    curves = read_plot(written["curves_plot"], min_pixels=(1000, 500))
    asks = [sum(k == "ask" for _, _, k in samples) / len(samples) for samples in steps]
    assert curves["series"]["samples"]["ask (valid question)"]["y"] == pytest.approx(asks)
    assert curves["series"]["belief"]["prior"]["y"] == [-4.0] * STEPS
    logged = read_metrics(out)
    for panel, label, key in (("entropy", "entropy", "entropy"), ("lr", "lr", "lr"),
                              ("grad_norm", "grad norm", "grad_norm"),
                              ("throughput", "step (prompt + response, per GPU)",
                               "throughput_tokens_per_s")):
        assert curves["series"][panel][label]["y"] == [m[key] for m in logged]
    titles = [a["title"] for a in curves["axes"]]
    assert "Clip fraction" in titles and "Attention-aware reward terms" not in titles  # no data
    markdown = written["markdown"].read_text()
    assert f"![reward_plot]({REWARD_PLOT})" in markdown and CURVES_PLOT in markdown
    # time per step, stacked by phase: the bars are the logged phase seconds, they reach each
    # step's time, and the shares printed sum to the run's step time
    time = read_plot(written["time_plot"])["series"]["time"]
    tops = [sum(time[p.replace("_", " ")]["y"][i] for p in PHASES) for i in range(STEPS)]
    assert tops == pytest.approx([m["time_step_s"] for m in logged], rel=1e-9)
    assert time["generation"]["y"] == [m["time_generation_s"] for m in logged]
    shares = json.loads(written["json"].read_text())["time"]
    total = sum(m["time_step_s"] for m in logged)
    assert shares["step_seconds"] == pytest.approx(total)
    assert sum(e["seconds"] for e in shares["phases"].values()) == pytest.approx(total)
    assert sum(e["share"] for e in shares["phases"].values()) == pytest.approx(1.0)
    update = shares["phases"]["update"]
    assert update["share"] == pytest.approx(sum(m["time_update_s"] for m in logged) / total)
    assert f"| update | {_fmt(update['seconds'])} | {100 * update['share']:.1f}% |" in markdown
    assert TIME_PLOT in markdown
    assert "Not logged by this run: `ig_mean`, `attention_cost_mean`" in markdown


def test_prour_report_detects_a_training_folder(tiny_run):
    from typer.testing import CliRunner

    from prour.cli.main import app

    out, _ = tiny_run
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report" / REWARD_PLOT).is_file() and (out / "report" / CURVES_PLOT).is_file()
    again = CliRunner().invoke(app, ["train", "report", str(out), "--out", str(out / "r2")])
    assert again.exit_code == 0, again.output
    assert f"markdown: {out / 'r2' / 'training_report.md'}" in again.output
    shares = json.loads((out / "r2" / "training_report.json").read_text())["time"]["phases"]
    printed = ", ".join(f"{p} {100 * e['share']:.1f}%" for p, e in shares.items())
    assert f"steps: {printed}" in again.output and list(shares) == list(PHASES)


def test_verl_file_logger_lines_read_under_the_local_names(tmp_path, monkeypatch):
    """verl's own FileLogger writes the sampler's metrics; a resume segment replaces later steps."""
    from verl.utils.tracking import FileLogger

    from prour.train.verl_ext.logic import SampleInfo, step_metrics, verl_phase_metrics

    session = SampleInfo("ask", False, 0.5, "clarify",
                         phases=(("generation", 100.0, 101.5), ("strict_user", 101.5, 102.0)))
    infos = [SampleInfo("ask", False, 0.5, "clarify", -3.0, -2.0),
             SampleInfo("ask", False, 0.25, "verify", -3.5, -3.0),
             SampleInfo("none", False, 0.0, "verify"), SampleInfo("ask", True, None, "clarify")]
    verl_only = {"actor/entropy": 1.5, "actor/pg_clipfrac": 0.1, "actor/grad_norm": 2.0,
                 "actor/lr": 1e-6, "perf/throughput": 900.0, "critic/score/mean": 0.3}

    def log(path: Path, steps: range, scale: float) -> None:
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
        logger = FileLogger("p", "e")
        for step in steps:
            timers = {"step": 4.0 * step, "update_actor": 1.0}  # verl's timing_raw of the step
            times = verl_phase_metrics([session], timers, step_started=100.0)
            logger.log({**step_metrics(infos), **verl_only, **times, "timing_s/step": 4.0 * step,
                        "actor/entropy": scale * step}, step)
        logger.finish()

    log(tmp_path / "metrics.jsonl", range(1, 5), 1.0)
    log(tmp_path / "metrics.from_step_2.jsonl", range(3, 4), 10.0)  # killed after step 3
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["entropy"] for r in records] == [1.0, 2.0, 30.0]
    first = records[0]
    assert first["reward_mean"] == pytest.approx(0.75 / 3)
    assert first["reward_mean_clarify"] == 0.5 and first["reward_mean_verify"] == 0.125
    assert first["ask_fraction"] == 0.75 and first["failed_fraction"] == 0.25
    assert first["prior_mean"] == -3.25 and first["post_mean"] == -2.5
    assert (first["pg_clipfrac"], first["grad_norm"], first["lr"]) == (0.1, 2.0, 1e-6)
    assert first["throughput_tokens_per_s"] == 900.0 and first["critic/score/mean"] == 0.3
    written = write_training_report(tmp_path)
    series = json.loads(written["curves_plot"].with_suffix(".json").read_text())["series"]
    assert series["entropy"]["entropy"]["y"] == [1.0, 2.0, 30.0]
    # the phases as verl's run logged them: 1.5 s generation, 0.5 s strict user, 1 s update
    time = read_plot(written["time_plot"])["series"]["time"]
    assert time["step"]["y"] == [4.0, 8.0, 12.0]
    assert time["generation"]["y"] == [1.5] * 3 and time["update"]["y"] == [1.0] * 3
    assert time["waiting"]["y"] == pytest.approx([1.0, 5.0, 9.0])
    shares = json.loads(written["json"].read_text())["time"]["phases"]
    assert shares["waiting"]["share"] == pytest.approx(15.0 / 24.0)
    assert sum(e["share"] for e in shares.values()) == pytest.approx(1.0)


def test_local_and_verl_report_the_same_diagnostic_names():
    from prour.train.local import sample_metrics
    from prour.train.policy import Rollout
    from prour.train.verl_ext.logic import SampleInfo, step_metrics

    rewards = [[SampleReward("ask", reward=1.0, prior=-2.0, post=-1.0),
                SampleReward("invalid", reward=-1.0)], [SampleReward("ask", failed=True)]]
    rollouts = [[Rollout(g, [1], [2], Completion(text="x", content="x")) for _ in group]
                for g, group in enumerate(rewards)]
    local = sample_metrics(rollouts, rewards, ["verify", "clarify"])
    infos = [SampleInfo(s.kind, s.failed, s.reward, mode, s.prior, s.post)
             for group, mode in zip(rewards, ["verify", "clarify"]) for s in group]
    verl = {k.removeprefix("training/prour/"): v for k, v in step_metrics(infos).items()}
    assert verl == {k: local[k] for k in verl}
    assert local["reward_mean_verify"] == 0.0 and local["reward_mean_clarify"] is None
    assert "reward_mean_clarify" not in verl  # no clarify sample got a reward this step


def test_progress_bar_shows_steps_eta_and_the_latest_reward():
    from rich.console import Console

    from prour.train.progress import StepProgress

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with StepProgress(4, 1, enabled=True, console=console) as bar:
        bar.advance(2, 0.4567)
    text = buffer.getvalue()
    assert "reward 0.457" in text and "2/4" in text and "ETA" in text
    assert not StepProgress(4, 4, enabled=True).enabled  # nothing left to do: no bar


def test_verl_runs_log_to_metrics_jsonl_and_a_segment_per_resume(tmp_path):
    from prour.train.verl_backend import metrics_file, trainer_overrides

    out = tmp_path / "ckpt"
    assert metrics_file(out, resume=False) == out / "metrics.jsonl"
    assert metrics_file(out, resume=True) == out / "metrics.jsonl"  # nothing to resume yet
    (out / "global_step_4" / "actor").mkdir(parents=True)
    assert metrics_file(out, resume=True) == out / "metrics.from_step_4.jsonl"
    recipe = Recipe(name="t", models={})
    cfg = TrainConfig.model_validate({"backend": "verl", "output_dir": str(out)})
    assert "file" in trainer_overrides(recipe, cfg, out, resume=True)["trainer.logger"]


def test_wandb_gets_the_report_keys(tiny_run, tmp_path, monkeypatch):
    """The local trainer's step metrics reach wandb (offline) under the names the report reads."""
    from prour.config.train import WandbSettings
    from prour.train.metrics import MetricsLog

    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    first, second = read_metrics(tiny_run[0])[:2]
    log = MetricsLog(tmp_path / "run", WandbSettings(track=True, mode="offline", project="t"),
                     run_name="t")
    try:
        for record in (first, second):
            log.log(record["step"], {k: v for k, v in record.items() if k != "step"})
        summary = dict(log._wandb.summary)  # wandb commits a step when the next one starts
    finally:
        log.close()
    numeric = {k: v for k, v in first.items() if isinstance(v, (int, float))}
    assert {"reward_mean", "reward_mean_clarify", "ask_fraction", "entropy", "grad_norm", "lr",
            "throughput_tokens_per_s"} <= set(numeric)
    assert {k: summary[k] for k in numeric} == numeric
