"""The protocol guard (prour.eval.protocol, DESIGN §6): breaches found from the recipe's splits before
any trajectory exists, and from the dev states file and the dataset parquet once they exist."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.data.reserve import reserve_task_ids, training_task_ids
from prour.env.domains import split_task_ids
from prour.eval.protocol import protocol_block, protocol_findings, shared_writes
from prour.preflight import check_protocol, protocol_warnings
from prour.provenance import write_provenance
from prour.recipes import load_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
PAPER = RECIPES / "paper.yaml"
ONE = ("eval.methods=[base,prour]",)  # the other rules' tests: no baseline in the way


@pytest.fixture(autouse=True)
def _clean_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As tests/test_preflight.py: no models folder, an empty HF cache and no GPUs."""
    monkeypatch.delenv("PROUR_MODELS_DIR", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def _extending(tmp_path: Path, name: str, **sections: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(PAPER), "name": name,
                                    "run_dir": str(tmp_path / name), **sections}))
    return path


def _protocol_lines(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{prefix}: protocol: ")]


@functools.cache
def _walked_overlap() -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """The content check of paper.yaml walked by hand from tau2's own retail tasks and tool types
    and the v1-train data file (reserve included: the whole split): (eval tasks, ids sharing a
    write action, ids sharing all of theirs)."""
    from prour.env.domains import DATA_DIR, require_tau2

    require_tau2()
    from tau2.domains.retail.environment import get_environment, get_tasks, get_tasks_split
    from tau2.environment.toolkit import ToolType, get_tool_types

    writes = {name for name, kind in get_tool_types(get_environment().tools).items()
              if kind == ToolType.WRITE}

    def calls(actions: list[dict]) -> set[str]:
        return {json.dumps([a["name"], a["arguments"]], sort_keys=True) for a in actions
                if a["name"] in writes and a.get("requestor", "assistant") == "assistant"}

    v1 = json.loads((DATA_DIR / "tau_bench_v1_retail_train.json").read_text())["tasks"]
    trained = set().union(*(calls(task["evaluation_criteria"]["actions"]) for task in v1))
    base = set(get_tasks_split()["base"])
    evals = {task.id: calls([a.model_dump() for a in task.evaluation_criteria.actions or []])
             for task in get_tasks() if task.id in base}
    some = tuple(sorted(t for t, mine in evals.items() if mine & trained))
    return len(evals), some, tuple(sorted(t for t in some if evals[t] <= trained))


def test_training_on_tau2_train_overlaps_74_eval_tasks_before_any_trajectory(tmp_path):
    expected = len(set(split_task_ids("retail", "train")) & set(split_task_ids("retail", "base")))
    assert expected == 74  # tau2's retail train split lies inside its base split
    recipe = _extending(tmp_path, "on-train", data={"split": "train", "num_trajectories": 200})
    result = CliRunner().invoke(app, ["validate", "--preflight", str(recipe)])
    assert result.exit_code == 2
    lines = _protocol_lines(result.output, "error")
    overlap = [line for line in lines if "eval tasks" in line]
    assert len(overlap) == 1 and overlap[0].startswith("error: protocol: 74 retail eval tasks")
    assert "--set data.split=v1-train" in overlap[0]
    assert not (tmp_path / "on-train").exists()  # nothing collected, nothing written

    warned = _extending(tmp_path, "on-train-warn", data={"split": "train", "num_trajectories": 200},
                        protocol={"on_breach": "warn"})
    again = CliRunner().invoke(app, ["validate", "--preflight", str(warned)])
    assert _protocol_lines(again.output, "error") == []
    assert [line for line in _protocol_lines(again.output, "warning") if "74 retail" in line]
    plain = CliRunner().invoke(app, ["validate", str(warned)])  # weights/GPUs not checked here
    assert plain.exit_code == 0, plain.output
    assert _protocol_lines(plain.output, "warning")


def test_paper_and_its_extensions_print_no_protocol_line():
    result = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)])
    assert result.exit_code == 2  # no weights, no GPUs on this node
    assert [line for line in result.output.splitlines() if "protocol:" in line] == []
    # ... but the notes, problems or not: the content overlap and the paper's 115
    n_eval, some, every = _walked_overlap()
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert [line for line in notes if line.startswith(
        f"note: content overlap: {len(some)} of {n_eval} retail eval tasks (")]
    assert [line for line in notes if f", {len(every)} of them every write action" in line]
    assert [line for line in notes if "Prour paper evaluates on 115" in line]
    for name in ("smoke", "gpu-smoke", "paper-attention"):
        assert [f.line() for f in protocol_findings(load_recipe(RECIPES / f"{name}.yaml"))] == []
    # the rehearsal's one task goes to both sides on purpose, downgraded to a warning
    rehearsal = load_recipe(RECIPES / "rehearsal.yaml")
    assert [f.rule for f in protocol_findings(rehearsal)] == ["shared-task"]
    assert rehearsal.protocol.on_breach == "warn"


def test_a_trajectory_split_is_refused(tmp_path):
    recipe = load_recipe(PAPER, ["data.split_by=trajectory", f"run_dir={tmp_path / 'r'}", *ONE])
    assert [f.rule for f in protocol_findings(recipe)] == ["shared-task"]
    assert "--set data.split_by=task" in protocol_findings(recipe)[0].line()
    # the parquet case (extract's own output): tests/data/test_pipeline.py


def test_dev_states_of_training_tasks_are_refused(tmp_path):
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", *ONE])
    training, reserve = training_task_ids(recipe.data), reserve_task_ids(recipe.data)
    states = Path(recipe.router.calibration.dev_states)
    states.parent.mkdir(parents=True)
    records = [{"id": f"s{i}", "domain": "retail", "task_id": task, "messages": []}
               for i, task in enumerate([reserve[0], training[0], training[1]])]
    states.write_text("".join(json.dumps(r) + "\n" for r in records))
    found = protocol_findings(recipe)
    assert [(f.rule, f.count, f.ids) for f in found] == [
        ("dev-states", 2, (f"retail:{training[0]}", f"retail:{training[1]}"))]
    states.write_text(json.dumps(records[0]) + "\n")
    assert protocol_findings(recipe) == []
    # from the recipe alone: calibrating without a reserve means training trajectories
    bare = load_recipe(PAPER, ["data.calibration_reserve=0", f"run_dir={tmp_path / 'bare'}", *ONE])
    assert [f.rule for f in protocol_findings(bare)] == ["dev-states"]
    assert "--set data.calibration_reserve=40" in protocol_findings(bare)[0].line()


def test_report_header_has_the_protocol_block(tmp_path):
    shipped = load_recipe(PAPER, [f"run_dir={tmp_path / 'a'}"])
    block = protocol_block(shipped)
    assert block[0] == (f"training tasks: retail v1-train, {len(training_task_ids(shipped.data))} "
                        "tasks (calibration reserve: 40)")
    assert "eval tasks: retail base 114, airline base 50" in block
    assert "overlap: 0" in block and "split_by: task" in block and block[-1] == "on_breach: error"
    assert any(line.startswith("note: calibration test states (airline)") for line in block)
    n_eval, some, every = _walked_overlap()
    overlap_note = (f"note: content overlap: {len(some)} of {n_eval} retail eval tasks (")
    assert [line for line in block if line.startswith(overlap_note)
            and f", {len(every)} of them every write action" in line]
    paper_count = "note: retail eval: tau2's base split holds 114 tasks where the Prour paper"
    assert [line for line in block if line.startswith(paper_count)]
    tau2_test = load_recipe(PAPER, ["eval.split=test", f"run_dir={tmp_path / 'c'}"])
    assert not [line for line in protocol_block(tau2_test) if line.startswith(paper_count)]

    warn = load_recipe(PAPER, ["data.split=train", "protocol.on_breach=warn",
                               f"run_dir={tmp_path / 'b'}"])
    assert protocol_block(warn)[-1].startswith(
        "on_breach: warn — this study deliberately breaks: eval-overlap (74)")

    from prour.eval.harness import RESULTS_FILE

    for recipe, folder in ((shipped, tmp_path / "a"), (warn, tmp_path / "b")):
        folder.mkdir()
        write_provenance(folder, recipe)
        line = {"schema": 1, "key": ["retail", "1", 0, "base"], "method": "base", "variant": None,
                "domain": "retail", "task_id": "1", "seed": 0, "reward": 1.0, "score": 1.0,
                "success": True, "termination": "user_stop", "error": False, "timeout": False,
                "unscored": False, "errors": [], "steps": {"act": 1, "clarify": 0, "verify": 0},
                "records": 1, "model_calls": {}, "model_calls_total": 0, "seconds": 1.0,
                "decisions": [], "episode_started_at": "t", "attention": None}
        (folder / RESULTS_FILE).write_text(json.dumps(line) + "\n")
    out = CliRunner().invoke(app, ["report", str(tmp_path / "a"), str(tmp_path / "b"),
                                   "--out", str(tmp_path / "out")])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"Protocol of `{tmp_path / 'a'}`:" in text and "- overlap: 0" in text
    assert f"- {overlap_note}" in text and f"- {paper_count}" in text
    assert "- overlap: 74 (" in text and "- on_breach: warn — this study deliberately breaks" in text


def test_a_baseline_writing_with_the_trained_generator_is_refused(tmp_path, monkeypatch):
    from prour.eval import methods

    spec = methods.check_method("saber")
    writes = dataclasses.replace(spec, roles=(*spec.roles, "generator"))
    if hasattr(spec, "writer"):
        writes = dataclasses.replace(writes, writer="generator")
    real = methods.check_method
    monkeypatch.setattr(methods, "check_method", lambda m: writes if m == "saber" else real(m))
    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", "eval.methods=[base,prour,saber]"])
    found = [f for f in protocol_findings(recipe) if f.rule == "baseline-checkpoint"]
    assert [(f.count, f.ids) for f in found] == [(1, ("saber",))]
    assert "--set 'eval.methods=[base,prour]'" in found[0].line()
    no_train = recipe.model_copy(update={"train": None})  # eval passes no --checkpoint
    assert [f for f in protocol_findings(no_train) if f.rule == "baseline-checkpoint"] == []


def test_the_chains_airline_collection_for_calibration_test_states_is_not_a_breach(tmp_path):
    from prour.preflight import check_protocol
    from prour.stages import AIRLINE_TRAJECTORIES

    airline = ["data.domain=airline", "data.split=train", "data.calibration_reserve=0",
               f"run_dir={tmp_path}", *ONE]
    assert len(check_protocol(load_recipe(PAPER, airline))) == 2  # on airline's training side
    chain = load_recipe(PAPER, [*airline, f"data.trajectories={AIRLINE_TRAJECTORIES}"])
    assert check_protocol(chain) == []  # collect-airline: nothing trains on these episodes


def test_the_content_check_counts_what_a_walk_over_the_tasks_counts(tmp_path):
    n_eval, some, every = _walked_overlap()
    assert 0 < len(every) < len(some) < n_eval  # the check has something to find, not all
    shared = shared_writes(load_recipe(PAPER, [f"run_dir={tmp_path}"]))
    assert shared is not None and shared.domain == "retail" and shared.eval_tasks == n_eval
    assert (sorted(shared.some), sorted(shared.every)) == (list(some), list(every))
    assert [f for f in protocol_findings(load_recipe(PAPER, [f"run_dir={tmp_path}", *ONE]))] == []
    # eval tasks chosen by hand are compared as they are; no eval of the training domain, no check
    picked = load_recipe(PAPER, [f"run_dir={tmp_path}", f"eval.tasks=[retail:{some[0]}]"])
    assert (picked_shared := shared_writes(picked)) is not None
    assert (picked_shared.eval_tasks, picked_shared.some) == (1, (some[0],))
    assert shared_writes(load_recipe(PAPER, [f"run_dir={tmp_path}", "eval.domains=[airline]"])) \
        is None


def test_past_max_shared_write_tasks_the_note_is_a_breach_that_follows_on_breach(tmp_path):
    _, some, _ = _walked_overlap()
    at = [f"run_dir={tmp_path}", *ONE, f"protocol.max_shared_write_tasks={len(some)}"]
    assert protocol_findings(load_recipe(PAPER, at)) == []
    past = [f"run_dir={tmp_path}", *ONE, f"protocol.max_shared_write_tasks={len(some) - 1}"]
    errors = check_protocol(load_recipe(PAPER, past))
    assert [p.message.split(" retail eval tasks")[0] for p in errors] == [str(len(some))]
    assert f"--set protocol.max_shared_write_tasks={len(some)}" in errors[0].message
    warned = load_recipe(PAPER, [*past, "protocol.on_breach=warn"])
    assert check_protocol(warned) == [] and len(protocol_warnings(warned)) == 1
    assert protocol_block(warned)[-1] == (
        f"on_breach: warn — this study deliberately breaks: shared-writes ({len(some)})")
    result = CliRunner().invoke(app, ["validate", str(PAPER), *(
        arg for item in past for arg in ("--set", item))])
    assert result.exit_code == 2
    assert [line for line in _protocol_lines(result.output, "error")
            if line.startswith(f"error: protocol: {len(some)} retail eval tasks")]
    with pytest.raises(ValueError, match="protocol.max_shared_write_tasks"):
        load_recipe(PAPER, [f"run_dir={tmp_path}", "protocol.max_shared_write_tasks=-1"])


def _walked_packaged_overlap(split: str) -> tuple[int, tuple[str, ...]]:
    """The content check of a packaged eval split against v1-train, walked from the two data
    files: (eval tasks, ids sharing a write action)."""
    from prour.env.domains import DATA_DIR, require_tau2

    require_tau2()
    from tau2.domains.retail.environment import get_environment
    from tau2.environment.toolkit import ToolType, get_tool_types

    writes = {name for name, kind in get_tool_types(get_environment().tools).items()
              if kind == ToolType.WRITE}

    def calls(task: dict) -> set[str]:
        return {json.dumps([a["name"], a["arguments"]], sort_keys=True)
                for a in task["evaluation_criteria"]["actions"] if a["name"] in writes}

    def tasks(name: str) -> list[dict]:
        return json.loads((DATA_DIR / name).read_text())["tasks"]

    trained = set().union(*map(calls, tasks("tau_bench_v1_retail_train.json")))
    evals = tasks({"tau3": "tau3_retail.json", "v1-test": "tau_bench_v1_retail_test.json"}[split])
    return len(evals), tuple(sorted(t["id"] for t in evals if calls(t) & trained))


def test_the_guard_on_the_v1_test_and_tau3_task_sets(tmp_path):
    """v1-test shares no id with v1-train, nor does tau3; tau3 keeps the ids of tau2's tasks it
    revises, so training on tau2's retail ``train`` overlaps it by id (all of that split but 21,
    which tau3 leaves out). The content check reads each split's own version of its tasks, and
    the block names the task set and its exclusions."""
    for split, sizes in (("v1-test", "retail v1-test 96, airline v1-test 50"),
                         ("tau3", "retail tau3 113, airline tau3 50")):
        recipe = load_recipe(PAPER, [f"run_dir={tmp_path / split}", f"eval.split={split}", *ONE])
        assert protocol_findings(recipe) == []
        block = protocol_block(recipe)
        assert f"eval tasks: {sizes}" in block and "overlap: 0" in block
        assert [line for line in block if line.startswith(f"note: task set retail {split}: ")]
        assert [line for line in block if line.startswith(f"note: task set airline {split}: ")]
        assert not [line for line in block if "Prour paper evaluates on 115" in line]
        n_eval, some = _walked_packaged_overlap(split)
        shared = shared_writes(recipe)
        assert (shared.eval_tasks, tuple(sorted(shared.some))) == (n_eval, some)
    from prour.eval.protocol import write_actions

    # retail 12: tau2's base returns the items with a refund to PayPal, which tau2's tools
    # refuse (not the original payment method); τ³ drops the return (transfer to a human only)
    assert [json.loads(c)["arguments"]["payment_method_id"]
            for c in write_actions("retail", "base")["12"]] == ["paypal_9497703"]
    assert write_actions("retail", "tau3")["12"] == frozenset()
    excluded = [line for line in protocol_block(recipe) if "1 excluded" in line]
    assert excluded and "prour/env/data/tau3_retail.json" in excluded[0]

    on_train = load_recipe(PAPER, [f"run_dir={tmp_path / 't'}", "eval.split=tau3",
                                   "data.split=train", *ONE])
    expected = sorted(set(split_task_ids("retail", "train")) - {"21"}, key=int)
    [overlap] = [f for f in protocol_findings(on_train) if f.rule == "eval-overlap"]
    assert overlap.count == len(expected) == 73
    assert list(overlap.ids) == expected[:len(overlap.ids)]
