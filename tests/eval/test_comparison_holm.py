"""The report's paired differences are Holm-adjusted as one family: every comparison of every
system with the baseline, each domain and the average (not one family per system).

Three systems on the same five retail tasks, one seed: ``base`` solves none, ``one`` and ``two``
solve all. Each difference is 1 on every task, so every bootstrap draw is 1 and, with B = 99
draws, each raw p-value is 2 * (0 + 1) / (B + 1) = 0.02 (prour.eval.stats' p-value). Two systems
times (retail, average) make a family of m = 4 equal p-values: Holm's adjusted values are
max over j <= i of (m - j + 1) * p, i.e. 4 * 0.02 = 0.08 for all four. A family per system
(m = 2) would give 0.04.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.eval.harness import RESULTS_FILE
from prour.eval.report import write_report
from prour.eval.systems import compare, load_systems

N_BOOT = 99
RAW_P = 2 * (0 + 1) / (N_BOOT + 1)
HOLM_ALL = 4 * RAW_P  # family of 4: two systems x (retail, average)


def _line(method: str, task: str, score: float) -> dict:
    return {"schema": 1, "key": ["retail", task, 0, method], "method": method, "variant": None,
            "domain": "retail", "task_id": task, "seed": 0, "reward": score, "score": score,
            "success": score == 1.0, "termination": "user_stop", "error": False,
            "timeout": False, "unscored": False, "errors": [],
            "steps": {"act": 2, "clarify": 0, "verify": 0}, "model_calls": {"agent.chat": 2},
            "model_calls_total": 2, "seconds": 1.0, "decisions": [], "attention": None}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    lines = [_line(method, f"t{i}", score) for method, score in
             (("base", 0.0), ("one", 1.0), ("two", 1.0)) for i in range(5)]
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / RESULTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def test_holm_family_is_every_comparison(run: Path) -> None:
    comparisons = compare(load_systems([run]), "base", n_boot=N_BOOT)
    assert [c.label for c in comparisons] == ["one", "two"]
    for c in comparisons:
        assert {d: r.p_value for d, r in c.deltas.items()} == pytest.approx(
            {"retail": RAW_P, "average": RAW_P})
        assert c.holm == pytest.approx({"retail": HOLM_ALL, "average": HOLM_ALL})


def test_the_holm_column_of_the_report(run: Path, tmp_path: Path) -> None:
    written = write_report([run], tmp_path / "report", baseline="base", n_boot=N_BOOT)
    markdown = written["markdown"].read_text()
    section = markdown.split("## Paired differences in Pass@1 (percentage points)")[1]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    holm = {cells[0]: cells[-1] for cells in
            ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    assert holm == {"one": f"{HOLM_ALL:.4f}", "two": f"{HOLM_ALL:.4f}"}  # 0.0800
    data = json.loads(written["json"].read_text())
    assert [c["holm"]["average"] for c in data["comparisons"]] == pytest.approx([HOLM_ALL] * 2)
