"""The paper's pipeline, shrunk, through the local single-node Slurm with every frozen model served.

A recipe with paper.yaml's shape (every role the pipeline reads; the generator trained in process)
whose frozen roles all name one model, the tiny Qwen3 served by the vLLM CPU server through
`prour serve`, runs serve → collect → normalize → calibrate → extract → train (local) → export →
eval → report; `prour slurm status` must say COMPLETED for every stage and the report must exist.
Then a second submission's server is killed while its eval runs: eval and serve are FAILED and
status names each cause.

The served model learned the decomposer's replies by heart (a goal reading, then the action
`{"tool": "respond", "arguments": {}}`), so that the decomposer proposes a valid candidate (a
random tiny model never does, and calibration needs measured states). The labels of the calibration states are given as a reviewer's
corrections (the annotator's replies are reviewed by people in the paper's workflow too).
Needs root (Slurm) and the vLLM venv; PROUR_REQUIRE_SLURM=1 / PROUR_REQUIRE_VLLM=1 make a
missing one fail instead of skip.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import write_recipe
from test_slurm_local import REPO, prour, status_of, submit, wait_done
from tiny_finetune import learned_by_heart

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.slow]

PAPER = REPO / "recipes" / "paper.yaml"
# Every role some stage reads (collect: agent, user, teacher; normalize: normalizer; calibrate:
# annotator, decomposer; train: strict_user, verifier; eval: the same plus judge).
PIPELINE_ROLES = ("agent", "user", "teacher", "normalizer", "annotator", "decomposer",
                  "strict_user", "verifier", "judge")
RESPOND = '{"tool": "respond", "arguments": {}}'
GOAL = "I want help with my order."
TIMEOUT_S = 1800
STAGES = "serve,collect,normalize,calibrate,extract,train,export,eval,report"
STATES = {"dev": ["d1", "d2"], "test": ["t1"]}


@pytest.fixture(scope="module")
def respond_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after learning the decomposer's two prompts by heart: GOAL as the reading,
    RESPOND as the action (retail's tools as the decomposer lists them)."""
    from prour.demo.corpus import SFTExample
    from prour.env.environment import tool_schemas
    from prour.router.candidates import ToolCatalog, render_tools
    from prour.router.prompts import action_prompt, goal_prompt

    tools = render_tools(ToolCatalog(tool_schemas("retail")), "brief")
    histories = ("user: Hi, where is my order?", "user: I want to return a lamp.")
    prompts = [(goal_prompt(h), GOAL) for h in histories]
    prompts += [(action_prompt(h, tools, GOAL), RESPOND) for h in histories]
    examples = [SFTExample("decomposer", [{"role": "user", "content": prompt}],
                           {"role": "assistant", "content": reply}) for prompt, reply in prompts]
    folder = tmp_path_factory.mktemp("respond")
    learned_by_heart(tiny_model_dir, folder, examples, 60, max_tokens=4096)
    # retail's policy and tool schemas alone are ~9k tiny-tokenizer tokens: vLLM serves no prompt
    # past the config's positions (RoPE, no weights of its own, so only the limit changes)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    return folder


def served_recipe(tmp_path: Path, run_dir: Path, vllm_python: Path, served: Path,
                  generator: Path) -> Path:
    """paper.yaml's roles: the generator in process, every other role the one served model."""
    paper = yaml.safe_load(PAPER.read_text())
    roles = sorted(set(paper["models"]) - {"generator"} | set(PIPELINE_ROLES))
    openai = {"backend": "openai", "model": "tiny", "max_retries": 1, "timeout_s": 120}
    models: dict[str, Any] = {role: dict(openai) for role in roles}
    models["generator"] = {"backend": "hf", "path": str(generator), "device": "cpu",
                           "dtype": "float32", "max_model_len": 4096}
    calibration = tmp_path / "calibration-states"
    for split, ids in STATES.items():
        lines = [{"id": i, "domain": "retail",
                  "messages": [{"role": "user", "content": f"Hi, I need help with order {i}."}]}
                 for i in ids]
        (calibration / f"{split}.jsonl").parent.mkdir(parents=True, exist_ok=True)
        (calibration / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return write_recipe(tmp_path / "served.yaml", {
        "name": "served",
        "seed": 0,
        "run_dir": str(run_dir),
        "models": models,
        "env": {"max_steps": 4, "agent_max_tokens": 12, "user_max_tokens": 12},
        # two trials of one task: one trajectory for train, one for validation
        "data": {"domain": "retail", "max_tasks": 1, "num_trajectories": 2, "trial_seeds": [0, 1],
                 "concurrency": 1, "teacher_max_tokens": 8, "normalizer_max_tokens": 16,
                 "max_decisions": 2, "val_ratio": 0.5, "max_prompt_tokens": 1024},
        "router": {"n_interpretations": 2, "n_actions": 2, "goal_max_tokens": 12,
                   "action_max_tokens": 48, "action_temperature": 0.3, "tool_detail": "brief", "empty_route": "clarify",
                   "calibration": {"dev_states": str(calibration / "dev.jsonl"),
                                   "test_states": str(calibration / "test.jsonl")}},
        "reward": {"responder_max_tokens": 8, "verifier_max_steps": 1},
        "train": {"backend": "local", "val_file": None, "states_per_step": 1, "total_steps": 1,
                  "save_every": 1, "output_dir": str(tmp_path / "checkpoints"), "device": "cpu",
                  "dtype": "float32", "gradient_checkpointing": False,
                  "rollout": {"n": 2, "keep": 2, "max_response_tokens": 8},
                  "ppo": {"epochs": 1, "mini_batch_states": 1, "micro_batch_size": 1},
                  "wandb": {"track": False}},
        "eval": {"methods": ["prour"], "seeds": [0], "domains": ["retail"], "max_tasks": 1,
                 "concurrency": 1, "judge": False},
        "serve": {"python": str(vllm_python), "startup_timeout_s": 600,
                  "models": {"tiny": {"path": str(served), "dtype": "float32",
                                      "enforce_eager": True, "max_model_len": 16384}}},
    })


def reviewed_labels(run_dir: Path) -> None:
    """A reviewer's labels for the calibration states (clarify for all)."""
    folder = run_dir / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    for split, ids in STATES.items():
        lines = [{"state_id": i, "label": None, "corrected": "clarify"} for i in ids]
        (folder / f"labels_{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def status_lines(run_dir: Path, cluster: Any) -> tuple[int, str]:
    done = prour(cluster, "slurm", "status", str(run_dir))
    return done.returncode, done.stdout + done.stderr


def stage_log(manifest: dict, stage: str) -> Path:
    entry = next(e for e in manifest["stages"] if e["stage"] == stage)
    return Path(entry["tasks"][0]["log"] if entry["tasks"] else entry["log"])


def test_paper_shaped_pipeline_served_through_slurm_then_a_killed_server_fails_eval(
    slurm_cluster: Any, vllm_python: Path, tiny_model_dir: Path, respond_model: Path,
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    recipe = served_recipe(tmp_path, run_dir, vllm_python, respond_model, tiny_model_dir)
    reviewed_labels(run_dir)
    manifest = submit(slurm_cluster, recipe, run_dir, STAGES, [])
    assert [e["stage"] for e in manifest["stages"]] == [*STAGES.split(","), "serve_stop"]
    wait_done(slurm_cluster, manifest, TIMEOUT_S)
    code, shown = status_lines(run_dir, slurm_cluster)
    assert code == 0 and "all stages done" in shown, shown
    for stage in STAGES.split(","):
        name = "eval.0" if stage == "eval" else stage
        assert status_of(run_dir, name)["rc"] == "0", (stage, shown)
        assert re.search(rf"^{re.escape(stage)}\S*\s.*\sCOMPLETED\s", shown, re.MULTILINE), shown
    # every stage left its product
    assert (run_dir / "data" / "trajectories.jsonl").read_text().strip()
    assert (run_dir / "data" / "goals.jsonl").read_text().strip()
    thresholds = json.loads((run_dir / "calibration" / "thresholds.json").read_text())
    assert "tiny" in json.dumps(thresholds)  # stored for the served decomposer's model id
    assert (run_dir / "data" / "dataset" / "train.parquet").is_file()
    step = tmp_path / "checkpoints" / "step_1"
    assert f"exported: {step}" in stage_log(manifest, "export").read_text()
    results = [json.loads(x) for x in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in results] == ["prour"] and not any(r["error"] for r in results)
    evaluated = yaml.safe_load((run_dir / "eval" / "recipe.resolved.yaml").read_text())
    assert evaluated["models"]["generator"]["path"] == str(step.resolve())
    assert (run_dir / "eval" / "report" / "report.md").read_text().startswith("# Evaluation")
    endpoints = json.loads((run_dir / "endpoints.json").read_text())
    command = " ".join(endpoints["servers"]["tiny"]["command"])
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in command

    # The same servers again, for an eval only; the server dies once the eval has started.
    killed_dir = tmp_path / "killed"
    second = submit(slurm_cluster, recipe, killed_dir, "serve,eval",
                    ["eval.methods=[base]", "eval.max_tasks=2"])
    pid, base_url = kill_server_once_eval_runs(killed_dir, stage_log(second, "eval"))
    wait_done(slurm_cluster, second, TIMEOUT_S)
    assert status_of(killed_dir, "eval.0")["rc"] != "0"
    code, shown = status_lines(killed_dir, slurm_cluster)
    assert code == 1, shown
    assert re.search(r"^eval\[0\].*\sFAILED\s", shown, re.MULTILINE), shown
    failures = shown.split("failed stage: ")[1:]
    eval_failure = next(f for f in failures if f.startswith("eval "))
    cause = next(line for line in eval_failure.splitlines() if line.startswith("cause: "))
    assert cause.startswith("cause: error: ") and base_url in cause, shown  # names the server
    serve_failure = next((f for f in failures if f.startswith("serve ")), None)
    assert serve_failure is not None, shown
    assert f"pid {pid}" in serve_failure and "exited while serving" in serve_failure, shown


def kill_server_once_eval_runs(
    run_dir: Path, eval_log: Path, timeout_s: float = TIMEOUT_S
) -> tuple[int, str]:
    """SIGKILL the vLLM server (its process group) once the eval task got past its endpoint wait;
    returns its pid and base URL."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = eval_log.read_text() if eval_log.is_file() else ""
        if '"status": "ready"' in text:
            server = json.loads((run_dir / "endpoints.json").read_text())["servers"]["tiny"]
            os.killpg(server["pid"], signal.SIGKILL)
            return server["pid"], server["base_url"]
        time.sleep(1)
    raise AssertionError(f"the eval task never got its endpoints: {eval_log}")
