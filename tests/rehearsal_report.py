"""What both rehearsal tests (``prour run`` and the Slurm chain) check of a finished eval: every
method x domain x seed has one result line, and the report's Pass@1 table has one row per method
in ``eval.methods`` order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def every_method_reported(run_dir: Path, recipe: Any) -> list[str]:
    """Assert the results and the report cover the recipe's eval plan; return the table's rows."""
    results = [json.loads(x) for x in (run_dir / "eval" / "results.jsonl").read_text().split("\n")
               if x.strip()]
    planned = {(m, d, s) for m in recipe.eval.methods for d in recipe.eval.domains
               for s in recipe.eval.seeds}
    assert sorted((r["method"], r["domain"], r["seed"]) for r in results) == sorted(planned)
    report = (run_dir / "eval" / "report" / "report.md").read_text()
    table = report.split("## Pass@1 (%) and interaction cost")[1].split("\n## ")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| ") and not line.startswith(("| System", "| ---"))]
    assert [row.split(" (")[0] for row in rows] == recipe.eval.methods  # a row per method
    questions_written_by_their_own_models(results, recipe)
    assert "## Question writers" in report
    return rows


def questions_written_by_their_own_models(results: list[dict[str, Any]], recipe: Any) -> None:
    """ig-clarifier's questions come from its own exported checkpoint (the chain's
    export-ig-clarifier), prour's methods' from prour's exported step, ask-before-plan's from the
    agent backbone: as every episode's result line records it."""
    from prour.eval.methods import check_method
    from prour.stages import _exported, ig_recipe

    prour_step = str(_exported(recipe).resolve())
    ig_step = str(_exported(ig_recipe(recipe)).resolve())
    assert ig_step != prour_step
    wanted = {"generator": prour_step, "ig_clarifier": ig_step,
              "agent": recipe.models["agent"].model}
    for line in results:
        writer = check_method(line["method"]).writer
        assert line["question_writer"] == wanted.get(writer), (line["method"], line)
