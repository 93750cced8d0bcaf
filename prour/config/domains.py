"""The domains prour runs on, as one table: the recipe's domain and split names come from it.

A leaf (no tau2 import): :mod:`prour.env.domains` loads tasks, policies and environments from
these rows. The shipped rows are tau2's retail, airline and telecom; adding another domain tau2
ships is one row of :data:`DOMAIN_SPECS`. A domain a user brings (its own environment, tasks and
splits) is a row added at run time by :func:`prour.env.plugins.register_domain`, called by the
``register()`` of a module the recipe names under ``plugins`` (:func:`register_plugins`, run
before the recipe's sections are validated). The recipe's domain and split types
(:data:`DomainName`, :data:`SplitName`) check a name against the table as it stands then,
registered rows included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator

from prour.registry import load_module, unknown_name
from prour.section import ConfigError

TAU2_SPLITS: tuple[str, ...] = ("train", "test", "base")  # tau2's own splits of every domain
@dataclass(frozen=True)
class DomainSpec:
    """One domain: where tau2 keeps it and how prour builds its environment, or the plugin that
    brings it."""

    name: str
    # keywords of tau2's ``get_environment`` (telecom: the manual policy the agent works under)
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    tau2_splits: tuple[str, ...] = TAU2_SPLITS  # the splits tau2 ships for the domain
    # splits prour ships beside tau2's: split name -> data file in prour/env/data
    packaged_splits: dict[str, str] = field(default_factory=dict)
    # A registered domain's :class:`prour.env.plugins.DomainPlugin`: its environment, tasks,
    # splits, policy and scoring come from it instead of tau2's modules (None: shipped by tau2).
    plugin: Any = None

    @property
    def splits(self) -> tuple[str, ...]:
        """tau2's splits, then the packaged ones (a registered domain: its own)."""
        if self.plugin is not None:
            return tuple(self.plugin.split_names)
        return self.tau2_splits + tuple(self.packaged_splits)

    @property
    def tau2_module(self) -> str:
        """tau2's module with the loaders for environment, tasks and splits."""
        if self.plugin is not None:
            raise ValueError(f"domain {self.name!r} is registered by a plugin; tau2 has no "
                             "module for it")
        return f"tau2.domains.{self.name}.environment"


def _ask_less(domain: str) -> dict[str, str]:
    """The ask-less paper's dev and test splits of a tau2 domain (its Table 6; ids drawn by
    prour.eval.attention.splits, which writes these files)."""
    return {f"ask-less-{part}": f"ask_less_{domain}_{part}.json" for part in ("dev", "test")}


# The shipped rows; register_domain adds a user's rows after them.
DOMAIN_SPECS: dict[str, DomainSpec] = {
    spec.name: spec
    for spec in (
        DomainSpec("retail", packaged_splits={"v1-train": "tau_bench_v1_retail_train.json",
                                              "v1-test": "tau_bench_v1_retail_test.json",
                                              "tau3": "tau3_retail.json",
                                              **_ask_less("retail")}),
        DomainSpec("airline", packaged_splits={"v1-test": "tau_bench_v1_airline_test.json",
                                               "tau3": "tau3_airline.json",
                                               **_ask_less("airline")}),
        DomainSpec("telecom", environment_kwargs={"policy_type": "manual"},
                   packaged_splits={"tau3": "tau3_telecom.json", **_ask_less("telecom")}),
    )
}
DOMAINS: tuple[str, ...] = tuple(DOMAIN_SPECS)  # the domains prour ships (all: domain_names())
SPLITS: tuple[str, ...] = TAU2_SPLITS + tuple(  # their splits (all: split_names())
    dict.fromkeys(name for spec in DOMAIN_SPECS.values() for name in spec.packaged_splits))


def domain_names() -> tuple[str, ...]:
    """Every domain a recipe may name now: the shipped ones, then the registered ones."""
    return tuple(DOMAIN_SPECS)


def split_names() -> tuple[str, ...]:
    """Every split name some domain of :func:`domain_names` has, in table order."""
    return tuple(dict.fromkeys(name for spec in DOMAIN_SPECS.values() for name in spec.splits))


def check_domain(domain: str) -> str:
    """Return ``domain`` if prour knows it (shipped or registered), else raise a ValueError
    listing the valid ones."""
    if domain not in DOMAIN_SPECS:
        raise ValueError(unknown_name("domain", domain, DOMAIN_SPECS))
    return domain


def check_split_name(split: str) -> str:
    """Return ``split`` if some domain has it, else raise a ValueError listing the valid ones
    (whether the domains a stage runs on have it is checked when it loads their tasks)."""
    names = split_names()
    if split not in names:
        raise ValueError(unknown_name("split", split, names))
    return split


def domain_spec(domain: str) -> DomainSpec:
    """The table row of ``domain`` (unknown names list the valid ones)."""
    return DOMAIN_SPECS[check_domain(domain)]


# The recipe's types: a name of the table as it stands when the recipe is validated.
DomainName = Annotated[str, AfterValidator(check_domain)]
SplitName = Annotated[str, AfterValidator(check_split_name)]


def add_domain(spec: DomainSpec, replace: bool = False) -> bool:
    """Add a registered domain's row; False when an equal row is there already (nothing done).

    A shipped domain cannot be replaced; another registered row of the same name only with
    ``replace``.
    """
    existing = DOMAIN_SPECS.get(spec.name)
    if existing is not None and existing.plugin is None:
        raise ValueError(f"domain {spec.name!r} is shipped with prour; register yours under "
                         "another name")
    if existing is not None and not replace:
        if existing == spec:
            return False
        raise ValueError(f"domain {spec.name!r} is already registered with another definition "
                         f"(by {existing.plugin.source}); pass replace=True to replace it")
    DOMAIN_SPECS[spec.name] = spec
    return True


def remove_domain(name: str) -> DomainSpec:
    """Take a registered domain out of the table (a shipped one stays); returns its row."""
    spec = domain_spec(name)
    if spec.plugin is None:
        raise ValueError(f"domain {name!r} is shipped with prour and cannot be removed")
    return DOMAIN_SPECS.pop(name)


PLUGIN_HOOK = "register"  # the function a plugin module defines; prour calls it with no argument


def register_plugins(value: Any) -> list[str]:
    """Import each module a recipe's ``plugins`` names and call its ``register()``.

    Run before the recipe's sections are validated, in every process that reads the recipe, so
    the domains the modules register are valid names there. A module that cannot be imported,
    has no ``register()`` or whose ``register()`` fails gives one :class:`ConfigError` naming
    ``plugins[i]`` and the module.
    """
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError("plugins", f"must be a list of Python module names, got {value!r}")
    for index, name in enumerate(value):
        key = f"plugins[{index}]"
        try:
            module = load_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
                raise ConfigError(key, f"no module named {name!r} on the Python path; a plugin "
                                  "module must be importable by every prour process (installed, "
                                  "or in a folder on PYTHONPATH)") from None
            raise ConfigError(key, f"importing plugin module {name!r} failed: {_why(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - whatever the module raises: one line naming it
            raise ConfigError(key, f"importing plugin module {name!r} failed: {_why(exc)}") from None
        hook = getattr(module, PLUGIN_HOOK, None)
        if not callable(hook):
            raise ConfigError(key, f"plugin module {name!r} ({getattr(module, '__file__', '?')}) "
                              f"defines no {PLUGIN_HOOK}() function")
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - a refused definition or the hook's own error
            raise ConfigError(key, f"{name}.{PLUGIN_HOOK}() failed: {_why(exc)}") from None
    return list(value)


def _why(exc: BaseException) -> str:
    """``Type: first line of the message``, for a one-line error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
