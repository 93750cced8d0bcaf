"""Table 5 and Figure 2 of the paper beside the run: where the missing information of the decision
steps lives, counted from the taxonomy's reviewed labels (``<run_dir>/taxonomy/labels.jsonl``,
:mod:`prour.data.taxonomy_labels`), next to the paper's 19,022 events, 16,947 (89.1 %) of them
world-side and 2,075 (10.9 %) user-side.

Our copy of the paper does not list the nine cases of its Table 5, only the sources Appendix A.1
names; the rows here are those sources, and both items say so. Counts are shown only from labels
a person approved (the ``taxonomy-review`` gate); labels that are missing or not approved are
said to be so, never shown as a measured 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prour.data.taxonomy_labels import (
    FOLDER,
    USER_SOURCES,
    WORLD_SOURCES,
    TaxonomyCounts,
    count_labels,
    drawn_from,
    is_approved,
    labels_path,
    read_labels,
    side_of,
)
from prour.env.domains import DOMAINS
from prour.eval.paper import Item, paper_value
from prour.eval.run_evidence import RunEvidence

SIDES = ("world", "user")
KIND_OF_SIDE = {"world": "epistemic", "user": "aleatoric"}
CASES_NOTE = ("Our copy of the paper does not list the nine cases of its Table 5, only the "
              "sources Appendix A.1 names (profiles, tools, policy, computation and interaction "
              "history on the world side; user-owned intent and preferences on the user side): "
              "this run's rows are those sources, not the paper's nine cases.")
OPEN_LABELS = 3  # the most frequent open labels shown per source


@dataclass
class TaxonomyEvidence:
    """The run's approved taxonomy counts (None: none to show) and what is missing."""

    counts: TaxonomyCounts | None = None
    record: dict[str, Any] = field(default_factory=dict)  # the labels drawn from (drawn_from)
    missing: list[str] = field(default_factory=list)


def read_taxonomy(evidence: RunEvidence) -> TaxonomyEvidence:
    """The counts of the run's taxonomy labels when a person approved them; else what is
    missing, with the step, command or recipe key that makes it."""
    if evidence.recipe is None:
        return TaxonomyEvidence(missing=[evidence.problem])
    folder = evidence.run_dir / FOLDER
    found = TaxonomyEvidence(record=drawn_from(folder))
    labels = labels_path(folder)
    if not labels.is_file():
        why = ("the chain's `taxonomy` step writes it (`prour taxonomy --recipe R`)"
               if evidence.recipe.taxonomy.run else "taxonomy.run is false: the chain leaves "
               "the taxonomy out (recipes/paper.yaml turns it on)")
        found.missing.append(f"{labels} is missing: {why}")
        return found
    if not is_approved(folder):
        found.missing.append(
            f"{labels} is not approved: review it (set a wrong line's `corrected` to a source or "
            "none), then approve it: `prour taxonomy --recipe R --approve` (the chain's "
            "taxonomy-review gate, or `prour run --approve-labels`)")
        return found
    try:
        counts = count_labels(read_labels(labels))
    except ValueError as exc:
        found.missing.append(f"{exc}: correct that line, then approve the labels again")
        return found
    found.counts = counts
    if counts.unusable:
        found.missing.append(
            f"{counts.unusable} of {counts.decisions} decision steps in {labels} have no usable "
            "label (the annotator's reply never validated and no `corrected` is set): they are "
            "left out of the counts")
    if counts.events == 0:
        found.missing.append(f"none of the {counts.decisions} decision steps in {labels} is "
                             "labelled with uncertainty: no event to count, no share")
    return found


def _share(part: int, whole: int) -> str:
    return "–" if whole == 0 else f"{100 * part / whole:.1f}"


def _paper(metric: str, label: str | None = None) -> str:
    value = paper_value("table5", metric=metric, label=label)
    return value.shown() if value else "–"


def _paper_side(side: str) -> str:
    return f"{_paper('events', side)} ({_paper('share', side)})"


def _domains(counts: TaxonomyCounts | None) -> list[str]:
    """The domains of the labelled decision steps (retail and airline when none is known)."""
    found = set(counts.domains) if counts else set()
    return [d for d in DOMAINS if d in found] + sorted(found - set(DOMAINS)) \
        if found else ["retail", "airline"]


def _open_labels(counts: TaxonomyCounts, source: str) -> str:
    common = counts.open_labels.get(source)
    if not common:
        return "–"
    return "; ".join(f"{label} ({n})" for label, n in common.most_common(OPEN_LABELS))


def table5_item(tax: TaxonomyEvidence) -> Item:
    """One row per source (events per domain, all, their share), the two sides' totals beside
    the paper's, all events, the steps without uncertainty and those without a usable label."""
    counts = tax.counts
    domains = _domains(counts)
    item = Item("table5", header=["Source", "Side (kind)", *(d.capitalize() for d in domains),
                                  "Events", "Share of events (%)",
                                  "Open labels (most frequent)", "Paper"])
    events = counts.events if counts else 0
    for source in (*WORLD_SOURCES, *USER_SOURCES):
        side = side_of(source)
        if counts is None:
            cells = ["–"] * (len(domains) + 3)
        else:
            cells = [*(str(counts.by_domain.get(d, {}).get(source, 0)) for d in domains),
                     str(counts.by_source[source]), _share(counts.by_source[source], events),
                     _open_labels(counts, source)]
        item.rows.append([source, f"{side} ({KIND_OF_SIDE[side]})", *cells, "–"])
    for side in SIDES:
        if counts is None:
            cells = ["–"] * len(domains) + ["missing", "–"]
        else:
            cells = [*(str(sum(n for s, n in counts.by_domain.get(d, {}).items()
                               if side_of(s) == side)) for d in domains),
                     str(counts.side(side)), _share(counts.side(side), events)]
        item.rows.append([f"{side} side", f"{side} ({KIND_OF_SIDE[side]})", *cells, "–",
                          _paper_side(side)])
        item.text.append(f"{side} side: " + (
            f"{counts.side(side)} events ({_share(counts.side(side), events)} %)"
            if counts else "missing") + f" | paper: {_paper_side(side)}")
    if counts is None:
        item.rows.append(["all events", "", *["–"] * len(domains), "missing", "–", "–",
                          _paper("events")])
    else:
        item.rows.append(["all events", "", *(str(sum(counts.by_domain.get(d, {}).values()))
                                              for d in domains),
                          str(events), "100.0" if events else "–", "–", _paper("events")])
        item.rows.append(["no uncertainty", "none", *["–"] * len(domains),
                          str(counts.without), "not an event", "–", "–"])
        if counts.unusable:
            item.rows.append(["no usable label", "–", *["–"] * len(domains),
                              str(counts.unusable), "left out", "–", "–"])
        item.notes.append(
            f"{counts.decisions} decision steps labelled ("
            + ", ".join(f"{d} {counts.domains[d]}" for d in domains) + f"): {events} with "
            f"uncertainty (events), {counts.without} without, {counts.unusable} without a "
            "usable label; a reviewer's `corrected` label wins over the annotator's.")
    item.text.append("all events: " + (str(events) if counts else "missing")
                     + f" | paper: {_paper('events')}")
    item.notes.append(CASES_NOTE)
    item.notes.append("World side (epistemic): " + "; ".join(
        f"{name}: {what}" for name, what in WORLD_SOURCES.items()) + ". User side (aleatoric): "
        + "; ".join(f"{name}: {what}" for name, what in USER_SOURCES.items()) + ".")
    item.notes.append("–: the paper's text states no number for this cell (the per-case counts "
                      "of its Table 5 are not in our copy).")
    item.missing = list(tax.missing)
    return item


def figure2_item(tax: TaxonomyEvidence) -> tuple[Item, dict[str, Any]]:
    """The world and user sides' events and shares beside the paper's; returns the item and
    what the figure draws (``shares``: side → %, ``events``: side → count, ``sources``: source
    → events; empty without approved events)."""
    counts = tax.counts
    item = Item("figure2", header=["Side", "Events", "Share of events (%)", "Paper events",
                                   "Paper share (%)"])
    drawn: dict[str, Any] = {}
    shares = counts.shares() if counts else None
    if shares is not None:
        drawn = {"shares": shares, "events": {side: counts.side(side) for side in SIDES},
                 "sources": {s: counts.by_source[s] for s in (*WORLD_SOURCES, *USER_SOURCES)}}
    for side in SIDES:
        paper_events = paper_value("table5", metric="events", label=side)
        paper_share = paper_value("figure2", metric="share", label=side)
        run = ([str(drawn["events"][side]), f"{shares[side]:.1f}"] if shares else
               ["missing" if counts is None else str(counts.side(side)), "–"])
        item.rows.append([side, *run, paper_events.text, paper_share.text])
        item.text.append(f"{side} side: " + (f"{run[1]} % of {counts.events} events" if shares
                                             else "missing") + f" | paper: {paper_share.shown()}")
    total = paper_value("figure2", metric="events")
    item.notes.append(f"paper: {total.shown()} step-level events of retail and airline "
                      "τ-bench trajectories; this run: " + (
                          f"{counts.events} events of {counts.decisions} decision steps"
                          if counts else "no approved labels"))
    item.notes.append(CASES_NOTE)
    item.missing = list(tax.missing)
    return item, drawn
