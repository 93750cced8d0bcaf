"""The stage table's roles are the roles each stage's code calls.

For the paper, paper-attention and smoke recipes, every stage of a whole run (serve aside: it
loads ``serve.models``, no role) runs once through its ``prour`` command on a tiny run: two
trajectories (one each for training and validation), one training step on two states, one
evaluation episode per method. Every role of the recipe is
a counting double (a scripted backend of its own); the query generator is the tiny model (warm
started to ask) where a stage needs real weights (extract's tokenizer, the trained policy) and a
double elsewhere. A role is *called* when its double answered a request or its weights loaded;
the set called must equal the table's roles for that stage and recipe
(:func:`prour.stages.stage_roles`), and with the roles whose tokenizer alone the stage reads, the
roles it needs (:func:`prour.stages.required_roles`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

TESTS = Path(__file__).resolve().parent
for folder in ("data", "eval", "train"):  # the scripted worlds of the stage tests
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

import data_scripts
import eval_world
from train_helpers import instance_rows, warm_start

from prour.cli.main import app
from prour.config import Recipe
from prour.config.ig_clarifier import setting_items
from prour.llm.scripted import ScriptedLLM, register_script
from prour.recipes import load_recipe
from prour.stages import get_step, required_roles, run_stages, stage_roles

RECIPES = TESTS.parent / "recipes"
HF_STAGES = ("extract", "train")  # stages that need the generator's weights
TAU = {"extract": data_scripts.THRESHOLDS, "eval": (eval_world.TAU_AU, eval_world.TAU_EU)}


def _annotator() -> ScriptedLLM:
    return ScriptedLLM(rules=[(r"(?i)user: [^\n]*order", "epistemic"),
                              (r"(?i)user: [^\n]*refund", "aleatoric")],
                       default="no_uncertainty")


# The double each stage's roles answer with; any other role gets a silent double that only counts.
DOUBLES: dict[str, dict[str, Callable[[], ScriptedLLM]]] = {
    "collect": {"agent": data_scripts.agent_llm, "user": data_scripts.user_llm,
                "teacher": data_scripts.teacher_llm},
    "normalize": {"normalizer": data_scripts.normalizer_llm},
    "calibrate": {"annotator": _annotator, "decomposer": data_scripts.decomposer_llm,
                  "router": lambda: ScriptedLLM(default='{"mode": "verify", "rationale": "x"}')},
    "extract": {"decomposer": data_scripts.decomposer_llm},
    "train": {"strict_user": lambda: ScriptedLLM(default="It is order #W1000."),
              "verifier": eval_world.verifier_llm, "judge": eval_world.judge_llm},
    "eval": {role: eval_world.SCRIPTS[f"eval-{role}"] for role in
             ("agent", "user", "decomposer", "generator", "verifier", "router", "judge")},
    "taxonomy": {"annotator": lambda: ScriptedLLM(default=json.dumps({
        "present": True, "kind": "epistemic", "source": "tools", "object": "the order",
        "evidence": "not looked up yet", "outcome": "resolved", "label": "order lookup"}))},
}

CALIBRATION_STATES = {"dev": ["Where is my order #W2?", "I want a refund, card or gift card.",
                              "Hello."],
                      "test": ["My order number is #W2, where is it?", "Bye."]}


class Calls:
    """What a stage did with each role: its doubles' answered requests, and the generator's
    weights (a call: the policy) or tokenizer alone (a read) loaded from disk."""

    def __init__(self, generator_dir: Path):
        self.generator_dir = generator_dir.resolve()
        self.doubles: dict[str, list[ScriptedLLM]] = {}
        self.loads: list[tuple[str, Path]] = []  # (what loaded, from where)

    def double(self, stage: str, role: str) -> Callable[[], ScriptedLLM]:
        def make() -> ScriptedLLM:
            llm = DOUBLES[stage].get(role, lambda: ScriptedLLM(default=""))()
            self.doubles.setdefault(role, []).append(llm)
            return llm

        return make

    def _generator_loaded(self, kind: str) -> bool:
        return any(what == kind and path.resolve() == self.generator_dir
                   for what, path in self.loads)

    def called(self) -> set[str]:
        roles = {role for role, made in self.doubles.items()
                 if any(llm.calls["chat"] or llm.calls["score"] for llm in made)}
        return roles | ({"generator"} if self._generator_loaded("model") else set())

    def read(self) -> set[str]:
        """The roles whose tokenizer alone was loaded."""
        tokenizer = self._generator_loaded("tokenizer") and not self._generator_loaded("model")
        return {"generator"} if tokenizer else set()


@pytest.fixture(scope="module")
def asking_policy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model fine-tuned to ask a well-formed question on the training rows' prompt, so a
    training step's responders (and judge) have questions to answer."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return warm_start(tiny_model_dir, tmp_path_factory.mktemp("asking"), good_share=2,
                          bad_share=0, steps=40)
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    """(``tokenizer`` or ``model``, path) of every tokenizer and causal LM transformers loads."""
    import transformers

    seen: list[tuple[str, Path]] = []
    for kind, cls in (("tokenizer", transformers.AutoTokenizer),
                      ("model", transformers.AutoModelForCausalLM)):
        original = cls.from_pretrained

        def recording(path: Any, *args: Any, _original: Any = original, _kind: str = kind,
                      **kwargs: Any) -> Any:
            seen.append((_kind, Path(str(path))))
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", recording)
    return seen


def _train_file(folder: Path) -> Path:
    """Two training states, one clarify and one verify (the second retargeted to a read)."""
    import pandas as pd

    rows = instance_rows(2)
    extra = rows[1]["extra_info"]
    extra["mode"], extra["state_id"] = "verify", extra["state_id"].replace(":clarify", ":verify")
    rows[1]["reward_model"]["ground_truth"] = '{"arguments":{},"tool":"list_all_product_types"}'
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def _calibration_states(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, utterances in CALIBRATION_STATES.items():
        paths[split] = folder / f"{split}_states.jsonl"
        paths[split].write_text("".join(
            json.dumps({"id": f"{split}{i}", "domain": "retail",
                        "messages": [{"role": "user", "content": text}]}) + "\n"
            for i, text in enumerate(utterances)))
    return paths


def _roles(recipe: Recipe) -> list[str]:
    """The recipe's roles, and ``ig_clarifier`` for an eval of the ig-clarifier method: the
    chain's eval step sets it to the baseline's exported checkpoint (`--set models.ig_clarifier…`),
    as this test does with a double."""
    extra = ["ig_clarifier"] if "ig-clarifier" in recipe.eval.methods else []
    return [*recipe.models, *(role for role in extra if role not in recipe.models)]


def _overrides(recipe: Recipe, stage: str, run: Path, policy: Path) -> list[str]:
    """A tiny run of ``stage``: every role a double of its own (the generator the asking policy in
    the stages that need weights), sizes cut to one task, one step, one episode."""
    sets = [f"run_dir={run}", "env.max_steps=30"]
    for role in _roles(recipe):
        if role == "generator" and stage in HF_STAGES:
            sets += [f"models.{role}.backend=hf", f"models.{role}.path={policy}",
                     f"models.{role}.device=cpu", f"models.{role}.dtype=float32"]
        else:
            sets += [f"models.{role}.backend=scripted", f"models.{role}.script=roles-{role}"]
    sets += ["data.max_tasks=2", "data.num_trajectories=2", "data.trial_seeds=[0]",
             "data.concurrency=1", "data.max_decisions=4", "data.val_ratio=0.5"]
    states = _calibration_states(run / "states")
    sets += [f"router.calibration.{split}_states={path}" for split, path in states.items()]
    if stage in TAU:
        sets += [f"router.tau_au={TAU[stage][0]}", f"router.tau_eu={TAU[stage][1]}"]
    sets += ["train.backend=local", f"train.train_file={_train_file(run / 'rows')}",
             "train.val_file=null", "train.states_per_step=2", "train.total_steps=1",
             "train.save_every=1", f"train.output_dir={run / 'checkpoints'}", "train.device=cpu",
             "train.dtype=float32", "train.gradient_checkpointing=false",
             "train.rollout.n=2", "train.rollout.keep=2", "train.rollout.max_response_tokens=48",
             "train.ppo.epochs=1", "train.ppo.mini_batch_states=1", "train.optim.warmup_steps=0",
             "train.wandb.track=false"]
    sets += ["eval.concurrency=1", "eval.max_tasks=1", "eval.seeds=[0]", "eval.domains=[retail]"]
    return sets


def _command(stage: str) -> list[str]:
    """The stage's ``prour`` command (without ``--recipe`` and its overrides)."""
    return {"collect": ["collect", "--no-progress"], "normalize": ["normalize"],
            "calibrate": ["calibrate"], "extract": ["extract", "--no-progress"],
            "train": ["train", "--backend", "local"],
            "eval": ["eval", "--no-progress"], "taxonomy": ["taxonomy"]}[stage]


def _run_stages(name: str, tmp: Path, policy: Path, loads: list[tuple[str, Path]]) -> Iterator[
        tuple[str, Recipe, Calls]]:
    """(stage, the recipe as written, what the stage called) for every stage of a whole run of
    recipe ``name`` that calls models (serve starts servers of ``serve.models``: no role)."""
    path = RECIPES / f"{name}.yaml"
    run = tmp / name
    # its own run folder: the table reads the train file's modes, and `make demo` leaves a
    # clarify-only one in runs/smoke
    recipe = load_recipe(path, [f"run_dir={run}"])
    runner = CliRunner()
    # (the study stage runs eval's episodes per cell of its grids, each with the models its axes
    # set, endpoints and the exported checkpoint: tests/eval/test_study.py and the rehearsal)
    for stage in [s for s in run_stages(recipe) if s not in ("serve", "study")]:
        calls = Calls(policy)
        for role in _roles(recipe):
            register_script(f"roles-{role}", calls.double(stage, role))
        loads.clear()
        sets = [part for item in _overrides(recipe, stage, run, policy) for part in ("--set", item)]
        result = runner.invoke(app, [*_command(stage), "--recipe", str(path), *sets])
        assert result.exit_code == 0, f"{name} {stage}:\n{result.output}"
        if stage == "extract" and get_step("extract-ig-clarifier").skip(recipe) is None:
            # the stage's second step: the ig-clarifier's own rows (its chain --set items)
            own = [part for item in setting_items() for part in ("--set", item)]
            result = runner.invoke(app, [*_command(stage), "--recipe", str(path), *sets, *own])
            assert result.exit_code == 0, f"{name} extract-ig-clarifier:\n{result.output}"
        calls.loads = list(loads)
        yield stage, recipe, calls


@pytest.mark.parametrize("name", ["smoke", "paper", "paper-attention"])
def test_each_stage_calls_the_roles_the_table_lists(name: str, tmp_path: Path,
                                                     asking_policy: Path,
                                                     loads: list[tuple[str, Path]]) -> None:
    called = {}
    for stage, recipe, calls in _run_stages(name, tmp_path, asking_policy, loads):
        called[stage] = calls.called()
        table = set(stage_roles(recipe, stage))
        assert called[stage] == table, (f"{name} {stage}: the code calls {sorted(called[stage])}, "
                                        f"the table lists {sorted(table)}")
        needed = set(required_roles(recipe, stage))
        # eval loads models.ig_clarifier, which the chain supplies (the exported ig-clarifier
        # checkpoint, set by the eval step), not the recipe: the recipe need not list it
        supplied = {"ig_clarifier"} if stage == "eval" else set()
        assert (called[stage] | calls.read()) - supplied == needed, (
            f"{name} {stage}: the code calls or reads {sorted(called[stage] | calls.read())}, "
            f"the table needs {sorted(needed)}")
    expected = ["collect", "normalize", "extract", "train", "eval"]
    if name != "smoke":  # smoke sets router.tau_au / tau_eu: no calibration in its run, and
        expected.insert(2, "calibrate")  # leaves the taxonomy out (taxonomy.run: false)
        expected.append("taxonomy")
    assert list(called) == expected
    assert ("judge" in called["train"]) == (name == "paper-attention")
