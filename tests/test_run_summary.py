"""What `prour run` says about the node (prour/run_summary.py): where each step's models run, and
the end table of what ran where and how long, read from the steps' stamps."""

from __future__ import annotations

import time
from pathlib import Path

from prour.recipes import load_recipe
from prour.run_summary import run_table, step_servers, where
from prour.runner import read_stamp, skip_reason, write_stamp
from prour.stages import get_step

ROOT = Path(__file__).resolve().parents[1]


def test_where_each_step_of_the_paper_runs() -> None:
    """paper.yaml places the 8B on GPU 1 and the 32B on GPUs 0 and 1; verl trains on both."""
    paper = load_recipe(ROOT / "recipes" / "paper.yaml", cluster=True)
    expected = {
        "collect-retail": "Qwen/Qwen3-8B vLLM on GPU 1; Qwen/Qwen3-32B vLLM on GPU 0,1",
        "annotate": "Qwen/Qwen3-32B vLLM on GPU 0,1",
        "search": "Qwen/Qwen3-8B vLLM on GPU 1",
        "train": "verl trainer on GPU 0-1; Qwen/Qwen3-8B vLLM on GPU 1",
        # eval.generator_backend vllm: the generator is the exported checkpoint's server
        "eval": "Qwen/Qwen3-8B vLLM on GPU 1; exported-generator vLLM on GPU 0",
        "export": "CPU",
        "report": "CPU",
    }
    assert {name: where(paper, get_step(name)) for name in expected} == expected
    assert step_servers(paper, get_step("train")) == {
        "Qwen/Qwen3-8B": ["strict_user", "verifier"]}
    hf = load_recipe(ROOT / "recipes" / "paper.yaml", ["eval.generator_backend=hf"],
                     cluster=True)
    assert where(hf, get_step("eval")) == "Qwen/Qwen3-8B vLLM on GPU 1; generator in process (auto)"


def test_the_end_table_says_what_ran_where_and_how_long(tmp_path: Path) -> None:
    smoke = load_recipe(ROOT / "recipes" / "gpu-smoke.yaml", [f"run_dir={tmp_path}"],
                        cluster=True)
    since = time.time()
    before = since - 3600
    write_stamp(smoke, get_step("collect-retail"), "prour collect", before, before + 61)
    write_stamp(smoke, get_step("normalize"), "prour normalize", since + 1, since + 6)
    write_stamp(smoke, get_step("train"), "prour train", since + 10, since + 10 + 3725)
    names = ["serve", "collect-retail", "normalize", "review", "train", "export"]
    lines = run_table(smoke, read_stamp, names, since, skip_reason).splitlines()
    rows = {line.split()[0]: line for line in lines[2:] if "/" in line.split()[0]}
    assert list(rows) == ["serve/serve", "collect/collect-retail", "normalize/normalize", "calibrate/review",
                          "train/train", "export/export"]
    assert rows["collect/collect-retail"].split()[1:3] == ["done", "before"]
    assert rows["collect/collect-retail"].endswith(" 1:01")
    assert rows["normalize/normalize"].split()[1] == "ran"
    assert rows["normalize/normalize"].endswith(" 0:05")
    assert "Qwen/Qwen3-0.6B vLLM on GPU 0" in rows["normalize/normalize"]
    assert "verl trainer on GPU 0; Qwen/Qwen3-0.6B vLLM on GPU 0" in rows["train/train"]
    assert rows["train/train"].endswith(" 1:02:05")
    assert rows["calibrate/review"].split()[1] == "waiting"
    assert rows["serve/serve"].split()[1:] == ["skipped"]  # prour run serves per step
    assert rows["export/export"].split()[1:3] == ["not", "run"]
    assert lines[-1].startswith("  this run: 2 step(s), 1:02:10 in steps, 1:02:14 wall clock")
