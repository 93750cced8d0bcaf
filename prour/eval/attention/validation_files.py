"""Files of the validation studies (:mod:`prour.eval.attention.validation`): the study folder's
result lines and episodes, the annotator folders, and the label files annotators return.

Every validation kind keeps its files in ``STUDY/validation/<kind>/``:

- ``to_annotate.jsonl``: what annotators see, blinded (no policy, backbone or score);
- ``instructions.md``: what each label means;
- ``key.jsonl``: what annotators must not see (where each item came from, its scores);
- ``labels/<annotator>.jsonl``: one file per annotator, as ``prour validation score`` stored it
  after checking it (the annotator is the file's name without ``.jsonl``).

A label file is JSONL, one object per item, naming the item by its id field (``pair_id`` or
``case_id``) and giving each answer field one of its allowed values (case does not matter; other
fields, such as a comment, are ignored). A file with an unknown id, an id twice, a missing field
or a value outside the allowed ones is refused with one line naming the file and line.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.files import write_atomic

log = logging.getLogger(__name__)

VALIDATION_DIR = "validation"
KINDS = ("burden", "requests", "classification")
TO_ANNOTATE = "to_annotate.jsonl"
KEY = "key.jsonl"
INSTRUCTIONS = "instructions.md"
LABELS_DIR = "labels"
SECOND_JUDGE = "second_judge.jsonl"
RESULTS = "results.jsonl"
EPISODES = "episodes.jsonl"


class ValidationInputError(ValueError):
    """A study folder, key or label file that cannot be used; the message is one line."""


# ---- the study ------------------------------------------------------------------------------


def study_folder(path: str | Path) -> Path:
    """The study folder of ``path``: the folder itself, or the parent of its ``validation/``."""
    path = Path(path)
    if path.name == VALIDATION_DIR and not (path / RESULTS).is_file() \
            and (path.parent / RESULTS).is_file():
        return path.parent
    return path


def kind_dir(study: str | Path, kind: str) -> Path:
    """``STUDY/validation/<kind>/`` (the kind must be one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValidationInputError(f"unknown validation kind {kind!r}; valid: {', '.join(KINDS)}")
    return study_folder(study) / VALIDATION_DIR / kind


def episode_key(key: Sequence[Any]) -> tuple[str, str, int, str]:
    """A result line's key as the episodes store it: (domain, task id, seed, agent)."""
    domain, task_id, seed, agent = key
    return str(domain), str(task_id), int(seed), str(agent)


def question_id(line: Mapping[str, Any], message_index: int) -> str:
    """The id of one delivered message: its episode's key and its index in the transcript."""
    domain, task_id, seed, agent = episode_key(line["key"])
    return f"{domain}|{task_id}|{seed}|{agent}#{message_index}"


def backbone_of(line: Mapping[str, Any]) -> str:
    """The study's backbone axis value of a result line, else its agent key."""
    axes = line.get("axes") or {}
    return str(axes.get("backbone") or line["key"][3])


@dataclass
class Study:
    """A study folder's gated result lines (the latest line of each key, sorted by key)."""

    folder: Path
    lines: list[dict[str, Any]]

    @property
    def episodes_path(self) -> Path:
        return self.folder / EPISODES

    def episodes(self, wanted: Iterable[tuple[str, str, int, str]] | None = None,
                 ) -> dict[tuple[str, str, int, str], Any]:
        """Trajectories of the wanted keys (all when None), the last stored one of each key;
        unreadable lines are skipped with a warning naming the line."""
        from prour.env.trajectory import Trajectory

        keys = None if wanted is None else set(wanted)
        found: dict[tuple[str, str, int, str], Any] = {}
        for number, record in self.raw_episodes():
            try:
                key = episode_key((record["domain"], record["task_id"], record.get("seed", 0),
                                   record["agent"]))
            except (KeyError, TypeError, ValueError):
                log.warning("%s:%d: not an episode; skipped", self.episodes_path, number)
                continue
            if keys is not None and key not in keys:
                continue
            try:
                found[key] = Trajectory.from_json(record)
            except ValueError as exc:
                log.warning("%s:%d: not a trajectory (%s); skipped", self.episodes_path,
                            number, str(exc).splitlines()[0])
        return found

    def episode_keys(self) -> set[tuple[str, str, int, str]]:
        """Keys of the stored episodes (without validating them)."""
        keys = set()
        for _, record in self.raw_episodes():
            try:
                keys.add(episode_key((record["domain"], record["task_id"],
                                      record.get("seed", 0), record["agent"])))
            except (KeyError, TypeError, ValueError):
                continue
        return keys

    def raw_episodes(self) -> Iterable[tuple[int, dict[str, Any]]]:
        """(line number, record) of each stored episode line that is a JSON object."""
        if not self.episodes_path.is_file():
            raise ValidationInputError(f"{self.folder} holds no {EPISODES}: annotators are shown "
                                       "the stored conversations")
        with self.episodes_path.open(encoding="utf-8") as handle:
            for number, raw in enumerate(handle, 1):
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except json.JSONDecodeError:
                    log.warning("%s:%d: not valid JSON; skipped", self.episodes_path, number)
                    continue
                if isinstance(record, dict):
                    yield number, record


def load_study(folder: str | Path) -> Study:
    """The gated result lines of a study folder (``results.jsonl``, latest line per key)."""
    from prour.eval.harness import load_result_lines

    folder = study_folder(folder)
    path = folder / RESULTS
    if not path.is_file():
        raise ValidationInputError(f"{folder} holds no {RESULTS}: not a study folder")
    lines = [line for _, line in sorted(load_result_lines(path).items())
             if isinstance(line.get("attention"), dict)]
    return Study(folder, lines)


# ---- export folders -------------------------------------------------------------------------


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def refuse_over_labels(folder: Path) -> None:
    """An export folder already holding annotators' labels is not replaced."""
    stored = sorted((folder / LABELS_DIR).glob("*.jsonl")) if folder.is_dir() else []
    if stored:
        names = ", ".join(p.name for p in stored)
        raise ValidationInputError(
            f"{folder} already holds annotators' labels ({LABELS_DIR}/{names}); a new export "
            "would not match them: move the folder away first")


def write_export(folder: Path, shown: Sequence[Mapping[str, Any]],
                 keys: Sequence[Mapping[str, Any]], instructions: str) -> dict[str, Path]:
    """Write the annotators' file, its instructions and the key (refused over labels)."""
    refuse_over_labels(folder)
    written = {"to_annotate": folder / TO_ANNOTATE, "instructions": folder / INSTRUCTIONS,
               "key": folder / KEY}
    write_atomic(written["to_annotate"], _jsonl(shown))
    write_atomic(written["instructions"], instructions)
    write_atomic(written["key"], _jsonl(keys))
    (folder / LABELS_DIR).mkdir(exist_ok=True)  # where the annotators' answers go
    return written


def read_key(folder: Path) -> list[dict[str, Any]]:
    """The key of an export; a missing one says to export first."""
    from prour.env.trajectory import read_jsonl

    path = folder / KEY
    if not path.is_file():
        raise ValidationInputError(f"no {path}: export first (`prour validation export "
                                   f"{folder.name} {shlex.quote(str(folder.parent.parent))}`)")
    return list(read_jsonl(path))


# ---- label files ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelSpec:
    """What one kind's label lines hold: the id field and each answer field's allowed values
    (lower case), mapped to the value stored (so synonyms share one)."""

    id_field: str
    fields: Mapping[str, Mapping[str, str]]

    def allowed(self, name: str) -> str:
        return ", ".join(sorted(self.fields[name]))


def read_labels(path: str | Path, spec: LabelSpec, known: Iterable[str],
                ) -> dict[str, dict[str, str]]:
    """One annotator's labels, ``{item id: {field: value}}``, checked line by line."""
    path = Path(path)
    if not path.is_file():
        raise ValidationInputError(f"{path}: no such label file")
    known = set(known)
    out: dict[str, dict[str, str]] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationInputError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValidationInputError(f"{where}: expected a JSON object")
        item = row.get(spec.id_field)
        if item is None:
            raise ValidationInputError(f"{where}: no {spec.id_field!r}")
        if item not in known:
            raise ValidationInputError(f"{where}: unknown {spec.id_field} {item!r} (not in this "
                                       f"export's {KEY})")
        if item in out:
            raise ValidationInputError(f"{where}: {spec.id_field} {item!r} labelled twice")
        answers = {}
        for name, values in spec.fields.items():
            given = row.get(name)
            value = values.get(given.strip().lower()) if isinstance(given, str) else None
            if value is None:
                raise ValidationInputError(f"{where}: {name}={given!r} must be one of "
                                           f"{spec.allowed(name)}")
            answers[name] = value
        out[item] = answers
    if not out:
        raise ValidationInputError(f"{path}: no labels in the file")
    return out


def store_labels(folder: Path, paths: Sequence[str | Path], spec: LabelSpec,
                 known: Iterable[str]) -> list[Path]:
    """Check each label file against the key, then keep a copy in ``labels/`` (a file of the
    same name there is replaced: an annotator's corrected answers)."""
    known = set(known)
    for path in paths:
        read_labels(path, spec, known)
    stems = [Path(p).stem for p in paths]
    if len(set(stems)) != len(stems):
        raise ValidationInputError("two label files share one name; each annotator's file "
                                   f"needs its own: {', '.join(map(str, paths))}")
    stored = []
    for path in map(Path, paths):
        target = folder / LABELS_DIR / f"{path.stem}.jsonl"
        if not (target.exists() and target.resolve() == path.resolve()):
            write_atomic(target, path.read_text(encoding="utf-8"))
        stored.append(target)
    return stored


def stored_labels(folder: Path, spec: LabelSpec, known: Iterable[str],
                  ) -> dict[str, dict[str, dict[str, str]]]:
    """Every annotator's stored labels, ``{annotator: {item id: {field: value}}}``."""
    known = set(known)
    return {path.stem: read_labels(path, spec, known)
            for path in sorted((folder / LABELS_DIR).glob("*.jsonl"))}


def command(*words: str | Path | int) -> str:
    """A shell command line, quoted so that it runs as printed."""
    return " ".join(shlex.quote(str(w)) for w in words)
