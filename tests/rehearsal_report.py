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
    return rows
