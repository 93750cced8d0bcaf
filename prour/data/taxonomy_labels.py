"""The taxonomy's labels file as a reviewer and the report read it (paper A.1, Table 5 and
Figure 2): the sources of missing information, one effective label per decision step (a person's
``corrected`` winning over the annotator's), the counts per source and side, and the approval
that the review gate and the report check.

The sources are the ones the paper's Appendix A.1 names (our copy of the paper lists them, not
the nine cases of its Table 5): on the world side (epistemic) the customer's records, tools,
policy, computation and the interaction history; on the user side (aleatoric) the intent and the
preferences only the user owns.

Files, under ``<run_dir>/taxonomy/``: ``labels.jsonl`` (one line per decision step, written by
:mod:`prour.data.taxonomy`), and ``labels.approved.json`` (the sha256 of the labels file as it
was approved: a labels file changed afterwards is no longer approved). Nothing heavy is imported
here: the review gate and the report read these files.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.files import file_sha256, write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

FOLDER = "taxonomy"
LABELS_FILE = "labels.jsonl"
APPROVAL_FILE = "labels.approved.json"
APPROVAL_SCHEMA = "prour.taxonomy-approved/1"

# source -> what it covers (the annotator's prompt and the report say the same)
WORLD_SOURCES = {
    "profile": "the customer's records: account, profile, order or reservation details",
    "tools": "what a tool returns, or whether an action is valid or available",
    "policy": "a rule of the domain policy",
    "computation": "a value computed from known facts (a price, a total, a date)",
    "history": "what was said or done earlier in the interaction",
}
USER_SOURCES = {
    "intent": "what the customer wants done, left unstated or ambiguous",
    "preference": "which of several valid options the customer prefers",
}
SOURCES = (*WORLD_SOURCES, *USER_SOURCES)
KINDS = ("epistemic", "aleatoric", "none")
KIND_SIDE = {"epistemic": "world", "aleatoric": "user"}
NO_UNCERTAINTY = "none"
FIELDS = ("present", "kind", "source", "object", "evidence", "outcome", "label")
TEXT_FIELDS = ("object", "evidence", "outcome", "label")


def side_of(source: str) -> str:
    """``world`` for a world-side source, ``user`` for a user-side one."""
    if source in WORLD_SOURCES:
        return "world"
    if source in USER_SOURCES:
        return "user"
    raise ValueError(f"unknown source {source!r}; expected one of {', '.join(SOURCES)}")


def validate_annotation(data: Mapping[str, Any]) -> dict[str, Any]:
    """The annotator's object checked: the seven fields, ``present`` true exactly when ``kind``
    is epistemic or aleatoric, an epistemic kind with a world-side source and an aleatoric one
    with a user-side source, no source without uncertainty, text fields as strings (the uncertain
    object and the open label named when uncertainty is present). Raises ``ValueError`` saying
    what is wrong (fed back to the annotator)."""
    missing = [k for k in FIELDS if k not in data]
    extra = [k for k in data if k not in FIELDS]
    if missing or extra:
        problems = ([f"missing field(s) {missing}"] if missing else []) + \
            ([f"unexpected field(s) {extra}"] if extra else [])
        raise ValueError("; ".join(problems) + f"; expected exactly {list(FIELDS)}")
    present, kind, source = data["present"], data["kind"], data["source"]
    if not isinstance(present, bool):
        raise ValueError(f"`present` must be true or false, got {present!r}")  # noqa: TRY004
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(KINDS)}, got {kind!r}")
    if present != (kind != NO_UNCERTAINTY):
        raise ValueError(f"`present` is {str(present).lower()} but `kind` is {kind!r}: present "
                         "is true exactly when kind is epistemic or aleatoric")
    if kind == NO_UNCERTAINTY:
        if source not in (None, "", NO_UNCERTAINTY):
            raise ValueError(f"`source` must be null when kind is none, got {source!r}")
        source = None
    else:
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {', '.join(SOURCES)}, got {source!r}")
        if side_of(source) != KIND_SIDE[kind]:
            allowed = WORLD_SOURCES if kind == "epistemic" else USER_SOURCES
            raise ValueError(f"an {kind} uncertainty lives on the {KIND_SIDE[kind]} side: its "
                             f"source is one of {', '.join(allowed)}, not {source!r}")
    texts = {}
    for key in TEXT_FIELDS:
        value = data[key]
        if value is None and kind == NO_UNCERTAINTY:
            value = ""
        if not isinstance(value, str):
            raise ValueError(f"`{key}` must be a string, got {type(value).__name__}")  # noqa: TRY004
        if kind != NO_UNCERTAINTY and key in ("object", "label") and not value.strip():
            raise ValueError(f"`{key}` must name the case when uncertainty is present")
        texts[key] = value.strip()
    return {"present": present, "kind": kind, "source": source, **texts}


# ---- one effective label per decision step ------------------------------------------------------


@dataclass(frozen=True)
class Label:
    """A decision step's label: its kind, and its source (None without uncertainty)."""

    kind: str
    source: str | None
    open_label: str = ""  # the annotator's provisional open name for the case

    @property
    def side(self) -> str | None:
        return None if self.source is None else side_of(self.source)


def corrected_label(value: Any) -> Label:
    """A reviewer's ``corrected`` value: a source name (its kind follows from its side), ``none``
    (no uncertainty), or an object with the annotator's seven fields."""
    if isinstance(value, str):
        if value == NO_UNCERTAINTY:
            return Label(NO_UNCERTAINTY, None)
        side = side_of(value)  # raises for an unknown name
        return Label("epistemic" if side == "world" else "aleatoric", value)
    if isinstance(value, dict):
        checked = validate_annotation(value)
        return Label(checked["kind"], checked["source"], checked["label"])
    raise ValueError(f"`corrected` must be a source name, {NO_UNCERTAINTY!r} or an object with "
                     f"the fields {list(FIELDS)}, got {type(value).__name__}")


def effective_label(record: Mapping[str, Any]) -> Label | None:
    """The label a labels line holds: ``corrected`` when a person set it, else the annotator's
    validated annotation; None when neither is there (no usable label). A ``corrected`` value
    that is not a label raises ``ValueError``."""
    corrected = record.get("corrected")
    if corrected not in (None, ""):
        return corrected_label(corrected)
    annotation = record.get("annotation")
    if not annotation:
        return None
    return Label(annotation["kind"], annotation["source"], annotation.get("label") or "")


def read_labels(path: Path) -> list[dict[str, Any]]:
    """The labels file's records; an unreadable line or a ``corrected`` value that is not a
    label raises one ``ValueError`` naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
            try:
                effective_label(record)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: decision {record.get('decision_id')!r}: "
                                 f"{exc}") from None
            records.append(record)
    return records


# ---- counts -------------------------------------------------------------------------------------


@dataclass
class TaxonomyCounts:
    """Decision steps by effective label: events (uncertainty present) per source and domain,
    steps without uncertainty, steps without a usable label, the open labels per source."""

    decisions: int = 0
    unusable: int = 0
    without: int = 0  # no uncertainty
    domains: Counter = field(default_factory=Counter)  # decision steps per domain
    by_source: Counter = field(default_factory=Counter)
    by_domain: dict[str, Counter] = field(default_factory=dict)  # domain -> source -> events
    open_labels: dict[str, Counter] = field(default_factory=dict)  # source -> label -> events

    @property
    def events(self) -> int:
        return sum(self.by_source.values())

    def side(self, side: str) -> int:
        """Events of one side (``world`` or ``user``)."""
        return sum(n for source, n in self.by_source.items() if side_of(source) == side)

    def shares(self) -> dict[str, float] | None:
        """Each side's share of the events (%); None without an event."""
        return side_shares(self.side("world"), self.side("user"))


def side_shares(world: int, user: int) -> dict[str, float] | None:
    """``{"world": %, "user": %}`` of ``world + user`` events; None when there are none."""
    total = world + user
    if total == 0:
        return None
    return {"world": 100 * world / total, "user": 100 * user / total}


def count_labels(records: Iterable[Mapping[str, Any]]) -> TaxonomyCounts:
    """Count the labels lines (each decision step once: a later line for the same decision id
    replaces an earlier one)."""
    latest = {str(record.get("decision_id")): record for record in records}
    counts = TaxonomyCounts()
    for record in latest.values():
        counts.decisions += 1
        domain = str(record.get("domain") or "?")
        counts.domains[domain] += 1
        label = effective_label(record)
        if label is None:
            counts.unusable += 1
        elif label.source is None:
            counts.without += 1
        else:
            counts.by_source[label.source] += 1
            counts.by_domain.setdefault(domain, Counter())[label.source] += 1
            if label.open_label:
                counts.open_labels.setdefault(label.source, Counter())[label.open_label] += 1
    return counts


def describe(counts: TaxonomyCounts) -> str:
    """``12 decision steps: world 5 (tools 3, policy 2), user 1 (preference 1), no uncertainty
    4, no usable label 2`` (a side with no event left out)."""
    parts = []
    for side, sources in (("world", WORLD_SOURCES), ("user", USER_SOURCES)):
        found = [f"{s} {counts.by_source[s]}" for s in sources if counts.by_source[s]]
        if found:
            parts.append(f"{side} {counts.side(side)} ({', '.join(found)})")
    parts.append(f"no uncertainty {counts.without}")
    if counts.unusable:
        parts.append(f"no usable label {counts.unusable}")
    return f"{counts.decisions} decision steps: " + ", ".join(parts)


# ---- where the files are, and the approval -------------------------------------------------------


def taxonomy_dir(recipe: Recipe) -> Path:
    """``<run_dir>/taxonomy``: the labels file and its approval."""
    return recipe.resolved_run_dir() / FOLDER


def labels_path(folder: Path) -> Path:
    return folder / LABELS_FILE


def is_approved(folder: Path) -> bool:
    """The labels file exists and is the one recorded as approved."""
    labels, record = labels_path(folder), folder / APPROVAL_FILE
    if not labels.is_file() or not record.is_file():
        return False
    try:
        approved = json.loads(record.read_text()).get("sha256")
    except (json.JSONDecodeError, AttributeError, OSError):
        return False
    return approved == file_sha256(labels)


def approve(folder: Path, by: str) -> TaxonomyCounts:
    """Record the labels file as approved (``by``: what approved it); returns its counts. A
    missing file or a ``corrected`` value that is not a label raises ``ValueError``."""
    labels = labels_path(folder)
    if not labels.is_file():
        raise ValueError(f"no taxonomy labels yet in {labels}; annotate first: "
                         "prour taxonomy --recipe RECIPE")
    counts = count_labels(read_labels(labels))
    record = {"schema": APPROVAL_SCHEMA, "file": labels.name, "sha256": file_sha256(labels),
              "decisions": counts.decisions, "events": dict(counts.by_source),
              "without": counts.without, "unusable": counts.unusable, "by": by,
              "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomic(folder / APPROVAL_FILE, json.dumps(record, indent=2) + "\n")
    return counts


def drawn_from(folder: Path) -> dict[str, Any]:
    """What a report drawn from ``folder`` records of its labels: the file, its sha256 (None:
    not there) and whether it was approved."""
    labels = labels_path(folder)
    return {"labels": str(labels), "sha256": file_sha256(labels) if labels.is_file() else None,
            "approved": is_approved(folder)}


def report_current(recipe: Recipe, sidecar: Path) -> bool:
    """Whether a report's record of the labels (``drawn_from``, kept in ``sidecar`` under
    ``labels``) matches them as they are now; True for a recipe without the taxonomy."""
    if not recipe.taxonomy.run:
        return True
    try:
        recorded = json.loads(sidecar.read_text())["series"]["labels"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False
    now = drawn_from(taxonomy_dir(recipe))
    return (recorded.get("sha256"), recorded.get("approved")) == (now["sha256"], now["approved"])
