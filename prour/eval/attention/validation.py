"""Human and judge validation of an Ask-Less study (ask-less paper, Tables 4, 10, 11 and 12).

Each study is run in two passes over a study folder (``results.jsonl``, ``episodes.jsonl``):
``prour validation export KIND STUDY`` writes what annotators see to
``STUDY/validation/KIND/`` (files: :mod:`.validation_files`), and ``prour validation score KIND
STUDY --labels FILE ...`` checks and stores their labels and prints the table. The report calls
:func:`table4_section` ... :func:`table12_section`, which read the same folders.

Table 4 (kind ``burden``; here). Two sets of N conversation pairs, each pair two conversations
of one task, both asking at least one discretionary question: *equal counts* (the same number of
delivered discretionary requests, different full costs) and *different counts*. Annotators see
the two transcripts as the user saw them, as A and B in a random order, the pairs of both sets
mixed under neutral ids, and answer two questions with A, B or same: whose questions were more
of a burden (``question_burden``) and which conversation was more burdensome overall
(``overall_burden``). The key ranks each pair by the full cost A_full and by one score alone,
each summed over the conversation's discretionary requests: avoidability Σ (1 − v/10) ("value
alone"), Σ r/20 ("effort alone") and the word count of the questions ("question words"); a score
that ties ranks neither. Agreement is the share of non-tie answers choosing the conversation
ranked higher, with pair-bootstrap intervals (all answers of a drawn pair together), per pair set,
question and ranking; "same" answers are counted apart.

Tables 10 and 11: :mod:`.validation_requests`; Table 12: :mod:`.second_judge`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prour.eval.attention.second_judge import (  # noqa: F401 - Table 12, importable from here
    CONTRASTS,
    read_rows,
    sample_questions,
    score_second_judge,
    study_questions,
    table12,
)
from prour.eval.attention.validation_files import (  # noqa: F401 - for the command
    KEY,
    KINDS,
    LABELS_DIR,
    SECOND_JUDGE,
    LabelSpec,
    ValidationInputError,
    backbone_of,
    command,
    episode_key,
    kind_dir,
    load_study,
    read_key,
    refuse_over_labels,
    stored_labels,
    study_folder,
    write_export,
)
from prour.eval.attention.validation_requests import (  # noqa: F401 - for the command
    CLASS_SPEC,
    REQUESTS_SPEC,
    classification_agreement,
    export_classification,
    export_requests,
    pair_questions,
    requests_agreement,
)
from prour.eval.attention.validation_stats import interval_json, percent_cell, plain_cell

FULL = "full"
PAIR_SETS = ("different", "equal")  # the paper's row order
QUESTIONS = ("question_burden", "overall_burden")
RANKINGS = ("full", "value", "effort", "words")
RANKING_NAMES = {"full": "full cost", "value": "value alone", "effort": "effort alone",
                 "words": "question words"}
SET_NAMES = {"different": "Different counts", "equal": "Equal counts"}
DEFAULT_BOOT = 2000
DEFAULT_COUNTS = {"burden": 60, "requests": 80, "classification": 100}  # the paper's sizes
_ANSWER = {"a": "a", "b": "b", "same": "same"}
BURDEN_SPEC = LabelSpec("pair_id", {q: _ANSWER for q in QUESTIONS})
SPECS = {"burden": BURDEN_SPEC, "requests": REQUESTS_SPEC, "classification": CLASS_SPEC}

BURDEN_INSTRUCTIONS = """\
# Conversation burden: instructions

Each line of `to_annotate.jsonl` holds two conversations, A and B, between a customer-service
agent and a customer, shown as the customer saw them. Both come from the same customer request.
Put yourself in the customer's place in each and answer two questions:

- `question_burden`: in which conversation were the agent's questions more of a burden, taking
  more of your effort to read, work out and answer, or asking for what seemed unnecessary?
- `overall_burden`: which conversation, as a whole, asked more of your time and attention?

Answer `A`, `B`, or `same` when you cannot tell them apart. Judge each pair on its own.

Return one JSON object per line, for example:

    {"pair_id": "pair-007", "question_burden": "A", "overall_burden": "same"}
"""


# ---- Table 4: export ------------------------------------------------------------------------


def _weights(lines: Sequence[Mapping[str, Any]]) -> Any:
    """The cost weights the study priced with (its first gated line's), else the defaults."""
    from prour.config.attention import CostWeights

    block = next((line["attention"] for line in lines if line["attention"].get("weights")), {})
    return CostWeights(**block["weights"]) if block else CostWeights()


def _record(line: Mapping[str, Any]) -> Any:
    from prour.eval.attention.analysis import ConversationRecord

    block = line["attention"]
    return ConversationRecord(
        method=str(line.get("variant")), model=backbone_of(line), domain=str(line["domain"]),
        task_id=str(line["task_id"]), seed=int(line["seed"]), reward=float(line.get("score") or 0),
        requests=list(block.get("requests") or []), fallback=(block.get("fallbacks") or 0) > 0,
        cut=line.get("termination") == "max_steps")


def single_scores(requests: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """One-score burdens of a conversation, summed over its discretionary requests:
    avoidability Σ (1 − v/10), effort Σ r/20 and question words (None where a score is
    missing)."""
    disc = [r for r in requests if r.get("discretionary")]

    def total(values: list[Any]) -> float | None:
        return None if any(v is None for v in values) else float(sum(values))

    return {
        "value": total([None if r.get("value") is None else 1 - float(r["value"]) / 10
                        for r in disc]),
        "effort": total([None if r.get("reading_effort") is None
                         else float(r["reading_effort"]) / 20 for r in disc]),
        "words": total([len(r["text"].split()) if isinstance(r.get("text"), str) else None
                        for r in disc])}


def ranked_higher(score_a: float | None, score_b: float | None) -> str | None:
    """``a`` or ``b``, whichever has the higher burden; None for a tie or a missing score."""
    if score_a is None or score_b is None or math.isclose(score_a, score_b, abs_tol=1e-9):
        return None
    return "a" if score_a > score_b else "b"


def _side(line: Mapping[str, Any], record: Any, cost: float, scores: Mapping[str, Any],
          ) -> dict[str, Any]:
    from prour.eval.attention.cost import discretionary_count

    return {"result_key": list(line["key"]), "variant": record.method, "backbone": record.model,
            "seed": record.seed, "requests": discretionary_count(record.requests), "cost": cost,
            "avoidability": scores["value"], "effort": scores["effort"],
            "words": scores["words"]}


def export_burden(study_dir: str | Path, n_pairs: int, seed: int) -> dict[str, Any]:
    """Write Table 4's two pair sets for annotators to ``validation/burden/`` (module
    docstring); pairs come only from conversations whose episodes are stored."""
    from prour.env.trajectory import user_view
    from prour.eval.attention.analysis import pair_rows, sample_count_pairs

    if n_pairs < 1:
        raise ValidationInputError(f"--pairs must be >= 1, got {n_pairs}")
    study = load_study(study_dir)
    folder = kind_dir(study.folder, "burden")
    refuse_over_labels(folder)
    stored = study.episode_keys()
    lines = [line for line in study.lines if episode_key(line["key"]) in stored]
    records, weights = [_record(line) for line in lines], _weights(lines)
    rng = np.random.default_rng(seed)
    mixed, candidates = [], {}
    for pair_set in ("equal", "different"):
        chosen, candidates[pair_set] = sample_count_pairs(records, n_pairs, rng, FULL, weights,
                                                          equal=pair_set == "equal")
        mixed += [(pair_set, i, j) for i, j in chosen]
    if not mixed:
        raise ValidationInputError(
            f"{study.folder}: no pair to export (two conversations of one task, each asking at "
            "least one judged discretionary question, their episodes stored)")
    mixed = [mixed[k] for k in rng.permutation(len(mixed))]
    episodes = study.episodes({episode_key(lines[x]["key"]) for _, i, j in mixed for x in (i, j)})
    for _, i, j in mixed:
        for x in (i, j):
            trajectory = episodes[episode_key(lines[x]["key"])]
            records[x].transcript = user_view(trajectory.messages, trajectory.steps)
    shown, ranked = pair_rows(records, [(i, j) for _, i, j in mixed], FULL, weights)
    keys = []
    for (pair_set, i, j), row in zip(mixed, ranked):
        scores = [single_scores(records[x].requests) for x in (i, j)]
        keys.append({
            "pair_id": row["pair_id"], "set": pair_set, "domain": records[i].domain,
            "task_id": records[i].task_id, "accounting": FULL,
            "a": _side(lines[i], records[i], row["cost_a"], scores[0]),
            "b": _side(lines[j], records[j], row["cost_b"], scores[1]),
            "higher": {"full": row["higher"],
                       **{r: ranked_higher(scores[0][r], scores[1][r]) for r in RANKINGS[1:]}}})
    blinded = [{k: row[k] for k in ("pair_id", "conversation_a", "conversation_b")}
               for row in shown]
    files = write_export(folder, blinded, keys, BURDEN_INSTRUCTIONS)
    counts = {s: sum(k["set"] == s for k in keys) for s in ("equal", "different")}
    return {"pairs": counts, "candidates": candidates, "files": files}


# ---- Table 4: agreement ---------------------------------------------------------------------


def burden_agreement(study_dir: str | Path, n_boot: int, seed: int = 0, ci: float = 0.95,
                     ) -> dict[str, Any] | None:
    """Table 4 from the stored labels (None when none are stored): per pair set, question and
    ranking, the agreement with a pair-bootstrap interval (or why it is missing), and per pair
    set and question the "same" answers."""
    from prour.eval.attention.analysis import annotation_agreement

    folder = kind_dir(study_dir, "burden")
    keys = read_key(folder)
    labels = stored_labels(folder, BURDEN_SPEC, [k["pair_id"] for k in keys])
    if not labels:
        return None
    rows, same = [], []
    for pair_set in PAIR_SETS:
        members = [k for k in keys if k["set"] == pair_set]
        ids = {k["pair_id"] for k in members}
        for question in QUESTIONS:
            answers = [{"pair_id": pair, "choice": given[question]}
                       for _, labs in sorted(labels.items()) for pair, given in labs.items()
                       if pair in ids]
            same.append({"set": pair_set, "question": question, "answers": len(answers),
                         "same": sum(a["choice"] == "same" for a in answers)})
            for ranking in RANKINGS:
                ranked = [{"pair_id": k["pair_id"], "higher": k["higher"][ranking]}
                          for k in members if k["higher"].get(ranking)]
                kept = {k["pair_id"] for k in ranked}
                row: dict[str, Any] = {"set": pair_set, "question": question,
                                       "ranking": ranking, "pairs": len(ranked),
                                       "agreement": None}
                try:
                    found = annotation_agreement(ranked, [a for a in answers
                                                          if a["pair_id"] in kept],
                                                 n_boot, seed, ci)
                    row.update(agreement=found.interval, answers=found.answers)
                except ValueError:
                    row["note"] = "no pair ranked" if not ranked else "no non-tie answers"
                rows.append(row)
    return {"annotators": sorted(labels), "pairs": {s: sum(k["set"] == s for k in keys)
                                                    for s in PAIR_SETS},
            "rows": rows, "same": same}


# ---- the report's sections ------------------------------------------------------------------


def export(kind: str, study_dir: str | Path, count: int | None, seed: int,
           policy: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """Export one kind for annotators (``count`` items; the paper's number when None)."""
    if kind not in KINDS:
        raise ValidationInputError(f"unknown validation kind {kind!r}; valid: "
                                   f"{', '.join(KINDS)}")
    count = DEFAULT_COUNTS[kind] if count is None else count
    if kind == "burden":
        return export_burden(study_dir, count, seed)
    if kind == "requests":
        return export_requests(study_dir, count, seed)
    return export_classification(study_dir, count, seed, policy)


def store(kind: str, study_dir: str | Path, paths: Sequence[str | Path]) -> list[Path]:
    """Check label files against the kind's key and keep them in its ``labels/`` folder."""
    from prour.eval.attention.validation_files import store_labels

    folder = kind_dir(study_dir, kind)
    keys = read_key(folder)
    spec = SPECS[kind]
    return store_labels(folder, paths, spec, [k[spec.id_field] for k in keys])


def _waiting(kind: str, title: str, study: Path | None) -> tuple[list[str], dict[str, Any]]:
    """Lines saying what to run when a kind is not exported or not labelled yet."""
    if study is None:
        return [title, "", "Not measured: no study folder was given.", ""], \
            {"status": "no study"}
    folder = kind_dir(study, kind)
    if not (folder / KEY).is_file():
        run = command("prour", "validation", "export", kind, study,
                      "--pairs" if kind != "classification" else "--cases",
                      DEFAULT_COUNTS[kind], "--seed", 0)
        return [title, "", f"Not measured: nothing exported yet. Run `{run}`.", ""], \
            {"status": "not exported", "command": run}
    run = command("prour", "validation", "score", kind, study)
    return [title, "", (f"Not measured: no labels yet. Give annotators "
            f"`{folder / 'to_annotate.jsonl'}` and `instructions.md`, copy each one's answers "
            f"to `{folder / LABELS_DIR}/<annotator>.jsonl`, then run `{run}`."), ""], \
        {"status": "not labelled", "command": run}


def _section(kind: str, title: str, study: str | Path | None, compute: Any, render: Any,
             ) -> tuple[list[str], dict[str, Any]]:
    folder = None if study is None else study_folder(study)
    try:
        found = None if folder is None or not (kind_dir(folder, kind) / KEY).is_file() \
            else compute(folder)
    except ValueError as exc:  # a label file or key that cannot be read: one line
        return [title, "", f"Not measured: {exc}", ""], {"status": "error", "error": str(exc)}
    if found is None:
        return _waiting(kind, title, folder)
    lines, data = render(found)
    return [title, "", *lines, ""], {"status": "scored", **data}


def _json(value: Any) -> Any:
    """Results (intervals included) as JSON-ready data."""
    from prour.eval.markdown import jsonable
    from prour.eval.stats import BootstrapResult

    if isinstance(value, BootstrapResult):
        return interval_json(value)
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return jsonable(value)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    from prour.eval.markdown import table

    return table(header, list(rows))


def table4_section(study: str | Path | None, n_boot: int = DEFAULT_BOOT, seed: int = 0,
                   ci: float = 0.95) -> tuple[list[str], dict[str, Any]]:
    """Table 4 (human burden study) from the study's ``validation/burden/`` files."""

    def render(found: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        cells = {(r["set"], r["question"], r["ranking"]): r for r in found["rows"]}

        def cell(key: tuple[str, str, str]) -> str:
            row = cells[key]
            text = percent_cell(row["agreement"], row.get("note", ""))
            return text if row["agreement"] is None else f"{text} (n={row['answers']})"

        body = []
        for pair_set in PAIR_SETS:
            for ranking in RANKINGS:
                name = (f"{SET_NAMES[pair_set]} ({found['pairs'][pair_set]} pairs)"
                        if ranking == FULL else f"  ↳ {RANKING_NAMES[ranking]}")
                body.append([name, *(cell((pair_set, q, ranking)) for q in QUESTIONS)])
        same = "; ".join(f"{SET_NAMES[s['set']].lower()}, {s['question'].replace('_', ' ')}: "
                         f"{s['same']} of {s['answers']}"
                         + (f" ({100 * s['same'] / s['answers']:.1f}%)" if s["answers"] else "")
                         for s in found["same"])
        lines = [(f"Share (%) of non-tie answers choosing the conversation ranked higher by the "
                 f"full cost or, in ↳ rows, by one score alone (value: Σ (1 − v/10); effort: "
                 f"Σ r/20; question words: words of the discretionary questions); brackets: "
                 f"{100 * ci:g}% pair-bootstrap intervals ({n_boot} draws); n: non-tie answers. "
                 f"Annotators: {', '.join(found['annotators'])}."), "",
                 *_table(["Pairs", "Question burden", "Overall burden"], body), "",
                 f"Answers \"same\": {same}."]
        return lines, _json(found)

    return _section("burden", "## Table 4: human burden study", study,
                    lambda f: burden_agreement(f, n_boot, seed, ci), render)


def table10_section(study: str | Path | None, second_judge: Iterable[Mapping[str, Any]] = (),
                    n_boot: int = DEFAULT_BOOT, seed: int = 0, ci: float = 0.95,
                    ) -> tuple[list[str], dict[str, Any]]:
    """Table 10 (judge versus annotators) from ``validation/requests/``; ``second_judge``:
    second-judge lines beside those the study folder holds."""
    rows = list(second_judge)

    def render(found: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        dims = [found["dimensions"][d] for d in ("readability", "value")]

        def cell(dim: dict[str, Any] | None, name: str, missing: str) -> str:
            return "– (no pairs exported)" if dim is None else \
                percent_cell(dim["results"].get(name), missing)

        body = [["Human–human", *(cell(d, "human", "one annotator") for d in dims)],
                ["Judge–annotator (mean)",
                 *(cell(d, "judge", "no labelled pair") for d in dims)],
                ["Second judge (mean)", *(cell(d, "second", "no second-judge scores")
                                          if d is None or d["second_pairs"] == 0 else
                                          f"{cell(d, 'second', 'no labelled pair')} "
                                          f"(n={d['second_pairs']})" for d in dims)]]
        domains = sorted({x for d in dims if d for x in d["domain_pairs"]})
        for domain in domains:
            body.append([domain, *(
                "–" if d is None or domain not in d["domain_pairs"]
                else f"{cell(d, f'domain:{domain}', 'no labelled pair')} "
                     f"(n={d['domain_pairs'][domain]})" for d in dims)])
        sizes = ", ".join(f"{name} {d['pairs']} pairs on {d['tasks']} tasks"
                          for name, d in zip(("readability", "question value"), dims) if d)
        lines = [(f"Agreement (%) on held-out request pairs ({sizes}); labels A/B/tie, a judge "
                 f"tie when the raw scores differ by at most one point. Judge–annotator rows "
                 f"average over the annotators ({', '.join(found['annotators'])}); domain rows "
                 f"are judge–annotator. Brackets: task-clustered {100 * ci:g}% intervals "
                 f"({n_boot} draws)."), "",
                 *_table(["Comparison", "Readability", "Question value"], body)]
        return lines, _json(found)

    return _section("requests", "## Table 10: judge–annotator agreement", study,
                    lambda f: requests_agreement(f, n_boot, seed, ci, rows), render)


def table11_section(study: str | Path | None, n_boot: int = DEFAULT_BOOT, seed: int = 0,
                    ci: float = 0.95) -> tuple[list[str], dict[str, Any]]:
    """Table 11 (request classification) from ``validation/classification/``."""

    def render(found: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        results = found["results"]
        names = found["annotators"]
        comparisons = [("human", "Human–human"), *((f"A{i}", f"Classifier–A{i}")
                                                    for i in range(1, len(names) + 1)),
                       ("classifier", "Classifier–human")]
        who = ", ".join(f"A{i} = {name}" for i, name in enumerate(names, 1))
        lines = [(f"{found['cases']} cases; annotators {who}. Classifier–human averages the "
                 f"two annotator comparisons (κ too). Brackets: "
                 f"{100 * ci:g}% case-bootstrap intervals ({n_boot} draws), both annotators' "
                 f"labels kept with each case.")]
        for label_set, heading in (("three", "Three labels"),
                                   ("binary", "Discretionary versus non-discretionary")):
            missing = "needs two annotators"
            body = [[name, percent_cell(results.get(f"{label_set}:{key}:agreement"), missing),
                     plain_cell(results.get(f"{label_set}:{key}:kappa"), missing)]
                    for key, name in comparisons]
            lines += ["", f"**{heading}**", "",
                      *_table(["Comparison", "Agreement (%)", "Cohen's κ"], body)]
        return lines, _json(found)

    return _section("classification", "## Table 11: request classification", study,
                    lambda f: classification_agreement(f, n_boot, seed, ci), render)


def table12_section(rows: Iterable[Mapping[str, Any]], n_boot: int = DEFAULT_BOOT,
                    seed: int = 0, ci: float = 0.95, study: str | Path | None = None,
                    ) -> tuple[list[str], dict[str, Any]]:
    """Table 12 (cross-family judge) from second-judge lines."""
    title = "## Table 12: cross-family judge sensitivity"
    found = table12(rows, n_boot, seed, ci)
    if not found["questions"]:
        where = study_folder(study) if study is not None else "STUDY"
        run = command("prour", "validation", "judge", where, "--recipe", "SECOND_JUDGE.yaml",
                      "--questions", 1989, "--seed", 0)
        why = (f"the second judge failed on all {found['failed']} questions"
               if found["failed"] else "no second-judge scores")
        return [title, "", (f"Not measured: {why}. A study's recipe with models.second_judge "
                f"and study.second_judge_sample scores its sample in the step `prour study "
                f"second-judge`; any recipe whose models.judge is the second judge does with "
                f"`{run}`. Only delivered discretionary requests the first judge scored are "
                f"sampled."), ""], \
            {"status": "not run", "failed": found["failed"], "command": run}
    dims = [found["dimensions"][d] for d in ("value", "reading_effort")]
    body = [["Questions", found["questions"], found["questions"]],
            ["Mean, first judge", *(f"{d['mean_first']:.1f}" for d in dims)],
            ["Mean, second judge", *(f"{d['mean_second']:.1f}" for d in dims)],
            ["Rank correlation", *("–" if math.isnan(d["rank_corr"]) else
                                   f"{d['rank_corr']:.2f}" for d in dims)],
            ["Mean abs. difference", *(f"{d['mean_abs_diff']:.1f}" for d in dims)]]
    effects = []
    for effect in found["effects"]:
        if "note" in effect:
            effects.append([effect["contrast"], "–", "–", "–", "–", effect["note"]])
            continue
        got = effect["results"]
        effects.append([effect["contrast"],
                        *(plain_cell(got[f"{j}:{d}"], "undefined", 1)
                          for d in ("value", "reading_effort") for j in ("first", "second")),
                        f"{effect['cells']} cells"])
    lines = [title, "", f"{found['questions']} sampled questions scored by both judges with the "
             "same prompts; scores 0–100 (value × 10, reading effort × 5)"
             + (f"; the second judge failed on {found['failed']} more" if found["failed"]
                else "") + ".", "",
             *_table(["", "Question value", "Reading effort"], body), "",
             (f"Policy effects (points, 0–100), equally weighting backbones and domains; "
             f"brackets: {100 * ci:g}% sampled-question bootstrap intervals ({n_boot} draws)."),
             "", *_table(["Contrast", "Value, first", "Value, second", "Effort, first",
                          "Effort, second", "Note"], effects), ""]
    return lines, {"status": "scored", **_json(found)}

