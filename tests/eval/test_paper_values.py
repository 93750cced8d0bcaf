"""The paper's published values (prour/eval/paper_values.yaml): each is read from the paper's words
kept beside it, the ones the report looks up are there with the numbers the paper's text gives,
and the file ships with the package."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from prour.config.eval import METHOD_NAMES
from prour.eval.paper import (
    FILES,
    VALUES_FILE,
    paper_data,
    paper_methods,
    paper_value,
    paper_values,
)

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"id", "item", "metric", "value", "unit", "source", "claim", "phrase"}
OPTIONAL = {"method", "model", "domain", "label", "at"}
NUMBER = re.compile(r"^\d{1,3}(,\d{3})*(\.\d+)?$|^\d+(\.\d+)?$")


@pytest.mark.parametrize("entry", paper_data()["values"], ids=lambda e: e["id"])
def test_each_value_is_read_from_the_papers_words_kept_beside_it(entry: dict) -> None:
    assert FIELDS <= set(entry) <= FIELDS | OPTIONAL
    assert all(isinstance(entry[k], str) and entry[k].strip() for k in FIELDS - {"unit"})
    assert NUMBER.match(entry["value"]), entry["value"]
    assert entry["value"] in entry["phrase"]  # the number, as the paper writes it
    assert entry["item"] in FILES
    assert entry["unit"] in ("%", "steps", "s", "nats", "states", "events", "")
    if "method" in entry:
        assert entry["method"] in METHOD_NAMES
    for key, where in entry.get("at", {}).items():
        assert key in ("step", "budget", "every_n") and isinstance(where, int)


def test_ids_are_unique_and_every_item_has_a_value() -> None:
    ids = [e["id"] for e in paper_data()["values"]]
    assert len(ids) == len(set(ids))
    assert {v.item for v in paper_values()} == set(FILES)
    assert set(paper_methods()) <= set(METHOD_NAMES)


# (item, fields, the number the paper's text gives), typed from the paper for this test
PUBLISHED = [
    ("table1", {"method": "prour", "metric": "pass_at_1", "domain": "average"}, 28.17),
    ("table1", {"method": "prour", "metric": "steps", "domain": "average"}, 21.33),
    ("table1", {"method": "base", "metric": "pass_at_1", "domain": "average"}, 17.40),
    ("table1", {"method": "base", "metric": "steps", "domain": "average"}, 28.90),
    ("table1", {"method": "ask-before-plan", "metric": "pass_at_1"}, 23.60),
    ("table1", {"method": "sage-agent", "metric": "pass_at_1"}, 21.13),
    ("table1", {"method": "ig-clarifier", "metric": "pass_at_1"}, 22.85),
    ("table1", {"method": "saber", "metric": "pass_at_1"}, 20.87),
    ("table1", {"method": "verifiagent", "metric": "steps"}, 43.01),
    ("table1", {"method": "verify-only", "domain": "airline"}, 30.0),
    ("table1", {"method": "verify-only", "domain": "retail"}, 15.7),
    ("table6", {"model": "Qwen3-8B", "metric": "macro_f1"}, 0.714),
    ("table6", {"model": "Qwen3-8B", "metric": "tau_au"}, 0.25),
    ("table6", {"model": "Qwen3-8B", "metric": "tau_eu"}, 0.20),
    ("figure4", {"metric": "reward"}, 0.7),
    ("figure5", {"metric": "steps"}, 20.42),
    ("figure7", {"label": "decomposer"}, 74.04),
    ("figure7", {"label": "llm_router"}, 54.24),
    ("figure2", {"metric": "events"}, 19022),
    ("figure2", {"metric": "share", "label": "world"}, 89.1),
    ("figure2", {"metric": "share", "label": "user"}, 10.9),
    ("table5", {"metric": "events", "label": None}, 19022),
    ("table5", {"metric": "events", "label": "world"}, 16947),
    ("table5", {"metric": "events", "label": "user"}, 2075),
    ("table5", {"metric": "share", "label": "world"}, 89.1),
    ("table5", {"metric": "share", "label": "user"}, 10.9),
]


@pytest.mark.parametrize(("item", "where", "number"), PUBLISHED)
def test_the_values_the_report_looks_up_are_the_papers(item: str, where: dict,
                                                       number: float) -> None:
    assert paper_value(item, **where).value == number


def test_sweep_and_curve_values_sit_where_the_text_places_them() -> None:
    every = {v.at["every_n"]: v.value for v in paper_values("figure8", metric="pass_at_1")}
    assert every == {1: 28.17, 2: 27.32, 4: 23.00, 8: 19.55}
    assert {v.at["every_n"]: v.value for v in paper_values("figure8", metric="steps")} == {
        1: 21.33, 2: 25.26}
    assert {v.at["every_n"]: v.value for v in paper_values("figure8", metric="seconds")} == {
        1: 696.51, 2: 708.27}
    budget = paper_values("figure5", metric="pass_at_1")
    assert {v.at.get("budget"): v.value for v in budget} == {16: 29.42, None: 18.37}
    assert paper_value("figure4", metric="reward").at == {"step": 2010}
    assert [(v.at["step"], v.value) for v in paper_values("figure6", metric="total")] == [
        (1, 0.58), (16, 0.11)]
    assert [(v.at["step"], v.value) for v in paper_values("figure6", metric="eu")] == [
        (1, 0.26), (16, 0.08)]


def test_the_taxonomy_counts_add_up_as_the_paper_says() -> None:
    """A.1: 16,947 world-side and 2,075 user-side of 19,022 events, 89.1 % and 10.9 %."""
    world, user = (paper_value("table5", metric="events", label=s).value for s in ("world", "user"))
    assert world + user == paper_value("table5", metric="events", label=None).value
    assert round(100 * world / (world + user), 1) == paper_value("figure2", metric="share",
                                                                 label="world").value


def test_the_values_file_ships_with_the_package() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["prour"]
    assert any(fnmatch.fnmatch(f"eval/{VALUES_FILE}", p) for p in patterns)
    assert (REPO / "prour" / "eval" / VALUES_FILE).is_file()
