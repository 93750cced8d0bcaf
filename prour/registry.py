"""Things chosen by name (backends, scripts, agents, users, methods, policies): one registry type.

An entry is the object itself or a lazy ``"module:attr"`` string, imported on the first
:meth:`Registry.get` of its name, so naming a heavy backend in a registry costs nothing until a
recipe uses it. An unknown name raises a ValueError that lists the valid names and the closest.
:func:`lazy_exports` gives a package the same lazy loading for the names it re-exports.
This module imports nothing of prour, so config modules may use :func:`did_you_mean`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def did_you_mean(value: Any, valid: Iterable[str], n: int = 1) -> str:
    """A `` Did you mean 'x'?`` hint naming the closest valid names, or nothing."""
    close = difflib.get_close_matches(str(value), list(valid), n=n)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(name) for name in close) + "?"


def unknown_name(kind: str, value: Any, valid: Iterable[str]) -> str:
    """``unknown KIND 'foo'; valid: a, b, c. Did you mean 'bar'?``"""
    names = list(valid)
    listing = ", ".join(names) or "none registered"
    return f"unknown {kind} {value!r}; valid: {listing}.{did_you_mean(value, names)}"


def load_module(name: str) -> ModuleType:
    """The module ``name`` (dotted), imported now: the one way prour imports a module by name
    (:func:`load_target`'s module, a recipe's ``plugins``)."""
    return importlib.import_module(name)


def load_target(target: str) -> Any:
    """The object a ``"module:attr"`` string names (``attr`` may be dotted), imported now: the
    one way prour imports a thing by name (registry entries, package re-exports, baselines)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"a lazy registry entry must look like 'module:attr', got {target!r}")
    obj: Any = load_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Names → entries of one kind (``kind`` words the errors: "unknown backend 'x'")."""

    def __init__(self, kind: str, entries: Mapping[str, T | str] | None = None):
        self.kind = kind
        self._entries: dict[str, T | str] = dict(entries or {})

    def register(self, name: str, entry: T | str, replace: bool = False) -> None:
        """Add ``name``; an existing name is an error unless ``replace``."""
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def check(self, name: Any) -> str:
        """``name`` if registered (nothing is imported), else the unknown-name ValueError."""
        if name not in self._entries:
            raise ValueError(unknown_name(self.kind, name, self._entries))
        return name

    def get(self, name: Any) -> T:
        """The entry of ``name``; a lazy entry is imported now and kept."""
        entry = self._entries[self.check(name)]
        if isinstance(entry, str):
            entry = load_target(entry)
            self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        """Registered names in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` that re-exports names of its submodules on first use:
    ``exports`` maps a module to the names it defines, each loaded as ``"module:name"``, so
    importing the package (or one leaf of it) loads none of the others."""
    targets = {name: f"{module}:{name}" for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in targets:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return load_target(targets[name])

    return __getattr__
