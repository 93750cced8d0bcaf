"""``prour run`` through the taxonomy's two steps with a scripted annotator: the ``taxonomy`` step
labels every decision step of the retail and airline trajectories, the ``taxonomy-review`` gate
stops the chain naming the labels file, ``--approve-labels`` (or ``prour taxonomy --approve``, or
``taxonomy.approve_labels``) passes it, a later correction closes it again, and a rerun skips
both. The calibration review and this gate pass with the same flag (the runner's own gate for
calibration is tests/test_run_review_mix.py's)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from taxonomy_world import airline, retail, write_rules, write_trajectories

from prour.data.taxonomy_labels import APPROVAL_FILE, is_approved
from prour.recipes import load_recipe
from prour.stages import get_step

ROOT = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r"^== (\S+): (.*)$", re.MULTILINE)


def _recipe(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    write_trajectories(run / "data" / "trajectories.jsonl", retail())
    write_trajectories(run / "data" / "airline_trajectories.jsonl", airline())
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "taxonomy-gate", "run_dir": str(run),
        "models": {"annotator": {"backend": "scripted",
                                 "script": str(write_rules(tmp_path / "annotator.yaml"))}},
        # calibration states named: the chain collects airline, so the taxonomy reads it
        "router": {"calibration": {"test_states": "calibration/test_states.jsonl"}},
        "taxonomy": {"run": True, "annotator_attempts": 2}}))
    return path


def _run(recipe: Path, *more: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    done = subprocess.run([sys.executable, "-m", "prour.cli.main", *more, "--recipe",
                           str(recipe)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          check=False)
    return done, dict(STEP_LINE.findall(done.stdout))


def _correct(labels: Path, corrections: dict[str, str]) -> None:
    """What a reviewer does: set `corrected` on some lines."""
    lines = [json.loads(x) for x in labels.read_text().splitlines()]
    for line in lines:
        line["corrected"] = corrections.get(line["decision_id"], line["corrected"])
    labels.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_gate_stops_names_the_file_and_one_flag_passes_it(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    loaded = load_recipe(recipe)
    assert get_step("taxonomy").skip is None and get_step("taxonomy-review").is_gate
    labels = tmp_path / "run" / "taxonomy" / "labels.jsonl"
    only = ("run", "--only", "taxonomy,taxonomy-review")

    first, said = _run(recipe, *only)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert said["taxonomy"].startswith("done in")
    assert said["taxonomy-review"].startswith("the chain stops at the review gate")
    # the file to review with its counts (hand-counted in taxonomy_world), the unusable line
    # said, and the command that approves and goes on
    assert (f"   {labels}: 5 decision steps: world 2 (profile 1, tools 1), user 1 "
            "(preference 1), no uncertainty 1, no usable label 1") in first.stdout
    assert "1 line(s) without a usable label" in first.stdout
    assert (f"   then approve them and continue:\n   prour run --only taxonomy,taxonomy-review "
            f"--recipe {recipe} --approve-labels") in first.stdout
    assert len(labels.read_text().splitlines()) == 5 and not is_approved(labels.parent)

    _correct(labels, {"airline/1/s0/agent#0": "intent"})  # the unusable line, labelled
    second, said = _run(recipe, *only, "--approve-labels")
    assert second.returncode == 0, second.stdout[-3000:]
    assert said["taxonomy"].startswith("skipped (done")
    assert said["taxonomy-review"] == (
        "labels approved by --approve-labels: 5 decision steps: world 2 (profile 1, tools 1), "
        f"user 2 (intent 1, preference 1), no uncertainty 1 -> {labels.parent / APPROVAL_FILE}")
    assert is_approved(labels.parent)
    assert json.loads((labels.parent / APPROVAL_FILE).read_text())["by"] == "--approve-labels"

    third, said = _run(recipe, *only)  # nothing to do
    assert third.returncode == 0 and "start" not in third.stdout
    assert said == {"taxonomy": said["taxonomy"], "taxonomy-review": "skipped (done: labels "
                                                                     "approved)"}

    _correct(labels, {"retail/0/s0/agent#3": "history"})  # a later correction closes the gate
    _, said = _run(recipe, *only)
    assert said["taxonomy-review"].startswith("the chain stops at the review gate")
    cli, _ = _run(recipe, "taxonomy", "--approve")  # the command a person types instead
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == [
        (f"{labels}: 5 decision steps: world 3 (profile 1, tools 1, history 1), user 2 "
        "(intent 1, preference 1), no uncertainty 0"),
        f"approved -> {labels.parent / APPROVAL_FILE}"]
    assert is_approved(labels.parent)

    _correct(labels, {"retail/0/s0/agent#3": "none"})
    _, said = _run(recipe, *only, "--set", "taxonomy.approve_labels=true")
    assert said["taxonomy-review"].startswith("labels approved by taxonomy.approve_labels: ")
    assert loaded.taxonomy.approve_labels is False  # the recipe itself asks a person

    _correct(labels, {"retail/0/s0/agent#3": "clarify"})  # not a source: the gate fails
    wrong, said = _run(recipe, *only, "--approve-labels")
    assert wrong.returncode == 1
    assert said["taxonomy-review"] == (
        f"failed: {labels}:4: decision 'retail/0/s0/agent#3': unknown source 'clarify'; "
        "expected one of profile, tools, policy, computation, history, intent, preference")


def test_the_annotation_says_what_it_lacks(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    (tmp_path / "run" / "data" / "airline_trajectories.jsonl").unlink()
    done, _ = _run(recipe, "taxonomy")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    airline_file = tmp_path / "run" / "data" / "airline_trajectories.jsonl"
    assert "4 decision steps, 4 newly annotated -> " in done.stdout
    assert (f"lacking: {airline_file} (collect-airline (--set data.trajectories)) is not there "
            "yet: its decision steps are not annotated") in lines
    assert "4 decision steps: world 2 (profile 1, tools 1), user 1 (preference 1), no " \
           "uncertainty 1" in lines
    assert ("world/user share of the events: 66.7 % / 33.3 % (before review; the paper: "
            "89.1 % / 10.9 % of 19,022)") in lines
    # not done until the airline steps are there too; then only they are asked for
    assert not get_step("taxonomy").is_done(load_recipe(recipe))
    write_trajectories(airline_file, airline())
    again, _ = _run(recipe, "taxonomy")
    assert "5 decision steps, 1 newly annotated" in again.stdout
    assert ("lacking: 1 of 1 decision steps annotated now have no usable label (the annotator's "
            "reply never validated in 2 attempt(s))") in again.stdout
    assert get_step("taxonomy").is_done(load_recipe(recipe))
