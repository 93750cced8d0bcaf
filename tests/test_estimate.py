"""Run-time estimates of the dry-runs (prour.estimate): the paper recipe's training estimate
from the recorded H200 rates, a previous run's metrics and eval results taking precedence, and
a broken rates file named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.estimate import chain_estimates, eval_estimate
from prour.recipes import load_recipe
from prour.train.estimate import (
    RESULTS_DIR,
    Rate,
    recorded_rates,
    train_estimate,
    train_from_metrics,
)

PAPER = Path(__file__).resolve().parents[1] / "recipes" / "paper.yaml"


def _seconds(text: str, label: str) -> float:
    match = re.search(rf"{label} ([\d,.]+) s", text)
    assert match, f"no '{label} N s' in:\n{text}"
    return float(match.group(1).replace(",", ""))


def test_train_dry_run_on_paper_prints_the_estimate_from_recorded_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = CliRunner().invoke(app, ["train", "--recipe", str(PAPER), "--dry-run", "--set",
                                      f"train.output_dir={tmp_path / 'out'}"])
    text = result.output
    # Independently: the raw benchmark file's numbers and the paper's shape (A.2.1); verl's two
    # data-parallel GPUs halve the update, and its two vLLM engines generate at the rate
    # rates.json assumes with its public source (silybench-data's Qwen3-8B on an H100 at 32
    # requests at once: 2,528.52 tokens/s) each.
    raw = json.loads((RESULTS_DIR / "gpu_step-h200-2026-11-30.json").read_text())
    assumed = json.loads((RESULTS_DIR / "rates.json").read_text())["rates"]
    update = 4 * 16 * 6 * raw["update"]["step_s_median"] / raw["update"]["samples"] / 2
    rollout = 16 * 8 * 1760 / (assumed["vllm_rollout_tokens_per_s"]["value"] * 2)
    assert rollout == pytest.approx(225_280 / 5057.04)  # 44.5 s
    score = 16 * 9 * raw["generate"]["score_s"] / 8
    assert "estimate (train): from recorded benchmark rates (an estimate" in text
    assert _seconds(text, "update") == pytest.approx(update, abs=0.05)  # 64 x 1.19 s / 2 = 38.1 s
    assert _seconds(text, "generation") == pytest.approx(rollout, abs=0.5)
    assert "2,528.5 tokens/s per vLLM engine x 2 engines" in text
    assert "silybench-data, run 20260924T125045Z_h100-80gbx1_qwen3-8b_bf16" in text
    assert _seconds(text, "per step:") == pytest.approx(rollout + score + update, abs=0.5)
    low, high = re.search(r"between ([\d,.]+) h .* and ([\d,.]+) h", text).groups()
    assert float(low) == pytest.approx((update + score) * 2010 / 3600, abs=0.05)
    assert float(high.replace(",", "")) == pytest.approx(
        (rollout + score + update) * 2010 / 3600, abs=0.05)
    assert "(generation at the assumed vLLM rate)" in text
    assert "64 optimizer steps/step" in text
    assert "gpu_step-h200-2026-11-30.json update.step_s_median" in text  # its sources
    assert "responder calls (strict user, verifier) and waiting are not counted" in text


def test_a_previous_runs_metrics_and_results_take_precedence(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    times = [(1, 10.0, 6.0, 1.0, 3.0), (2, 14.0, 9.0, 1.0, 4.0), (3, 12.0, 8.0, 1.0, 3.0)]
    (out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "time_step_s": t, "time_generation_s": g, "time_strict_user_s": w,
                    "time_update_s": u}) + "\n" for s, t, g, w, u in times))
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", f"train.output_dir={out}",
                                 "eval.methods=[base,prour]", "eval.max_tasks=2"])
    text = "\n".join(train_estimate(recipe, recipe.train))
    earlier = train_from_metrics([{"step": 1, "time_step_s": 5.0, "time_rollout_s": 2.0}], 10,
                                 out / "metrics.jsonl")  # a run from before the phase keys
    assert earlier[1] == "  per step: 5.0 s; median of each phase: rollout 2.0 s"
    assert "from this run's metrics" in text and "median of 3 step(s)" in text
    assert _seconds(text, "per step:") == 12.0 and _seconds(text, "generation") == 8.0
    assert _seconds(text, "strict user") == 1.0 and "verifier" not in text  # phases it logged
    assert f"{12.0 * 2010 / 3600:.1f} h for 2,010 steps" in text
    assert f"{12.0 * 2007 / 3600:.1f} h left after step 3" in text

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.jsonl").write_text("".join(
        json.dumps({"key": ["retail", str(task), 0, "prour"], "method": "prour", "seconds": s})
        + "\n" for task, s in enumerate((100, 300, 200))))
    rate = Rate(50.0, "s", "an episode", "a stated source", {}, measured=False)
    lines = eval_estimate(recipe, {"eval_episode_s": rate})
    episodes = 2 * 2 * 3  # max_tasks 2 in each of retail and airline, 3 seeds
    assert lines[0].startswith("estimate (eval): 2 methods x 4 tasks (retail 2, airline 2)")
    conc = recipe.eval.concurrency  # paper.yaml's
    assert f"base: {episodes} episodes x 50.0 s (assumed) / {conc} = " \
           f"{episodes * 50 / conc / 3600:.1f} h" in lines[1]
    assert f"prour: {episodes} episodes x 200 s (median of 3" in lines[2]
    assert any("a stated source" in line for line in lines)


def test_a_broken_rates_file_is_named(tmp_path):
    (tmp_path / "rates.json").write_text(json.dumps(
        {"rates": {"update_s_per_optimizer_step": {"file": "gone.json", "key": "update.s"}}}))
    with pytest.raises(ValueError, match=r"rates\.update_s_per_optimizer_step\.file: .*gone"):
        recorded_rates(tmp_path / "rates.json")
    (tmp_path / "gone.json").write_text(json.dumps({"update": {}}))
    with pytest.raises(ValueError, match=r"gone\.json: no key 'update\.s'"):
        recorded_rates(tmp_path / "rates.json")
    assert recorded_rates(tmp_path / "absent.json") == {}
    (tmp_path / "gone.json").write_text('{"update": ')  # cut short
    with pytest.raises(ValueError, match=r"gone\.json: not JSON"):
        recorded_rates(tmp_path / "rates.json")
    for broken in ({"rates": {"eval_episode_s": 696.5}}, {"rates": ["eval_episode_s"]}):
        (tmp_path / "rates.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=r"rates\.json: "):  # no AttributeError traceback
            recorded_rates(tmp_path / "rates.json")


def test_the_eval_median_reads_each_episode_once_and_no_errored_one(tmp_path):
    """An errored attempt (2 s) and its rerun (300 s) share a key: the rerun's line replaces it,
    as in the report; the episode that errored for good is no finished episode either."""
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", "eval.methods=[prour]",
                                 "eval.max_tasks=2"])
    (tmp_path / "eval").mkdir()
    rows = [("1", 2.0, True), ("1", 300.0, False), ("2", 100.0, False), ("3", 200.0, False),
            ("4", 1.0, True)]
    (tmp_path / "eval" / "results.jsonl").write_text("".join(
        json.dumps({"key": ["retail", task, 0, "prour"], "method": "prour", "seconds": s,
                    "error": error}) + "\n" for task, s, error in rows))
    lines = eval_estimate(recipe, {})
    assert "prour: 12 episodes x 200 s (median of 3 in" in lines[1]


def test_the_phase_split_claims_no_sum_it_does_not_have(tmp_path):
    """Medians of phases need not add up to the median step (here 9 + 10 = 19 against 12): the
    line may show them, but an equation it prints must hold."""
    records = [{"step": s, "time_step_s": t, "time_generation_s": g, "time_update_s": u}
               for s, t, g, u in ((1, 10.0, 9.0, 1.0), (2, 12.0, 1.0, 11.0), (3, 20.0, 10.0, 10.0))]
    line = train_from_metrics(records, 10, tmp_path / "metrics.jsonl")[1]
    assert _seconds(line, "per step:") == 12.0
    assert _seconds(line, "generation") == 9.0 and _seconds(line, "update") == 10.0
    if "=" in line:
        total, parts = line.split("=", 1)
        numbers = [float(x) for x in re.findall(r"([\d.]+) s", parts)]
        assert sum(numbers) == pytest.approx(_seconds(total, "per step:")), line


def test_the_update_line_counts_the_samples_of_one_optimizer_step(tmp_path):
    """Two states per mini-batch: each optimizer step takes 2 x 6 kept samples, half as many
    steps, and the same update seconds (the rate is per sample)."""
    rates = recorded_rates()
    one, two = (load_recipe(PAPER, [f"run_dir={tmp_path}", f"train.ppo.mini_batch_states={m}"])
                for m in (1, 2))
    lines = ["\n".join(train_estimate(r, r.train, rates)) for r in (one, two)]
    assert "64 optimizer steps/step" in lines[0] and "of 6 kept samples" in lines[0]
    assert "32 optimizer steps/step" in lines[1] and "of 12 kept samples" in lines[1]
    assert _seconds(lines[0], "update") == _seconds(lines[1], "update")


def test_the_chain_estimates_the_ig_clarifier_training_too(tmp_path):
    """paper.yaml evaluates ig-clarifier, so the chain trains twice (train-ig-clarifier: the same
    steps, its own folder): both trainings are estimated, each from its own folder's metrics."""
    from prour.stages import ig_recipe

    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}"])
    ig = ig_recipe(recipe)
    out = Path(ig.train.output_dir)
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "time_step_s": 30.0}) + "\n")
    text = "\n".join(chain_estimates(recipe, ["train", "train-ig-clarifier"]))
    assert "estimate (train): from recorded benchmark rates" in text
    assert f"estimate (train-ig-clarifier): from this run's metrics, {out / 'metrics.jsonl'}" \
        in text
    assert f"{30.0 * 2010 / 3600:.1f} h for 2,010 steps" in text
    assert "train-ig-clarifier" not in "\n".join(chain_estimates(recipe, ["train"]))


def _hours(text: str, pattern: str) -> float:
    match = re.search(pattern, text)
    assert match, f"no {pattern!r} in:\n{text}"
    return float(match.group(1).replace(",", ""))


def test_the_paper_dry_run_prints_both_eval_totals_and_the_chain_uses_the_queues(tmp_path):
    """paper.yaml: 10 methods x 492 episodes at the recorded 697 s. The eval steps size their
    servers (test_sizing.py: the 8B runs 151 requests at once over its two replicas, the
    exported generator 64; the sweeps, without IG-Clarifier in process, 155 and 69), all above
    eval.concurrency 32, so every method runs 32 at a time, alone or through one queue. The
    chain's total adds the queue totals of eval and both sweeps (prour alone: also at 32); the
    study, estimated on its own, is left out here."""
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}"])
    result = CliRunner().invoke(app, ["run", "--recipe", str(PAPER), "--dry-run", "--set",
                                      f"run_dir={tmp_path}", "--set", "study.run=false"])
    text = result.output
    episode_s = recorded_rates()["eval_episode_s"].value
    episodes = 164 * 3
    assert len(recipe.eval.methods) == 10
    work = {m: episodes * episode_s for m in recipe.eval.methods}
    after = sum(w / 32 for w in work.values()) / 3600
    queue = sum(work.values()) / 32 / 3600
    eval_part = text.split("estimate (eval):", 1)[1].split("estimate (eval-budget)", 1)[0]
    assert ("requests in flight at once per model, as eval sizes its servers (the GPU plan; the "
            "lower of these and eval.concurrency holds): exported-generator 64, Qwen/Qwen3-8B "
            "151 (2 replicas)") in eval_part
    assert _hours(eval_part, r"total: ([\d,.]+) h through one queue") == pytest.approx(
        queue, abs=0.05)
    assert _hours(eval_part, r"; ([\d,.]+) h one method after another") == pytest.approx(
        after, abs=0.05)
    assert "throughput of Qwen/Qwen3-8B: not bounded (no generated tokens per episode" \
        in eval_part  # a fresh run folder has no results yet
    assert "throughput of exported-generator: not bounded (no vLLM rate of it" in eval_part
    budget = len(recipe.eval.tradeoff.budget) * episodes * episode_s / 32 / 3600
    every_n = len(recipe.eval.tradeoff.every_n) * episodes * episode_s / 32 / 3600
    chain = text.split("estimate (chain):", 1)[1].splitlines()[0]
    assert _hours(chain, r"evaluation ([\d,.]+) h through one queue") == pytest.approx(
        queue + budget + every_n, abs=0.1)
    low = _hours(chain, r"training ([\d,.]+) h to")
    assert _hours(chain, r"^ between ([\d,.]+) h") == pytest.approx(
        low + queue + budget + every_n, abs=0.1)
    assert _hours(chain, r"; ([\d,.]+) h one method after another") == pytest.approx(
        after + budget + every_n, abs=0.1)


def test_a_runs_recorded_tokens_bound_the_eval_by_the_servers_throughput(tmp_path):
    """Tokens per episode per role from a run's own results: base's agent generates 600 tokens
    and its user 400 an episode (two finished episodes; the errored one is left out). At
    eval.max_tasks 1 that is 1 + 1 tasks x 3 seeds = 6 episodes x 1,000 tokens through the 8B,
    whose 2 replicas are credited 3,917.07 tokens/s each (rates.json) -> 6,000 / 7,834.14 s; a
    rate of 0.01 tokens/s makes that bound the total."""
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", "eval.methods=[base]",
                                 "eval.max_tasks=1"])
    (tmp_path / "eval").mkdir()
    tokens = {"agent.requests": 10, "agent.prompt": 40_000, "agent.sequences": 10,
              "agent.completion": 600, "user.requests": 8, "user.prompt": 16_000,
              "user.sequences": 8, "user.completion": 400}
    rows = [("1", tokens, False), ("2", tokens, False), ("3", {**tokens, "agent.completion": 9},
                                                           True)]
    (tmp_path / "eval" / "results.jsonl").write_text("".join(
        json.dumps({"key": ["retail", task, 0, "base"], "method": "base", "seconds": 60.0,
                    "error": error, "model_tokens": t}) + "\n" for task, t, error in rows))
    rates = recorded_rates()
    text = "\n".join(eval_estimate(recipe, rates))
    seconds = 6 * 1000 / (3917.07 * 2)
    assert (f"throughput of Qwen/Qwen3-8B: 6,000 generated tokens (per episode by role, from "
            f"{tmp_path / 'eval' / 'results.jsonl'}) / (3,917.1 tokens/s x 2 replica(s)) = "
            f"{seconds / 3600:.1f} h (assumed: ") in text
    slow = {**rates, "vllm_qwen3_8b_output_tokens_per_s": Rate(
        0.01, "tokens/s", "a slow server", "a stated source", {}, measured=False,
        model="Qwen/Qwen3-8B")}
    text = "\n".join(eval_estimate(recipe, slow))
    bound = 6 * 1000 / (0.01 * 2)
    assert _hours(text, r"total: ([\d,.]+) h through one queue") == pytest.approx(
        bound / 3600, abs=0.05)
    assert "bound by Qwen/Qwen3-8B's token throughput" in text


def test_a_recorded_queue_gives_the_achieved_concurrency(tmp_path):
    """A previous run's queue.jsonl (two sessions, wall-weighted mean 6 in flight) replaces the
    limits' bound: the total is the episodes' seconds over 6."""
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", "eval.methods=[base]",
                                 "eval.max_tasks=2"])
    (tmp_path / "eval").mkdir()
    sessions = [{"wall_s": 100.0, "mean_in_flight": 4.0, "episodes": 10},
                {"wall_s": 300.0, "mean_in_flight": 6.666667, "episodes": 30}]
    (tmp_path / "eval" / "queue.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in sessions))
    rate = Rate(60.0, "s", "an episode", "a stated source", {}, measured=False)
    text = "\n".join(eval_estimate(recipe, {"eval_episode_s": rate}))
    mean = (4.0 * 100 + 6.666667 * 300) / 400
    assert f"at the {mean:.1f} episodes in flight a previous run achieved (40 episodes, " \
           f"{40 / (400 / 60):.1f}/min" in text
    assert _hours(text, r"total: ([\d,.]+) h through one queue") == pytest.approx(
        round(12 * 60.0 / mean / 3600, 1))


def test_overlap_shortens_the_training_step_to_the_longer_phase(tmp_path):
    """train.overlap one_step: after the first step, each step takes the longer of sampling
    (generation + scoring) and the update, not their sum."""
    rates = recorded_rates()
    off, on = (load_recipe(PAPER, [f"run_dir={tmp_path}", f"train.overlap={o}",
                                   "train.ppo.drop_zero_variance=false"])
               for o in ("off", "one_step"))
    text_off = "\n".join(train_estimate(off, off.train, rates))
    text_on = "\n".join(train_estimate(on, on.train, rates))
    gen, score = _seconds(text_off, "generation"), _seconds(text_off, "posterior")
    update, steps = _seconds(text_off, "update"), on.train.total_steps
    expected = (gen + score + update + (steps - 1) * max(gen + score, update)) / steps
    assert _seconds(text_on, "per step:") == pytest.approx(expected, abs=1)
    assert _seconds(text_on, "per step:") < _seconds(text_off, "per step:")
    assert "train.overlap one_step samples and scores step k + 1" in text_on
