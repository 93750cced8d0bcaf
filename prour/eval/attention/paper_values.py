"""The Ask-Less paper's published numbers (:data:`VALUES_FILE`, shipped with the package): one
:class:`Published` per number of its abstract and of the tables a study reproduces, each with the
row it is printed in, so the study report can set its own numbers beside them.

``published("table3", policy="budgeted+mgr")`` lists entries; ``published_value(...)`` gives the
one entry a lookup names, or None where the paper prints no number there (a "–" cell has no
entry). The file's header documents every field and metric name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

VALUES_FILE = "paper_values.yaml"
PACKAGE = "prour.eval.attention"

ITEMS = ("abstract", "table3", "table4", "table5", "table7", "table8", "table10", "table11",
         "table12", "table13", "table14", "table17", "table19", "table21", "table25", "backbone")
METRICS = ("R", "A", "A_tilde", "V", "V_tilde", "U", "U_tilde", "U_bar", "dR", "dV_tilde",
           "dA_pct", "requests", "atomic", "exempt", "bundled", "reviews", "vetoed",
           "max_reviews", "fixed", "tokens_read", "saved", "retained", "agreement", "kappa",
           "questions", "mean_first", "mean_second", "rank_corr", "mean_abs_diff", "recall")


@dataclass(frozen=True)
class Published:
    """One number the paper prints (an entry of :data:`VALUES_FILE`; its ``value`` is ``text``)."""

    id: str
    item: str
    metric: str
    text: str  # as printed: "49.4", "-0.7", "+4.8", "0.783"
    source: str  # "Table 3", "Table 31", "Abstract", "Table 7 (caption)"
    cell: str  # the printed row or sentence; ``text`` occurs in it
    column: str
    policy: str | None = None
    budget: str | None = None  # "0", "1", "2", "3", "1-3", "1-8", "inf"
    threshold: str | None = None  # VoI c as printed: "0.27", "0.50", "0.65"
    model: str | None = None
    domain: str | None = None
    regime: str | None = None  # table25: "guarded" / "original"
    row: str | None = None
    interval: tuple[str, str] | None = None  # the bracketed 95% interval as printed
    starred: bool = False  # marked * (its interval excludes zero)

    @property
    def value(self) -> float:
        return float(self.text)


FIELDS = tuple(f.name for f in fields(Published))
_REQUIRED = ("id", "item", "metric", "value", "source", "cell", "column")
_OPTIONAL = ("policy", "budget", "threshold", "model", "domain", "regime", "row")


@functools.cache
def paper_data() -> dict[str, Any]:
    """The parsed data file (package data beside this module)."""
    from importlib.resources import files

    import yaml

    data = yaml.safe_load((files(PACKAGE) / VALUES_FILE).read_text(encoding="utf-8"))
    for key in ("policies", "models", "values"):
        if not isinstance(data, dict) or key not in data:
            raise ValueError(f"{VALUES_FILE}: the top-level key `{key}` is missing")
    return data


def _entry(index: int, raw: Any) -> Published:
    """One ``values`` entry as a :class:`Published`; a malformed one raises a ValueError naming
    the file, its place in ``values`` and its id."""
    where = f"{VALUES_FILE}: values[{index}]"
    if not isinstance(raw, dict):
        raise TypeError(f"{where} is not a mapping")
    where += f" ({raw.get('id', 'no id')})"
    unknown = set(raw) - {*_REQUIRED, *_OPTIONAL, "interval", "starred"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for key in _REQUIRED:
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{where}.{key}: a non-empty string is required")
    for key in _OPTIONAL:
        if key in raw and not isinstance(raw[key], str):
            raise ValueError(f"{where}.{key}: a string is required, got {raw[key]!r}")
    if raw["item"] not in ITEMS:
        raise ValueError(f"{where}.item: unknown item {raw['item']!r}; valid: {', '.join(ITEMS)}")
    if raw["metric"] not in METRICS:
        raise ValueError(f"{where}.metric: unknown metric {raw['metric']!r}; "
                         f"valid: {', '.join(METRICS)}")
    try:
        float(raw["value"])
    except ValueError:
        raise ValueError(f"{where}.value: {raw['value']!r} is not a number") from None
    interval = raw.get("interval")
    if interval is not None:
        if (not isinstance(interval, list) or len(interval) != 2
                or not all(isinstance(x, str) for x in interval)):
            raise ValueError(f"{where}.interval: two strings [low, high] are required")
        interval = (interval[0], interval[1])
    starred = raw.get("starred", False)
    if not isinstance(starred, bool):
        raise TypeError(f"{where}.starred: true or false is required, got {starred!r}")
    given = {k: raw[k] for k in _OPTIONAL if k in raw}
    return Published(id=raw["id"], item=raw["item"], metric=raw["metric"], text=raw["value"],
                     source=raw["source"], cell=raw["cell"], column=raw["column"],
                     interval=interval, starred=starred, **given)


@functools.cache
def _all() -> tuple[Published, ...]:
    entries = tuple(_entry(i, raw) for i, raw in enumerate(paper_data()["values"]))
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise ValueError(f"{VALUES_FILE}: id {entry.id!r} occurs more than once")
        seen.add(entry.id)
    return entries


def published(item: str | None = None, **where: str | None) -> list[Published]:
    """The paper's numbers of ``item`` (all items when None) whose fields equal every ``where``
    (``policy="budgeted", budget="1-3"``; ``threshold=None`` asks for entries without one)."""
    unknown = set(where) - set(FIELDS)
    if unknown:
        raise ValueError(f"no field {', '.join(sorted(unknown))} in {VALUES_FILE}; "
                         f"valid: {', '.join(FIELDS)}")
    return [p for p in _all() if (item is None or p.item == item)
            and all(getattr(p, k) == v for k, v in where.items())]


def published_value(item: str, **where: str | None) -> Published | None:
    """The one number of ``item`` matching ``where``; None where the paper prints none (a "–"
    cell, or a row our copy lacks); a ValueError when ``where`` matches several."""
    found = published(item, **where)
    if len(found) > 1:
        ids = ", ".join(p.id for p in found[:4]) + (", ..." if len(found) > 4 else "")
        raise ValueError(f"{VALUES_FILE}: {len(found)} numbers match {item} {where} ({ids}); "
                         "name more fields")
    return found[0] if found else None


def paper_policies() -> dict[str, str]:
    """prour policy name → the paper's name for its row."""
    return dict(paper_data()["policies"])


def paper_models() -> tuple[str, ...]:
    """The paper's eight backbones, in the order of its Tables 29-36."""
    return tuple(paper_data()["models"])


def paper_accountings() -> dict[str, str]:
    """prour accounting name → the cost definition Table 13 prints for it."""
    return dict(paper_data().get("accountings", {}))


def paper_note(item: str) -> str | None:
    """What the paper (or our copy) says of ``item`` without a number; None: nothing."""
    return paper_data().get("notes", {}).get(item)
