"""The rehearsal: recipes/rehearsal.yaml (paper.yaml on the tiny model, served by the vLLM CPU
server) through `prour run` from an empty run folder, with no file made by hand: `prour
tiny-model` builds the model (it finds the session's build of the same command copied in, and
reuses it), then every step of the paper's chain runs (collect retail and airline, normalize, the
calibration states, annotate, the review gate (the test reviews: it corrects the tiny annotator's
unusable labels, then approves on the command line), threshold search, held-out, extract and the
ig-clarifier's own rows, train and export of both, eval of every method with the final
checkpoints, the budget and frequency sweeps, the post-hoc AU/EU pass, the taxonomy of every
decision step and its review gate (annotated while the chain waits at the first gate, reviewed
with it, approved by the same flag), report). The report's paper folder holds Tables 1-7 and
Figures 2 and 4-8 (Tables 2, 3, 4 and 7 from the study's grids), each checked against numbers
recomputed here from the run's own files. A stage that cannot get what it needs from a tiny model
completes and says what it lacked. Run again, every step is done; a changed decomposer key names
the stale steps.

Needs the vLLM venv (PROUR_REQUIRE_VLLM=1 makes a missing one fail instead of skip).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from rehearsal_report import (
    TINY_MODEL_ARGS,
    every_method_reported,
    paper_items_from_the_run,
    study_items_from_the_run,
    taxonomy_items_from_the_run,
)

from prour.recipes import load_recipe
from prour.stages import STAGES

# the whole chain twice (to the gate, then on) plus the rerun: ~8 min alone on 2 cores with the
# study cut (CI), ~10 min whole (`full`), more under load; each prour call has its own timeout
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
REHEARSAL = REPO / "recipes" / "rehearsal.yaml"


def prour(cwd: Path, vllm_python: Path, *args: str, timeout: float = 900):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROUR_VLLM_PYTHON": str(vllm_python)}
    return subprocess.run([sys.executable, "-m", "prour.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


# The CI cut of the study (Tables 2, 3, 4 and 7): every table keeps a row of each kind (the
# trained generator beside the prompted one in Table 2, the served and in-process agents in Table 3,
# both threshold sources in Table 7, a baseline beside prour on each τ³ domain in Table 4), the
# tables on the base tasks on retail alone: 14 study episodes where the whole rehearsal runs 43.
CI_CUT = (
    "study.grids.table3.axes.generator=[trained]",
    "study.grids.table7.axes.generator=[trained]",
    "study.grids.table4.methods=[base, prour]",
    *(f"study.grids.{grid}.domains=[retail]"
      for grid in ("table2", "table3", "table3-base", "table7", "table7-base")),
)


@pytest.mark.parametrize("cut", [
    pytest.param(CI_CUT, id="study-cut"),
    pytest.param((), id="whole", marks=pytest.mark.full),
])
def test_the_rehearsal_runs_the_papers_chain_from_an_empty_run_folder(
    tmp_path: Path, vllm_python: Path, rehearsal_model: Callable[[Path], None],
    cut: tuple[str, ...],
) -> None:
    sets = [part for item in cut for part in ("--set", item)]
    rehearsal_model(tmp_path)  # the session's build: the command below finds it and reuses it
    built = prour(tmp_path, vllm_python, *TINY_MODEL_ARGS)
    assert built.returncode == 0, built.stdout + built.stderr
    # the run folder the chain writes (its outputs' paths, as the eval run recorded them)
    recipe = load_recipe(REHEARSAL, [*cut, f"run_dir={tmp_path / 'runs' / 'rehearsal'}"])
    assert not Path(tmp_path / "runs" / "rehearsal").exists()  # nothing made beforehand

    # first the chain stops at the review gate; the test is the reviewer: the tiny annotator's
    # labels are unusable, so it corrects every line (act, clarify, verify in turn) and approves
    first = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets)
    annotated = first.stdout + first.stderr
    assert first.returncode == 0 and "--approve-labels" in annotated, annotated[-6000:]
    calibration = tmp_path / "runs" / "rehearsal" / "calibration"
    unusable = {}
    walk = json.loads((calibration / "dev_mix.json").read_text())  # as annotated, before review
    for split in ("dev", "test"):
        path = calibration / f"labels_{split}.jsonl"
        labels = [json.loads(x) for x in path.read_text().splitlines()]
        unusable[split] = sum(not (x["corrected"] or x["label"]) for x in labels)
        for i, line in enumerate(labels):
            line["corrected"] = ("act", "clarify", "verify")[i % 3]
        path.write_text("".join(json.dumps(x) + "\n" for x in labels))
    # the taxonomy (A.1) runs after the eval; while the chain waits here, its step annotates
    # every decision step of the collected trajectories so that one review covers both label
    # files: the tiny annotator's strict-JSON replies rarely validate, so the reviewer labels
    # every line (a source or none in turn, both sides among them)
    taxonomy = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets, "--only",
                     "taxonomy")
    annotated += taxonomy.stdout + taxonomy.stderr
    assert taxonomy.returncode == 0, annotated[-6000:]
    tax_path = tmp_path / "runs" / "rehearsal" / "taxonomy" / "labels.jsonl"
    tax_lines = [json.loads(x) for x in tax_path.read_text().splitlines()]
    tax_unusable = sum(x["annotation"] is None for x in tax_lines)
    assert ("have no usable label (the annotator's reply never validated"
            in " ".join(annotated.split())) == bool(tax_unusable), annotated[-3000:]
    for i, line in enumerate(tax_lines):
        line["corrected"] = ("tools", "preference", "policy", "none", "profile", "intent")[i % 6]
    tax_path.write_text("".join(json.dumps(x) + "\n" for x in tax_lines))
    run = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets,
                "--approve-labels")
    shown = annotated + run.stdout + run.stderr
    assert run.returncode == 0, shown[-6000:]
    # every step of the table ran (serve: prour run serves each step's models itself; a local
    # run's export finds the step folder train wrote already a Hugging Face folder: done)
    # (the study's judge, second judge and ask-less report: no attention variant to judge, and
    # its tables are the paper report's: skipped, saying why)
    from prour.run_state import skip_reason

    for step in [step for stage in STAGES for step in stage.steps]:
        name = step.name
        if name == "serve":
            continue
        if skip_reason(recipe, step) is not None:
            assert re.search(rf"^== {re.escape(name)}: skipped \(", shown, re.MULTILINE), name
            continue
        ended = (rf"^== {re.escape(name)}: (done in|labels approved by --approve-labels"
                 + (r"|skipped \(done)" if name in ("export", "export-ig-clarifier",
                                                    "nl-assertions") else ")"))
        assert re.search(ended, shown, re.MULTILINE), (name, shown[-6000:])
    run_dir = tmp_path / "runs" / "rehearsal"
    # collect: one task (data.max_tasks) x two trials, retail and airline; the reserve's task
    # (data.calibration_reserve) x two trials for the dev states
    from prour.data.reserve import reserve_task_ids, training_task_ids

    reserve = set(reserve_task_ids(recipe.data))
    for name, domain in (("trajectories", "retail"), ("airline_trajectories", "airline"),
                         ("calibration_dev_trajectories", "retail")):
        lines = (run_dir / "data" / f"{name}.jsonl").read_text().splitlines()
        assert [json.loads(x)["domain"] for x in lines] == [domain] * 2
        tasks = {json.loads(x)["task_id"] for x in lines}
        if name == "trajectories":
            assert tasks <= set(training_task_ids(recipe.data)) and not tasks & reserve
        elif domain == "retail":
            assert tasks == reserve
    # calibration: test, n_states with a label line each; dev, every state of the reserve's
    # trajectories as candidates, labelled in their order (a prefix), the mix stored
    test_states = (calibration / "test_states.jsonl").read_text().splitlines()
    assert len(test_states) == len((calibration / "labels_test.jsonl").read_text().splitlines()) \
        == recipe.router.calibration.n_states
    candidates = [json.loads(x) for x in (calibration / "dev_states.jsonl").read_text().splitlines()]
    assert candidates and {c["task_id"] for c in candidates} == reserve
    labelled = [json.loads(x)["state_id"] for x in
                (calibration / "labels_dev.jsonl").read_text().splitlines()]
    assert labelled == [c["id"] for c in candidates][: len(labelled)]
    mix = json.loads((calibration / "dev_mix.json").read_text())
    assert set(mix["kept"]) <= set(labelled) and "dev mix: " in shown
    lacked = f"dev states: {mix['candidates_walked']} candidates labelled"
    after = " ".join((run.stdout + run.stderr).split())  # the walk the search used, reviewed
    assert (lacked in after) == bool(mix["short"]), mix
    thresholds = json.loads((run_dir / "calibration" / "thresholds.json").read_text())
    # the search's, and the study's second decomposer (Table 7: the tiny model in process,
    # recalibrated on the same reviewed dev states in its own cache)
    from prour.router.pipeline import decomposer_tag

    second = "hf:./runs/tiny-model"  # models.decomposer.path as the recipe writes it
    assert sorted(thresholds) == sorted(["openai:tiny", second]), list(thresholds)
    assert (calibration / f"uncertainty_dev.{decomposer_tag(second)}.jsonl").is_file()
    approval = json.loads((run_dir / "calibration" / "labels.approved.json").read_text())
    assert approval  # approved on the command line (--approve-labels)
    # train -> export: the final step, what eval loaded
    final = run_dir / "checkpoints" / f"step_{recipe.train.total_steps}"
    assert (final / "config.json").is_file()
    # eval's generator requests went to the vLLM server of that folder (eval.generator_backend:
    # vllm): the endpoint eval recorded is the server that loaded the export, and its request log
    # holds one request per generator call the episodes of eval and its sweeps counted (the
    # routed methods ask: empty decisions go to clarify; llm-router's fallback asks)
    evaluated = yaml.safe_load((run_dir / "eval" / "recipe.resolved.yaml").read_text())
    generator = evaluated["models"]["generator"]
    assert (generator["backend"], generator["model"]) == ("openai", "exported-generator")
    provenance = json.loads((run_dir / "eval" / "provenance.json").read_text())
    assert provenance["endpoints"]["generator"] == generator["base_url"]
    port = int(generator["base_url"].rsplit(":", 1)[1].split("/")[0])
    log = (run_dir / "serve" / "exported-generator.log").read_text()
    assert f"'port': {port}, 'model': '{final}'" in log, log[:3000]
    called = sum(line["model_calls"].get("generator.chat", 0)  # the sweeps' episodes too
                 for folder in ("eval", "eval-budget", "eval-every-n") for line in
                 map(json.loads, (run_dir / folder / "results.jsonl").read_text().splitlines()))
    called += sum(line["model_calls"].get("generator.chat", 0)  # the study's trained cells
                  for line in map(json.loads, (run_dir / "study" / "results.jsonl")
                                  .read_text().splitlines())
                  if line["axes"]["generator"] == "trained")
    requests = log.count('"POST /v1/chat/completions HTTP/1.1" 200')
    assert called > 0 and requests == called, (called, requests)
    # eval: every method x domain x seed once; the report has a row per method
    rows = every_method_reported(run_dir, recipe)
    assert "prour (generator rehearsal step 2)" in rows  # the trained checkpoint's row
    # what the tiny annotator could not give is said before the review, counted from its files;
    # after the review no state lacks a label
    flat = " ".join(annotated.split())
    said = f"{len(walk['unusable'])} without a usable label"  # the walk met them unlabelled
    assert (said in flat) == bool(walk["unusable"]) and len(walk["unusable"]) <= unusable["dev"]
    assert ("annotator replies were not a label; review them" in flat) == \
        bool(unusable["dev"] or unusable["test"]), unusable
    for split in ("dev", "test"):
        assert f"{split} states have no usable label" not in run.stdout + run.stderr
    assert not mix["unusable"]
    # the paper's evidence beside the run: Table 1, Table 6, Figures 4-8, each from these files
    paper_items_from_the_run(run_dir, recipe)
    # Table 5 and Figure 2: the collected trajectories' decision steps, one labels line each,
    # counted again here from the reviewed labels file
    from prour.data.steps import taxonomy_sources
    from prour.data.taxonomy import recipe_decisions

    decisions, lacking = recipe_decisions(recipe, taxonomy_sources(recipe))
    assert not lacking and len(decisions) == len(tax_lines) > 1
    assert {d.domain for d in decisions} == {"retail", "airline"}
    taxonomy_items_from_the_run(run_dir)
    # Tables 2, 3, 4 and 7: the study's grids, each row's Pass@1 averaged again from the
    # study's own result lines
    study_items_from_the_run(run_dir, recipe)
    from prour.data.dataset import read_rows

    rows = read_rows(run_dir / "data" / "dataset" / "train.parquet")
    metrics = (run_dir / "checkpoints" / "metrics.jsonl")
    steps_logged = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    if rows:
        assert steps_logged == recipe.train.total_steps
    else:  # no clarify/verify state: extract and train say so, the initial policy is evaluated
        assert "lacking: no clarify or verify state among" in shown
        assert "holds no training state" in shown and steps_logged == 0

    again = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets,
                  "--approve-labels")
    assert again.returncode == 0, again.stdout + again.stderr
    ran = re.findall(r"^== (\S+): (\w+)", again.stdout, re.MULTILINE)
    assert ran and all(state in ("skipped", "done") for _, state in ran), again.stdout
    assert "start:" not in again.stdout  # nothing ran a second time

    stale = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets, "--set",
                  "router.n_actions=3", "--dry-run")
    assert stale.returncode == 0, stale.stdout + stale.stderr
    named = set(re.findall(r"^\s+\S+/(\S+)\s+stale\b", stale.stdout, re.MULTILINE))
    assert {"search", "heldout", "extract", "train", "eval", "eval-budget", "eval-every-n",
            "posthoc"} <= named, stale.stdout
    assert not named & {"collect-retail", "collect-dev", "collect-airline", "normalize",
                        "states-dev", "states-test", "annotate", "extract-ig-clarifier",
                        "train-ig-clarifier", "taxonomy"}, stale.stdout
