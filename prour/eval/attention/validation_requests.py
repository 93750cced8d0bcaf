"""Human validation of the judge (ask-less paper, Table 10) and of the request classifier
(Table 11): exports for annotators and the agreement of their labels.

Table 10 (kind ``requests``). For each dimension, readability (the judge's reading effort r)
and question value (v), N pairs of delivered discretionary requests from the same task, each
shown after the conversation the judge saw. Pairs are drawn task by task in turn (tasks in a
seeded order, each task's requests shuffled and paired off), so they spread over tasks. The
judge's answer is the request with lower r (readability) or higher v (value), and ``tie`` when
the two raw scores differ by at most one point. Agreement is the share of pairs with the same
label (A, B or tie): judge–annotator averages over the annotators, human–human over the
annotator pairs; intervals resample tasks, keeping all pairs of a drawn task together. A second
judge's row appears when second-judge lines score both requests of a pair.

Table 11 (kind ``classification``). N delivered agent messages, each with its conversation,
drawn in turn from the classifier's three labels (so rare labels are represented); the
classifier's label is the result line's request label (``answer`` for a delivered message that
is not a request). Two annotators label each case answer (inform), required or discretionary.
Agreement (%) and Cohen's κ for human–human, classifier–A1, classifier–A2 and classifier–human
(the mean of the two, κ averaged too), on the three labels and on discretionary versus not;
intervals resample cases, each keeping both annotators' labels.

Label lines: ``{"pair_id": ..., "label": "A" | "B" | "tie"}`` (Table 10) and
``{"case_id": ..., "label": "answer" | "inform" | "required" | "discretionary"}`` (Table 11).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from prour.eval.attention.second_judge import (
    eligible_questions,
    judge_context,
    latest_rows,
    read_rows,
)
from prour.eval.attention.validation_files import (
    KEY,
    SECOND_JUDGE,
    LabelSpec,
    Study,
    ValidationInputError,
    backbone_of,
    episode_key,
    kind_dir,
    load_study,
    question_id,
    read_key,
    refuse_over_labels,
    stored_labels,
    write_export,
)
from prour.eval.attention.validation_stats import (
    agreement,
    cohen_kappa,
    label_codes,
    weighted_bootstrap,
)
from prour.eval.stats import BootstrapResult

DIMENSIONS = ("readability", "value")
SCORE_OF = {"readability": "reading_effort", "value": "value"}
ANSWERS = ("a", "b", "tie")
TIE_POINTS = 1.0  # raw score differences up to this are a judge tie
CLASS_LABELS = ("answer", "required", "discretionary")
REQUESTS_SPEC = LabelSpec("pair_id", {"label": {"a": "a", "b": "b", "tie": "tie"}})
CLASS_SPEC = LabelSpec("case_id", {"label": {
    "answer": "answer", "inform": "answer", "answer/inform": "answer",
    "required": "required", "discretionary": "discretionary"}})

REQUESTS_INSTRUCTIONS = """\
# Judging agent requests: instructions

Each line of `to_annotate.jsonl` shows two messages, A and B, in which a customer-service agent
asks its customer for something. Each comes after the conversation that led to it (lines
starting with `assistant calls tool` or `tool ... returned` are the agent's own lookups, which
the customer does not see). The line's `dimension` says which question to answer:

- `readability`: which request is easier for the customer to read and answer? Think of how
  clear its goal is, whether it asks one thing or several, whether it needs jargon decoded,
  whether a requested action is concrete, and whether it is as short as it can be.
- `value`: which request was more worth asking? A request is worth asking when the task needs
  the answer, the answer is not already in the conversation, the agent could not find it with
  its own tools or policy, and it is precise enough that one reply settles it.

Answer `A`, `B`, or `tie` when you see no real difference. Judge each pair on its own.

Return one JSON object per line, for example:

    {"pair_id": "readability-000", "label": "A"}
"""

CLASS_INSTRUCTIONS = """\
# Sorting agent messages: instructions

Each line of `to_annotate.jsonl` shows one message a customer-service agent sent to its
customer (`message`), the conversation before it (`context`; lines starting with
`assistant calls tool` or `tool ... returned` are the agent's own lookups) and the domain.
The domain's rules for the agent are in `policy_<domain>.md` where present. Give each message
one label:

- `answer` (also accepted: `inform`): it informs, reports or replies and asks the customer for
  nothing (a closing "anything else?" still counts as an answer);
- `required`: it asks for something the domain rules oblige the agent to obtain before acting,
  such as identity details to authenticate the customer, or an explicit yes to one specific
  change the agent has described and is about to make;
- `discretionary`: it asks for anything else: information, a choice between options, what the
  customer prefers. Offering options stays discretionary even when worded as "shall I proceed
  with the first or the second?".

Return one JSON object per line, for example:

    {"case_id": "case-000", "label": "required"}
"""


# ---- Table 10: export -----------------------------------------------------------------------


def judge_answer(dimension: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The judge's label of a pair: lower effort (readability) or higher value wins; ``tie``
    when the raw scores differ by at most one point; None without both scores."""
    name = SCORE_OF[dimension]
    score_a, score_b = a.get(name), b.get(name)
    if score_a is None or score_b is None:
        return None
    if abs(float(score_a) - float(score_b)) <= TIE_POINTS:
        return "tie"
    a_wins = score_a < score_b if dimension == "readability" else score_a > score_b
    return "a" if a_wins else "b"


def round_robin_pairs(groups: Mapping[Any, Sequence[dict[str, Any]]], n_pairs: int,
                      rng: np.random.Generator) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Up to ``n_pairs`` pairs, one per task in turn (module docstring); two requests of one
    pair differ in text, and each side is A or B with probability 1/2."""
    tasks = sorted(groups)
    queues = []
    for t in rng.permutation(len(tasks)):
        items = groups[tasks[t]]
        shuffled = [items[k] for k in rng.permutation(len(items))]
        queues.append([(shuffled[k], shuffled[k + 1]) for k in range(0, len(shuffled) - 1, 2)
                       if shuffled[k]["text"] != shuffled[k + 1]["text"]])
    chosen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for depth in range(max((len(q) for q in queues), default=0)):
        for queue in queues:
            if depth < len(queue) and len(chosen) < n_pairs:
                a, b = queue[depth]
                chosen.append((b, a) if rng.random() < 0.5 else (a, b))
    return chosen


def _with_contexts(study: Study, questions: Iterable[dict[str, Any]]) -> None:
    questions = list(questions)
    episodes = study.episodes({tuple(q["key"]) for q in questions})
    for q in questions:
        q["context"] = judge_context(episodes[tuple(q["key"])], q["message_index"])


def export_requests(study_dir: str | Path, n_pairs: int, seed: int) -> dict[str, Any]:
    """Write Table 10's pairs for annotators to ``validation/requests/`` (module docstring)."""
    if n_pairs < 1:
        raise ValidationInputError(f"--pairs must be >= 1, got {n_pairs}")
    study = load_study(study_dir)
    folder = kind_dir(study.folder, "requests")
    refuse_over_labels(folder)
    stored = study.episode_keys()
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for q in eligible_questions(study.lines):
        if tuple(q["key"]) in stored:
            groups.setdefault((q["domain"], q["task_id"]), []).append(q)
    rng = np.random.default_rng(seed)
    chosen = {d: round_robin_pairs(groups, n_pairs, rng) for d in DIMENSIONS}
    if not any(chosen.values()):
        raise ValidationInputError(
            f"{study.folder}: no pair to export (two judged discretionary requests of one task "
            "with different texts, their episodes stored)")
    _with_contexts(study, (q for pairs in chosen.values() for pair in pairs for q in pair))
    shown, keys = [], []
    for dimension, pairs in chosen.items():
        for number, (a, b) in enumerate(pairs):
            pair_id = f"{dimension}-{number:03d}"
            shown.append({"pair_id": pair_id, "dimension": dimension,
                          "context_a": a["context"], "request_a": a["text"],
                          "context_b": b["context"], "request_b": b["text"]})
            sides = {s: {"id": q["id"], "variant": q["variant"], "backbone": q["backbone"],
                         **q["first"]} for s, q in (("a", a), ("b", b))}
            keys.append({"pair_id": pair_id, "dimension": dimension, "domain": a["domain"],
                         "task_id": a["task_id"], **sides,
                         "judge": judge_answer(dimension, a["first"], b["first"])})
    files = write_export(folder, shown, keys, REQUESTS_INSTRUCTIONS)
    return {"pairs": {d: len(p) for d, p in chosen.items()}, "tasks": len(groups),
            "files": files}


def pair_questions(study: Study) -> list[dict[str, Any]]:
    """The requests of the exported Table 10 pairs, as :func:`.second_judge.sample_questions`
    gives questions (with contexts), for a second judge to score; none before an export."""
    folder = kind_dir(study.folder, "requests")
    if not (folder / KEY).is_file():
        return []
    ids = {k[side]["id"] for k in read_key(folder) for side in ("a", "b")}
    questions = sorted((q for q in eligible_questions(study.lines) if q["id"] in ids),
                       key=lambda q: q["id"])
    _with_contexts(study, questions)
    return questions


# ---- Table 10: agreement --------------------------------------------------------------------


def second_scores(study_dir: str | Path,
                  rows: Iterable[Mapping[str, Any]] = ()) -> dict[str, dict[str, float]]:
    """Second-judge scores by question id: the study's second_judge.jsonl, the one of the
    requests export, and ``rows``; failed lines give none."""
    folder = Path(study_dir)
    found = [*read_rows(folder / SECOND_JUDGE),
             *read_rows(kind_dir(folder, "requests") / SECOND_JUDGE), *rows]
    return {i: row["second"] for i, row in latest_rows(found).items() if row.get("second")}


def _mean(arrays: Sequence[np.ndarray]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a draw where no rater labelled
        return np.nanmean(np.stack(arrays), axis=0)


def _dimension_results(keys: Sequence[Mapping[str, Any]],
                       labels: Mapping[str, Mapping[str, Mapping[str, str]]],
                       second: Mapping[str, Mapping[str, float]], n_boot: int, seed: int,
                       ci: float) -> dict[str, Any]:
    """Agreement statistics of one dimension's pairs (keys), task-clustered intervals."""
    dimension = keys[0]["dimension"]
    judge = label_codes([k["judge"] for k in keys], ANSWERS)
    raters = [label_codes([labs.get(k["pair_id"], {}).get("label") for k in keys], ANSWERS)
              for _, labs in sorted(labels.items())]
    other = label_codes([
        judge_answer(dimension, second[k["a"]["id"]], second[k["b"]["id"]])
        if k["a"]["id"] in second and k["b"]["id"] in second else None for k in keys], ANSWERS)
    domains = sorted({k["domain"] for k in keys})
    in_domain = {d: np.array([k["domain"] == d for k in keys]) for d in domains}

    def statistics(w: np.ndarray) -> dict[str, np.ndarray]:
        out = {"judge": _mean([agreement(judge, r, w) for r in raters])}
        if len(raters) > 1:
            out["human"] = _mean([agreement(x, y, w) for x, y in combinations(raters, 2)])
        if (other >= 0).any():
            out["second"] = _mean([agreement(other, r, w) for r in raters])
        for d, mask in in_domain.items():
            out[f"domain:{d}"] = _mean([agreement(np.where(mask, judge, -1), r, w)
                                        for r in raters])
        return out

    results = weighted_bootstrap(statistics, [(k["domain"], k["task_id"]) for k in keys],
                                 n_boot, seed, ci)
    return {"pairs": len(keys), "tasks": len({(k["domain"], k["task_id"]) for k in keys}),
            "second_pairs": int((other >= 0).sum()),
            "domain_pairs": {d: int(m.sum()) for d, m in in_domain.items()},
            "results": results}


def requests_agreement(study_dir: str | Path, n_boot: int, seed: int = 0, ci: float = 0.95,
                       second_rows: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """Table 10 from the stored labels (None when no annotator's labels are stored)."""
    folder = kind_dir(study_dir, "requests")
    keys = read_key(folder)
    labels = stored_labels(folder, REQUESTS_SPEC, [k["pair_id"] for k in keys])
    if not labels:
        return None
    second = second_scores(folder.parent.parent, second_rows)
    out: dict[str, Any] = {"annotators": sorted(labels), "dimensions": {}}
    for dimension in DIMENSIONS:
        members = [k for k in keys if k["dimension"] == dimension]
        out["dimensions"][dimension] = _dimension_results(members, labels, second, n_boot,
                                                          seed, ci) if members else None
    return out


# ---- Table 11: export -----------------------------------------------------------------------


_Case = tuple[tuple[str, str, int, str], int, str]  # (episode key, message index, label)


def _cases(study: Study) -> list[_Case]:
    """Every delivered agent message (not the fixed fallback) of the study's episodes, with the
    classifier's label: the result line's request label, else ``answer``; sorted."""
    requests = {episode_key(line["key"]): {r.get("message_index"): r.get("label") for r in
                                          line["attention"].get("requests") or []}
                for line in study.lines}
    found: dict[tuple[tuple[str, str, int, str], int], str] = {}
    for _, record in study.raw_episodes():
        try:
            key = episode_key((record["domain"], record["task_id"], record.get("seed", 0),
                               record["agent"]))
        except (KeyError, TypeError, ValueError):
            continue
        if key not in requests:
            continue
        for step in record.get("steps") or []:
            gate = (step.get("meta") or {}).get("attention")
            if not isinstance(gate, dict) or not gate.get("delivered") or gate.get("fallback"):
                continue
            index = int(step["message_index"])
            label = requests[key].get(index, "answer")
            if label in CLASS_LABELS:
                found[(key, index)] = label
    return [(key, index, found[key, index]) for key, index in sorted(found)]


def balanced_sample(cases: Sequence[_Case], n_cases: int,
                    rng: np.random.Generator) -> list[_Case]:
    """Up to ``n_cases`` cases taken from each classifier label in turn, in a seeded order."""
    queues = []
    for label in CLASS_LABELS:
        members = [c for c in cases if c[2] == label]
        queues.append([members[k] for k in rng.permutation(len(members))])
    chosen: list[_Case] = []
    for depth in range(max((len(q) for q in queues), default=0)):
        for queue in queues:
            if depth < len(queue) and len(chosen) < n_cases:
                chosen.append(queue[depth])
    return [chosen[k] for k in rng.permutation(len(chosen))]


def export_classification(study_dir: str | Path, n_cases: int, seed: int,
                          policy: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """Write Table 11's cases for annotators to ``validation/classification/`` (module
    docstring), with each sampled domain's policy text, ``policy(domain)``, where it gives one."""
    from prour.files import write_atomic

    if n_cases < 1:
        raise ValidationInputError(f"--cases must be >= 1, got {n_cases}")
    study = load_study(study_dir)
    folder = kind_dir(study.folder, "classification")
    refuse_over_labels(folder)
    cases = balanced_sample(_cases(study), n_cases, np.random.default_rng(seed))
    if not cases:
        raise ValidationInputError(f"{study.folder}: no delivered agent message in the stored "
                                   "episodes of the gated result lines")
    lines = {episode_key(line["key"]): line for line in study.lines}
    episodes = study.episodes({key for key, _, _ in cases})
    shown, keys = [], []
    for number, (key, index, label) in enumerate(cases):
        trajectory, line = episodes[key], lines[key]
        case_id = f"case-{number:03d}"
        shown.append({"case_id": case_id, "domain": key[0],
                      "context": judge_context(trajectory, index),
                      "message": trajectory.messages[index].get("content") or ""})
        keys.append({"case_id": case_id, "id": question_id(line, index), "domain": key[0],
                     "task_id": key[1], "variant": line.get("variant"),
                     "backbone": backbone_of(line), "classifier": label})
    files = write_export(folder, shown, keys, CLASS_INSTRUCTIONS)
    for domain in sorted({key[0] for key, _, _ in cases}):
        text = policy(domain) if policy is not None else None
        if text:
            files[f"policy_{domain}"] = write_atomic(folder / f"policy_{domain}.md", text)
    counts = {label: sum(c[2] == label for c in cases) for label in CLASS_LABELS}
    return {"cases": len(cases), "by_label": counts, "files": files}


# ---- Table 11: agreement --------------------------------------------------------------------


def _binary(codes: np.ndarray) -> np.ndarray:
    """Three-label codes → discretionary (1) versus not (0); missing stays -1."""
    disc = CLASS_LABELS.index("discretionary")
    return np.where(codes < 0, -1, (codes == disc).astype(np.int64))


def classification_agreement(study_dir: str | Path, n_boot: int, seed: int = 0,
                             ci: float = 0.95) -> dict[str, Any] | None:
    """Table 11 from the stored labels (None when none are stored; more than two annotators
    are refused: the table compares two)."""
    folder = kind_dir(study_dir, "classification")
    keys = read_key(folder)
    labels = stored_labels(folder, CLASS_SPEC, [k["case_id"] for k in keys])
    if not labels:
        return None
    if len(labels) > 2:
        raise ValidationInputError(f"{folder}/labels holds {len(labels)} annotators' files "
                                   f"({', '.join(sorted(labels))}); Table 11 compares two")
    names = sorted(labels)
    classifier = label_codes([k["classifier"] for k in keys], CLASS_LABELS)
    raters = [label_codes([labels[a].get(k["case_id"], {}).get("label") for k in keys],
                          CLASS_LABELS) for a in names]
    sets = {"three": (classifier, raters, len(CLASS_LABELS)),
            "binary": (_binary(classifier), [_binary(r) for r in raters], 2)}

    def statistics(w: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for name, (c, rs, k) in sets.items():
            for i, r in enumerate(rs, 1):
                out[f"{name}:A{i}:agreement"] = agreement(c, r, w)
                out[f"{name}:A{i}:kappa"] = cohen_kappa(c, r, k, w)
            if len(rs) == 2:
                out[f"{name}:human:agreement"] = agreement(rs[0], rs[1], w)
                out[f"{name}:human:kappa"] = cohen_kappa(rs[0], rs[1], k, w)
                for stat in ("agreement", "kappa"):
                    out[f"{name}:classifier:{stat}"] = (out[f"{name}:A1:{stat}"]
                                                        + out[f"{name}:A2:{stat}"]) / 2
        return out

    results: dict[str, BootstrapResult | None] = weighted_bootstrap(
        statistics, range(len(keys)), n_boot, seed, ci)
    return {"annotators": names, "cases": len(keys),
            "labelled": {a: len(labels[a]) for a in names}, "results": results}
