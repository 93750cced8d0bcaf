"""DAPO pieces of the query-generator update, under the names training code has used.

The maths lives in :mod:`prour.core.policy_gradient` (pure torch, verl's formulas written out,
held equal to verl's ``core_algos`` by tests/core/test_verl_parity.py); this module keeps the old
import path working.
"""

from __future__ import annotations

from prour.core.policy_gradient import (
    ASK,
    drop_zero_variance,
    group_advantages,
    policy_loss,
    select_kept,
    token_entropy,
)

__all__ = [
    "ASK",
    "drop_zero_variance",
    "group_advantages",
    "policy_loss",
    "select_kept",
    "token_entropy",
]
