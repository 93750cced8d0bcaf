"""The ask-less paper's development and test splits (its Table 6), drawn by a fixed rule.

The paper splits each customer-service domain's tasks into a development set, on which
thresholds such as the VoI gate's are chosen, and a test set, which is evaluated: retail 114 =
23 + 91, airline 50 = 10 + 40, telecom 114 = 23 + 91. It does not publish which tasks went
where, so prour draws them with a rule that gives the same ids on every machine and every
Python: the tasks of tau2's ``base`` split ordered by the SHA-256 of
``ask-less|<seed>|<domain>|<task id>``, the first ``DEV_SIZES[domain]`` of them the dev split,
the rest the test split, each kept in tau2's order. The ids drawn with seed 0 ship as packaged
splits of tau2 task ids, ``prour/env/data/ask_less_<domain>_<dev|test>.json`` (written by
:func:`write_splits`): the task sets ``ask-less-dev`` and ``ask-less-test`` of each domain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEV_SIZES = {"retail": 23, "airline": 10, "telecom": 23}  # Table 6: Dev column
TEST_SIZES = {"retail": 91, "airline": 40, "telecom": 91}  # Table 6: Test column
SEED = 0
SPLIT_NAMES = {"dev": "ask-less-dev", "test": "ask-less-test"}


def draw_split(ids: Sequence[str], domain: str, dev_size: int,
               seed: int = SEED) -> tuple[list[str], list[str]]:
    """(dev ids, test ids) of one domain by the module's rule; each list in ``ids``' order."""
    if not 0 <= dev_size <= len(ids):
        raise ValueError(f"{domain}: a dev split of {dev_size} from {len(ids)} tasks")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{domain}: task ids repeat")

    def rank(task_id: str) -> str:
        return hashlib.sha256(f"ask-less|{seed}|{domain}|{task_id}".encode()).hexdigest()

    dev = set(sorted(ids, key=rank)[:dev_size])
    return [i for i in ids if i in dev], [i for i in ids if i not in dev]


def split_file(domain: str, part: str) -> str:
    """The packaged file of one domain's dev or test ids."""
    return f"ask_less_{domain}_{part}.json"


def splits_data(seed: int = SEED) -> dict[str, dict[str, Any]]:
    """File name -> content of every packaged split, drawn from tau2's installed ``base``."""
    from prour.env.domains import domain_module

    out = {}
    for domain, size in DEV_SIZES.items():
        base = list(domain_module(domain).get_tasks_split()["base"])  # tau2's own, in its order
        parts = dict(zip(("dev", "test"), draw_split(base, domain, size, seed)))
        for part, ids in parts.items():
            out[split_file(domain, part)] = {
                "source": f"the ask-less paper's Table 6 {part} split of {domain} (tau2 base "
                          "tasks, drawn by prour/eval/attention/splits.py)",
                "rule": "tau2 base tasks ordered by sha256('ask-less|<seed>|<domain>|<task "
                        "id>'); the first Dev of them are dev, the rest test, in tau2's order",
                "seed": seed, "task_ids": ids, "excluded": []}
    return out


def write_splits(folder: str | Path, seed: int = SEED) -> list[Path]:
    """Write the packaged split files into ``folder`` (what ships is seed 0's)."""
    from prour.files import write_atomic

    written = []
    for name, data in splits_data(seed).items():
        written.append(write_atomic(Path(folder) / name, json.dumps(data, indent=1) + "\n"))
    return written


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped files
    from prour.env.domains import DATA_DIR

    for path in write_splits(DATA_DIR):
        print(path)
