"""Preflight checks and local weights: each problem is one line naming what is missing and the fix.

Real checks on this machine (no GPUs, no hub, no vLLM in the main venv); the endpoint checks probe
a closed 127.0.0.1 port and a tiny local HTTP server speaking the OpenAI model list.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import wall_clock
from typer.testing import CliRunner

from prour.cli.main import app
from prour.cluster.endpoints import PROBE_TIMEOUT_S, probe_endpoint
from prour.config import parse_recipe
from prour.llm.weights import MODELS_DIR_ENV, ModelNotFound, local_weights
from prour.preflight import (
    check_endpoints,
    check_paths,
    preflight,
    visible_gpus,
)
from prour.recipes import load_recipe

PAPER = Path(__file__).resolve().parents[1] / "recipes" / "paper.yaml"


@pytest.fixture(autouse=True)
def _clean_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No models folder, an empty HF cache and no GPUs, whatever the machine has."""
    monkeypatch.delenv(MODELS_DIR_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


# ---- local weights ---------------------------------------------------------------------------


def test_lookup_order_recipe_dir_then_env_dir_full_id_then_last_part(tmp_path, monkeypatch):
    recipe_dir, env_dir = tmp_path / "recipe-models", tmp_path / "env-models"
    short = _model(env_dir / "Qwen3-1.7B")
    monkeypatch.setenv(MODELS_DIR_ENV, str(env_dir))
    assert local_weights("Qwen/Qwen3-1.7B") == str(short)  # <dir>/<last part>
    full = _model(env_dir / "Qwen" / "Qwen3-1.7B")
    assert local_weights("Qwen/Qwen3-1.7B") == str(full)  # <dir>/<id> comes first
    mine = _model(recipe_dir / "Qwen3-1.7B")
    assert local_weights("Qwen/Qwen3-1.7B", str(recipe_dir)) == str(mine)  # recipe before env
    folder = _model(tmp_path / "checkpoint")
    assert local_weights(str(folder), str(recipe_dir)) == str(folder)  # a folder is itself


def test_the_hugging_face_cache_is_read_without_the_network(tmp_path):
    repo = tmp_path / "hf-cache" / "models--Qwen--Qwen3-8B"
    snapshot = _model(repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    assert Path(local_weights("Qwen/Qwen3-8B")) == snapshot


def test_a_missing_model_is_one_line_at_once_naming_id_folders_and_fix(tmp_path, monkeypatch):
    """At once: the lookup reads local folders only (a network call fails the test), so it has no
    timeout to wait for and its bound is the bare allowance."""
    def no_network(*args, **kwargs):
        raise AssertionError("local_weights opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    models = tmp_path / "models"
    models.mkdir()
    started = time.monotonic()
    with pytest.raises(ModelNotFound) as info:
        local_weights("Qwen/Qwen3-1.7B", str(models), "models.generator.path")
    assert time.monotonic() - started < wall_clock.bound(0.0)
    message = str(info.value)
    assert "\n" not in message
    assert "'Qwen/Qwen3-1.7B' (models.generator.path) has no local weights" in message
    for looked in (models / "Qwen" / "Qwen3-1.7B", models / "Qwen3-1.7B", tmp_path / "hf-cache"):
        assert str(looked) in message
    assert f"hf download Qwen/Qwen3-1.7B --local-dir {models}/Qwen/Qwen3-1.7B" in message


def test_a_folder_without_model_files_and_a_wrong_path_are_named(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFound, match="holds neither config.json nor tokenizer_config.json"):
        local_weights(str(empty))
    with pytest.raises(ModelNotFound, match="fix the path"):
        local_weights(str(tmp_path / "nowhere"))


# ---- endpoints -----------------------------------------------------------------------------


class _ModelList(BaseHTTPRequestHandler):
    served = "tiny"

    def do_GET(self) -> None:
        ok = self.path == "/v1/models"
        body = json.dumps({"object": "list", "data": [{"id": self.served}]}).encode()
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(body if ok else b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def healthy_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelList)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _openai_recipe(tmp_path: Path, base_url: str | None, model: str = "tiny"):
    role = {"backend": "openai", "model": model, **({"base_url": base_url} if base_url else {})}
    return parse_recipe({"name": "probe", "run_dir": str(tmp_path / "run"),
                         "models": {"agent": role, "user": role}})


def test_a_healthy_endpoint_passes_and_a_wrong_model_is_named(tmp_path, healthy_url):
    assert probe_endpoint(healthy_url, "tiny") is None
    assert check_endpoints(_openai_recipe(tmp_path, healthy_url), ["agent", "user"]) == []
    problems = check_endpoints(_openai_recipe(tmp_path, healthy_url, "Qwen/Qwen3-8B"), ["agent"])
    assert [p.line() for p in problems] == [
        (f"endpoint: models.agent: {healthy_url}/models serves ['tiny'], not 'Qwen/Qwen3-8B'; "
         "start the server or fix models.agent.base_url")]


def test_an_unreachable_endpoint_is_one_line_for_all_its_roles_and_fast(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    started = time.monotonic()
    problems = check_endpoints(_openai_recipe(tmp_path, url), ["agent", "user"])
    assert time.monotonic() - started < wall_clock.bound(PROBE_TIMEOUT_S)  # one probe of the URL
    assert len(problems) == 1
    line = problems[0].line()
    assert line.startswith(f"endpoint: models.agent, models.user: {url}/models is unreachable")


def test_no_base_url_names_the_endpoints_file(tmp_path):
    problems = check_endpoints(_openai_recipe(tmp_path, None), ["agent"])
    assert [p.check for p in problems] == ["endpoint"]
    assert f"the endpoints file {tmp_path / 'run' / 'endpoints.json'} does not exist" in \
        problems[0].message


# ---- paths, GPUs -------------------------------------------------------------------------------


def test_inputs_made_by_an_earlier_stage_of_the_run_need_not_exist(tmp_path):
    recipe = parse_recipe({"name": "paths", "run_dir": str(tmp_path / "run")})
    trajectories = tmp_path / "run" / "data" / "trajectories.jsonl"
    lines = [p.line() for p in check_paths(recipe, "extract")]
    assert f"path: data.trajectories: {trajectories} does not exist; run `prour collect` first" \
        in lines and len(lines) == 2
    assert check_paths(recipe, "extract", ["collect", "normalize", "extract"]) == []


def test_thresholds_where_calibrate_writes_them_satisfy_the_routing_stages(tmp_path):
    """No router.tau_*, no thresholds_file: extract reads <run_dir>/calibration/thresholds.json,
    and so does its preflight."""
    from prour.preflight import check_thresholds
    from prour.router.calibration import calibrate
    from prour.router.thresholds import decomposer_model_id, save_thresholds

    recipe = parse_recipe({"name": "routes", "run_dir": str(tmp_path / "run"),
                           "models": {"decomposer": {"backend": "openai", "model": "dec"}}})
    [missing] = check_thresholds(recipe, "extract")
    assert missing.check == "thresholds"
    model_id = decomposer_model_id(recipe.models["decomposer"])
    fit = calibrate([0.3, 0.0], [0.0, 0.0], ["clarify", "act"])
    save_thresholds(tmp_path / "run" / "calibration" / "thresholds.json", model_id, fit, "dev")
    assert check_thresholds(recipe, "extract") == []


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    assert visible_gpus() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert visible_gpus() == 2
    recipe = load_recipe(PAPER)
    assert [p for p in preflight(recipe, ["train"]) if p.check == "gpus"] == []


# ---- the paper recipe on this machine ----------------------------------------------------------


def _hub_ids(recipe) -> set[str]:
    """Every model the paper run loads: hf roles, the verl policy, the models `prour serve` starts."""
    from prour.cluster.recipe import served_models, served_roles

    ids = {cfg.path for cfg in recipe.models.values() if cfg.backend == "hf"}
    ids |= {spec.path or model_id for model_id, spec in served_models(recipe).items()
            if served_roles(recipe)[model_id]}
    if recipe.train is not None and recipe.train.backend == "verl":
        generator = recipe.models["generator"]
        ids.add(generator.path or generator.model)
    return ids


def _problem_lines(output: str, check: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"error: {check}: ")]


def test_validate_preflight_names_missing_weights_gpus_and_extras_one_line_each(tmp_path):
    result = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)])
    assert result.exit_code == 2
    lines = result.output.splitlines()  # the protocol's notes, then one error line per problem
    assert lines and all(line.startswith(("error: ", "note: ")) for line in lines)
    assert [line for line in lines if line.startswith("error: ")]
    recipe = load_recipe(PAPER)
    weights = _problem_lines(result.output, "weights")
    for hub_id in _hub_ids(recipe):
        assert sum(f"model {hub_id!r}" in line for line in weights) == 1, hub_id
    assert len(weights) == len(_hub_ids(recipe))
    needed = recipe.train.verl.n_gpus_per_node  # the paper's node: 2 GPUs, servers beside
    gpus = _problem_lines(result.output, "gpus")
    assert len(gpus) == 1 and gpus[0].startswith(f"error: gpus: GPUs visible: 0, needed: {needed} (")
    assert "train.verl.n_gpus_per_node" in gpus[0]
    absent = [m for m in ("verl", "ray", "vllm", "transfer_queue")
              if importlib.util.find_spec(m) is None]
    extras = _problem_lines(result.output, "extra")
    assert [line.split("`")[1] for line in extras if "train.backend=verl" in line] == absent

    models = tmp_path / "models"
    for hub_id in _hub_ids(recipe):
        _model(models / hub_id)
    again = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)],
                               env={MODELS_DIR_ENV: str(models)})
    assert _problem_lines(again.output, "weights") == []


def test_a_gpu_memory_plan_that_does_not_fit_is_one_line(monkeypatch, tmp_path):
    """Two servers at 0.5 of one 80 GiB GPU leave no room for their CUDA contexts (81 GiB)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    recipe = parse_recipe({
        "name": "tight", "run_dir": str(tmp_path / "run"),
        "models": {"user": {"backend": "openai", "model": "a"},
                   "judge": {"backend": "openai", "model": "b"}},
        "serve": {"models": {name: {"gpus": [0], "gpu_memory_utilization": 0.5}
                             for name in ("a", "b")}}})
    lines = [p.line() for p in preflight(recipe, ["serve"]) if p.check == "gpus"]
    assert len(lines) == 1 and lines[0].startswith(
        "gpus: the GPU memory plan of stage serve does not fit on 1 x 80 GiB: GPU 0 needs "
        "81.0 GiB > 80 GiB")


def test_a_stage_that_reaches_the_servers_over_http_needs_none_of_their_gpus():
    """A collect job (a Slurm job without GPUs) checks no GPU of the servers it calls; serve's
    own check counts them."""
    from prour.cluster.recipe import served_roles
    from prour.preflight import gpu_needs

    recipe = load_recipe(PAPER)
    # the exported generator's server is the eval step's (eval.generator_backend: vllm), once
    # export wrote its folder; the serve stage starts the frozen models a role calls (the
    # study's own, Qwen3-1.7B and GLM-4-32B, only its serving groups start)
    called = served_roles(recipe)
    assert {"Qwen/Qwen3-1.7B", "THUDM/GLM-4-32B-0414"} <= set(recipe.serve.models) - set(called)
    gpus = {model_id: max(spec.gpus) + 1 for model_id, spec in recipe.serve.models.items()
            if spec.gpus and model_id != "exported-generator" and model_id in called}
    assert gpus  # the paper places its servers on listed GPUs
    assert gpu_needs(recipe, ["collect"]) == {}
    assert gpu_needs(recipe, ["serve"]) == {f"serve.models.{m}.gpus": n for m, n in gpus.items()}


def test_a_fresh_run_folder_is_not_asked_for_what_the_chain_makes(tmp_path):
    """issue 23: the calibration states, the airline trajectories, labels, thresholds, dataset
    and checkpoints are all made by earlier steps of the chain, so the whole-run preflight of
    paper.yaml on an empty run folder names none of them (only weights, extras and GPUs)."""
    run_dir = tmp_path / "fresh"
    result = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER), "--set",
                                      f"run_dir={run_dir}"])
    assert result.exit_code == 2
    checks = {line.split(":")[1].strip() for line in result.output.splitlines()
              if line.startswith("error: ")}
    assert checks and checks <= {"weights", "extra", "gpus"}, result.output
    assert not run_dir.exists() or not any(run_dir.rglob("*.jsonl"))


def test_a_step_whose_outputs_exist_needs_none_of_its_inputs(tmp_path):
    """Calibration states already sampled (here: written by hand, as paper-attention reads the
    paper run's): the calibrate stage no longer needs the trajectories they came from."""
    from prour.preflight import check_paths

    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}"])
    missing = {p.message.split(":")[0] for p in check_paths(recipe, "calibrate")}
    assert missing == {"collect-dev (--set data.trajectories)",
                       "collect-airline (--set data.trajectories)"}
    for split in ("dev", "test"):
        path = tmp_path / "calibration" / f"{split}_states.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"id": "s1", "messages": []}\n')
    assert check_paths(recipe, "calibrate") == []


def test_a_missing_local_model_folder_names_the_command_that_builds_the_tiny_model(
    tmp_path, monkeypatch,
):
    """A relative folder (not a hub id) that does not exist: no `hf download` of a path; the hint
    builds the CPU recipes' tiny model there, and runs as printed."""
    import shlex

    from prour.llm.weights import missing_message

    monkeypatch.chdir(tmp_path)
    folder = "./runs/tiny"
    message = missing_message(folder, None, "models.generator.path")
    assert "hf download" not in message
    command = message.split("`")[1]
    assert command == f"prour tiny-model {folder}"
    result = CliRunner().invoke(app, [*shlex.split(command)[1:], "--no-warm-start"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "tiny" / "config.json").is_file()
