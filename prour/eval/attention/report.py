"""The attention protocol's sections of ``prour report`` (:mod:`prour.eval.report`): the gated
episodes of each system as conversation records, the ask-less tables over them
(:mod:`prour.eval.attention.tables`) and the human burden study."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prour.env.trajectory import is_cut
from prour.eval.systems import System

ATTENTION_PLOT = "reward_vs_attention.png"


def _model_label(system: System, several_runs: bool) -> str:
    return f"{system.run}:{system.method}" if several_runs else system.method


def conversation_records(systems: Sequence[System], transcripts: bool = False) -> list[Any]:
    """One :class:`ConversationRecord` per gated episode: model = method, method = policy;
    with ``transcripts``, each carries the dialogue as the user saw it (from the episodes)."""
    from prour.eval.attention.analysis import ConversationRecord

    several = len({s.run for s in systems}) > 1
    records = []
    for system in systems:
        seen = _user_views(system) if transcripts else {}
        for line in system.lines:
            block = line.get("attention")
            if not block:
                continue
            records.append(ConversationRecord(
                method=line["variant"], model=_model_label(system, several),
                domain=line["domain"], task_id=line["task_id"], seed=int(line["seed"]),
                reward=float(line["score"]), requests=block["requests"],
                fallback=block["fallbacks"] > 0, cut=is_cut(line["termination"]),
                transcript=seen.get(tuple(line["key"]))))
    return records


def _user_views(system: System) -> dict[tuple, list[dict[str, Any]]]:
    """Episode key → the messages its user saw, from the run folder's episodes."""
    from prour.env.trajectory import read_trajectories, user_view
    from prour.eval.harness import EPISODES_FILE

    if system.folder is None:
        return {}
    path = system.folder / EPISODES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{system.folder} holds no {EPISODES_FILE}: the burden study "
                                "shows annotators the conversations it stores")
    return {t.key: user_view(t.messages, t.steps)
            for t in read_trajectories(path, on_error="skip")}


def _cost_settings(systems: Sequence[System], accounting: str | None,
                   lam: float | None) -> tuple[str, float, Any]:
    """Accounting, λ and weights: the arguments, else those the runs were made with."""
    from prour.config.attention import DEFAULT_LAMBDA, CostWeights

    block = next((line["attention"] for s in systems for line in s.lines
                  if line.get("attention")), {})
    weights = CostWeights(**block["weights"]) if block.get("weights") else CostWeights()
    return (accounting or block.get("accounting", "full"),
            lam if lam is not None else block.get("lam", DEFAULT_LAMBDA), weights)


def attention_section(systems: Sequence[System], out: Path, n_boot: int, ci: float,
                      accounting: str | None, lam: float | None,
                      ) -> tuple[list[str], dict[str, Any], Path | None]:
    """Markdown lines, JSON data and the reward-versus-attention plot of the gated runs (the
    tables: :mod:`prour.eval.attention.tables`)."""
    from prour.eval.attention.tables import attention_tables

    records = conversation_records(systems)
    if not records:
        return ["## Attention", "", "No run used an attention policy.", ""], {}, None
    accounting, lam, weights = _cost_settings(systems, accounting, lam)
    return attention_tables(records, accounting, lam, weights, n_boot, ci, out / ATTENTION_PLOT)


# ---- human burden study -------------------------------------------------------------------


def burden_study(systems: Sequence[System], out: Path, n_pairs: int,
                 annotations: str | Path | None, accounting: str | None, n_boot: int,
                 ci: float) -> tuple[list[str], dict[str, Any], dict[str, Path]]:
    """The human burden study (ask-less paper, Table 4) in two passes: export ``n_pairs``
    equal-count pairs to ``OUT/burden/``, then, given the annotators' answers, their agreement
    with the cost ranking stored in ``pairs_key.jsonl``. Returns markdown, JSON and files."""
    if n_pairs and annotations:
        raise ValueError("export the pairs (--burden-pairs) and score the answers "
                         "(--annotations) in separate runs: the answers refer to pairs already "
                         "exported, which a new export would replace")
    if n_pairs < 0:
        raise ValueError(f"--burden-pairs must be >= 0, got {n_pairs}")
    from prour.eval.attention.tables import (
        BURDEN_DIR,
        BURDEN_KEY,
        agreement_section,
        export_section,
    )

    if annotations is None:
        accounting, _, weights = _cost_settings(systems, accounting, None)
        return export_section(conversation_records(systems, transcripts=True), out / BURDEN_DIR,
                              n_pairs, accounting, weights)
    return agreement_section(out / BURDEN_DIR / BURDEN_KEY, Path(annotations), n_boot, ci)
