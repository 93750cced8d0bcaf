"""``prour run`` through the calibrate stage with scripted models: a review whose corrections
move kept dev states out of their quota. With ``router.calibration.short_mix: annotate`` the
annotate step labels further candidates, the review gate closes again for them and, once they
are approved, the search fits on the re-established mix; with ``continue`` the search fits on
the short mix and the router evidence says so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from prour.recipes import load_recipe
from prour.runner import DONE, PARTIAL, table

ROOT = Path(__file__).resolve().parents[1]
# each candidate's label (the scripted annotator's reading of its utterance), in candidate order
CANDIDATES = ["act", "verify", "act", "clarify", "act", "verify", "clarify", "act"]
UTTERANCE = {"clarify": "Refund to card or gift card, whichever.", "verify": "Where is order #W2?",
             "act": "Thanks."}
QUOTAS = {"clarify": 1, "verify": 1, "act": 2}
STEP_LINE = re.compile(r"^== (\S+): (\w+)", re.MULTILINE)


def _script(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _recipe(tmp_path: Path, short_mix: str) -> Path:
    annotator = _script(tmp_path / "annotator.yaml", {"rules": [
        {"pattern": "(?i)user: [^\\n]*refund", "reply": "aleatoric"},
        {"pattern": "(?i)user: [^\\n]*order", "reply": "epistemic"},
        {"pattern": "(?i)user: thanks", "reply": "no_uncertainty"}]})
    decomposer = _script(tmp_path / "decomposer.yaml", {"rules": [
        {"pattern": "The customer's goal, in one sentence:",
         "reply": ["I want a refund.", "I want to know where my order is."]},
        {"pattern": "Propose one plausible next action", "reply": [
            '{"tool": "get_order_details", "arguments": {"order_id": "#W2"}}',
            '{"tool": "respond", "arguments": {}}']}]})
    router = _script(tmp_path / "router.yaml",
                     {"default": '{"mode": "verify", "rationale": "look it up"}'})
    with (tmp_path / "dev.jsonl").open("w") as handle:
        for i, label in enumerate(CANDIDATES):
            handle.write(json.dumps({"id": f"c{i}", "domain": "retail", "messages": [
                {"role": "user", "content": f"{UTTERANCE[label]} ({i})"}]}) + "\n")
    with (tmp_path / "test.jsonl").open("w") as handle:
        for i, label in enumerate(("verify", "clarify")):
            handle.write(json.dumps({"id": f"t{i}", "domain": "retail", "messages": [
                {"role": "user", "content": UTTERANCE[label]}]}) + "\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "review-mix", "seed": 0, "run_dir": str(tmp_path / "run"),
        "models": {"annotator": {"backend": "scripted", "script": annotator},
                   "decomposer": {"backend": "scripted", "script": decomposer},
                   "router": {"backend": "scripted", "script": router}},
        "router": {"n_interpretations": 2, "n_actions": 2, "calibration": {
            "dev_states": str(tmp_path / "dev.jsonl"), "test_states": str(tmp_path / "test.jsonl"),
            "dev_mix": QUOTAS, "short_mix": short_mix}}}))
    return path


def _run(recipe: Path, *more: str) -> tuple[str, dict[str, str]]:
    done = subprocess.run([sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe),
                           "--only", "annotate,review,search,heldout", *more],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, dict(STEP_LINE.findall(done.stdout))


def _review(folder: Path, corrections: dict[str, str]) -> None:
    """What a reviewer does: set `corrected` on some lines of labels_dev.jsonl."""
    path = folder / "labels_dev.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        record["corrected"] = corrections.get(record["state_id"], record["corrected"])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _labelled(folder: Path) -> list[str]:
    return [json.loads(line)["state_id"]
            for line in (folder / "labels_dev.jsonl").read_text().splitlines()]


def test_a_review_that_opens_a_quota_labels_more_closes_the_gate_and_the_mix_is_met(
        tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "annotate")
    folder = tmp_path / "run" / "calibration"
    out, words = _run(recipe)
    assert words["annotate"] == "done" and "search" not in words  # stopped at the gate
    # by hand: act c0, verify c1, act c2, clarify c3 meet 1/1/2 after four candidates
    assert _labelled(folder) == ["c0", "c1", "c2", "c3"]
    assert "labelled after the review" not in out and "short after the review" not in out

    # the reviewer reads c0 as verify and c2 as clarify: verify and clarify stay met (c0, c2),
    # act has none; the walk goes on: c4 act, c5 verify (over), c6 clarify (over), c7 act
    _review(folder, {"c0": "verify", "c2": "clarify"})
    out, words = _run(recipe, "--approve-labels")
    assert words["annotate"] == "done" and "search" not in words
    assert "== review: the chain stops at the review gate" in out  # the flag did not approve
    assert _labelled(folder) == [f"c{i}" for i in range(8)]
    gate = " ".join(out[out.index("== review:"):].split())
    assert "the dev mix was short after the review: 4 more dev states were labelled" in gate
    command = next(line.strip() for line in out[out.index("== review:"):].splitlines()
                   if line.strip().startswith("prour run "))
    assert command.split().count("--approve-labels") == 1  # approves them, once reviewed
    assert not (folder / "labels.approved.json").exists()
    stored = json.loads((folder / "dev_mix.json").read_text())
    assert stored["kept"] == ["c0", "c2", "c4", "c7"] and stored["labelled_after_review"] == 4
    assert stored["reached"] == {"act": 2, "clarify": 1, "verify": 1} and stored["complete"]

    out, words = _run(recipe, "--approve-labels")  # the person reviewed the four: approved
    assert words["annotate"] == "skipped" and words["search"] == "done"
    assert words["heldout"] == "done"
    assert "== review: labels approved by --approve-labels" in out
    assert "the search fits on the dev mix: 1 clarify / 1 verify / 2 act (target 1/1/2)" in \
        " ".join(out.split())
    fitted = [json.loads(line)["state_id"]
              for line in (folder / "uncertainty_dev.jsonl").read_text().splitlines()]
    assert fitted == ["c0", "c2", "c4", "c7"]  # the decomposer ran on the kept states only
    evidence = json.loads((folder / "router_evidence.json").read_text())
    assert evidence["dev_mix"] == {"target": QUOTAS, "used": {"act": 2, "clarify": 1, "verify": 1},
                                   "short": {}, "policy": "annotate", "complete": True}
    assert evidence["dev"]["states"] == 4

    # a later correction that keeps the mix (c3, over its quota, read as act: it replaces c4)
    # still changes the labels the search fitted on: once approved, search is due again
    _review(folder, {"c3": "act"})
    from prour.router.review import approve

    loaded = load_recipe(str(recipe))
    approve(loaded, "test")
    rows = {row.step.name: row.state for row in table(loaded)}
    assert rows["annotate"] == DONE and rows["review"] == DONE and rows["search"] == PARTIAL


def test_continue_fits_on_the_short_mix_and_the_evidence_states_it(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "continue")
    folder = tmp_path / "run" / "calibration"
    _run(recipe)
    _review(folder, {"c0": "verify", "c2": "clarify"})
    out, words = _run(recipe, "--approve-labels")
    assert words["annotate"] == "skipped" and words["search"] == "done"
    assert words["heldout"] == "done"
    assert _labelled(folder) == ["c0", "c1", "c2", "c3"]  # nothing more was labelled
    text = " ".join(out.split())
    assert ("the search fits on the dev mix: 1 clarify / 1 verify / 0 act (target 1/1/2; act "
            "short: candidates not labelled yet)") in text
    assert "lacking: 2 act dev states: a review's corrections left the mix short" in text
    assert "router.calibration.short_mix is continue" in text
    stored = json.loads((folder / "dev_mix.json").read_text())
    assert stored["kept"] == ["c0", "c2"] and stored["short"] == {"act": 2}
    evidence = json.loads((folder / "router_evidence.json").read_text())
    assert evidence["dev_mix"] == {"target": QUOTAS, "used": {"act": 0, "clarify": 1, "verify": 1},
                                   "short": {"act": 2}, "policy": "continue", "complete": False}
    assert evidence["dev"]["states"] == 2
