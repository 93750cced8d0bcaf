"""``prour calibrate`` end to end with scripted models: labels, AU/EU cache (resumable), stored
thresholds keyed by the decomposer model, held-out report; human corrections are honoured."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.llm.scripted import ScriptedLLM, register_script
from prour.router import load_thresholds

GOALS = ["I want to return an item.", "I want a refund to my card.", "I want to track order #W2."]
ACTIONS = [
    '{"tool": "get_order_details", "arguments": {"order_id": "#W2"}}',
    '{"tool": "respond", "arguments": {}}',
    '{"tool": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}',
    "oops",
]
UTTERANCES = {
    "d1": "Where is my order #W2?",
    "d2": "I want a refund, card or gift card, whichever.",
    "d3": "Hello.",
    "d4": "Please return my order number #W2 items.",
    "d5": "Which refund method is best, I can't decide.",
    "d6": "Thanks, that's all.",
    "t1": "My order number is #W2, where is it?",
    "t2": "Refund to card or gift card? You choose.",
    "t3": "Bye.",
}


CANDIDATES = [json.loads(a) for a in ACTIONS[:3]]


def _score(context: str, target: str) -> list[float]:
    """Planted behaviour: refund dialogues -> goals disagree (AU), order dialogues -> every goal
    is unsure (EU), anything else -> every goal picks the first candidate (neither)."""
    dialogue = context.split("Conversation so far:")[1].split("Assume the customer's goal")[0]
    goal = GOALS.index(re.search(r"Assume the customer's goal is: (.*)", context).group(1))
    action = json.loads(target.removesuffix("<|im_end|>"))
    index = CANDIDATES.index(action)
    if "refund" in dialogue.lower():
        return [0.0 if index == goal else -6.0]
    if "order" in dialogue.lower():
        return [0.0]
    return [0.0 if index == 0 else -8.0]


register_script(
    "router-test-decomposer",
    lambda: ScriptedLLM(
        rules=[
            ("The customer's goal, in one sentence:", GOALS),
            ("Propose one plausible next action", ACTIONS),
        ],
        scorer=_score,
    ),
)


def _write_states(path: Path, ids: list[str]) -> None:
    with path.open("w") as handle:
        for state_id in ids:
            messages = [{"role": "user", "content": UTTERANCES[state_id]}]
            handle.write(
                json.dumps({"id": state_id, "domain": "retail", "messages": messages}) + "\n"
            )


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return make_recipe(tmp_path)


def make_recipe(tmp_path: Path) -> Path:
    """A recipe with scripted decomposer, annotator and router, and small dev/test state files."""
    annotator = tmp_path / "annotator.yaml"
    annotator.write_text(
        yaml.safe_dump(
            {
                "rules": [
                    {"pattern": "(?i)user: [^\\n]*order", "reply": "epistemic"},
                    {"pattern": "(?i)user: [^\\n]*refund", "reply": "aleatoric"},
                    {"pattern": "Label:", "reply": "no_uncertainty"},
                ]
            }
        )
    )
    router = tmp_path / "router.yaml"
    router.write_text(yaml.safe_dump({"default": '{"mode": "verify", "rationale": "look it up"}'}))
    _write_states(tmp_path / "dev.jsonl", ["d1", "d2", "d3", "d4", "d5", "d6"])
    _write_states(tmp_path / "test.jsonl", ["t1", "t2", "t3"])
    data = {
        "name": "calib",
        "seed": 0,
        "run_dir": str(tmp_path / "run"),
        "models": {
            "decomposer": {"backend": "scripted", "script": "router-test-decomposer"},
            "annotator": {"backend": "scripted", "script": str(annotator)},
            "router": {"backend": "scripted", "script": str(router)},
        },
        "router": {
            "n_interpretations": 3,
            "n_actions": 4,
            "calibration": {
                "dev_states": str(tmp_path / "dev.jsonl"),
                "test_states": str(tmp_path / "test.jsonl"),
            },
        },
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_calibrate_all_stages(recipe: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "--recipe", str(recipe)])
    assert result.exit_code == 0, result.output
    out_dir = tmp_path / "run" / "calibration"
    labels = [json.loads(line) for line in (out_dir / "labels_dev.jsonl").read_text().splitlines()]
    assert [r["label"] for r in labels] == ["verify", "clarify", "act", "verify", "clarify", "act"]
    assert all(r["corrected"] is None and r["raw"] for r in labels)
    cache = (out_dir / "uncertainty_dev.jsonl").read_text().splitlines()
    assert len(cache) == 6 and all(json.loads(line)["au"] is not None for line in cache)
    stored = load_thresholds(out_dir / "thresholds.json", "scripted:router-test-decomposer")
    # clarify states have AU ~ 1.0, verify states EU = ln 3, act states ~0: smallest perfect pair
    assert (stored.tau_au, stored.tau_eu, stored.macro_f1) == (0.01, 0.01, 1.0)
    assert stored.dataset == str(tmp_path / "dev.jsonl") and stored.n_states == 6
    assert "held-out, τ_AU=0.01 τ_EU=0.01: macro-F1 1.000" in result.output
    assert "held-out" in result.output and "LLM router (0 invalid replies)" in result.output
    assert "macro-F1" in result.output

    # resume: nothing is relabelled or recomputed; a human correction changes the search input
    labels[2]["corrected"] = "verify"
    (out_dir / "labels_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labels))
    again = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "search"])
    assert again.exit_code == 0, again.output
    assert "decomposer ran on 0 new dev states" in again.output
    corrected = load_thresholds(out_dir / "thresholds.json", "scripted:router-test-decomposer")
    assert corrected.macro_f1 < 1.0  # d3 (an act state by AU/EU) is now labelled verify
    assert len((out_dir / "uncertainty_dev.jsonl").read_text().splitlines()) == 6
    relabel = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "label"])
    assert "labelled 0 new dev states" in relabel.output


def test_evaluate_without_thresholds_names_model_and_file(recipe: Path) -> None:
    runner = CliRunner()
    assert (
        runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "label"]).exit_code
        == 0
    )
    result = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "evaluate"])
    assert result.exit_code == 2
    assert "thresholds.json does not exist" in result.output and "scripted:" in result.output


def test_bad_router_key_is_reported_with_its_dotted_path(recipe: Path) -> None:
    data = yaml.safe_load(recipe.read_text())
    data["router"]["n_actoins"] = 3
    recipe.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "search"])
    assert result.exit_code == 2 and "router.n_actoins" in result.output


def _annotate_with(recipe: Path, tmp_path: Path, rules: list[dict], default: str) -> None:
    annotator = tmp_path / "annotator.yaml"
    annotator.write_text(yaml.safe_dump({"rules": rules, "default": default}))


def test_labels_of_one_class_and_unusable_labels_still_calibrate(recipe: Path,
                                                                  tmp_path: Path) -> None:
    """What a tiny annotator writes: one class, and replies that are no label. The search leaves
    the unlabelled states out, fits on the rest and names the missing classes; the held-out run
    does the same. With no usable label at all the grid's first pair is stored, said unfitted."""
    _annotate_with(recipe, tmp_path, [{"pattern": "(?i)user: [^\\n]*refund",
                                       "reply": "aleatoric"}], "hmm")
    result = CliRunner().invoke(app, ["calibrate", "--recipe", str(recipe)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # dev: d2, d5 are refund dialogues (clarify); the 4 others are unlabelled
    assert "lacking: 4 dev states have no usable label and were left out" in text
    assert "the dev labels hold no act, verify state: macro-F1 averages clarify only" in text
    stored = load_thresholds(tmp_path / "run" / "calibration" / "thresholds.json",
                             "scripted:router-test-decomposer")
    assert stored.n_states == 2 and stored.macro_f1 == 1.0  # clarify has AU ~ 1.0: any τ_AU < 1
    assert "lacking: 2 test states have no usable label" in text  # t1, t3
    assert "held-out, τ_AU=" in text
    evidence = json.loads((tmp_path / "run" / "calibration" / "router_evidence.json").read_text())
    dev = evidence["dev"]
    assert dev["per_class_f1"] == {"act": None, "clarify": 1.0, "verify": None}  # not a 0
    assert "the dev labels hold no act, verify state: macro-F1 averages clarify only" in \
        dev["notes"]
    assert any(n.startswith("4 dev states have no usable label") for n in dev["notes"])
    llm = evidence["heldout"]["llm_router"]  # t2 (clarify) routed verify: a measured 0
    assert llm["confusion"] == [[0, 0, 0], [0, 0, 1], [0, 0, 0]] and llm["states"] == 1
    assert llm["per_class_f1"] == {"act": None, "clarify": 0.0, "verify": None}
    data = yaml.safe_load(recipe.read_text())
    del data["models"]["router"]
    recipe.write_text(yaml.safe_dump(data))
    again = CliRunner().invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "evaluate"])
    assert again.exit_code == 0, again.output
    evidence = json.loads((tmp_path / "run" / "calibration" / "router_evidence.json").read_text())
    assert evidence["heldout"]["llm_router"] == {
        "lacking": "the recipe has no models.router (the prompted LLM router)"}
    assert evidence["heldout"]["decomposer"]["states"] == 1

    _annotate_with(recipe, tmp_path, [], "hmm")
    for name in ("labels_dev.jsonl", "labels_test.jsonl", "thresholds.json"):
        (tmp_path / "run" / "calibration" / name).unlink()
    result = CliRunner().invoke(app, ["calibrate", "--recipe", str(recipe)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "lacking: 6 dev states have no usable label" in text
    assert "the pair below is the grid's first, not fitted" in text
    assert "τ_AU = 0.00, τ_EU = 0.00 (0 tied pairs)" in text
    stored = load_thresholds(tmp_path / "run" / "calibration" / "thresholds.json",
                             "scripted:router-test-decomposer")
    assert (stored.tau_au, stored.tau_eu, stored.n_states, stored.macro_f1) == (0.0, 0.0, 0, 0.0)
    assert "no held-out state has a usable label" in text and "is not scored" in text
    evidence = json.loads((tmp_path / "run" / "calibration" / "router_evidence.json").read_text())
    assert evidence["dev"] == {"lacking": "no dev state has a usable label"}
    assert evidence["heldout"]["decomposer"] == {"lacking": "no held-out state has a usable label"}


def test_search_before_labelling_names_the_label_command_and_it_runs(recipe: Path) -> None:
    import shlex

    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "search"])
    assert result.exit_code == 2 and "labels file not found" in result.output
    command = " ".join(result.output.split()).split("run `")[1].split("` first")[0]
    assert command == f"prour calibrate --stage label --recipe {recipe}"
    assert runner.invoke(app, shlex.split(command)[1:]).exit_code == 0
    again = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "search"])
    assert again.exit_code == 0, again.output


ROUTE_ORDER = ["act", "clarify", "verify"]


def _f1_by_hand(labels: list[str], predicted: list[str]) -> dict:
    """Confusion (rows: label, columns: route), per-class F1 2tp / (2tp + fp + fn) (None for a
    class no label holds) and their mean over the classes present, counted here by hand."""
    confusion = [[sum(1 for t, p in zip(labels, predicted) if (t, p) == (row, col))
                  for col in ROUTE_ORDER] for row in ROUTE_ORDER]
    per_class = {}
    for i, name in enumerate(ROUTE_ORDER):
        tp = confusion[i][i]
        fn, fp = sum(confusion[i]) - tp, sum(row[i] for row in confusion) - tp
        per_class[name] = None if tp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
    present = [f for f in per_class.values() if f is not None]
    return {"states": len(labels), "confusion": confusion, "per_class_f1": per_class,
            "macro_f1": sum(present) / len(present)}


def _assert_same(scores: dict, want: dict) -> None:
    assert (scores["states"], scores["confusion"]) == (want["states"], want["confusion"])
    assert scores["macro_f1"] == pytest.approx(want["macro_f1"])
    for name, f1 in want["per_class_f1"].items():
        assert scores["per_class_f1"][name] == (None if f1 is None else pytest.approx(f1)), name


def _route_by_hand(record: dict, tau_au: float, tau_eu: float) -> str:
    if record["au"] is None:
        return "act"  # router.empty_route's default
    return "clarify" if record["au"] >= tau_au else "verify" if record["eu"] >= tau_eu else "act"


def _labels_of(path: Path) -> dict[str, str]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["state_id"]: r["corrected"] or r["label"] for r in records}


def test_heldout_evaluation_saves_the_router_evidence(recipe: Path, tmp_path: Path) -> None:
    """router_evidence.json holds the stored pair's F1 on the dev states (from the cached AU/EU),
    on the held-out states, and the prompted router's, each equal to a count by hand; a class
    no held-out label holds has no per-class F1 and a note saying macro-F1 leaves it out."""
    runner = CliRunner()
    assert runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "label"]) \
        .exit_code == 0
    out_dir = tmp_path / "run" / "calibration"
    for name, state_id, corrected in (("labels_dev.jsonl", "d3", "verify"),
                                      ("labels_test.jsonl", "t3", "clarify")):
        records = [json.loads(line) for line in (out_dir / name).read_text().splitlines()]
        next(r for r in records if r["state_id"] == state_id)["corrected"] = corrected
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    for stage in ("search", "evaluate"):
        result = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", stage])
        assert result.exit_code == 0, result.output
    evidence = json.loads((out_dir / "router_evidence.json").read_text())
    model = "scripted:router-test-decomposer"
    stored = json.loads((out_dir / "thresholds.json").read_text())[model]
    assert evidence["schema"] == "prour.router-evidence/1" and evidence["decomposer_model"] == model
    assert evidence["thresholds"] == {"tau_au": stored["tau_au"], "tau_eu": stored["tau_eu"]}
    assert evidence["labels"] == ROUTE_ORDER
    assert f"-> {out_dir / 'router_evidence.json'}" in " ".join(result.output.split())

    def expected(split: str, predict) -> dict:
        labels = _labels_of(out_dir / f"labels_{split}.jsonl")
        ids = [json.loads(line)["id"]
               for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        return _f1_by_hand([labels[i] for i in ids], [predict(i) for i in ids])

    for split, scores in (("dev", evidence["dev"]), ("test", evidence["heldout"]["decomposer"])):
        cache = {json.loads(line)["state_id"]: json.loads(line) for line in
                 (out_dir / f"uncertainty_{split}.jsonl").read_text().splitlines()}
        want = expected(split, lambda i, cache=cache: _route_by_hand(
            cache[i], stored["tau_au"], stored["tau_eu"]))
        _assert_same(scores, want)
    assert evidence["dev"]["macro_f1"] < 1.0  # d3 (act by its AU/EU) is labelled verify
    # the scripted router always answers verify
    llm = evidence["heldout"]["llm_router"]
    want = expected("test", lambda i: "verify")
    _assert_same(llm, want)
    assert llm["invalid"] == 0
    assert want["per_class_f1"]["act"] is None and want["macro_f1"] == pytest.approx(0.25)
    absent = "the test labels hold no act state: macro-F1 averages clarify, verify only"
    assert absent in evidence["heldout"]["decomposer"]["notes"] and absent in llm["notes"]
    assert evidence["dev"]["notes"] == []
    # 6 dev candidates for the default 60/90/90: every one kept (d3 as verify), the walk ended
    assert evidence["dev_mix"] == {
        "target": {"clarify": 60, "verify": 90, "act": 90},
        "used": {"act": 1, "clarify": 2, "verify": 3},
        "short": {"clarify": 58, "verify": 87, "act": 89}, "policy": "annotate", "complete": True}


def _second_score(context: str, target: str) -> list[float]:
    """Another decomposer: as the first, but less sure of its action in the other dialogues
    (EU about 0.42 there, where the first model's is about 0), so its act states need a higher
    τ_EU than the first model's."""
    dialogue = context.split("Conversation so far:")[1].split("Assume the customer's goal")[0]
    if "refund" in dialogue.lower() or "order" in dialogue.lower():
        return _score(context, target)
    index = CANDIDATES.index(json.loads(target.removesuffix("<|im_end|>")))
    return [0.0 if index == 0 else -2.0]


register_script(
    "router-test-second-decomposer",
    lambda: ScriptedLLM(rules=[("The customer's goal, in one sentence:", GOALS),
                               ("Propose one plausible next action", ACTIONS)],
                        scorer=_second_score))


def _grid_search(au: list[float], eu: list[float], labels: list[str]) -> tuple[float, float]:
    """The paper's search, written out: every (τ_AU, τ_EU) on [0, 0.8]^2 in steps of 0.01, AU
    first, the best three-class macro-F1, ties to the smallest τ_AU then τ_EU."""
    classes = ("act", "clarify", "verify")
    best = (-1.0, 0.0, 0.0)
    for i in range(81):
        for j in range(81):
            tau_au, tau_eu = i / 100, j / 100
            routed = ["clarify" if a >= tau_au else "verify" if e >= tau_eu else "act"
                      for a, e in zip(au, eu)]
            f1s = []
            for c in classes:
                tp = sum(r == c and y == c for r, y in zip(routed, labels))
                fp = sum(r == c and y != c for r, y in zip(routed, labels))
                fn = sum(r != c and y == c for r, y in zip(routed, labels))
                f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
            macro = sum(f1s) / 3
            if macro > best[0] + 1e-12:
                best = (macro, tau_au, tau_eu)
    return best[1], best[2]


def test_a_study_decomposer_is_recalibrated_from_its_own_scores(recipe: Path,
                                                                 tmp_path: Path) -> None:
    """The Prour paper's Table 7 (A.2.2: the same calibration procedure for GLM-4-32B): a study
    cell whose decomposer is another model gets thresholds grid-searched on that model's own
    AU/EU of the same reviewed dev states, stored under its id beside the first model's."""
    from prour.build import Builder
    from prour.recipes import load_recipe
    from prour.router.recalibrate import recalibrate

    runner = CliRunner()
    for stage in ("label", "search"):
        done = runner.invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", stage])
        assert done.exit_code == 0, done.output
    out_dir = tmp_path / "run" / "calibration"
    first = load_thresholds(out_dir / "thresholds.json", "scripted:router-test-decomposer")
    other = ('models.decomposer={"backend": "scripted", '
             '"script": "router-test-second-decomposer"}')
    second = Builder(load_recipe(recipe, [other]))
    said: list[str] = []
    recalibrate(second, said.append)
    cache = [json.loads(x) for x in
             (out_dir / "uncertainty_dev.scripted_router-test-second-decomposer.jsonl")
             .read_text().splitlines()]
    assert {c["model_id"] for c in cache} == {"scripted:router-test-second-decomposer"}
    labels = {r["state_id"]: r["label"] for r in map(json.loads, (out_dir / "labels_dev.jsonl")
                                                     .read_text().splitlines())}
    ids = [c["state_id"] for c in cache if c["au"] is not None]
    au = [next(c["au"] for c in cache if c["state_id"] == s) for s in ids]
    eu = [next(c["eu"] for c in cache if c["state_id"] == s) for s in ids]
    own = load_thresholds(out_dir / "thresholds.json", "scripted:router-test-second-decomposer")
    assert (own.tau_au, own.tau_eu) == _grid_search(au, eu, [labels[s] for s in ids])
    assert (own.tau_au, own.tau_eu) != (first.tau_au, first.tau_eu)  # its scores, not the first's
    assert load_thresholds(out_dir / "thresholds.json",
                           "scripted:router-test-decomposer") == first  # left as it was
    assert any("stored for scripted:router-test-second-decomposer" in line for line in said)
    said.clear()
    recalibrate(second, said.append)
    assert said == []  # fitted on these labels already: nothing to do
    second.close()
    pinned = load_recipe(recipe, [other, "router.thresholds_model=scripted:router-test-decomposer"])
    assert Builder(pinned).thresholds() == (first.tau_au, first.tau_eu)  # the first model's pair
