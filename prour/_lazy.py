"""Lazy re-exports for package ``__init__`` files.

``from prour.router import decompose`` keeps working, but importing one submodule (for example a
stage's config section, which :mod:`prour.config` needs) does not import the whole package.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(
    package: str, exports: dict[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``; ``exports`` maps module -> names."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__, sorted(where)
