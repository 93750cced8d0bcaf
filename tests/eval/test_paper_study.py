"""The Prour paper's Tables 2, 3, 4 and 7 from a study's result lines (prour.eval.paper_study):
each row's Pass@1 equals the success rate recomputed here from the lines (mean over tasks and
seeds per domain, then over domains), a cell the study did not run reads "not run" with what is
missing said in words, the paper's number sits beside its row, and Table 4 names its task set."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from prour.eval.paper_study import StudyRuns, table2_item, table3_item, table4_item, table7_item

DOMAINS = ("retail", "airline")
TASKS = ("1", "2", "3")
SEEDS = (0, 1)


def line(rng: np.random.Generator, method: str, domain: str, task: str, seed: int,
         split: str = "base", **axes: str) -> dict[str, Any]:
    score = float(rng.random() < 0.4)
    return {"key": [domain, task, seed, f"{method} {axes}"], "method": method, "variant": None,
            "axes": axes, "domain": domain, "task_id": task, "seed": seed, "split": split,
            "score": score, "success": score == 1.0, "error": False, "timeout": False,
            "unscored": False, "termination": "user_stop", "seconds": 10.0,
            "steps": {"act": 5, "clarify": int(rng.integers(0, 3)), "verify": 1},
            "model_calls": {}, "model_calls_total": 3, "turns": [], "router": None}


def grid(rng: np.random.Generator, methods: tuple[str, ...], cells: list[dict[str, str]],
         domains: tuple[str, ...] = DOMAINS, split: str = "base") -> list[dict[str, Any]]:
    return [line(rng, m, d, t, s, split, **cell) for cell in cells for m in methods
            for d in domains for t in TASKS for s in SEEDS]


def cells(**axes: list[str]) -> list[dict[str, str]]:
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


NAMES = {"generator": {"trained": "Qwen3-1.7B (trained)", "qwen3-8b": "Qwen3-8B",
                       "deepseek-v4-flash": "DeepSeek-V4-Flash"},
         "agent": {"qwen3-8b": "Qwen3-8B", "qwen3-32b": "Qwen3-32B",
                   "glm-4-32b-qwen3-8b-thresholds": "GLM-4-32B (Qwen3-8B thresholds)",
                   "glm-4-32b": "GLM-4-32B (GLM-4-32B thresholds)"}}


def runs() -> StudyRuns:
    rng = np.random.default_rng(0)
    grids = {
        "table2": grid(rng, ("prour",), cells(generator=["trained", "qwen3-8b"],
                                              agent=["qwen3-8b"])),
        "table3": grid(rng, ("prour",), cells(generator=["qwen3-8b", "trained"],
                                              agent=["qwen3-8b", "qwen3-32b"])),
        "table3-base": grid(rng, ("base",), cells(generator=["trained"],
                                                  agent=["qwen3-8b", "qwen3-32b"])),
        "table4": grid(rng, ("base", "prour"), cells(generator=["trained"], agent=["qwen3-8b"]),
                       ("retail", "airline", "telecom"), "tau3"),
        "table7": grid(rng, ("prour",), cells(generator=["trained", "qwen3-8b"],
                                              agent=["glm-4-32b-qwen3-8b-thresholds",
                                                     "glm-4-32b"])),
        "table7-base": grid(rng, ("base",), cells(generator=["trained"], agent=["glm-4-32b"])),
    }
    return StudyRuns(grids, NAMES, Path("study"),
                     {"openai:Qwen/Qwen3-8B": (0.25, 0.2), "openai:GLM": (0.2, 0.08)})


def pass_at_1(lines: list[dict[str, Any]], domains: tuple[str, ...] = DOMAINS) -> float:
    """Mean success over tasks and seeds per domain, then over domains, in %."""
    return 100 * float(np.mean([np.mean([x["score"] for x in lines if x["domain"] == d])
                                for d in domains]))


def average(row: list[str]) -> float:
    return float(row[-5].split(" ")[0])


def rows_of(item: Any) -> dict[str, list[str]]:
    return {f"{row[0]} | {row[1]}": row for row in item.rows}


def test_table2_rows_are_the_generators_success_and_the_paper_beside() -> None:
    study = runs()
    rows = rows_of(table2_item(study, 200))
    trained = [x for x in study.grids["table2"] if x["axes"]["generator"] == "trained"]
    assert abs(average(rows["Qwen3-1.7B (trained) | this run"]) - pass_at_1(trained)) < 0.006
    assert rows["Qwen3-1.7B (trained) | paper"][-5] == "28.17"
    assert rows["Qwen3-8B | paper"][-5] == "–"  # the text states no number for it
    # the paper's DeepSeek-V4-Flash column: not run (its key) is said, not shown as 0
    item = table2_item(study, 200)
    assert any("DeepSeek-V4-Flash (generator=deepseek-v4-flash): no episode" in m
               for m in item.missing)


def test_table3_base_rows_come_from_the_base_grid() -> None:
    study = runs()
    rows = rows_of(table3_item(study, 200))
    base = [x for x in study.grids["table3-base"] if x["axes"]["agent"] == "qwen3-32b"]
    assert abs(average(rows["Qwen3-32B / none (base agent) | this run"]) - pass_at_1(base)) \
        < 0.006
    assert rows["Qwen3-32B / Qwen3-1.7B (trained) | paper"][-5] == "40.25"
    assert rows["Qwen3-8B / Qwen3-1.7B (trained) | paper"][-5] == "28.17"


def test_table4_is_on_tau3_and_says_so() -> None:
    study = runs()
    item = table4_item(study, 200)
    rows = rows_of(item)
    prour = [x for x in study.grids["table4"] if x["method"] == "prour"]
    assert abs(average(rows["prour | this run"]) - pass_at_1(prour, ("retail", "airline",
                                                                     "telecom"))) < 0.006
    assert rows["prour | paper"][-5] == "29.00" and rows["prour | paper"][-1] == "29.25"
    assert any(note.startswith("Task set: retail tau3") for note in item.notes), item.notes


def test_table7_blocks_and_thresholds() -> None:
    study = runs()
    item = table7_item(study, 200)
    rows = rows_of(item)
    assert rows["GLM-4-32B (GLM-4-32B thresholds) / Qwen3-1.7B (trained) | paper"][-5] == "37.00"
    assert rows["GLM-4-32B (Qwen3-8B thresholds) / Qwen3-8B | paper"][-5] == "29.65"
    assert "Thresholds stored for openai:GLM: τ_AU 0.20, τ_EU 0.08" in item.notes


def test_a_study_that_did_not_run_is_said_in_words() -> None:
    empty = StudyRuns({}, {}, Path("study"), {}, "the run's recipe has no `study` section")
    for build in (table2_item, table3_item, table4_item, table7_item):
        item = build(empty, 200)
        assert item.missing == ["the run's recipe has no `study` section"] and not item.rows
    half = runs()
    half.grids.pop("table7")
    item = table7_item(half, 200)
    assert any("no result lines in grid `table7`" in m for m in item.missing)
