"""serve.colocate_train: false: the train step starts no server of its own and reaches those of a
`prour serve` on another node through the recipe's endpoints file, waiting until it says ready;
slurm.<stage>.nodelist pins a job to nodes. The two-node run of it with the real vLLM server is
tests/cluster/test_serve_train_nodes.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import write_recipe

from prour.cluster.endpoints import write_endpoints
from prour.cluster.serve import ServeError
from prour.recipes import load_recipe
from prour.run_servers import StepServers
from prour.run_summary import server_lines, where
from prour.runner import Runner, RunOptions
from prour.stages import get_step

URL = "http://10.9.9.1:8123/v1"


def recipe_at(tmp_path: Path, *items: str):
    path = write_recipe(tmp_path / "apart.yaml", {
        "name": "apart",
        "run_dir": str(tmp_path / "run"),
        "models": {
            "generator": {"backend": "hf", "path": str(tmp_path / "policy")},
            "strict_user": {"backend": "openai", "model": "tiny"},
            "verifier": {"backend": "openai", "model": "tiny"},
        },
        "train": {"backend": "local", "device": "cpu"},
        "serve": {"colocate_train": False, "startup_timeout_s": 10,
                  "models": {"tiny": {"path": str(tmp_path / "tiny")}}},
    })
    return path, load_recipe(path, list(items), cluster=True)


def ready(path: Path, servers: dict) -> None:
    write_endpoints(path, {"status": "ready", "node": "node1", "servers": servers})


def test_the_train_step_waits_for_the_servers_of_another_node_and_starts_none(
    tmp_path: Path,
) -> None:
    path, recipe = recipe_at(tmp_path)
    train = get_step("train")
    endpoints = tmp_path / "run" / "endpoints.json"
    write_endpoints(endpoints, {"status": "starting", "servers": {}})
    said: list[str] = []
    servers = StepServers(recipe, tmp_path / "run" / "endpoints" / "mine.json", said.append)
    later = threading.Timer(1.0, ready, (endpoints, {"tiny": {
        "base_url": URL, "roles": ["strict_user", "verifier"]}}))
    later.start()
    started = time.monotonic()
    servers.ensure(train)
    later.join()
    assert time.monotonic() - started >= 1.0  # it waited for the file to say ready
    assert servers.groups == {}  # and started nothing here
    assert said[-1] == f"   using the servers of `prour serve` on node1: tiny at {URL}"
    assert not (tmp_path / "run" / "endpoints" / "mine.json").exists()
    # the step's command reads the recipe's endpoints file, not this runner's own
    argv = Runner(recipe, RunOptions(str(path))).command(train)
    assert not any(item.startswith("endpoints_file=") for item in argv)
    assert where(recipe, train) == "local trainer on cpu; tiny vLLM on another node"
    assert server_lines(recipe, ["train"]) == [
        "servers: none (no selected step calls a served model)"]  # this run starts none
    beside = load_recipe(path, ["serve.colocate_train=true"], cluster=True)
    assert any(item.startswith("endpoints_file=")
               for item in Runner(beside, RunOptions(str(path))).command(train))


def test_no_servers_elsewhere_fails_the_train_step_naming_the_file_and_the_fix(
    tmp_path: Path,
) -> None:
    _, recipe = recipe_at(tmp_path, "serve.startup_timeout_s=0.5")
    train = get_step("train")
    endpoints = tmp_path / "run" / "endpoints.json"
    servers = StepServers(recipe, tmp_path / "mine.json", lambda line: None)
    with pytest.raises(ServeError, match=rf"{endpoints} not ready after 0.5 s \(status: "
                                         r"missing\).*prour slurm submit --stages serve"):
        servers.ensure(train)
    ready(endpoints, {"other": {"base_url": URL, "roles": ["judge"]}})
    with pytest.raises(ServeError, match=r"lists no server for tiny \(roles strict_user, "
                                         r"verifier\).*colocate_train: true"):
        servers.ensure(train)
    write_endpoints(endpoints, {"status": "stopped", "servers": {}})
    with pytest.raises(ServeError, match=r"are stopped"):
        servers.ensure(train)


def test_nodelist_pins_a_stage_job_to_its_nodes(tmp_path: Path) -> None:
    from prour.cluster.slurm import SubmitRequest, plan_stage

    path, recipe = recipe_at(tmp_path, "slurm.train.nodelist=node2", "slurm.serve.nodelist=node1")
    request = SubmitRequest(path, ["serve"], tmp_path / "run", [], tmp_path)
    scripts = {stage: plan_stage(recipe, request, stage).script for stage in ("serve", "train")}
    assert "#SBATCH --nodelist=node1\n" in scripts["serve"]
    assert "#SBATCH --nodelist=node2\n" in scripts["train"]
    assert "--nodelist" not in plan_stage(recipe, request, "eval").script  # unpinned
