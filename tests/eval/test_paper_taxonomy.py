"""Table 5 and Figure 2 of the paper beside a run (prour/eval/paper_taxonomy.py) on a hand-written
labels file: every cell against counts made by hand below, the paper's numbers beside them, the
note that our copy lists sources and not the nine cases, and what labels that are missing, not
approved or without a usable line say instead of a number."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from taxonomy_world import DONE, FIND_USER, ORDER, SWITCHES

from prour.config import Recipe
from prour.data.taxonomy_labels import approve, report_current
from prour.eval.paper_plots import plot_sources
from prour.eval.paper_report import item_markdown
from prour.eval.paper_taxonomy import figure2_item, read_taxonomy, table5_item
from prour.eval.run_evidence import RunEvidence

LINES = [  # (decision id, domain, annotation, corrected)
    ("r#0", "retail", FIND_USER, None),  # profile, open label "user id lookup"
    ("r#1", "retail", SWITCHES, None),  # preference
    ("r#2", "retail", ORDER, None),  # tools, "order state check"
    ("r#3", "retail", DONE, None),  # no uncertainty
    ("r#4", "retail", ORDER, "computation"),  # the reviewer: computation (no open label)
    ("a#0", "airline", None, "policy"),  # unusable, labelled by the reviewer
    ("a#1", "airline", None, None),  # unusable, left so
    ("a#2", "airline", ORDER, None),  # tools
]
# by hand: events 6 (world 5: profile 1, tools 2, computation 1, policy 1; user 1: preference)
HEADER = ["Source", "Side (kind)", "Retail", "Airline", "Events", "Share of events (%)",
          "Open labels (most frequent)", "Paper"]
ROWS = [
    ["profile", "world (epistemic)", "1", "0", "1", "16.7", "user id lookup (1)", "–"],
    ["tools", "world (epistemic)", "1", "1", "2", "33.3", "order state check (2)", "–"],
    ["policy", "world (epistemic)", "0", "1", "1", "16.7", "–", "–"],
    ["computation", "world (epistemic)", "1", "0", "1", "16.7", "–", "–"],
    ["history", "world (epistemic)", "0", "0", "0", "0.0", "–", "–"],
    ["intent", "user (aleatoric)", "0", "0", "0", "0.0", "–", "–"],
    ["preference", "user (aleatoric)", "1", "0", "1", "16.7", "product option preference (1)",
     "–"],
    ["world side", "world (epistemic)", "3", "2", "5", "83.3", "–", "16,947 events (89.1 %)"],
    ["user side", "user (aleatoric)", "1", "0", "1", "16.7", "–", "2,075 events (10.9 %)"],
    ["all events", "", "4", "2", "6", "100.0", "–", "19,022 events"],
    ["no uncertainty", "none", "–", "–", "1", "not an event", "–", "–"],
    ["no usable label", "–", "–", "–", "1", "left out", "–", "–"],
]


def _evidence(tmp_path: Path, run: bool = True, lines=LINES) -> RunEvidence:
    run_dir = tmp_path / "run"
    if lines is not None:
        folder = run_dir / "taxonomy"
        folder.mkdir(parents=True)
        (folder / "labels.jsonl").write_text("".join(json.dumps(
            {"decision_id": i, "domain": d, "annotation": a, "corrected": c}) + "\n"
            for i, d, a, c in lines))
    recipe = Recipe(name="t", run_dir=str(run_dir), taxonomy={"run": run})
    return RunEvidence(tmp_path / "eval", recipe=recipe, run_dir=run_dir)


def test_table5_and_figure2_count_the_approved_labels(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    approve(evidence.run_dir / "taxonomy", "a test")
    tax = read_taxonomy(evidence)
    table5 = table5_item(tax)
    assert table5.header == HEADER and table5.rows == ROWS
    assert tax.missing == [(f"1 of 8 decision steps in {evidence.run_dir / 'taxonomy' / 'labels.jsonl'}"
                           " have no usable label (the annotator's reply never validated and no "
                           "`corrected` is set): they are left out of the counts")]
    assert table5.text == ["world side: 5 events (83.3 %) | paper: 16,947 events (89.1 %)",
                           "user side: 1 events (16.7 %) | paper: 2,075 events (10.9 %)",
                           "all events: 6 | paper: 19,022 events"]
    assert any("not the paper's nine cases" in note for note in table5.notes)
    assert ("8 decision steps labelled (retail 5, airline 3): 6 with uncertainty (events), 1 "
            "without, 1 without a usable label") in " ".join(table5.notes)
    markdown = item_markdown(table5)
    assert "| tools | world (epistemic) | 1 | 1 | 2 | 33.3 | order state check (2) | – |" in markdown
    assert "Paper: Table 5 assigns each event to one of nine source-relevant cases" in markdown

    figure2, drawn = figure2_item(tax)
    assert figure2.rows == [["world", "5", "83.3", "16,947", "89.1"],
                            ["user", "1", "16.7", "2,075", "10.9"]]
    assert drawn["events"] == {"world": 5, "user": 1}
    assert drawn["sources"] == {"profile": 1, "tools": 2, "policy": 1, "computation": 1,
                                "history": 0, "intent": 0, "preference": 1}
    out = plot_sources(drawn, tax.record, figure2, tmp_path / "figure2_sources.png")
    sidecar = json.loads(out.with_suffix(".json").read_text())["series"]
    run, paper = sidecar["share"]["this run"], sidecar["share"]["paper"]
    assert run["x"] == ["world", "user"] and run["events"] == [5, 1]
    assert [round(y, 4) for y in run["y"]] == [round(500 / 6, 4), round(100 / 6, 4)]
    assert (paper["y"], paper["events"]) == ([89.1, 10.9], [16947, 2075])
    assert dict(zip(sidecar["sources"]["this run"]["x"], sidecar["sources"]["this run"]["y"])) \
        == drawn["sources"]
    assert sidecar["labels"]["approved"] is True and sidecar["missing"] == tax.missing
    # the report is current for these labels, and no longer once a reviewer changes one
    assert report_current(evidence.recipe, out.with_suffix(".json"))
    labels = evidence.run_dir / "taxonomy" / "labels.jsonl"
    labels.write_text(labels.read_text().replace('"corrected": null}', '"corrected": "none"}', 1))
    assert not report_current(evidence.recipe, out.with_suffix(".json"))


@pytest.mark.parametrize(("run", "lines", "said"), [
    (True, LINES, ("is not approved: review it (set a wrong line's `corrected` to a source or "
                  "none), then approve it: `prour taxonomy --recipe R --approve`")),
    (True, None, ("is missing: the chain's `taxonomy` step writes it (`prour taxonomy --recipe "
                 "R`)")),
    (False, None, "is missing: taxonomy.run is false: the chain leaves the taxonomy out"),
])
def test_labels_missing_or_not_approved_show_no_number(tmp_path: Path, run: bool, lines,
                                                       said: str) -> None:
    tax = read_taxonomy(_evidence(tmp_path, run, lines))
    assert tax.counts is None and len(tax.missing) == 1 and said in tax.missing[0]
    table5 = table5_item(tax)
    figure2, drawn = figure2_item(tax)
    assert drawn == {} and table5.missing == figure2.missing == tax.missing
    run_cells = [cell for row in table5.rows for cell in row[2:-1]] + \
        [cell for row in figure2.rows for cell in row[1:3]]
    assert set(run_cells) <= {"–", "missing"}  # no measured-looking number, no 0
    assert [row[-1] for row in table5.rows[-3:]] == ["16,947 events (89.1 %)",
                                                     "2,075 events (10.9 %)", "19,022 events"]
    out = plot_sources(drawn, tax.record, figure2, tmp_path / "figure2_sources.png")
    sidecar = json.loads(out.with_suffix(".json").read_text())["series"]
    assert sidecar["share"]["this run"]["y"] == [] and sidecar["sources"] == {}
    assert sidecar["missing"] == tax.missing


def test_approved_labels_without_an_event_give_no_share(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, lines=[("r#0", "retail", DONE, None)])
    approve(evidence.run_dir / "taxonomy", "a test")
    tax = read_taxonomy(evidence)
    assert tax.missing == [(f"none of the 1 decision steps in "
                           f"{evidence.run_dir / 'taxonomy' / 'labels.jsonl'} is labelled with "
                           "uncertainty: no event to count, no share")]
    figure2, drawn = figure2_item(tax)
    assert drawn == {} and figure2.rows[0][:3] == ["world", "0", "–"]
    table5 = table5_item(tax)
    assert table5.header[2:5] == ["Retail", "Events", "Share of events (%)"]  # one domain
    assert table5.rows[7][:5] == ["world side", "world (epistemic)", "0", "0", "–"]


def test_without_a_run_folder_the_items_say_why(tmp_path: Path) -> None:
    evidence = RunEvidence(tmp_path, problem="no recipe here")
    tax = read_taxonomy(evidence)
    assert tax.missing == ["no recipe here"] and table5_item(tax).missing == ["no recipe here"]
