"""The GPU memory plan against numbers worked out by hand (prour.cluster.gpu_plan)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import write_recipe

from prour.cluster.gpu_plan import GpuPlanError, check_stage, gpu_plan
from prour.cluster.serve import ServeError, serve
from prour.cluster.shapes import KNOWN_MODELS, model_shape
from prour.recipes import load_recipe

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"
GIB = 2**30
# paper.yaml's servers at the shares it gives them outside `prour run`'s steps, in every step too
# (no size_per_step, one copy of the 8B, the exported generator at 16 requests): the arithmetic
# of fixed shares below; the shares each step leaves are tests/cluster/test_sizing.py's
FIXED = ["serve.models.Qwen/Qwen3-8B.size_per_step=false", "serve.models.Qwen/Qwen3-8B.replicas=1",
         "serve.models.exported-generator.size_per_step=false",
         "serve.models.exported-generator.max_num_seqs=16"]


def test_parameter_counts_of_the_papers_models() -> None:
    """Qwen3-1.7B per layer: q, k+v, o = 3 x 4,194,304; q/k norms 256; MLP 3 x 2048 x 6144 =
    37,748,736; two layer norms 4,096 -> 50,336,000 x 28 = 1,409,408,000; tied embeddings
    151,936 x 2048 = 311,164,928; final norm 2,048. Qwen3-8B per layer: q 16,777,216, k+v
    8,388,608, o 16,777,216, norms 256, MLP 150,994,944, layer norms 8,192 -> 192,946,432 x 36;
    untied embeddings 2 x 622,329,856; final norm 4,096."""
    assert KNOWN_MODELS["Qwen/Qwen3-1.7B"].params == 1_409_408_000 + 311_164_928 + 2_048
    assert KNOWN_MODELS["Qwen/Qwen3-8B"].params == 192_946_432 * 36 + 2 * 622_329_856 + 4_096
    # KV cache: 2 (K, V) x 36 layers x 8 heads x 128 dims x 2 bytes = 147,456 bytes per token
    assert KNOWN_MODELS["Qwen/Qwen3-8B"].kv_bytes_per_token(2) == 147_456
    assert round(KNOWN_MODELS["Qwen/Qwen3-32B"].params / 1e9, 2) == 32.76  # model card: 32.8B


def test_a_local_config_json_wins_over_the_table(tmp_path: Path) -> None:
    """hidden 128, 2 layers, 4 heads, 2 KV heads of 32: attention 128 x 32 x (8 + 4) + 64 =
    49,216; MLP 3 x 128 x 384 = 147,456; layer norms 256 -> 196,928 per layer; tied embeddings
    1,000 x 128; final norm 128."""
    cfg = {
        "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
        "intermediate_size": 384, "tie_word_embeddings": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = model_shape("Qwen/Qwen3-8B", str(tmp_path))
    assert shape is not None and shape.params == 2 * 196_928 + 128_000 + 128
    assert model_shape("someone/unknown") is None


@pytest.mark.parametrize("text", ["{", "[1, 2]"])
def test_a_config_json_that_is_not_a_model_config_leaves_the_size_to_the_table(
    tmp_path: Path, text: str
) -> None:
    (tmp_path / "config.json").write_text(text)
    assert model_shape("Qwen/Qwen3-8B", str(tmp_path)) == KNOWN_MODELS["Qwen/Qwen3-8B"]
    assert model_shape("someone/unknown", str(tmp_path)) is None


def test_the_papers_train_node() -> None:
    """GPU 1 holds the Qwen3-8B server (0.45 x 80 = 36 GiB), the FSDP shard of the 1.7B policy
    (1,720,574,976 params x 16 B / 2 GPUs), the rollout (0.2 x 80 = 16 GiB) and three CUDA
    contexts of 0.5 GiB; GPU 0 the same without the server."""
    plan = check_stage(load_recipe(PAPER, FIXED, cluster=True), "train")
    shard = 1_720_574_976 * 16 / 2 / GIB  # 12.82 GiB
    assert plan.n_gpus == 2 and plan.gpu_gib == 80
    assert plan.total(0) == pytest.approx(shard + 16 + 1.0)
    assert plan.total(1) == pytest.approx(36 + 0.5 + shard + 16 + 1.0)
    assert "stop Qwen/Qwen3-32B on this node while training" in plan.text()
    serving = check_stage(load_recipe(PAPER, cluster=True), "serve")  # 8B + the 32B's half on GPU 1
    assert serving.total(1) == pytest.approx(36 + 0.5 + 40 + 0.5)


def test_a_share_too_small_for_the_weights_and_one_sequence_is_refused() -> None:
    """0.2 x 80 = 16 GiB - 15.26 GiB of bf16 weights (8,190,735,360 x 2 B) - 1.5 GiB reserve =
    -0.76 GiB of KV cache, but one 32,768-token sequence needs 147,456 x 32,768 B = 4.5 GiB."""
    recipe = load_recipe(PAPER, [*FIXED, "serve.models.Qwen/Qwen3-8B.gpu_memory_utilization=0.2"],
                         cluster=True)
    with pytest.raises(GpuPlanError) as info:
        check_stage(recipe, "train")
    assert (
        "serve.models.Qwen/Qwen3-8B: gpu_memory_utilization 0.2 x 80 GiB = 16.0 GiB per GPU holds "
        "15.3 GiB of weights + 1.5 GiB reserve, leaving -0.8 GiB of KV cache < 4.5 GiB for one "
        "32768-token sequence" in str(info.value)
    )


def test_a_smaller_gpu_overflows_with_the_sum_named() -> None:
    """On 40 GiB GPUs the rollout share (0.2 x 40 = 8 GiB) is below the update's activations
    (3,160 x 151,936 x 4 B x 5 = 8.94 GiB of logits + 28 x 3,160 x 2,048 x 2 B = 0.34 GiB of
    hidden states), so GPU 1 needs 18 + 0.5 + 12.82 + 9.28 + 1 = 41.6 GiB."""
    plan = gpu_plan(load_recipe(PAPER, [*FIXED, "serve.gpu_memory_gib=40"], cluster=True), "train")
    assert not plan.fits
    assert any(p.startswith("GPU 1 needs 41.6 GiB > 40 GiB") for p in plan.problems)
    apart = gpu_plan(
        load_recipe(PAPER, ["serve.gpu_memory_gib=40", "serve.colocate_train=false"], cluster=True),
        "train",
    )
    activations = (3160 * 151_936 * 4 * 5 + 28 * 3160 * 2048 * 2) / GIB
    assert apart.fits
    assert apart.total(1) == pytest.approx(1_720_574_976 * 8 / GIB + activations + 1)


def test_serve_refuses_servers_that_cannot_share_a_gpu(tmp_path: Path) -> None:
    """Shares of 0.5 + 0.5 pass the config check (at most 1.0) but leave no room for the two
    CUDA contexts: 81 GiB on an 80 GiB GPU; nothing starts, no endpoints file is written."""
    models = {name: {"gpus": [0], "gpu_memory_utilization": 0.5} for name in ("a", "b")}
    data = {
        "name": "tight",
        "run_dir": str(tmp_path / "run"),
        "models": {"user": {"backend": "openai", "model": "a"},
                   "judge": {"backend": "openai", "model": "b"}},
        "serve": {"python": sys.executable, "models": models},
    }  # fmt: skip
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", data), cluster=True)
    with pytest.raises(ServeError, match=r"GPU 0 needs 81.0 GiB > 80 GiB"):
        serve(recipe, threading.Event())
    assert not (tmp_path / "run" / "endpoints.json").exists()


def test_the_update_estimate_matches_the_measured_peak() -> None:
    """benchmarks/RESULTS.md: one update at Qwen3-1.7B shape (micro-batch 1, 1,400 prompt + 1,760
    response tokens, one GPU, no sharding, no rollout engine) peaked at 34.5 GiB of torch memory.
    The plan of that setup, less its CUDA contexts (outside torch's count), must land on it."""
    benchmark = [
        "serve.colocate_train=false",  # the benchmark ran the update alone on its GPU
        "serve.gpu_memory_gib=141",
        "train.verl.nnodes=1",
        "train.verl.n_gpus_per_node=1",
        "train.verl.gpu_memory_utilization=0.05",  # a rollout share below the update's needs
        "data.max_prompt_tokens=1400",
        "train.rollout.max_response_tokens=1760",
        "train.ppo.micro_batch_size=1",
    ]
    plan = gpu_plan(load_recipe(PAPER, benchmark, cluster=True), "train")
    assert plan.fits and plan.n_gpus == 1
    parts = dict(plan.uses[0])
    assert set(parts) == {"FSDP actor params+grads+AdamW (fp32, 16 B/param)",
                          "update activations (fp32 logits x5, checkpoints)", "CUDA contexts"}
    assert plan.total(0) - parts["CUDA contexts"] == pytest.approx(34.5, abs=1.0)


def test_eval_counts_the_served_generator_not_an_in_process_one() -> None:
    """paper.yaml's eval.generator_backend is vllm: the evaluated Qwen3-1.7B is the served
    exported-generator (0.45 x 80 + 0.5 on GPU 0), so eval's process loads only the
    ig-clarifier's own checkpoint (the eval step sets models.ig_clarifier, hf, bf16:
    1,720,574,976 x 2 B = 3.2 GiB + 0.5); no method of the paper's eval calls a 32B role
    (teacher, annotator, judge), and GPU 1 holds the 8B server (0.45 x 80 + 0.5)."""
    plan = check_stage(load_recipe(PAPER, FIXED, cluster=True), "eval")
    parts = [what for what, _ in plan.uses[0]]
    assert "models.generator in process (bfloat16)" not in parts
    assert "exported-generator vLLM (0.45)" in parts
    assert not any("size unknown" in note for note in plan.notes)  # sized as models.generator
    one = 1_720_574_976 * 2 / GIB + 0.5
    assert plan.total(0) == pytest.approx(0.45 * 80 + 0.5 + one)
    assert parts.count("models.ig_clarifier in process (bfloat16)") == 1
    assert plan.total(1) == pytest.approx(0.45 * 80 + 0.5)
    assert not any("Qwen3-32B" in what for uses in plan.uses.values() for what, _ in uses)


def test_eval_counts_the_generator_it_loads_in_process() -> None:
    """With eval.generator_backend hf the evaluated generator and the ig-clarifier's checkpoint
    both sit on GPU 0 in eval's process: 2 x (3.2 + 0.5) GiB, no exported-generator server.
    Without servers the two in-process models make the plan one GPU."""
    hf = [*FIXED, "eval.generator_backend=hf"]
    plan = check_stage(load_recipe(PAPER, hf, cluster=True), "eval")
    weights = 2 * (1_720_574_976 * 2 / GIB + 0.5)
    assert plan.total(0) == pytest.approx(weights)
    assert [what for what, _ in plan.uses[0]] == [
        "models.generator in process (bfloat16)", "CUDA context",
        "models.ig_clarifier in process (bfloat16)", "CUDA context"]
    assert plan.total(1) == pytest.approx(0.45 * 80 + 0.5)
    alone = gpu_plan(load_recipe(PAPER, [*hf, "serve.models={}"], cluster=True), "eval")
    assert alone.n_gpus == 1 and alone.total(0) == pytest.approx(weights)


def test_a_stage_plan_sums_only_the_servers_of_one_step() -> None:
    """calibrate's annotate calls the 32B (0.5 x 80 + 0.5 on each GPU), its search and heldout
    the 8B (0.45 x 80 + 0.5 on GPU 1); `prour run` stops one before it starts the other, so
    GPU 1 peaks at 40.5 GiB (annotate), not 77.0, and no warning; collect-retail calls both
    (agent and user on the 8B, the teacher on the 32B), so collect keeps 77.0 and its warning."""
    recipe = load_recipe(PAPER, [*FIXED, "router.tau_au=null", "router.tau_eu=null"], cluster=True)
    calibrate = check_stage(recipe, "calibrate")
    assert calibrate.total(1) == pytest.approx(40.5) and calibrate.warnings == []
    assert calibrate.total(0) == pytest.approx(40.5)
    assert "  GPU 1: 40.5 / 80 GiB (annotate) = Qwen/Qwen3-32B vLLM (0.5) 40.0" in calibrate.text()
    collect = check_stage(recipe, "collect")
    assert collect.total(1) == pytest.approx(77.0) and len(collect.warnings) == 1


def test_servers_of_one_step_that_overflow_a_gpu_are_refused_with_numbers() -> None:
    """A served router of its own on GPU 0 beside the exported-generator (0.45: 36 + 0.5 GiB),
    which eval runs together: at 0.6 their shares add up to 1.05 > 1.0; at 0.55 (44 + 0.5 GiB)
    the shares fit but the CUDA contexts do not: 81.0 GiB."""
    router = [*FIXED, "models.router.model=Qwen/Qwen3-4B", "serve.models.Qwen/Qwen3-4B.gpus=[0]",
              "eval.methods=[base,llm-router]"]
    with pytest.raises(GpuPlanError) as info:
        check_stage(load_recipe(
            PAPER, [*router, "serve.models.Qwen/Qwen3-4B.gpu_memory_utilization=0.6"],
            cluster=True), "eval")
    assert ("serve.models.Qwen/Qwen3-4B.gpu_memory_utilization: GPU 0 is shared by "
            "exported-generator (0.45), Qwen/Qwen3-4B (0.6) while step eval runs: shares add up "
            "to 1.05 > 1.0") in str(info.value)
    recipe = load_recipe(PAPER, [*router, "serve.models.Qwen/Qwen3-4B.gpu_memory_utilization=0.55"],
                         cluster=True)
    plan = gpu_plan(recipe, "eval")
    assert any(p.startswith("GPU 0 needs 81.0 GiB > 80 GiB") for p in plan.problems), plan.text()
    assert "Qwen/Qwen3-32B" not in plan.text()  # its half on GPU 0 is down while eval runs


def test_slurm_dry_run_plans_each_job_with_what_it_holds(tmp_path: Path) -> None:
    """On Slurm each job serves what its own steps call: train's plan holds the trainer
    (12.8 + 16 + 1 GiB per GPU) and, on GPU 1, the 8B the reward calls (0.45 x 80 + 0.5 GiB);
    eval's the served exported-generator (0.45 x 80 + 0.5 GiB) and the in-process ig-clarifier
    checkpoint (3.2 + 0.5 GiB) on GPU 0 and the same 8B; neither the 32B."""
    from typer.testing import CliRunner

    from prour.cli.main import app

    result = CliRunner().invoke(
        app,
        ["slurm", "submit", "--recipe", str(PAPER), "--stages", "train,eval", "--dry-run",
         "--run-dir", str(tmp_path / "run"), *(part for item in FIXED for part in ("--set", item))],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "GPU memory plan, stage train: 2 x 80 GiB\n  GPU 0: 29.8 / 80 GiB" in out
    assert "  GPU 1: 66.3 / 80 GiB = Qwen/Qwen3-8B vLLM (0.45) 36.0 + CUDA context 0.5" in out
    assert "GPU memory plan, stage eval: 2 x 80 GiB\n  GPU 0: 40.2 / 80 GiB" in out
    # eval's steps hold different servers (posthoc only the 8B): each GPU names its largest step
    assert ("  GPU 1: 36.5 / 80 GiB (eval) = Qwen/Qwen3-8B vLLM (0.45) 36.0 + CUDA context 0.5\n"
            in out)
    assert "Qwen3-32B vLLM" not in out
    assert out.count("#SBATCH --gpus-per-node=2") == 2


def test_the_train_plan_counts_the_8b_server_already_running_on_the_node(
    tmp_path: Path, fake_vllm_python: Path
) -> None:
    """`prour serve --roles strict_user,verifier` runs the 8B (a stand-in vLLM) on GPU 1; once its
    endpoints file gives those roles their URLs they are no longer "to be served", yet the server
    holds 0.45 x 80 + 0.5 GiB of GPU 1: the train plan shows 66.3 GiB there, not the trainer's
    29.8 alone (what it showed before it read the endpoints file)."""
    models = tmp_path / "models" / "Qwen" / "Qwen3-8B"
    models.mkdir(parents=True)
    (models / "config.json").write_text("{}")
    sets = [*FIXED, f"run_dir={tmp_path / 'run'}", f"models_dir={tmp_path / 'models'}",
            "serve.host=127.0.0.1", f"serve.python={fake_vllm_python}"]
    stop = threading.Event()
    serving = threading.Thread(target=serve, daemon=True, args=(
        load_recipe(PAPER, sets, cluster=True), stop, ["strict_user", "verifier"]))
    serving.start()
    try:
        endpoints = tmp_path / "run" / "endpoints.json"
        deadline = time.monotonic() + 30
        while not (endpoints.exists() and json.loads(endpoints.read_text())["status"] == "ready"):
            assert time.monotonic() < deadline and serving.is_alive(), "the 8B never got ready"
            time.sleep(0.1)
        resolved = load_recipe(PAPER, sets, cluster=True, endpoints=True)
        assert resolved.models["strict_user"].base_url  # served, so no longer to be served
        plan = gpu_plan(resolved, "train")
        shard = 1_720_574_976 * 16 / 2 / GIB
        assert plan.total(1) == pytest.approx(36 + 0.5 + shard + 16 + 1.0)
        assert "GPU 1: 66.3 / 80 GiB = Qwen/Qwen3-8B vLLM (0.45, running) 36.0" in plan.text()
        assert plan.total(0) == pytest.approx(shard + 16 + 1.0)
        assert "GPU 1: 29.8 / 80 GiB" in gpu_plan(resolved, "train", running={}).text()
    finally:
        stop.set()
        serving.join(30)
    # stopped: nothing runs, and the roles are to be served again by the train stage's servers
    after = gpu_plan(load_recipe(PAPER, sets, cluster=True, endpoints=True), "train")
    assert "running" not in after.text() and after.total(1) == pytest.approx(plan.total(1))


def test_an_endpoints_file_of_another_node_or_a_dead_server_is_not_counted(tmp_path: Path) -> None:
    """A ready record written on another host, or naming a pid that is gone, holds nothing here."""
    import socket
    import subprocess

    from prour.cluster.endpoints import write_endpoints
    from prour.cluster.gpu_plan import running_servers

    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}"], cluster=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    server = {"base_url": "http://127.0.0.1:9/v1", "path": "Qwen/Qwen3-8B", "gpus": [1],
              "command": ["python", "--gpu-memory-utilization", "0.45", "--max-model-len", "32768",
                          "--dtype", "bfloat16"]}
    for node, pid, expected in (("elsewhere", os.getpid(), {}), (socket.gethostname(), int(gone), {}),
                                (socket.gethostname(), os.getpid(), {"Qwen/Qwen3-8B"})):
        write_endpoints(tmp_path / "endpoints" / "host-1.json",
                        {"status": "ready", "node": node, "pid": pid,
                         "servers": {"Qwen/Qwen3-8B": {**server, "pid": pid}}})
        assert set(running_servers(recipe)) == set(expected)
    spec = running_servers(recipe)["Qwen/Qwen3-8B"]
    assert (spec.gpus, spec.gpu_memory_utilization, spec.max_model_len, spec.dtype) == (
        [1], 0.45, 32768, "bfloat16")


def test_a_plan_within_five_percent_of_a_gpu_warns_and_names_the_keys() -> None:
    """The paper's serve stage puts 0.45 x 80 + 0.5 + 0.5 x 80 + 0.5 = 77.0 GiB on GPU 1: above
    95% of 80 GiB (76), so it fits with a warning; with the 8B at 0.43 (75.4 GiB) there is none."""
    plan = check_stage(load_recipe(PAPER, cluster=True), "serve")
    assert plan.fits and len(plan.warnings) == 1
    assert plan.warnings[0].startswith("GPU 1 is planned at 77.0 of 80 GiB (96%), within 5%")
    assert ("lower serve.models.Qwen/Qwen3-8B.gpu_memory_utilization or "
            "serve.models.Qwen/Qwen3-32B.gpu_memory_utilization") in plan.warnings[0]
    assert "  warning: GPU 1 is planned at 77.0" in plan.text()
    roomy = check_stage(load_recipe(
        PAPER, ["serve.models.Qwen/Qwen3-8B.gpu_memory_utilization=0.43"], cluster=True), "serve")
    assert roomy.fits and roomy.warnings == [] and roomy.total(1) == pytest.approx(75.4)


def test_serving_a_tight_plan_says_so_before_the_servers_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """check_memory (what `prour serve` and `prour run` ask first) logs the plan's warning."""
    import logging

    from prour.cluster.serve import check_memory, plan_servers

    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}"], cluster=True)
    with caplog.at_level(logging.WARNING, logger="prour.cluster.serve"):
        check_memory(recipe, plan_servers(recipe))
    assert [r.getMessage() for r in caplog.records] == [
        f"GPU memory plan: {check_stage(recipe, 'serve').warnings[0]}"]
