"""The rehearsal through the local single-node Slurm: `prour slurm submit --recipe
recipes/rehearsal.yaml` (no --stages) from an empty run folder.

Three methods are evaluated and the sweeps are left out (see SETS: the in-process rehearsal runs
every one). The first submission runs collect, normalize and calibrate, whose job ends at the
review gate; `prour slurm status` says so and prints the approve command, which, run as printed, submits the
rest of the chain to the report. Every job must be COMPLETED and the report must have a row for
every method of the recipe. The one model every role uses is the tiny Qwen3 that `prour
tiny-model` builds (the recipe's relative path, from the working folder of the submission),
served by the vLLM CPU server inside each job that calls it.
Needs root (Slurm) and the vLLM venv; PROUR_REQUIRE_SLURM=1 / PROUR_REQUIRE_VLLM=1 make a
missing one fail instead of skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rehearsal_report import TINY_MODEL_ARGS, every_method_reported
from test_slurm_local import REPO, job_logs, wait_done

from prour.recipes import load_recipe

# `full`: each of its nine jobs starts Python, and most a vLLM server, on its own (~8 min on two
# cores); CI runs the same chain in process (tests/cli/test_rehearsal.py) and Slurm's jobs,
# gate rendering and served steps in the shorter tests beside this one
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.slow, pytest.mark.full]

REHEARSAL = REPO / "recipes" / "rehearsal.yaml"
CHAIN = ["collect", "normalize", "calibrate", "extract", "train", "export", "eval", "report"]
GATED = CHAIN[:3]
TIMEOUT_S = 1200
# every method and the sweeps of Figures 5 and 8 run in tests/cli/test_rehearsal.py's chain;
# here, through Slurm, they would only lengthen the eval job: a baseline, prour's trained
# generator and IG-Clarifier's (its own training job) stand for them; posthoc still runs. The
# taxonomy (its annotation and review gate) and the generalization study (its serving groups)
# run in tests/cli/test_rehearsal.py's chain only.
SETS = ["eval.tradeoff.run=false", "eval.methods=[base,prour,ig-clarifier]", "taxonomy.run=false",
        "study.run=false"]


def prour(env: dict[str, str], cwd: Path, *args: str,
          timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prour.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def status(env: dict[str, str], cwd: Path, run_dir: Path) -> tuple[int, str]:
    done = prour(env, cwd, "slurm", "status", str(run_dir))
    return done.returncode, done.stdout + done.stderr


def states(shown: str) -> dict[str, str]:
    """Unit label -> state from the `prour slurm status` table."""
    found = {}
    for line in shown.splitlines():
        match = re.match(r"^(\S+(?: \(before-review\))?)\s+(\d+)\s+(\S+)\s", line)
        if match:
            found[match.group(1)] = match.group(3)
    return found


def test_the_rehearsal_chain_through_slurm_stops_at_the_gate_then_reaches_the_report(
    slurm_cluster: Any, vllm_python: Path, tmp_path: Path,
    rehearsal_model: Callable[[Path], None],
) -> None:
    work = tmp_path / "work"  # the submission's working folder: runs/tiny-model lives here
    work.mkdir()
    rehearsal_model(work)  # the session's build: `prour tiny-model` below finds it and reuses it
    env = {**slurm_cluster.env(), "PROUR_VLLM_PYTHON": str(vllm_python),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    built = prour(env, work, *TINY_MODEL_ARGS)
    assert built.returncode == 0, built.stderr
    run_dir = tmp_path / "run"
    first = prour(env, work, "slurm", "submit", "--recipe", str(REHEARSAL),
                  "--run-dir", str(run_dir), *(a for item in SETS for a in ("--set", item)))
    assert first.returncode == 0, first.stderr
    manifest = json.loads((run_dir / "slurm_jobs.json").read_text())
    assert [e["stage"] for e in manifest["stages"]] == GATED
    approve = first.stdout.strip().splitlines()[-1].strip()
    assert approve == shlex.join(["prour", "slurm", "submit", "--recipe", str(REHEARSAL),
                                  "--run-dir", str(run_dir),
                                  *(a for item in SETS for a in ("--set", item)),
                                  "--approve-labels"]), first.stdout
    wait_done(slurm_cluster, manifest, TIMEOUT_S)

    code, shown = status(env, work, run_dir)
    assert code == 0, shown + job_logs(run_dir)
    assert states(shown) == dict.fromkeys(GATED, "COMPLETED"), shown + job_logs(run_dir)
    assert "waiting at the review gate" in shown and f"\n  {approve}\n" in shown, shown
    calibrate_log = Path(manifest["stages"][-1]["log"]).read_text()
    recipe = load_recipe(REHEARSAL, [f"run_dir={run_dir}", *SETS])
    labels = run_dir / "calibration" / "labels_dev.jsonl"
    assert labels.is_file() and str(labels) in calibrate_log, calibrate_log
    assert not (run_dir / "calibration" / "thresholds.json").exists()  # the search waits
    assert calibrate_log.rstrip().endswith(approve)  # the gate names the command that continues

    argv = shlex.split(approve)
    assert argv[0] == "prour"
    second = prour(env, work, *argv[1:])
    assert second.returncode == 0, second.stderr
    manifest = json.loads((run_dir / "slurm_jobs.json").read_text())
    # collect and normalize are complete: the approved chain starts at calibrate
    assert [e["stage"] for e in manifest["stages"]] == CHAIN[2:]
    wait_done(slurm_cluster, manifest, TIMEOUT_S)

    code, shown = status(env, work, run_dir)
    assert code == 0 and "all stages done" in shown, shown + job_logs(run_dir)
    expected = {**{f"{s} (before-review)": "COMPLETED" for s in GATED},
                **dict.fromkeys(CHAIN[2:], "COMPLETED")}
    assert states(shown) == expected, shown
    assert (run_dir / "calibration" / "labels.approved.json").is_file()
    rows = every_method_reported(run_dir, recipe)
    final = run_dir / "checkpoints" / f"step_{recipe.train.total_steps}"
    assert f"prour (generator rehearsal step {recipe.train.total_steps})" in rows  # trained one
    evaluated = (run_dir / "eval" / "recipe.resolved.yaml").read_text()
    assert str(final.resolve()) in evaluated  # the trained generator was the one evaluated
