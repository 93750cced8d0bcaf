"""recipes/gpu-smoke.yaml, the first GPU run: its dry run on this machine (no weights, no GPU)
prints the chain, each stage's GPU memory plan and the vLLM server's command line, and the only
problems it names are the missing weights and GPUs (and the optional modules this interpreter
lacks, computed here independently: a CPU dev venv has no vLLM for verl's rollouts)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import yaml

from prour.recipes import load_recipe
from prour.run_state import skip_reason
from prour.stages import STAGES, stage_of, steps

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gpu-smoke.yaml"
PAPER = ROOT / "recipes" / "paper.yaml"
MODEL = "Qwen/Qwen3-0.6B"


def _importable(module: str, python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec(module) is not None
    probe = f"import importlib.util as u, sys; sys.exit(u.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", probe], check=False).returncode == 0


def test_gpu_smoke_changes_only_models_counts_and_placement() -> None:
    from prour.config import _RecipeLoader

    own = yaml.load(RECIPE.read_text(), Loader=_RecipeLoader)  # the safe loader + !replace
    assert own.pop("extends") == "paper.yaml"
    # the study's section changes its models alone: its axes and grids name the 0.6B
    assert set(own) == {"name", "models", "env", "data", "router", "train", "eval", "study",
                        "serve", "slurm"}
    smoke = load_recipe(RECIPE, cluster=True)
    paper = load_recipe(PAPER, cluster=True)
    assert {cfg.model or cfg.path for cfg in smoke.models.values()} == {MODEL}
    assert set(smoke.models) == set(paper.models)
    assert smoke.train.backend == paper.train.backend == "verl"
    assert smoke.eval.methods == paper.eval.methods
    assert smoke.eval.domains == paper.eval.domains
    assert smoke.reward == paper.reward
    study_models = {model["model"] for axis in smoke.study.axes.values() for value in axis.values()
                    if value.set for model in value.set["models"].values()}
    assert study_models == {MODEL}


def test_gpu_smoke_dry_run_names_only_weights_and_gpus(tmp_path: Path) -> None:
    serve_python = sys.executable
    env = {**os.environ, "PROUR_MODELS_DIR": str(tmp_path / "models"), "CUDA_VISIBLE_DEVICES": "",
           "PROUR_VLLM_PYTHON": serve_python, "HF_HUB_CACHE": str(tmp_path / "hf"),
           "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(RECIPE), "--set",
         f"run_dir={run_dir}", "--dry-run"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out  # it names problems (weights, GPUs): a broken setup

    rows = [line.split()[:2] for line in out.splitlines() if line.startswith("  ")]
    recipe = load_recipe(RECIPE, [f"run_dir={run_dir}"])
    for step in steps():  # the chain, every step with its state in an empty run folder
        state = ("skipped" if stage_of(step).long_running or skip_reason(recipe, step) else
                 "gate" if step.command is None else "pending")
        assert [f"{stage_of(step).name}/{step.name}", state] in rows, (step.name, out)

    plans = [stage.name for stage in STAGES if stage.placement != "none" and not
             stage.long_running]
    for stage in plans:  # the GPU plan of each stage that places models, all on GPU 0
        assert f"GPU memory plan, stage {stage}: 1 x 80 GiB" in out, (stage, out)
    train_gpu = next(line for line in out.splitlines()[out.splitlines().index(
        "GPU memory plan, stage train: 1 x 80 GiB") + 1:] if line.strip().startswith("GPU 0:"))
    assert f"{MODEL} vLLM (0.25) 20.0" in train_gpu and "FSDP actor" in train_gpu, train_gpu

    commands = [line.strip() for line in out.splitlines() if "vllm.entrypoints.openai" in line]
    # one server for every role, and eval's generator (eval.generator_backend vllm): the
    # exported checkpoint, which the run's export step writes
    assert len(commands) == 2, out
    assert commands[0].startswith(f"{serve_python} -m vllm.entrypoints.openai.api_server "
                                  f"--model {MODEL} ")
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in commands[0]
    assert commands[1].startswith(f"{serve_python} -m vllm.entrypoints.openai.api_server "
                                  f"--model {run_dir / 'checkpoints' / 'step_2'} "
                                  "--served-model-name exported-generator ")

    errors = [line.removeprefix("problem: ") for line in out.splitlines()
              if line.startswith("problem: ")]
    missing = [module for module in ("verl", "ray", "vllm", "transfer_queue")
               if not _importable(module, sys.executable)]
    serve_missing = not _importable("vllm", serve_python)
    expected_extras = len(missing) + serve_missing
    kinds = sorted(line.split(":", 1)[0] for line in errors)
    assert kinds == sorted(["weights", "gpus", *["extra"] * expected_extras]), "\n".join(errors)
    weights = next(line for line in errors if line.startswith("weights:"))
    assert f"model '{MODEL}'" in weights and "hf download" in weights
    assert "GPUs visible: 0, needed: 1" in next(line for line in errors
                                                if line.startswith("gpus:"))
    for module in missing:
        assert any(f"`{module}` is not importable (train" in line for line in errors), module
    if serve_missing:
        assert any(f"`vllm` is not importable by {serve_python}" in line for line in errors)
    assert f"{len(errors)} problem(s) on this node" in out
    assert not run_dir.exists() or not any((run_dir / "data").glob("*")), "a dry run wrote data"
