"""The dev set's label mix (paper A.2.2: 60 clarify / 90 verify / 90 act): candidates are
annotated in their seeded order and kept while their label's quota is open, by the pure walk and
by ``prour calibrate --stage label`` with a scripted annotator."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.router.dev_mix import fill_quotas

# label of each candidate, in candidate order; None: a reply that is no label
SEQUENCE = ["act", "act", "verify", None, "act", "act", "clarify", "verify", "act", "clarify",
            "clarify", "verify", "verify", "act", "verify"]
UTTERANCE = {"clarify": "Refund to card or gift card, whichever.", "verify": "Where is order #W2?",
             "act": "Thanks.", None: "Hmm."}


def expected_walk(labels: list[str | None], quotas: dict[str, int]) -> tuple[list[int], int]:
    """Independently: the kept positions and how many candidates the walk reads (it stops once
    every quota is met)."""
    kept, counts = [], dict.fromkeys(quotas, 0)
    for position, label in enumerate(labels):
        if all(counts[k] >= v for k, v in quotas.items()):
            return kept, position
        if label is not None and counts[label] < quotas[label]:
            counts[label] += 1
            kept.append(position)
    return kept, len(labels)


def test_the_walk_keeps_states_while_their_quota_is_open() -> None:
    ids = [f"s{i}" for i in range(len(SEQUENCE))]
    labels = dict(zip(ids, SEQUENCE))
    mix = fill_quotas(ids, labels, {"clarify": 2, "verify": 2, "act": 3})
    # by hand: act s0 s1 s4 (s5, s8 over quota), verify s2 s7, clarify s6 s9; met after s9
    assert mix.kept == ["s0", "s1", "s2", "s4", "s6", "s7", "s9"]
    assert mix.counts == {"clarify": 2, "verify": 2, "act": 3} and mix.met
    assert mix.walked == 10 and mix.pending is None and mix.unusable == ["s3"]
    assert mix.line() == "dev mix: 2 clarify / 2 verify / 3 act (target 2/2/3)"

    short = fill_quotas(ids, labels, {"clarify": 4, "verify": 5, "act": 2})
    kept, walked = expected_walk(SEQUENCE, {"clarify": 4, "verify": 5, "act": 2})
    assert short.kept == [ids[p] for p in kept] and short.walked == walked == len(ids)
    assert short.counts == {"clarify": 3, "verify": 5, "act": 2}
    assert short.short() == {"clarify": 1}
    assert short.line() == ("dev mix: 3 clarify / 5 verify / 2 act "
                            "(target 4/5/2; clarify short: candidates ran out)")
    # a candidate not labelled yet while a quota is open: the walk waits for its label there
    partial = fill_quotas(ids, {i: labels[i] for i in ids[:5]}, {"clarify": 1, "verify": 1,
                                                                 "act": 1})
    assert partial.pending == 5 and partial.kept == ["s0", "s2"]


def _recipe(tmp_path: Path, labels: list[str | None], mix: dict[str, int]) -> Path:
    annotator = tmp_path / "annotator.yaml"
    annotator.write_text(yaml.safe_dump({"rules": [
        {"pattern": "(?i)user: [^\\n]*refund", "reply": "aleatoric"},
        {"pattern": "(?i)user: [^\\n]*order", "reply": "epistemic"},
        {"pattern": "(?i)user: thanks", "reply": "no_uncertainty"}], "default": "hmm"}))
    with (tmp_path / "dev.jsonl").open("w") as handle:
        for i, label in enumerate(labels):
            handle.write(json.dumps({"id": f"c{i}", "domain": "retail", "messages": [
                {"role": "user", "content": f"{UTTERANCE[label]} ({i})"}]}) + "\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "mix", "seed": 0, "run_dir": str(tmp_path / "run"),
        "models": {"annotator": {"backend": "scripted", "script": str(annotator)},
                   "decomposer": {"backend": "scripted", "script": str(annotator)}},
        "router": {"calibration": {"dev_states": str(tmp_path / "dev.jsonl"), "dev_mix": mix}}}))
    return path


def _label(recipe: Path) -> str:
    result = CliRunner().invoke(app, ["calibrate", "--recipe", str(recipe), "--stage", "label"])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_label_stage_annotates_in_order_until_the_quotas_are_met(tmp_path: Path) -> None:
    from prour.recipes import load_recipe
    from prour.router.pipeline import split_states

    quotas = {"clarify": 2, "verify": 2, "act": 3}
    recipe = _recipe(tmp_path, SEQUENCE, quotas)
    out = _label(recipe)
    kept, walked = expected_walk(SEQUENCE, quotas)
    folder = tmp_path / "run" / "calibration"
    labelled = [json.loads(x) for x in (folder / "labels_dev.jsonl").read_text().splitlines()]
    # annotated in candidate order, and no further than the chunks the open quotas asked for
    assert [r["state_id"] for r in labelled] == [f"c{i}" for i in range(len(labelled))]
    assert walked <= len(labelled) < len(SEQUENCE)
    assert [r["label"] for r in labelled] == SEQUENCE[: len(labelled)]
    assert "dev mix: 2 clarify / 2 verify / 3 act (target 2/2/3)" in out
    assert "lacking:" not in out
    stored = json.loads((folder / "dev_mix.json").read_text())
    assert stored["reached"] == {"act": 3, "clarify": 2, "verify": 2} and stored["complete"]
    assert stored["kept"] == [f"c{p}" for p in kept]
    assert [s.state_id for s in split_states(load_recipe(str(recipe)), "dev")] == stored["kept"]
    assert "labelled 0 new dev states" in _label(recipe)  # resumable: nothing relabelled


def test_label_stage_short_of_candidates_says_what_it_lacked(tmp_path: Path) -> None:
    quotas = {"clarify": 4, "verify": 5, "act": 7}
    recipe = _recipe(tmp_path, SEQUENCE, quotas)
    out = _label(recipe)
    kept, _ = expected_walk(SEQUENCE, quotas)
    counts = {name: sum(SEQUENCE[p] == name for p in kept) for name in quotas}
    assert counts == {"clarify": 3, "verify": 5, "act": 6}  # by hand: 3 clarify, 6 act in all
    assert ("dev mix: 3 clarify / 5 verify / 6 act (target 4/5/7; clarify, act short: "
            "candidates ran out)") in out
    assert f"lacking: 1 clarify, 1 act dev states: {len(SEQUENCE)} candidates labelled, " \
           "1 without a usable label" in out
    stored = json.loads((tmp_path / "run" / "calibration" / "dev_mix.json").read_text())
    assert stored["short"] == {"clarify": 1, "act": 1} and stored["kept"] == \
        [f"c{p}" for p in kept]
