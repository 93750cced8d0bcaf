"""Task-success metrics of an evaluation run: Pass@1, pass^k, step split, paired comparisons.

Results come as a reward table ``{task_id: {seed: reward}}`` per domain. An episode succeeds
when its reward is at least 1 − 1e-6 (tau2 rewards are products of per-check scores in [0, 1]).
Every (task, seed) cell must be present: a missing episode is an error to fix (rerun the
harness), never a silent zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb

import numpy as np

from prour.eval.stats import BootstrapResult, bootstrap_mean_ci, paired_bootstrap

SUCCESS_TOLERANCE = 1e-6
STEP_KINDS = ("act", "clarify", "verify")
PAPER_KIND = {"confirm": "clarify"}
"""Turn tags the paper's Act / Clarify / Verify split counts under another kind: a confirmation
(the user's consent before a mutating action) is a turn addressed to the user, so Clarify."""
AVERAGE = "average"

RewardTable = Mapping[str, Mapping[int, float]]
"""task_id → seed → episode reward in [0, 1]."""


@dataclass(frozen=True)
class RewardMatrix:
    """Rewards laid out as (n_tasks, n_seeds), rows in ``task_ids`` order, columns in ``seeds``."""

    task_ids: list[str]
    seeds: list[int]
    values: np.ndarray

    @property
    def successes(self) -> np.ndarray:
        """(n_tasks, n_seeds) of 0.0 / 1.0."""
        return (self.values >= 1.0 - SUCCESS_TOLERANCE).astype(float)


def is_success(reward: float) -> bool:
    """An episode counts as solved when its reward is 1 up to float error."""
    return reward >= 1.0 - SUCCESS_TOLERANCE


def reward_matrix(rewards: RewardTable, name: str = "run") -> RewardMatrix:
    """Lay a reward table out as a full matrix; raise naming the missing (task, seed) cells."""
    if not rewards:
        raise ValueError(f"{name}: no tasks in the reward table")
    task_ids = sorted(rewards)
    seeds = sorted({seed for by_seed in rewards.values() for seed in by_seed})
    missing = [(t, s) for t in task_ids for s in seeds if s not in rewards[t]]
    if missing:
        shown = ", ".join(f"task {t!r} seed {s}" for t, s in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"{name}: missing episodes: {shown}{more}")
    values = np.array([[float(rewards[t][s]) for s in seeds] for t in task_ids])
    if np.any(~np.isfinite(values)):
        raise ValueError(f"{name}: non-finite reward in the table")
    return RewardMatrix(task_ids, seeds, values)


def pass_at_1(rewards: RewardTable) -> float:
    """Mean over seeds of the fraction of tasks solved in that seed's run."""
    return float(reward_matrix(rewards).successes.mean(axis=0).mean())


def pass_hat_k(rewards: RewardTable, k: int) -> float:
    """tau-bench's pass^k: mean over tasks of C(c, k) / C(n, k), c successes among n trials."""
    matrix = reward_matrix(rewards)
    n = len(matrix.seeds)
    if not 1 <= k <= n:
        raise ValueError(f"pass^k needs 1 <= k <= n_trials = {n}, got k = {k}")
    counts = matrix.successes.sum(axis=1).astype(int)
    return float(np.mean([comb(int(c), k) / comb(n, k) for c in counts]))


def _stack_domains(
    by_domain: Mapping[str, RewardTable],
) -> tuple[dict[str, RewardMatrix], np.ndarray, list[str]]:
    """Per-domain matrices, all success rows stacked, and each row's domain label."""
    matrices = {d: reward_matrix(table, d) for d, table in by_domain.items()}
    seed_sets = {tuple(m.seeds) for m in matrices.values()}
    if len(seed_sets) > 1:
        raise ValueError(f"domains were run with different seeds: {sorted(seed_sets)}")
    rows = np.concatenate([m.successes for m in matrices.values()])
    labels = [d for d, m in matrices.items() for _ in m.task_ids]
    return matrices, rows, labels


def domain_pass_at_1(
    by_domain: Mapping[str, RewardTable], n_boot: int = 10_000, seed: int = 0, ci: float = 0.95,
) -> dict[str, BootstrapResult]:
    """Pass@1 per domain and their unweighted average (key ``"average"``), task-bootstrap CIs.

    The average's interval resamples tasks within each domain (domains stay equally weighted).
    """
    matrices, rows, labels = _stack_domains(by_domain)
    out = {d: bootstrap_mean_ci(m.successes, n_boot, seed, ci) for d, m in matrices.items()}
    out[AVERAGE] = bootstrap_mean_ci(rows, n_boot, seed, ci, strata=labels)
    return out


def _aligned(a: RewardTable, b: RewardTable, name: str) -> tuple[RewardMatrix, RewardMatrix]:
    """Both runs as matrices over identical tasks and seeds (else an error naming the gaps)."""
    ma, mb = reward_matrix(a, f"{name} (a)"), reward_matrix(b, f"{name} (b)")
    if ma.task_ids != mb.task_ids or ma.seeds != mb.seeds:
        only_a = sorted(set(ma.task_ids) - set(mb.task_ids))[:5]
        only_b = sorted(set(mb.task_ids) - set(ma.task_ids))[:5]
        raise ValueError(
            f"{name}: runs differ in tasks or seeds (tasks only in a: {only_a}, only in b: "
            f"{only_b}; seeds a: {ma.seeds}, b: {mb.seeds})")
    return ma, mb


def compare_runs(
    a: Mapping[str, RewardTable], b: Mapping[str, RewardTable], n_boot: int = 10_000,
    seed: int = 0, ci: float = 0.95,
) -> dict[str, BootstrapResult]:
    """Paired Pass@1 difference a − b per domain and averaged, on the same tasks and seeds."""
    if set(a) != set(b):
        raise ValueError(f"runs cover different domains: {sorted(a)} vs {sorted(b)}")
    out: dict[str, BootstrapResult] = {}
    rows_a, rows_b, labels = [], [], []
    for domain in a:
        ma, mb = _aligned(a[domain], b[domain], domain)
        out[domain] = paired_bootstrap(ma.successes, mb.successes, n_boot, seed, ci)
        rows_a.append(ma.successes)
        rows_b.append(mb.successes)
        labels += [domain] * len(ma.task_ids)
    out[AVERAGE] = paired_bootstrap(np.concatenate(rows_a), np.concatenate(rows_b),
                                    n_boot, seed, ci, strata=labels)
    return out


@dataclass(frozen=True)
class StepSplit:
    """Mean number of act / clarify / verify turns per episode, and their total."""

    act: float
    clarify: float
    verify: float
    episodes: int

    @property
    def total(self) -> float:
        return self.act + self.clarify + self.verify


def step_split(episodes: Sequence[Sequence[str]]) -> StepSplit:
    """Average per-episode counts of each turn label (``confirm`` counts as clarify); unknown
    labels are errors."""
    if not episodes:
        raise ValueError("step_split needs at least one episode")
    counts = np.zeros((len(episodes), len(STEP_KINDS)))
    for i, labels in enumerate(episodes):
        try:
            split = paper_split(labels)
        except ValueError as exc:
            raise ValueError(f"episode {i}: {exc}") from None
        counts[i] = [split[kind] for kind in STEP_KINDS]
    act, clarify, verify = counts.mean(axis=0)
    return StepSplit(float(act), float(clarify), float(verify), len(episodes))


def paper_split(labels: Sequence[str]) -> dict[str, int]:
    """Act / Clarify / Verify counts of the paper's tables from turn tags (a confirmation is a
    user-facing turn: it counts as Clarify); unknown labels are errors."""
    kinds = [PAPER_KIND.get(label, label) for label in labels]
    unknown = [label for label, kind in zip(labels, kinds) if kind not in STEP_KINDS]
    if unknown:
        raise ValueError(f"unknown step label {unknown[0]!r}; "
                         f"valid: {', '.join([*STEP_KINDS, *PAPER_KIND])}")
    return {kind: kinds.count(kind) for kind in STEP_KINDS}
