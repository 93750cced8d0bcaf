"""The Ask-Less paper's published numbers (prour/eval/attention/paper_values.yaml): every entry is
complete and names known things, every number is found in the row copied beside it, the grid
tables' numbers sit under the columns their fields name, blanks stay blank, and numbers checked
by eye against the paper are the file's."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from prour.config.attention import POLICIES
from prour.core.cost import ACCOUNTINGS
from prour.eval.attention import paper_values as pv
from prour.eval.attention.paper_values import (
    VALUES_FILE,
    Published,
    paper_accountings,
    paper_data,
    paper_models,
    paper_note,
    paper_policies,
    published,
    published_value,
)

REPO = Path(__file__).resolve().parents[3]
REQUIRED = {"id", "item", "metric", "value", "source", "cell", "column"}
OPTIONAL = {"policy", "budget", "threshold", "model", "domain", "regime", "row", "interval",
            "starred"}
# typed here from the file's header, independently of the loader's own lists
ITEMS = {"abstract", "table3", "table4", "table5", "table7", "table8", "table10", "table11",
         "table12", "table13", "table14", "table17", "table19", "table21", "table25", "backbone"}
METRICS = {"R", "A", "A_tilde", "V", "V_tilde", "U", "U_tilde", "U_bar", "dR", "dV_tilde",
           "dA_pct", "requests", "atomic", "exempt", "bundled", "reviews", "vetoed",
           "max_reviews", "fixed", "tokens_read", "saved", "retained", "agreement", "kappa",
           "questions", "mean_first", "mean_second", "rank_corr", "mean_abs_diff", "recall"}
DOMAINS = {"retail", "airline", "telecom", "webshop", "customer-service", "main", "browsecomp"}
BUDGETS = {"0", "1", "2", "3", "1-3", "1-8", "inf"}
MODELS = ("GPT-6-Astra", "GPT-5.4", "GPT-4.1", "Llama-4-Mav", "Grok-4.3", "Llama-3.3-70B",
          "Grok-4.6", "GPT-OSS-120B")
NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")


def occurs(number: str, text: str) -> bool:
    """``number`` stands in ``text`` as a whole number ("0" is not found in "0.94" or "50")."""
    return re.search(rf"(?<![\d.]){re.escape(number)}(?!\d|\.\d)", text) is not None


def test_the_whole_number_check_is_strict() -> None:
    assert occurs("0", "50.9 0 –") and not occurs("0", "0.94 50.9")
    assert occurs("-0.7", "$-0.7^{*}$") and occurs("12.1", "reads 12.1k")
    assert not occurs("2.1", "12.1") and not occurs("0.8", "0.84")


def test_each_entry_is_complete_and_its_numbers_are_in_its_cell() -> None:
    problems = []
    for e in paper_data()["values"]:
        name = e.get("id")
        if not REQUIRED <= set(e) <= REQUIRED | OPTIONAL:
            problems.append(f"{name}: missing {sorted(REQUIRED - set(e))}, "
                            f"unknown {sorted(set(e) - REQUIRED - OPTIONAL)}")
            continue
        if not all(isinstance(e[k], str) and e[k].strip() for k in REQUIRED):
            problems.append(f"{name}: an empty or non-string required field")
        if e["item"] not in ITEMS or e["metric"] not in METRICS:
            problems.append(f"{name}: item {e['item']} / metric {e['metric']}")
        if not NUMBER.match(e["value"]) or not occurs(e["value"], e["cell"]):
            problems.append(f"{name}: value {e['value']!r} not a number found in its cell")
        if "interval" in e:
            low, high = e["interval"]
            if not (occurs(low, e["cell"]) and occurs(high, e["cell"])
                    and float(low) <= float(e["value"]) <= float(high)):
                problems.append(f"{name}: interval {e['interval']} not in the cell around it")
        if "–" in e["value"] or "\t" in e["cell"] or e["cell"] != e["cell"].strip():
            problems.append(f"{name}: a dash value or an unconverted tab in the cell")
        if e.get("domain") not in DOMAINS | {None} or e.get("budget") not in BUDGETS | {None}:
            problems.append(f"{name}: domain {e.get('domain')} / budget {e.get('budget')}")
        if e.get("regime") not in ("guarded", "original", None):
            problems.append(f"{name}: regime {e['regime']}")
        if e.get("threshold") not in ("0.27", "0.50", "0.65", None):
            problems.append(f"{name}: threshold {e['threshold']}")
        caption = e["source"].endswith(" (caption)")
        if caption != (e.get("row") == "caption"):
            problems.append(f"{name}: a caption's number has row 'caption' and only it")
        expected = {"abstract": "Abstract", "backbone": None}.get(
            e["item"], "Table " + e["item"].removeprefix("table"))
        source = e["source"].removesuffix(" (caption)")
        if (expected or source) != source:
            problems.append(f"{name}: source {e['source']} for item {e['item']}")
    assert not problems, "\n".join(problems)


def test_ids_are_unique_and_the_loader_reads_every_entry() -> None:
    ids = [e["id"] for e in paper_data()["values"]]
    assert len(ids) == len(set(ids))
    loaded = published()
    assert [p.id for p in loaded] == ids
    assert {p.item for p in loaded} == ITEMS
    assert {p.metric for p in loaded} <= METRICS


def test_policies_are_prours_and_models_are_the_papers_eight() -> None:
    names = paper_policies()
    assert set(names) <= set(POLICIES.names())
    assert names["budgeted+mgr"] == "Budgeted + MGR"
    assert names["frugal"] == "Frugal prompt"
    assert {p.policy for p in published() if p.policy} <= set(names)
    assert paper_models() == MODELS
    assert {p.model for p in published() if p.model} == set(MODELS)
    for number, model in enumerate(MODELS, start=29):
        sources = {p.source for p in published("backbone", model=model)}
        assert sources == {f"Table {number}"}
    assert {p.model for p in published("table25")} == {"GPT-6-Astra"}


def test_table13_rows_are_prours_accountings() -> None:
    assert set(paper_accountings()) == set(ACCOUNTINGS)
    assert set(paper_accountings().values()) == {p.row for p in published("table13")}
    assert published_value("table13", row=paper_accountings()["full"], policy="budgeted+mgr",
                           ).text == "12.7"


# Entries per item, counted from the paper by hand: Table 3 (5 rows x 6), Table 4 (5 x 2),
# Table 5 (4 x 4 less Budgeted's two dashes), Table 7 (27 cells + 2 caption maxima), Table 8
# (34 cells + 3 caption maxima), Tables 10 (5 x 2), 11 (4 x 2), 12 (5 x 2), 13 (5 x 4),
# 14 (6 x 4), 17 (3 x 2 + 4 caption numbers), 19 (4 x 4 + Unrestricted's 31.1), 21 (5 x 8),
# 25 (4 x 8), Tables 29-36 (4 No-ask rewards + 4 rows x 16, less Table 34's four airline V
# dashes), the abstract (75, 36, 73, 86, 94, 13).
COUNTS = {"abstract": 6, "table3": 30, "table4": 10, "table5": 14, "table7": 29, "table8": 37,
          "table10": 10, "table11": 8, "table12": 10, "table13": 20, "table14": 24,
          "table17": 10, "table19": 17, "table21": 40, "table25": 32, "backbone": 540}


def test_entry_counts_per_item_are_those_transcribed() -> None:
    assert Counter(p.item for p in published()) == COUNTS
    per_model = Counter(p.model for p in published("backbone"))
    assert per_model == {m: 64 if m == "Llama-3.3-70B" else 68 for m in MODELS}
    rows = Counter((p.model, p.policy) for p in published("backbone"))
    assert all(rows[m, "no-ask"] == 4 for m in MODELS)
    assert Counter(p.policy for p in published("table21")) == {
        "unrestricted": 8, "frugal": 8, "voi-gate-as-run": 8, "budgeted": 8, "budgeted+mgr": 8}


# The grid tables: (item, number of trailing cells per row, the fields of each cell in order)
def _grid(groups: list[tuple[str, str]], metrics: list[str]) -> list[tuple[str, str, str]]:
    return [(key, group, metric) for key, group in groups for metric in metrics]


GRIDS = {
    "table3": _grid([("domain", "customer-service"), ("domain", "browsecomp")],
                    ["R", "A_tilde", "V_tilde"]),
    "table21": _grid([("domain", "main"), ("domain", "browsecomp")],
                     ["R", "A_tilde", "U_tilde", "V_tilde"]),
    "table25": _grid([("regime", "guarded"), ("regime", "original")], ["R", "A", "U_bar", "V"]),
    "backbone": _grid([("domain", d) for d in ("retail", "airline", "telecom", "webshop")],
                      ["R", "A", "U", "V"]),
}


@pytest.mark.parametrize("item", sorted(GRIDS))
def test_grid_numbers_sit_under_the_columns_their_fields_name(item: str) -> None:
    """Each printed row's trailing cells, in column order, are the entries of that row (a dash
    has none), so no number is filed under another column or dropped."""
    layout = GRIDS[item]
    by_row: dict[tuple[str, str], list[Published]] = defaultdict(list)
    for p in published(item):
        by_row[p.source, p.cell].append(p)
    assert len(by_row) == {"table3": 5, "table21": 5, "table25": 4, "backbone": 40}[item]
    for (source, cell), entries in by_row.items():
        tokens = cell.split(" ")[-len(layout):]
        key = layout[0][0]
        filed = {(getattr(p, key), p.metric): p.text for p in entries}
        assert len(filed) == len(entries), (source, cell)
        expected = {(group, metric): token for (_, group, metric), token in zip(layout, tokens)
                    if token != "–"}
        assert filed == expected, (source, cell)


# (item, fields, the number as printed), each read by eye from the paper for this test
SPOT = [
    ("table3", {"policy": "unrestricted", "metric": "R", "domain": "customer-service"}, "49.4"),
    ("table3", {"policy": "budgeted", "budget": "1-8", "metric": "A_tilde",
                "domain": "browsecomp"}, "16.0"),
    ("table3", {"policy": "voi-gate-as-run", "threshold": "0.27", "metric": "V_tilde",
                "domain": "customer-service"}, "58.6"),
    ("table25", {"policy": "unrestricted", "regime": "guarded", "metric": "R"}, "0.783"),
    ("table25", {"policy": "unrestricted", "regime": "guarded", "metric": "U_bar"}, "-0.059"),
    ("table25", {"policy": "budgeted+mgr", "budget": "1", "regime": "original", "metric": "V"},
     "8.801"),
    ("table5", {"policy": "budgeted+review", "metric": "dR"}, "-0.7"),
    ("table7", {"policy": "voi-gate", "threshold": "0.65", "metric": "vetoed"}, "94"),
    ("table7", {"policy": "voi-gate", "threshold": "0.50", "metric": "max_reviews"}, "52"),
    ("table8", {"policy": "voi-gate", "budget": "2", "threshold": "0.27", "metric": "reviews"},
     "2.1"),
    ("table8", {"policy": "budgeted+mgr", "budget": "1", "metric": "V_tilde"}, "79.3"),
    ("table4", {"row": "Equal counts", "column": "Annotator judgment / Overall burden"}, "75.0"),
    ("table10", {"row": "Second judge (mean)", "column": "Question value"}, "76.9"),
    ("table11", {"row": "Classifier–A2", "metric": "kappa"}, "0.87"),
    ("table12", {"metric": "rank_corr",
                 "column": "Agreement on the same questions / Reading effort"}, "0.85"),
    ("table13", {"row": "Full cost + exempt requests", "policy": "budgeted", "budget": "3"},
     "17.3"),
    ("table14", {"policy": "voi-gate-as-run", "metric": "bundled"}, "35.0"),
    ("table17", {"metric": "dA_pct", "column": "Wide window minus Budgeted + MGR"}, "+4.8"),
    ("table19", {"policy": "budgeted+mgr", "budget": "3"}, "24.7"),
    ("table19", {"policy": "unrestricted"}, "31.1"),
    ("table21", {"policy": "budgeted+mgr", "domain": "main", "metric": "U_tilde"}, "57.7"),
    ("backbone", {"model": "GPT-4.1", "policy": "unrestricted", "domain": "telecom",
                  "metric": "A"}, "8.62"),
    ("backbone", {"model": "Llama-4-Mav", "policy": "unrestricted", "domain": "retail",
                  "metric": "U"}, "-0.06"),
    ("backbone", {"model": "Grok-4.3", "policy": "voi-gate-as-run", "domain": "retail",
                  "metric": "A"}, "14.66"),
    ("backbone", {"model": "GPT-OSS-120B", "policy": "budgeted", "domain": "webshop",
                  "metric": "V"}, "6.80"),
    ("backbone", {"model": "Llama-3.3-70B", "policy": "budgeted", "domain": "airline",
                  "metric": "A"}, "0.02"),
    ("backbone", {"model": "GPT-6-Astra", "policy": "no-ask", "domain": "airline",
                  "metric": "R"}, "0.70"),
    ("abstract", {"metric": "retained", "row": "high"}, "94"),
    ("abstract", {"metric": "agreement"}, "75"),
]


@pytest.mark.parametrize(("item", "where", "text"), SPOT)
def test_numbers_checked_by_eye_against_the_paper(item: str, where: dict, text: str) -> None:
    found = published_value(item, **where)
    assert found is not None and found.text == text


def test_intervals_and_stars_are_where_the_paper_prints_them() -> None:
    hit = published_value("table4", row="Equal counts", column="Annotator judgment / Overall "
                          "burden")
    assert hit.interval == ("64.5", "84.9") and hit.value == 75.0
    assert published_value("table13", row="Messages", policy="budgeted+mgr").interval == (
        "9.9", "12.0")
    for item in ("table4", "table11", "table13", "table14"):
        assert all(p.interval for p in published(item)), item
    assert [p.row for p in published("table10") if p.interval] == [
        "Human–human", "Human–human", "Judge–annotator (mean)", "Judge–annotator (mean)",
        "Second judge (mean)", "Second judge (mean)"]
    starred = {(p.item, p.text) for p in published() if p.starred}
    assert starred == {("table5", "-0.7"), ("table5", "-0.9"), ("table5", "+0.9"),
                       ("table5", "+1.7"), ("table7", "-4.2"), ("table7", "-3.0"),
                       ("table8", "-4.6"), ("table17", "+4.8"), ("table17", "+2.5"),
                       ("table17", "-3.3")}
    assert len([p for p in published() if p.starred]) == 11  # Table 8's -4.6 twice
    assert not published_value("table5", policy="budgeted+mgr", metric="dR").starred  # phantom


def test_blanks_have_no_entry() -> None:
    assert published_value("backbone", model="Llama-3.3-70B", policy="unrestricted",
                           metric="V", domain="airline") is None
    assert published_value("backbone", model="Llama-3.3-70B", policy="unrestricted",
                           metric="V", domain="retail").text == "6.23"
    assert published_value("backbone", model="GPT-5.4", policy="no-ask", metric="A",
                           domain="retail") is None
    assert published_value("table5", policy="budgeted", metric="dR") is None
    assert published_value("table7", policy="unrestricted", metric="reviews") is None
    assert published_value("table8", policy="budgeted+mgr", budget="2") is None  # not in our copy


def test_lookups_parse_numbers_and_refuse_ambiguity_and_unknown_fields() -> None:
    assert published_value("table17", metric="dR", column="Wide window minus Budgeted + Review",
                           ).value == 1.4
    assert published_value("table3", policy="budgeted+mgr", metric="R",
                           domain="browsecomp").budget == "1-8"
    with pytest.raises(ValueError, match="2 numbers match table17"):
        published_value("table17", metric="dR")
    with pytest.raises(ValueError, match="no field colour"):
        published("table3", colour="red")
    assert published("table3", threshold=None, policy="voi-gate-as-run") == []


def test_a_malformed_entry_is_named_in_the_error() -> None:
    good = dict(paper_data()["values"][0])
    with pytest.raises(ValueError, match=r"paper_values.yaml: values\[7\] \(x\)\.metric"):
        pv._entry(7, {**good, "id": "x", "metric": "Reward"})
    with pytest.raises(ValueError, match=r"\(x\): unknown field\(s\) unit"):
        pv._entry(7, {**good, "id": "x", "unit": "%"})
    with pytest.raises(ValueError, match=r"\(x\)\.value: 'n/a' is not a number"):
        pv._entry(7, {**good, "id": "x", "value": "n/a"})


def test_notes_say_what_has_no_numbers() -> None:
    for item in ("figure3", "figure5", "figure8"):
        assert "picture" in paper_note(item)
    assert "not a result" in paper_note("table6") and "not a result" in paper_note("table9")
    assert "not in our copy" in paper_note("appendix-e")
    assert paper_note("table99") is None


def test_the_values_file_ships_with_the_package() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["prour"]
    assert any(fnmatch.fnmatch(f"eval/attention/{VALUES_FILE}", p) for p in patterns)
    assert (REPO / "prour" / "eval" / "attention" / VALUES_FILE).is_file()
