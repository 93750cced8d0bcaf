"""eval.generator_backend: vllm: eval's query generator is a vLLM server of the exported checkpoint.

The eval step serves it (the runner starts it before eval, after export wrote the folder), eval
takes its URL from the endpoints file and refuses a file without it or with a server of another
folder, and eval's concurrency is capped by the servers' max_num_seqs. The rehearsal
(tests/cli/test_rehearsal.py) runs it on the real vLLM CPU server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.cluster.endpoints import EndpointsError, write_endpoints
from prour.cluster.recipe import (
    EXPORTED_GENERATOR,
    connect_served_generator,
    eval_concurrency,
)
from prour.cluster.serve import plan_servers
from prour.recipes import load_recipe
from prour.run_summary import step_servers as served_models_of
from prour.stages import get_step

REHEARSAL = Path(__file__).resolve().parents[2] / "recipes" / "rehearsal.yaml"


def recipe_at(tmp_path: Path, *items: str):
    return load_recipe(REHEARSAL, [f"run_dir={tmp_path / 'run'}", "eval.concurrency=8",
                                   f"serve.models.{EXPORTED_GENERATOR}.max_num_seqs=3", *items],
                       cluster=True)


def server(path: Path, port: int) -> dict:
    return {"base_url": f"http://127.0.0.1:{port}/v1", "model": EXPORTED_GENERATOR,
            "path": str(path), "roles": ["generator"], "pid": None}


def test_the_eval_step_serves_the_exported_checkpoint_and_eval_connects_to_it(
    tmp_path: Path,
) -> None:
    recipe = recipe_at(tmp_path)
    final = tmp_path / "run" / "checkpoints" / f"step_{recipe.train.total_steps}"
    # eval calls the generator through one more server; train's policy stays in process
    eval_step, train_step = get_step("eval"), get_step("train")
    assert served_models_of(recipe, eval_step)[EXPORTED_GENERATOR] == ["generator"]
    assert EXPORTED_GENERATOR not in served_models_of(recipe, train_step)
    plan = {p.model_id: p for p in plan_servers(eval_step.served_recipe(recipe), ["generator"])}
    assert plan[EXPORTED_GENERATOR].spec.path == str(final)
    assert plan[EXPORTED_GENERATOR].spec.max_num_seqs == 3

    endpoints = tmp_path / "run" / "endpoints.json"
    with pytest.raises(EndpointsError, match=rf"{endpoints}.*no ready server '{EXPORTED_GENERATOR}'"):
        connect_served_generator(recipe, final)
    write_endpoints(endpoints, {"status": "ready", "servers": {
        EXPORTED_GENERATOR: server(tmp_path / "elsewhere", 8001)}})
    with pytest.raises(EndpointsError, match=r"serves .*elsewhere, not the checkpoint"):
        connect_served_generator(recipe, final)
    write_endpoints(endpoints, {"status": "ready", "servers": {
        EXPORTED_GENERATOR: server(final, 8002)}})
    served = connect_served_generator(recipe, final)
    generator = served.models["generator"]
    assert (generator.backend, generator.model, generator.base_url) == \
        ("openai", EXPORTED_GENERATOR, "http://127.0.0.1:8002/v1")
    # min(eval.concurrency 8, the generator server's 3; tiny's server sets no cap)
    assert eval_concurrency(served) == 3
    assert eval_concurrency(recipe_at(tmp_path, "eval.generator_backend=hf")) == 8


def test_eval_without_the_generator_server_stops_naming_the_endpoints_file(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "step_2"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"")
    (checkpoint / "tokenizer_config.json").write_text("{}")
    result = CliRunner().invoke(app, [
        "eval", "--recipe", str(REHEARSAL), "--set", f"run_dir={tmp_path / 'run'}",
        "--checkpoint", str(checkpoint), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"{tmp_path / 'run' / 'endpoints.json'} has no ready server" in result.output
    assert not (tmp_path / "run" / "eval").exists()
