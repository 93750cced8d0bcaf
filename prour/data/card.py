"""The dataset card (``prour data stats``): what a dataset holds, as JSON and as markdown.

Counts per mode and domain, prompt/target token-length percentiles, truncation counts (rows
truncated, and among them the rows whose newest user message and what follows it were over budget
and keep their tool results as excerpts, see :mod:`prour.data.truncate`), and from the summary
``extract`` leaves next to the parquet files: the extraction cost (decomposer calls per routed
state) and what extraction dropped (duplicate and errored trajectories, invalid lines, states
dropped per reason, ``over_budget`` among them) and the prompts the trajectories were collected
with.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prour.data.dataset import SPLITS, read_rows, split_path
from prour.data.truncate import is_excerpt
from prour.files import write_atomic
from prour.markdown import md, table

CARD_JSON = "card.json"
CARD_MD = "card.md"
EXTRACT_SUMMARY = "extract_summary.json"
PERCENTILES = (50, 90, 95, 99)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p95/p99 (linear interpolation), mean and max; zeros for an empty list."""
    if not values:
        return {**{f"p{q}": 0.0 for q in PERCENTILES}, "mean": 0.0, "max": 0.0}
    arr = np.asarray(values, dtype=np.float64)
    stats = {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}
    return {**stats, "mean": float(arr.mean()), "max": float(arr.max())}


def split_stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and length statistics of one split's rows."""
    extras = [row["extra_info"] for row in rows]
    by_domain_mode: dict[str, Counter[str]] = {}
    for extra in extras:
        by_domain_mode.setdefault(extra["domain"], Counter())[extra["mode"]] += 1
    truncated = sum(1 for extra in extras if extra["truncated"])
    excerpted = sum(1 for extra in extras if any(map(is_excerpt, json.loads(extra["history"]))))
    return {
        "rows": len(rows),
        "by_mode": dict(Counter(extra["mode"] for extra in extras)),
        "by_domain": {domain: sum(c.values()) for domain, c in by_domain_mode.items()},
        "by_domain_mode": {domain: dict(c) for domain, c in by_domain_mode.items()},
        "trajectories": len({extra["trajectory_id"] for extra in extras}),
        "tasks": len({(extra["domain"], extra["task_id"]) for extra in extras}),
        "prompt_tokens": percentiles([extra["prompt_tokens"] for extra in extras]),
        "target_tokens": percentiles([extra["target_tokens"] for extra in extras]),
        "truncated": truncated,
        "truncated_share": truncated / len(rows) if rows else 0.0,
        "excerpted": excerpted,
        "dropped_messages": sum(extra["dropped_messages"] for extra in extras),
    }


def dataset_card(dataset_dir: str | Path) -> dict[str, Any]:
    """The card of a dataset folder (both splits plus the extraction summary when present)."""
    dataset_dir = Path(dataset_dir)
    card: dict[str, Any] = {"dataset_dir": str(dataset_dir), "splits": {}}
    for split in SPLITS:
        path = split_path(dataset_dir, split)
        if path.is_file():
            card["splits"][split] = split_stats(checked_rows(path))
    if not card["splits"]:
        raise FileNotFoundError(f"no split files (train/validation .parquet) in {dataset_dir}")
    if not any(stats["rows"] for stats in card["splits"].values()):
        files = [f"{split}.parquet" for split in card["splits"]]
        raise ValueError(f"{dataset_dir}: {' and '.join(files)} hold{'s' if len(files) == 1 else ''}"
                         " no rows; rerun `prour extract` (its card says what it dropped)")
    summary = dataset_dir / EXTRACT_SUMMARY
    if summary.is_file():
        try:
            card["extraction"] = json.loads(summary.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{summary}: not valid JSON ({exc}); rerun `prour extract`") from None
        if not isinstance(card["extraction"], dict):
            raise ValueError(f"{summary}: not a JSON object; rerun `prour extract`")
    return card


def checked_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a split file, each checked against the row schema first: a row that is not
    one is a ValueError naming the file, the row and its first problem (how many more)."""
    from prour.data.schema import REBUILD, check_rows

    rows = read_rows(path)
    problems = check_rows(rows, f"{path}: ")
    if problems:
        more = f" ({len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ValueError(f"{problems[0]}{more}; {REBUILD}")
    return rows


def _lengths_row(name: str, stats: dict[str, float]) -> list[str]:
    cells = [f"{stats[key]:.0f}" for key in (*[f"p{q}" for q in PERCENTILES], "max")]
    return [name, *cells, f"{stats['mean']:.1f}"]


def _split_markdown(split: str, stats: dict[str, Any]) -> list[str]:
    summary = (f"{stats['rows']} rows from {stats['trajectories']} trajectories "
               f"of {stats['tasks']} tasks.")
    lines = [f"## {split}", "", summary, "",
             *table(["domain", "clarify", "verify", "total"],
                    [[domain, counts.get("clarify", 0), counts.get("verify", 0),
                      sum(counts.values())]
                     for domain, counts in sorted(stats["by_domain_mode"].items())])]
    truncation = (f"Truncated prompts: {stats['truncated']} "
                  f"({100 * stats['truncated_share']:.1f}%), "
                  f"{stats['dropped_messages']} history messages dropped in all; "
                  f"{stats['excerpted']} kept tool results after the newest user message only as "
                  "excerpts.")
    lines += ["", *table(["tokens", *(f"p{q}" for q in PERCENTILES), "max", "mean"],
                         [_lengths_row("prompt", stats["prompt_tokens"]),
                          _lengths_row("target", stats["target_tokens"])]), "", truncation, ""]
    return lines


def _extraction_markdown(summary: dict[str, Any]) -> list[str]:
    routes = summary.get("routes", {})
    routed = (f"States routed: {summary.get('states', 0)} (act {routes.get('act', 0)}, "
              f"clarify {routes.get('clarify', 0)}, verify {routes.get('verify', 0)}).")
    cost = (f"Decomposer calls: {summary.get('decomposer_calls', 0)} in all, "
            f"{summary.get('decomposer_calls_per_state', 0.0):.2f} per routed state.")
    return ["## Extraction", "", routed, cost, *drop_lines(summary), ""]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def drop_lines(summary: dict[str, Any]) -> list[str]:
    """What extraction left out, from its summary, as the card and ``prour extract`` say it:
    trajectories (duplicate records named by key, invalid lines, errored episodes,
    calibration-reserve tasks), states per reason (``over_budget``, ``verify_off_reference`` …),
    and the prompts hashes the trajectories were collected with. Summaries written before these
    were recorded give what they hold."""
    duplicates = summary.get("duplicates") or {}
    invalid = summary.get("invalid_lines") or []
    trajectories = summary.get("trajectories") or {}
    parts = [_plural(sum(duplicates.values()), "duplicate record")]
    if duplicates:
        keys = "; ".join(f"{key}: {n + 1} records, the last kept"
                         for key, n in list(duplicates.items())[:5])
        parts[0] += f" (key {keys}{'; …' if len(duplicates) > 5 else ''})"
    parts.append(_plural(len(invalid), "invalid line") + (
        f" (line {', '.join(map(str, invalid[:10]))}{', …' if len(invalid) > 10 else ''})"
        if invalid else ""))
    parts.append(_plural(trajectories.get("errored", 0), "errored episode"))
    if trajectories.get("reserve_task"):
        parts.append(f"{trajectories['reserve_task']} of calibration-reserve tasks")
    dropped = summary.get("dropped") or {}
    states = ", ".join(f"{n} {why}" for why, n in sorted(dropped.items())) or "none"
    lines = [f"Dropped trajectories: {', '.join(parts)}.", f"Dropped states: {states}."]
    for domain, counts in sorted((summary.get("verify_targets") or {}).items()):
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items())
                        if reason != "target") or "none"
        lines.append(f"Verify targets ({domain}): {counts.get('target', 0)} of "
                     f"{sum(counts.values())} verify states; dropped: {why}.")
    hashes = summary.get("prompts_hashes") or {}
    if hashes:
        current = summary.get("prompts_hash", "")
        counts = ", ".join(f"{n} with {digest}" + (" (this code's)" if digest == current else "")
                           for digest, n in hashes.items())
        lines.append(f"Prompts (prompts_hash) the trajectories were collected with: {counts}.")
    return lines


def card_markdown(card: dict[str, Any]) -> str:
    """The card as a markdown page."""
    lines = [f"# Dataset card: {md(card['dataset_dir'])}", ""]
    for split, stats in card["splits"].items():
        lines += _split_markdown(split, stats)
    if "extraction" in card:
        lines += _extraction_markdown(card["extraction"])
    return "\n".join(lines)


def write_card(dataset_dir: str | Path) -> tuple[dict[str, Any], Path, Path]:
    """Compute the card and write ``card.json`` and ``card.md`` next to the parquet files."""
    card = dataset_card(dataset_dir)
    json_path, md_path = Path(dataset_dir) / CARD_JSON, Path(dataset_dir) / CARD_MD
    write_atomic(json_path, json.dumps(card, indent=2, sort_keys=True) + "\n")
    write_atomic(md_path, card_markdown(card))
    return card, json_path, md_path
