"""The table of stages (prour/stages.py): its order, its files, its roles per recipe, and the
readers that follow it (the GPU plan, Slurm's resources, the CLI that runs each command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.config import parse_recipe
from prour.recipes import load_recipe
from prour.stages import (
    EXTERNAL,
    STAGES,
    get_stage,
    get_step,
    required_roles,
    stage_names,
    stage_roles,
    steps,
    writer_of,
)

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
PAPER, ATTENTION, SMOKE = (RECIPES / f"{name}.yaml" for name in ("paper", "paper-attention", "smoke"))


def test_the_stages_and_steps_follow_the_papers_chain() -> None:
    """DESIGN.md §6: serve beside everything, then collect retail and airline, normalize, the
    calibration states, annotate, review, search, held-out, extract, train, export, eval, report;
    the ig-clarifier baseline's own rows, training and export beside prour's (issues 24, 34);
    the trade-off sweeps and the post-hoc pass after the main eval (issue 34); a recipe's study
    (its episodes, judge pass, second judge and report) before the report that reads it."""
    assert stage_names() == ("serve", "collect", "normalize", "calibrate", "extract", "train",
                             "export", "eval", "study", "taxonomy", "report")
    assert [step.name for step in steps()] == [
        "serve", "collect-retail", "collect-dev", "collect-airline", "normalize", "states-dev",
        "states-test", "annotate", "review", "search", "heldout", "extract",
        "extract-ig-clarifier", "train", "train-ig-clarifier", "export", "export-ig-clarifier",
        "eval", "eval-budget", "eval-every-n", "posthoc", "study", "nl-assertions", "judge",
        "second-judge", "study-report", "taxonomy", "taxonomy-review", "report"]
    # the two gates: the calibration review (the runner's own) and the taxonomy's review, whose
    # row says how it passes (paper A.1: the taxonomy last, its review holding up neither
    # training nor the evaluations; the report reads its labels)
    assert [step.name for step in steps() if step.command is None] == ["review",
                                                                        "taxonomy-review"]
    assert [step.name for step in steps() if step.approval is not None] == ["taxonomy-review"]


@pytest.mark.parametrize("path", [PAPER, ATTENTION, SMOKE], ids=lambda p: p.stem)
def test_every_input_is_an_earlier_steps_output(path: Path) -> None:
    recipe = load_recipe(path)
    written: dict[Path, str] = {}
    for step in steps():
        for file in step.reads(recipe):
            assert file.path in written, f"{step.name} reads {file.key} ({file.path}): no earlier step writes it"
        for file in step.writes(recipe):
            written.setdefault(file.path, step.name)


def test_a_file_no_step_writes_is_external(tmp_path: Path) -> None:
    recipe = parse_recipe({"name": "x", "run_dir": str(tmp_path)})
    assert writer_of(recipe, tmp_path / "elsewhere.jsonl") is EXTERNAL
    assert writer_of(recipe, tmp_path / "data" / "goals.jsonl").name == "normalize"


# ig_clarifier: the ig-clarifier baseline's own checkpoint (the chain's eval step sets it)
EVAL_PAPER = {"agent", "user", "generator", "decomposer", "verifier", "router", "ig_clarifier"}
PAPER_ROLES = {  # hand-written from the recipe: data.teacher is on, models.router exists, the
    # train file does not exist yet (both responders), no eval.attention (no judge)
    "serve": set(), "collect": {"agent", "user", "teacher"}, "normalize": {"normalizer"},
    "calibrate": {"annotator", "decomposer", "router"}, "extract": {"decomposer"},
    "train": {"generator", "strict_user", "verifier"}, "export": set(), "eval": EVAL_PAPER,
    # the study: Table 4's methods on the agent (no attention variant: no classifier), and the
    # judge of τ³-bench's natural-language assertions (no models.nl_judge)
    "taxonomy": {"annotator"}, "study": {*EVAL_PAPER - {"router"}, "judge"}, "report": set(),
}
SMOKE_ROLES = {  # no models.router; methods base and prour only; no study section
    **PAPER_ROLES, "calibrate": {"annotator", "decomposer"},
    "eval": {"agent", "user", "generator", "decomposer", "verifier"}, "study": set(),
}


@pytest.mark.parametrize(("path", "expected"), [
    (PAPER, PAPER_ROLES),
    (ATTENTION, {**PAPER_ROLES, "train": {"generator", "strict_user", "verifier", "judge"}}),
    (SMOKE, SMOKE_ROLES),
], ids=["paper", "paper-attention", "smoke"])
def test_roles_each_stage_calls(path: Path, expected: dict[str, set[str]], tmp_path: Path) -> None:
    # a run folder of its own: the train roles follow the train file's modes, and `make demo`
    # leaves a clarify-only train file in runs/smoke
    recipe = load_recipe(path, [f"run_dir={tmp_path}"])
    assert {name: set(stage_roles(recipe, name)) for name in stage_names()} == expected
    # extract reads the policy's tokenizer from models.generator without calling it
    assert set(required_roles(recipe, "extract")) == {"decomposer", "generator"}


def test_the_chain_trains_exports_and_evaluates_the_ig_clarifier(tmp_path: Path) -> None:
    """eval.methods with ig-clarifier and a train section: train-ig-clarifier and
    export-ig-clarifier run the recipe with prour.config.ig_clarifier's settings into their own
    folder (on the clarify states: the strict user only), and eval loads that export as
    models.ig_clarifier, which the recipe then need not have; without the method the steps
    are left out and eval sets nothing."""
    import json

    from prour.config.ig_clarifier import OUTPUT_DIR, setting_items
    from prour.stages import get_step, run_steps

    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}", "train.backend=local"])
    names = [step.name for step in run_steps(recipe)]
    assert names[names.index("train"):names.index("eval")] == [
        "train", "train-ig-clarifier", "export", "export-ig-clarifier"]
    train = get_step("train-ig-clarifier")
    argv = train.argv(recipe, "R.yaml")
    assert argv[:3] == ["train", "--recipe", "R.yaml"]
    assert [argv[i + 1] for i in range(3, len(argv), 2)] == setting_items()
    export = tmp_path / OUTPUT_DIR / "step_2010"
    assert [f.path for f in train.writes(recipe)] == [export]
    assert [f.path for f in get_step("export-ig-clarifier").writes(recipe)] == [
        export / "config.json"]
    assert train.roles(recipe) == ("generator", "strict_user")
    eval_argv = get_step("eval").argv(recipe, "R.yaml")
    ig = json.loads(eval_argv[eval_argv.index("--set") + 1].split("=", 1)[1])
    assert ig == {"backend": "hf", "path": str(export), "dtype": "bfloat16", "device": "auto"}
    assert "ig_clarifier" in stage_roles(recipe, "eval")
    assert "ig_clarifier" not in required_roles(recipe, "eval")  # the eval step supplies it
    assert writer_of(recipe, export / "config.json").name == "export-ig-clarifier"
    without = load_recipe(PAPER, [f"run_dir={tmp_path}", "eval.methods=[base,prour]"])
    assert not {"train-ig-clarifier", "export-ig-clarifier"} & {
        step.name for step in run_steps(without)}
    assert "--set" not in get_step("eval").argv(without, "R.yaml")
    # a recipe that trains nothing evaluates ig-clarifier with a models.ig_clarifier of its own
    untrained = load_recipe(PAPER, ["train=null"])
    assert "ig_clarifier" in required_roles(untrained, "eval")


def test_roles_follow_the_recipe() -> None:
    """No teacher without data.teacher; an eval calls what its methods call and the judge with the
    attention protocol; the proxy-priced attention reward calls no judge."""
    recipe = load_recipe(PAPER, ["data.teacher=false", "eval.methods=[base,saber]",
                                 "reward.attention.lambda=0.1", "reward.attention.cost=proxy"])
    assert stage_roles(recipe, "collect") == ("agent", "user")
    assert stage_roles(recipe, "eval") == ("agent", "user")  # no Prour to set Figure 6 beside
    assert get_step("posthoc").skip(recipe) == ("eval.methods holds no method that routes with "
                                                "the decomposer")
    with_prour = load_recipe(PAPER, ["eval.methods=[base,prour]"])
    assert get_step("posthoc").skip(with_prour) is None
    assert stage_roles(with_prour, "posthoc") == ("decomposer",)
    for sweep in ("eval-budget", "eval-every-n"):  # eval.methods has no routed method to sweep
        assert get_step(sweep).skip(recipe) == "eval.methods holds none of eval.tradeoff.methods"
    assert "judge" not in stage_roles(recipe, "train")
    judged = load_recipe(PAPER, ["eval.methods=[base]", "eval.attention={policy: no-ask}"])
    assert set(stage_roles(judged, "eval")) == {"agent", "user", "judge"}
    # a step alone: the held-out evaluation scores the decomposer and the prompted router
    assert stage_roles(recipe, "heldout") == ("decomposer", "router")
    assert stage_roles(recipe, "states-dev") == ()


def test_train_calls_only_the_responders_of_its_train_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path}"])
    folder = tmp_path / "data" / "dataset"
    folder.mkdir(parents=True)
    rows = pa.table({"extra_info": [{"mode": "clarify"}, {"mode": "clarify"}]})
    pq.write_table(rows, folder / "train.parquet")
    assert stage_roles(recipe, "train") == ("generator", "strict_user")


# GPU 0 also holds half the 32B (0.5) and the exported generator (0.45): 1.15 in all, but no
# step runs the 32B beside the router or eval's generator, so the recipe loads
SERVED_ROUTER = ["models.router.model=Qwen/Qwen3-4B", "serve.models.Qwen/Qwen3-4B.gpus=[0]",
                 "serve.models.Qwen/Qwen3-4B.gpu_memory_utilization=0.2"]


@pytest.mark.parametrize(("methods", "has_router"), [
    ("[base,prour]", False), ("[base,llm-router]", True)])
def test_the_eval_plan_holds_only_the_servers_its_methods_call(methods: str, has_router: bool):
    """The router on a server of its own: the eval plan holds it only when a method calls it."""
    from prour.cluster.gpu_plan import gpu_plan

    recipe = load_recipe(PAPER, [*SERVED_ROUTER, f"eval.methods={methods}"], cluster=True)
    plan = gpu_plan(recipe, "eval")
    parts = [what for uses in plan.uses.values() for what, _ in uses]
    assert any(what.startswith("Qwen/Qwen3-4B vLLM") for what in parts) is has_router
    assert any(what.startswith("Qwen/Qwen3-8B vLLM") for what in parts)  # agent, user
    assert not any("Qwen3-32B" in what for what in parts)  # no 32B role in any of these methods


def test_paper_attention_train_plan_counts_the_judge_server() -> None:
    """paper-attention's train calls the judge: beside the trainer its plan holds the 32B next to
    the 8B, which cannot fit on GPU 1 (36.5 + 40.5 + 12.8 + 16 + 1 GiB > 80), so the recipe serves
    them on another node (serve.colocate_train: false) and the plan holds the trainer alone."""
    from prour.cluster.gpu_plan import gpu_plan

    beside = gpu_plan(load_recipe(ATTENTION, ["serve.colocate_train=true"], cluster=True), "train")
    names = {what.split(" vLLM")[0] for uses in beside.uses.values() for what, _ in uses
             if " vLLM (" in what and not what.startswith("rollout")}
    assert names == {"Qwen/Qwen3-8B", "Qwen/Qwen3-32B"}
    assert not beside.fits
    apart = gpu_plan(load_recipe(ATTENTION, cluster=True), "train")
    assert apart.fits and not any(" vLLM (0.5" in what or "Qwen" in what
                                  for uses in apart.uses.values() for what, _ in uses)
    plain = gpu_plan(load_recipe(PAPER, cluster=True), "train")
    assert not any("Qwen3-32B" in what for uses in plain.uses.values() for what, _ in uses)


def test_slurm_has_one_resources_field_per_stage() -> None:
    from prour.config.cluster import SlurmConfig, SlurmResources

    fields = [name for name, info in SlurmConfig.model_fields.items()
              if info.annotation is SlurmResources and name != "defaults"]
    assert fields == list(stage_names())
    for name in stage_names():
        assert SlurmConfig().resources(name) == SlurmResources()


def _parses(argv: list[str]) -> None:
    """Parse ``prour <argv>`` as the CLI would, down to the command that runs (no command runs);
    a usage error (unknown option, missing value) raises."""
    import typer

    from prour.cli.main import app

    command = typer.main.get_command(app)
    ctx = command.make_context("prour", list(argv))
    while hasattr(command, "resolve_command") and (left := _left(ctx)):
        _, command, rest = command.resolve_command(ctx, left)
        ctx = command.make_context(command.name, rest, parent=ctx)
    # a group runs only when it has a command of its own (`prour calibrate --stage label`)
    assert not hasattr(command, "resolve_command") or command.invoke_without_command, argv


def _left(ctx) -> list[str]:
    """The arguments a group leaves to its subcommand (click 8.2 keeps them private)."""
    return [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]


@pytest.mark.parametrize("step", [s for s in steps() if s.command], ids=lambda s: s.name)
def test_every_command_parses_as_printed(step) -> None:
    import shlex

    recipe = load_recipe(PAPER)
    line = step.hint(recipe, str(PAPER))
    _parses(shlex.split(line)[1:])
    stage = next(stage for stage in STAGES if step in stage.steps)
    if stage.slurm_command:
        _parses(stage.job_argv(recipe, str(PAPER), ["--set", "seed=1"]))


def test_a_planted_bad_option_does_not_parse() -> None:
    with pytest.raises(Exception, match="No such option: --splitt"):
        _parses(["calibrate", "states", "--recipe", str(PAPER), "--splitt", "dev"])


def _episodes(*stored: tuple[str, int, str]) -> str:
    """Trajectory lines with their resume key and termination (what "done" reads of them)."""
    return "".join(json.dumps({"domain": "retail", "task_id": task, "seed": seed,
                               "agent": "teacher-collect", "termination": termination}) + "\n"
                   for task, seed, termination in stored)


def test_a_collection_is_done_when_collect_would_exit_0(tmp_path: Path) -> None:
    """Enough episodes, each key once, at most data.max_error_fraction of them errored: a
    collection that failed is not done (the runner reruns it and the errored episodes retry)."""
    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path}", "data.num_trajectories=2",
                                 "data.max_error_fraction=0.5"])
    collect = get_stage("collect").steps[0]
    out = tmp_path / "data" / "trajectories.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(_episodes(("0", 0, "error"), ("1", 0, "error")))
    assert not collect.is_done(recipe)  # 2 of 2 errored
    out.write_text(_episodes(("0", 0, "error"), ("1", 0, "error"), ("0", 0, "user_stop")))
    assert collect.is_done(recipe)  # a retry's record replaces the errored one: 1 of 2
    out.write_text(_episodes(("0", 0, "user_stop"), ("0", 0, "user_stop")))
    assert not collect.is_done(recipe)  # one key twice is one episode


def test_done_is_read_from_the_outputs(tmp_path: Path) -> None:
    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path}", "data.num_trajectories=2",
                                 f"router.calibration.dev_states={tmp_path}/dev.jsonl",
                                 f"router.calibration.test_states={tmp_path}/test.jsonl"])
    collect, annotate = get_stage("collect").steps[0], get_stage("calibrate").steps[2]
    out = tmp_path / "data" / "trajectories.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(_episodes(("0", 0, "user_stop")))
    assert not collect.is_done(recipe)  # 1 of 2 trajectories
    out.write_text(_episodes(("0", 0, "user_stop"), ("1", 0, "max_steps")))
    assert collect.is_done(recipe)
    for split in ("dev", "test"):
        (tmp_path / f"{split}.jsonl").write_text('{"id": "a", "messages": []}\n'
                                                 '{"id": "b", "messages": []}\n')
    labels = tmp_path / "calibration"
    labels.mkdir()
    (labels / "labels_dev.jsonl").write_text('{"state_id": "a", "label": "act"}\n')
    (labels / "labels_test.jsonl").write_text('{"state_id": "a"}\n')
    assert not annotate.is_done(recipe)  # one test state unlabelled
    (labels / "labels_test.jsonl").write_text('{"state_id": "a"}\n{"state_id": "b"}\n')
    assert not annotate.is_done(recipe)  # the dev walk waits for candidate b's label
    (labels / "labels_dev.jsonl").write_text('{"state_id": "a", "label": "act"}\n'
                                             '{"state_id": "b", "label": "verify"}\n')
    assert not annotate.is_done(recipe)  # candidates ran out, but no mix was stored
    (labels / "dev_mix.json").write_text("{}")
    assert annotate.is_done(recipe)
    # without router.calibration.dev_mix: a label line per dev state
    plain = recipe.model_copy(deep=True)
    plain.router.calibration.dev_mix = None
    (labels / "labels_dev.jsonl").write_text('{"state_id": "a", "label": "act"}\n')
    assert not annotate.is_done(plain)
    assert not get_stage("calibrate").steps[3].is_done(recipe)  # the review gate: a person


def test_normalize_and_eval_are_done_when_every_planned_line_is_there(tmp_path: Path) -> None:
    """smoke.yaml: 3 tasks to normalize (data.max_tasks); eval plans 2 methods x 1 variant x 2
    retail tasks (eval.max_tasks) x 1 seed = 4 episodes."""
    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path}"])
    normalize, evaluate = get_stage("normalize").steps[0], get_stage("eval").steps[0]
    goals, results = tmp_path / "data" / "goals.jsonl", tmp_path / "eval" / "results.jsonl"
    for path, planned, step in ((goals, 3, normalize), (results, 4, evaluate)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"a": 1}\n' * (planned - 1))
        assert not step.is_done(recipe), step.name
        path.write_text('{"a": 1}\n' * planned)
        assert step.is_done(recipe), step.name


def test_train_and_export_are_done_at_the_last_step(tmp_path: Path) -> None:
    """smoke.yaml trains 3 steps locally: done once a complete step_3 is saved; a local step is a
    Hugging Face folder already, so export is done once it holds config and weights."""
    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path}", f"train.output_dir={tmp_path}/ck"])
    train, export = get_stage("train").steps[0], get_stage("export").steps[0]
    for step in (2, 3):
        folder = tmp_path / "ck" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        assert not train.is_done(recipe)  # step_2 saved, or step_3 without its trainer state
        (folder / "trainer_state.pt").write_bytes(b"")
    assert train.is_done(recipe) and not export.is_done(recipe)  # no weights yet
    (tmp_path / "ck" / "step_3" / "model.safetensors").write_bytes(b"")
    assert export.is_done(recipe)


def test_a_stage_narrowed_to_one_step_is_what_one_command_of_it_runs() -> None:
    """``stage/step`` (``prour train``'s preflight: its own recipe's training, not the
    ig-clarifier's beside it, whose data may ask other responders)."""
    from prour.stages import get_stage

    assert [s.name for s in get_stage("train/train").steps] == ["train"]
    assert [s.name for s in get_stage("train").steps] == ["train", "train-ig-clarifier"]
    with pytest.raises(ValueError, match="extract"):
        get_stage("train/extract")
