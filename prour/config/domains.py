"""The tau2 domains prour runs on, as one table: the recipe's domain and split names come from it.

A leaf (no tau2 import): :mod:`prour.env.domains` loads tasks, policies and environments from
these rows. Adding a domain is one row of :data:`DOMAIN_SPECS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from prour.registry import unknown_name

TAU2_SPLITS: tuple[str, ...] = ("train", "test", "base")  # tau2's own splits of every domain
@dataclass(frozen=True)
class DomainSpec:
    """One tau2 domain: where tau2 keeps it and how prour builds its environment."""

    name: str
    # keywords of tau2's ``get_environment`` (telecom: the manual policy the agent works under)
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    tau2_splits: tuple[str, ...] = TAU2_SPLITS  # the splits tau2 ships for the domain
    # splits prour ships beside tau2's: split name -> data file in prour/env/data
    packaged_splits: dict[str, str] = field(default_factory=dict)

    @property
    def splits(self) -> tuple[str, ...]:
        """tau2's splits, then the packaged ones."""
        return self.tau2_splits + tuple(self.packaged_splits)

    @property
    def tau2_module(self) -> str:
        """tau2's module with the loaders for environment, tasks and splits."""
        return f"tau2.domains.{self.name}.environment"


DOMAIN_SPECS: dict[str, DomainSpec] = {
    spec.name: spec
    for spec in (
        DomainSpec("retail", packaged_splits={"v1-train": "tau_bench_v1_retail_train.json"}),
        DomainSpec("airline"),
        DomainSpec("telecom", environment_kwargs={"policy_type": "manual"}),
    )
}
DOMAINS: tuple[str, ...] = tuple(DOMAIN_SPECS)
DomainName = Literal[DOMAINS]  # type: ignore[valid-type]  # the recipe's domain type
SPLITS: tuple[str, ...] = TAU2_SPLITS + tuple(
    dict.fromkeys(name for spec in DOMAIN_SPECS.values() for name in spec.packaged_splits))
SplitName = Literal[SPLITS]  # type: ignore[valid-type]

def check_domain(domain: str) -> str:
    """Return ``domain`` if prour supports it, else raise a ValueError listing the valid ones."""
    if domain not in DOMAIN_SPECS:
        raise ValueError(unknown_name("domain", domain, DOMAINS))
    return domain


def domain_spec(domain: str) -> DomainSpec:
    """The table row of ``domain`` (unknown names list the valid ones)."""
    return DOMAIN_SPECS[check_domain(domain)]
