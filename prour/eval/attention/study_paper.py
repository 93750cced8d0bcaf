"""The Ask-Less paper's published values as the study report looks them up: which entry of
:mod:`prour.eval.attention.paper_values` a run's row or cell sits beside, how it is shown, and
the points the figures draw from the per-model Tables 29-36 (the paper prints no curve values).

Every lookup goes through a :class:`PaperLookup`, which remembers the entries an item used, so
that each item lists the paper values it shows with their source and cell.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prour.config.attention import variant_of

log = logging.getLogger(__name__)

TAU_DOMAINS = ("retail", "airline", "telecom")
PAPER_LAMBDA = 0.03  # λ of the paper's utility U = R − λ·A (its Tables 21 and 29-36, Figure 7)
DASH = "–"


def threshold_text(c: float | None) -> str | None:
    """A VoI threshold as the paper prints it (``0.5`` → ``"0.50"``)."""
    return None if c is None else f"{c:.2f}"


def shown(entry: Any | None, interval: bool = True) -> str:
    """A published value as printed: its star and bracketed interval; "–" where none."""
    if entry is None:
        return DASH
    text = entry.text + ("*" if entry.starred else "")
    if interval and entry.interval:
        text += f" [{entry.interval[0]}, {entry.interval[1]}]"
    return text


def paper_fields(label: str, per_model: bool = False) -> dict[str, str | None]:
    """The ``policy``/``budget``/``threshold`` fields a run variant's row carries in the paper's
    values; ``per_model`` writes budgets as Tables 29-36 do ("0" No-ask, "inf" unlimited)."""
    variant = variant_of(label)
    budget = None if variant.budget is None else str(variant.budget)
    if per_model and budget is None:
        budget = "0" if variant.policy == "no-ask" else "inf"
    return {"policy": variant.policy, "budget": budget,
            "threshold": threshold_text(variant.option("c"))}


@dataclass
class PaperLookup:
    """Finds published values and remembers, in order, the ones an item shows."""

    used: list[Any] = field(default_factory=list)

    def get(self, item: str, **where: str | None) -> Any | None:
        """The one entry of ``item`` whose fields equal ``where`` (None fields: absent)."""
        from prour.eval.attention.paper_values import published_value

        try:
            entry = published_value(item, **where)
        except ValueError as exc:  # an ambiguous lookup shows nothing rather than a guess
            log.warning("%s", exc)
            return None
        if entry is not None and entry not in self.used:
            self.used.append(entry)
        return entry

    def text(self, item: str, interval: bool = True, **where: str | None) -> str:
        return shown(self.get(item, **where), interval)

    def model_cell(self, model: str | None, label: str, metric: str, domain: str) -> Any | None:
        """A Tables 29-36 cell of the paper model ``model`` for a run variant."""
        if model is None:
            return None
        return self.get("backbone", model=model, metric=metric, domain=domain,
                        **paper_fields(label, per_model=True))


def paper_model(name: str | None) -> str | None:
    """The paper's model of that name (None when the paper has no such backbone)."""
    from prour.eval.attention.paper_values import paper_models

    return name if name in paper_models() else None


def paper_note(item: str) -> str | None:
    from prour.eval.attention.paper_values import paper_note as note

    return note(item)


@dataclass(frozen=True)
class PaperPoint:
    """A figure point computed from the paper's per-model cells (mean over ``domains``)."""

    label: str
    x: float
    y: float
    ids: tuple[str, ...]
    source: str


def model_point(lookup: PaperLookup, model: str, label: str, domains: Sequence[str],
                x_metric: str = "A", y_metric: str = "R") -> PaperPoint | None:
    """The mean of a paper model's ``x_metric``/``y_metric`` cells over ``domains`` for a run
    variant (No-ask: x = 0, its A being zero by definition); None unless every cell is printed."""
    xs, ys, ids = [], [], []
    for domain in domains:
        y = lookup.model_cell(model, label, y_metric, domain)
        x = None if label == "no-ask" else lookup.model_cell(model, label, x_metric, domain)
        if y is None or (x is None and label != "no-ask"):
            return None
        ys.append(y.value)
        xs.append(0.0 if x is None else x.value)
        ids += [e.id for e in (x, y) if e is not None]
    if not ys:
        return None
    source = lookup.get("backbone", model=model, metric=y_metric, domain=domains[0],
                        **paper_fields(label, per_model=True)).source
    return PaperPoint(label, sum(xs) / len(xs), sum(ys) / len(ys), tuple(ids), source)


def scale_check(lookup: PaperLookup) -> list[str]:
    """Our reading of the display scales, checked on the paper's own numbers: Table 3's R and Ṽ
    against the mean of the per-model cells (domain within model, then models; four domains)."""
    from prour.eval.attention.paper_values import paper_models

    lines = []
    for label in ("unrestricted", "frugal", "voi-gate-as-run(c=0.27)"):
        means = {}
        for metric in ("R", "A", "V"):
            per_model = []
            for model in paper_models():
                cells = [lookup.model_cell(model, label, metric, d)
                         for d in (*TAU_DOMAINS, "webshop")]
                values = [c.value for c in cells if c is not None]
                if values:
                    per_model.append(sum(values) / len(values))
            means[metric] = sum(per_model) / len(per_model) if per_model else math.nan
        fields = paper_fields(label)
        table3 = {m: lookup.text("table3", metric=m, domain="customer-service", interval=False,
                                 **fields) for m in ("R", "A_tilde", "V_tilde")}
        ratio = float(table3["A_tilde"]) / means["A"] if table3["A_tilde"] != DASH else math.nan
        lines.append(
            f"{label}: Tables 29-36 mean R {100 * means['R']:.1f} (Table 3 R {table3['R']}), "
            f"10 × mean V {10 * means['V']:.1f} (Table 3 Ṽ {table3['V_tilde']}), mean A "
            f"{means['A']:.2f} (Table 3 Ã {table3['A_tilde']}, {ratio:.2f} times as large).")
    return lines
