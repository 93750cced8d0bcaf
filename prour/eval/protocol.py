"""The protocol guard (DESIGN §6): what a study must not mix, checked from the recipe's splits
before any trajectory exists and, once they exist, from the dev states file and the dataset.

Rules (each a :class:`Finding` when broken):

``eval-overlap``      an eval task of a domain is among that domain's training tasks
``dev-states``        calibration dev states come from trajectories training uses
``shared-task``       train and validation rows share a task
``baseline-checkpoint`` a baseline writes its questions with prour's trained checkpoint
``shared-writes``     more eval tasks than ``protocol.max_shared_write_tasks`` perform a write
                      action that a training or reserve task performs too (by content)

The airline calibration *test* states only evaluate thresholds fitted on retail: allowed, listed
as a note (:func:`protocol_notes`). So is the content check (:func:`shared_writes`) below its
threshold: τ-bench v1's training tasks (``v1-train``) share no id with tau2's ``base`` split, yet
some of their write actions are the very calls some eval tasks need; and so is the count of
tau2's retail ``base`` (114) against the paper's 115. ``protocol.on_breach`` (``error`` by default)
says whether a finding stops preflight or is printed as a warning (the section:
prour.config.ProtocolConfig).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prour.config import Recipe

MAX_IDS = 5
NOTE_IDS = 12  # ids a note lists before "..."
# The paper's retail eval set (§4 and A.2.1, "115 held-out retail tasks"): τ-bench v1's retail
# test set. tau2's retail ``base`` split is that set with its maintainers' corrections.
PAPER_RETAIL_EVAL_TASKS = 115


@dataclass(frozen=True)
class Finding:
    """One broken rule: how many items break it, up to five of their ids, and the fix."""

    rule: str
    count: int
    what: str  # the items, e.g. "retail eval tasks are training tasks"
    ids: tuple[str, ...]
    fix: str

    def line(self) -> str:
        return f"protocol: {self.count} {self.what} ({_shown(self.ids, MAX_IDS)}); {self.fix}"


def _shown(ids: tuple[str, ...], most: int) -> str:
    return ", ".join(ids[:most]) + (", ..." if len(ids) > most else "")


def _fix(recipe: Recipe, *items: str) -> str:
    import shlex

    from prour.recipes import prour_command

    sets = [part for item in items for part in ("--set", item)]
    return f"fix: {prour_command(recipe, 'run')}" + (f" {shlex.join(sets)}" if sets else "")


def training_tasks(recipe: Recipe) -> tuple[str, list[str]]:
    """(domain, task ids) training uses (:func:`prour.data.reserve.training_task_ids`)."""
    from prour.data.reserve import training_task_ids

    return recipe.data.domain, training_task_ids(recipe.data)


def eval_task_ids(recipe: Recipe, domain: str) -> list[str]:
    """The task ids the evaluation runs in ``domain`` (as the harness selects them)."""
    from prour.env.domains import select_tasks

    cfg = recipe.eval
    ids = None
    if cfg.tasks:
        ids = {t.split(":", 1)[1] if ":" in t else t for t in cfg.tasks
               if ":" not in t or t.split(":", 1)[0] == domain}
        if not ids:
            return []
    try:
        return [t.id for t in select_tasks(domain, cfg.split, ids, cfg.max_tasks)]
    except ValueError:
        return []


def _eval_overlap(recipe: Recipe) -> list[Finding]:
    """Eval tasks among the tasks of ``data.split`` (training tasks and the calibration reserve,
    whose dev states fit the thresholds the evaluation routes with). A recipe without a
    ``train`` section trains nothing, so its evaluation overlaps no training."""
    from prour.data.reserve import reserve_task_ids

    if recipe.train is None:
        return []
    domain, training = training_tasks(recipe)
    if domain not in recipe.eval.domains:
        return []
    used = set(training) | set(reserve_task_ids(recipe.data))
    shared = [t for t in eval_task_ids(recipe, domain) if t in used]
    if not shared:
        return []
    return [Finding("eval-overlap", len(shared),
                    f"{domain} eval tasks (eval.split {recipe.eval.split}) are training or "
                    f"calibration-reserve tasks of data.split {recipe.data.split}", tuple(shared),
                    _fix(recipe, "data.split=v1-train"))]


@dataclass(frozen=True)
class SharedWrites:
    """The content check of one domain: eval tasks whose write actions training performs too."""

    domain: str
    eval_tasks: int  # eval tasks compared
    some: tuple[str, ...]  # eval task ids sharing at least one write action, in split order
    every: tuple[str, ...]  # of those, the ids sharing every write action they have


@functools.cache
def write_actions(domain: str, split: str) -> dict[str, frozenset[str]]:
    """Task id -> the canonical JSON (``{"tool", "arguments"}``, sorted keys) of its reference
    actions that the agent takes with a tool tau2 marks ``ToolType.WRITE``. Parsed once per
    process, so ``prour validate`` pays for it once."""
    from prour.env.domains import load_tasks
    from prour.env.environment import tool_types
    from prour.router.candidates import canonical_json

    writes = {name for name, kind in tool_types(domain).items() if kind == "write"}
    found = {}
    for task in load_tasks(domain, split):
        actions = (task.evaluation_criteria.actions if task.evaluation_criteria else None) or []
        found[task.id] = frozenset(
            canonical_json({"tool": a.name, "arguments": a.arguments}) for a in actions
            if a.requestor == "assistant" and a.name in writes)
    return found


def shared_writes(recipe: Recipe) -> SharedWrites | None:
    """The eval tasks of the training domain whose write actions (by content, not by id) are
    among those of the tasks of ``data.split`` the run uses: training tasks and the calibration
    reserve, as the id check counts them. ``every`` holds only tasks with a write action. None
    when the run trains nothing or does not evaluate its training domain."""
    from prour.data.reserve import reserve_task_ids

    if recipe.train is None:
        return None
    domain, training = training_tasks(recipe)
    if domain not in recipe.eval.domains:
        return None
    by_task = write_actions(domain, recipe.data.split)
    used = frozenset().union(*(by_task[t] for t in {*training, *reserve_task_ids(recipe.data)}))
    evals = write_actions(domain, recipe.eval.split)
    ids = eval_task_ids(recipe, domain)
    some = tuple(t for t in ids if evals[t] & used)
    return SharedWrites(domain, len(ids), some, tuple(t for t in some if evals[t] <= used))


def _shared_writes(recipe: Recipe) -> list[Finding]:
    """More eval tasks sharing a write action than ``protocol.max_shared_write_tasks``."""
    limit = recipe.protocol.max_shared_write_tasks
    shared = shared_writes(recipe) if limit is not None else None
    if shared is None or len(shared.some) <= limit:
        return []
    count = len(shared.some)
    return [Finding("shared-writes", count,
                    f"{shared.domain} eval tasks (eval.split {recipe.eval.split}) perform a write "
                    "action (same tool and arguments) that a training or calibration-reserve task "
                    f"of data.split {recipe.data.split} performs, past "
                    f"protocol.max_shared_write_tasks={limit}", shared.some,
                    _fix(recipe, f"protocol.max_shared_write_tasks={count}")
                    + " to accept them, or leave them out of eval.tasks")]


def _shared_writes_note(recipe: Recipe) -> str | None:
    shared = shared_writes(recipe)
    if shared is None:
        return None
    limit = recipe.protocol.max_shared_write_tasks
    verdict = ("a note (protocol.max_shared_write_tasks: null)" if limit is None else
               f"{'past' if len(shared.some) > limit else 'within'} "
               f"protocol.max_shared_write_tasks={limit}")
    every = f" ({', '.join(shared.every)})" if shared.every else ""
    listed = f" ({_shown(shared.some, NOTE_IDS)})" if shared.some else ""
    return (f"content overlap: {len(shared.some)} of {shared.eval_tasks} {shared.domain} eval "
            f"tasks{listed} perform a write action (same tool and arguments) that a training or "
            f"calibration-reserve task of data.split {recipe.data.split} performs too, "
            f"{len(shared.every)} of them every write action{every}; {verdict}")


def _paper_count_note(recipe: Recipe) -> str | None:
    """The paper's 115 retail eval tasks against tau2's ``base`` split."""
    from prour.env.domains import split_task_ids

    if "retail" not in recipe.eval.domains or recipe.eval.split != "base":
        return None
    held = len(split_task_ids("retail", "base"))
    if held == PAPER_RETAIL_EVAL_TASKS:
        return None
    return (f"retail eval: tau2's base split holds {held} tasks where the Prour paper evaluates "
            f"on {PAPER_RETAIL_EVAL_TASKS} (§4 and A.2.1: τ-bench v1's retail test set); tau2's "
            f"base split is that test set with its maintainers' corrections, which leave {held}")


def _calibrates(recipe: Recipe) -> bool:
    """The recipe fits its thresholds (no tau_au/tau_eu) on dev states (as the chain's
    collect-dev step decides)."""
    return recipe.router.tau_au is None and recipe.router.calibration.dev_states is not None


def _read_states(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def _dev_states(recipe: Recipe) -> list[Finding]:
    if not _calibrates(recipe):
        return []
    domain, training = training_tasks(recipe)
    path = recipe.router.calibration.dev_states
    if path and Path(path).is_file():
        train = set(training)
        bad = [f"{r.get('domain')}:{r.get('task_id')}" for r in _read_states(Path(path))
               if r.get("domain") == domain and str(r.get("task_id")) in train]
        bad = list(dict.fromkeys(bad))
        if bad:
            return [Finding("dev-states", len(bad), f"tasks of the dev states {path} are training "
                            "tasks (the thresholds would be fitted on training data)", tuple(bad),
                            _fix(recipe, "data.calibration_reserve=40") + " and rebuild the dev "
                            "states from the reserve (the chain's collect-dev, states-dev steps)")]
        return []
    if recipe.data.calibration_reserve == 0:
        return [Finding("dev-states", len(training), "training tasks would feed the calibration "
                        "dev states (router.calibration is used, data.calibration_reserve is 0)",
                        tuple(training), _fix(recipe, "data.calibration_reserve=40"))]
    return []


def shared_tasks(dataset_dir: str | Path) -> list[tuple[str, str]] | None:
    """(domain, task id) with rows in both train and validation parquet files of a dataset
    folder; None when the folder lacks either file or one is not readable parquet (what reads
    it names that file: train's path check; extract writes it again)."""
    from prour.data.dataset import read_rows, split_path

    paths = [split_path(dataset_dir, s) for s in ("train", "validation")]
    if not all(path.is_file() for path in paths):
        return None
    try:
        keys = [{(r["extra_info"]["domain"], str(r["extra_info"]["task_id"]))
                 for r in read_rows(p)} for p in paths]
    except ValueError:
        return None
    return sorted(keys[0] & keys[1])


def _shared_tasks(recipe: Recipe, dataset_dir: str | Path | None) -> list[Finding]:
    folder = dataset_dir or recipe.data.dataset_dir
    shared = shared_tasks(folder) if folder else None
    if shared is not None:
        if shared:
            return [Finding("shared-task", len(shared), f"tasks have rows in both train and "
                            f"validation of {folder}", tuple(f"{d}:{t}" for d, t in shared),
                            _fix(recipe, "data.split_by=task") + " after `prour extract`")]
        return []
    if recipe.data.split_by == "trajectory" and recipe.data.val_ratio > 0:
        return [Finding("shared-task", 1, "recipe splits by trajectory, so trials of one task "
                        "land in both train and validation", ("data.split_by=trajectory",),
                        _fix(recipe, "data.split_by=task"))]
    return []


def _baseline_checkpoint(recipe: Recipe) -> list[Finding]:
    from prour.eval.methods import check_method

    if recipe.train is None:  # eval runs without --checkpoint
        return []
    bad = [m for m in recipe.eval.methods
           if check_method(m).baseline is not None and _writer(check_method(m)) == "generator"]
    if not bad:
        return []
    keep = [m for m in recipe.eval.methods if m not in bad]
    return [Finding("baseline-checkpoint", len(bad), "baselines of eval.methods would write their "
                    "questions with prour's trained checkpoint (models.generator under "
                    "--checkpoint)", tuple(bad),
                    _fix(recipe, f"eval.methods=[{','.join(keep)}]"))]


def _writer(spec: Any) -> str | None:
    """The role whose model writes a method's questions (``MethodSpec.writer`` where the spec
    names it, else ``generator`` when the method calls that role)."""
    if hasattr(spec, "writer"):
        return spec.writer
    return "generator" if "generator" in spec.roles else None


def protocol_findings(recipe: Recipe, trajectories: Any = None,
                      dataset_dir: str | Path | None = None) -> list[Finding]:
    """Every broken protocol rule of ``recipe``: from its splits alone, and from the dev states
    file and the dataset parquet where they exist. ``trajectories`` (records with ``domain`` and
    ``task_id``), when given, are checked as the dev states are: none may be a training task of
    ``data.domain`` if they feed calibration."""
    found = _eval_overlap(recipe) + _dev_states(recipe) + _shared_tasks(recipe, dataset_dir)
    found += _baseline_checkpoint(recipe) + _shared_writes(recipe)
    if trajectories is not None and _calibrates(recipe):
        domain, training = training_tasks(recipe)
        train = set(training)
        bad = list(dict.fromkeys(
            f"{_get(t, 'domain')}:{_get(t, 'task_id')}" for t in trajectories
            if _get(t, "domain") == domain and str(_get(t, "task_id")) in train))
        if bad:
            found.append(Finding("dev-states", len(bad), "trajectories given for the dev states "
                                 "are of training tasks", tuple(bad),
                                 _fix(recipe, "data.tasks=reserve")))
    return found


def _get(record: Any, key: str) -> Any:
    return record.get(key) if isinstance(record, dict) else getattr(record, key, None)


def protocol_notes(recipe: Recipe) -> list[str]:
    """What the protocol allows and a report states: the airline calibration test states, the
    content check (stated even past its threshold, where it is also a finding), the paper's
    retail eval count and, for a split prour ships, the task set and its exclusions."""
    notes = []
    if _calibrates(recipe) and recipe.router.calibration.test_states:
        notes.append("calibration test states (airline) only evaluate thresholds fitted on "
                     f"{recipe.data.domain} dev states: allowed")
    notes += [note for note in (_shared_writes_note(recipe), _paper_count_note(recipe)) if note]
    return notes + _task_set_notes(recipe)


def _task_set_notes(recipe: Recipe) -> list[str]:
    """Per eval domain on a split prour ships: its source and the tasks it leaves out (and where
    they are listed); tau2's own splits need none."""
    from prour.env.domains import task_set_note

    notes = [task_set_note(domain, recipe.eval.split) for domain in recipe.eval.domains]
    return [f"task set {note}" for note in notes if note]


def protocol_block(recipe: Recipe) -> list[str]:
    """The report header's Protocol lines: training and eval tasks, overlap, calibration sources,
    split_by, and the downgrade when ``protocol.on_breach`` is ``warn``."""
    from prour.data.reserve import reserve_task_ids

    domain, training = training_tasks(recipe)
    lines = [(f"training tasks: {domain} {recipe.data.split}, {len(training)} tasks "
              f"(calibration reserve: {len(reserve_task_ids(recipe.data))})")]
    evals = {d: eval_task_ids(recipe, d) for d in recipe.eval.domains}
    lines.append("eval tasks: " + ", ".join(f"{d} {recipe.eval.split} {len(ids)}"
                                           for d, ids in evals.items()))
    overlap = _eval_overlap(recipe)
    lines.append(f"overlap: {overlap[0].count} ({', '.join(overlap[0].ids[:MAX_IDS])})"
                 if overlap else "overlap: 0")
    if _calibrates(recipe):
        dev = ("the calibration reserve" if recipe.data.calibration_reserve
               else "training trajectories (breach)")
        lines.append(f"calibration: dev states from {dev}; test states: "
                     f"{recipe.router.calibration.test_states or 'none'}")
    else:
        lines.append(f"calibration: fixed thresholds ({recipe.router.tau_au}, "
                     f"{recipe.router.tau_eu}), none fitted")
    lines += [f"note: {note}" for note in protocol_notes(recipe)]
    lines.append(f"split_by: {recipe.data.split_by}")
    found = protocol_findings(recipe)
    if recipe.protocol.on_breach == "warn" and found:
        lines.append("on_breach: warn — this study deliberately breaks: "
                     + "; ".join(f"{f.rule} ({f.count})" for f in found))
    else:
        lines.append(f"on_breach: {recipe.protocol.on_breach}")
    return lines
