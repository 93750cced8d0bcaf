"""Base class of every recipe section and the error that names a dotted key.

Kept apart from :mod:`prour.config` so that stage sections (``prour/<stage>/config.py``) can import
it while :mod:`prour.config` imports those sections to assemble the whole recipe.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A recipe value is wrong. ``key`` is the dotted path of the offending value."""

    def __init__(self, key: str, message: str, source: str | None = None):
        self.key = key
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{shown_key(key)}: {message}")


def shown_key(key: str) -> str:
    """A dotted key as an error prints it: control characters escaped, so the line stays one."""
    return key if key.isprintable() else repr(key)[1:-1]


class Section(BaseModel):
    """Base for recipe sections: unknown keys are errors (typos must not pass silently)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
