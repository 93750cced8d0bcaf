"""The validation tools of an Ask-Less study (Tables 4, 10, 11, 12) on synthetic study folders:
exports, hand-made annotator labels, agreement and κ checked against hand counts."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.env.trajectory import StepRecord, Trajectory
from prour.eval.attention import validation as v
from prour.eval.attention.validation_requests import judge_answer
from prour.eval.attention.validation_stats import (
    agreement,
    cohen_kappa,
    label_codes,
    spearman,
    weighted_bootstrap,
)
from prour.files import append_jsonl
from prour.llm.scripted import ScriptedLLM, register_script
from prour.rewards.judge import RequestJudge

WEIGHTS = {"message": 1, "atomic": 1, "effort": 1, "avoidability": 1}
LONG_Q = ("Could you tell me which of your two orders, and which of the items in it, you would "
          "like to exchange today?")  # 22 words
SHORT_Q = "Which order?"
runner = CliRunner()


# ---- synthetic study folders ----------------------------------------------------------------


def conversation(domain: str, task: str, variant: str, backbone: str,
                 turns: list[tuple[str, str, float | None, float | None]], seed: int = 0,
                 ) -> tuple[dict[str, Any], Trajectory]:
    """A result line and its episode: each turn (label, text, r, v) is an agent message the
    gate delivered, answered by the user; answers are not listed as requests."""
    agent = f"{variant}/{backbone}"
    messages = [{"role": "system", "content": "secret policy"},
                {"role": "user", "content": f"Hello, I need help with {task}."}]
    steps = [StepRecord(kind="user_message", message_index=1)]
    requests = []
    for label, text, effort, value in turns:
        index = len(messages)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Sure."}]
        steps += [StepRecord(kind="agent_message", message_index=index,
                             meta={"attention": {"delivered": True, "label": label,
                                                 "fallback": False}}),
                  StepRecord(kind="user_message", message_index=index + 1)]
        if label != "answer":
            requests.append({"discretionary": label == "discretionary", "label": label,
                             "atomic_questions": 1, "reading_effort": effort, "value": value,
                             "fallback": False, "judge_error": None, "text": text,
                             "message_index": index})
    line = {"key": [domain, task, seed, agent], "method": "base", "variant": variant,
            "axes": {"backbone": backbone}, "domain": domain, "task_id": task, "seed": seed,
            "score": 1.0, "error": False, "termination": "user_stop",
            "attention": {"policy": variant.split("@")[0], "accounting": "full", "lam": 0.03,
                          "weights": WEIGHTS, "requests": requests,
                          "discretionary": sum(r["discretionary"] for r in requests),
                          "fallbacks": 0}}
    trajectory = Trajectory(domain=domain, task_id=task, seed=seed, agent=agent, user="user",
                            messages=messages, steps=steps)
    return line, trajectory


def write_study(folder: Path, conversations: list[tuple[dict[str, Any], Trajectory]]) -> Path:
    for line, trajectory in conversations:
        append_jsonl(folder / "results.jsonl", line)
        append_jsonl(folder / "episodes.jsonl", trajectory)
    return folder


def write_labels(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def invoke(*args: Any) -> Any:
    return runner.invoke(app, [str(a) for a in args])


# ---- pure statistics ------------------------------------------------------------------------


def test_agreement_and_kappa_by_hand() -> None:
    classifier = ["d", "d", "d", "d", "r", "r", "r", "a", "a", "a"]
    human = ["d", "d", "d", "r", "r", "r", "a", "a", "a", "d"]
    c, h = label_codes(classifier, "ard"), label_codes(human, "ard")
    # disagreements at cases 3, 6, 9: 7 of 10
    assert agreement(c, h)[0] == pytest.approx(0.7)
    # shares: classifier d .4 r .3 a .3; human d .4 r .3 a .3 -> p_e = .16 + .09 + .09 = .34
    assert cohen_kappa(c, h, 3)[0] == pytest.approx((0.7 - 0.34) / (1 - 0.34))
    # discretionary versus not: disagreements at cases 3 and 9; p_e = .4·.4 + .6·.6 = .52
    cb, hb = (c == 2).astype(int), (h == 2).astype(int)
    assert agreement(cb, hb)[0] == pytest.approx(0.8)
    assert cohen_kappa(cb, hb, 2)[0] == pytest.approx((0.8 - 0.52) / 0.48)
    # a missing label (-1) leaves the case out of that comparison: 7 of 9
    h_missing = h.copy()
    h_missing[0] = -1
    assert agreement(c, h_missing)[0] == pytest.approx(6 / 9)
    # weights count a case as often as it is drawn: case 3 (a disagreement) twice, case 0 never
    w = np.ones(10)
    w[0], w[3] = 0, 2
    assert agreement(c, h, w[None, :])[0] == pytest.approx(6 / 10)
    # both raters constant and equal: p_e = 1, κ undefined
    assert math.isnan(cohen_kappa(np.zeros(4, int), np.zeros(4, int), 2)[0])


def test_spearman_with_ties_by_hand() -> None:
    # ranks of y = [5, 6, 7, 8, 7]: 1, 2, 3.5, 5, 3.5; deviations from 3: -2, -1, .5, 2, .5
    covariance = (-2) * (-2) + (-1) * (-1) + 0 * 0.5 + 1 * 2 + 2 * 0.5  # = 8
    expected = covariance / math.sqrt(10 * (4 + 1 + 0.25 + 4 + 0.25))
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(expected)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_task_clustered_bootstrap_keeps_a_tasks_pairs_together() -> None:
    # 10 tasks of 4 pairs: the annotator agrees with the judge on every pair of tasks 0-4 and on
    # none of tasks 5-9, so pairs of one task are not independent evidence
    tasks = [t for t in range(10) for _ in range(4)]
    judge = np.zeros(40, dtype=int)
    rater = np.array([0 if t < 5 else 1 for t in tasks])

    def statistics(w: np.ndarray) -> dict[str, np.ndarray]:
        spread = np.stack([np.ptp(w[:, [i for i, t in enumerate(tasks) if t == task]], axis=1)
                           for task in range(10)]).max(axis=0)
        return {"agreement": agreement(judge, rater, w), "spread": spread}

    clustered = weighted_bootstrap(statistics, tasks, 2000, 0)
    by_pair = weighted_bootstrap(statistics, range(40), 2000, 0)
    assert clustered["agreement"].estimate == by_pair["agreement"].estimate == 0.5
    assert clustered["spread"].high == 0  # every pair of a drawn task drawn as often
    assert by_pair["spread"].high > 0
    width = {name: r["agreement"].high - r["agreement"].low
             for name, r in (("clustered", clustered), ("pair", by_pair))}
    # 10 independent units instead of 40: the interval is about twice as wide
    assert width["clustered"] > 1.6 * width["pair"]


def test_judge_ties_when_raw_scores_differ_by_at_most_one_point() -> None:
    assert judge_answer("readability", {"reading_effort": 5}, {"reading_effort": 6}) == "tie"
    assert judge_answer("readability", {"reading_effort": 5}, {"reading_effort": 7}) == "a"
    assert judge_answer("readability", {"reading_effort": 9}, {"reading_effort": 7}) == "b"
    assert judge_answer("value", {"value": 7}, {"value": 8}) == "tie"
    assert judge_answer("value", {"value": 9}, {"value": 7}) == "a"
    assert judge_answer("value", {"value": 2}, {"value": 7}) == "b"
    assert judge_answer("value", {"value": None}, {"value": 7}) is None


# ---- Table 4: burden pairs ------------------------------------------------------------------


@pytest.fixture
def burden_study(tmp_path: Path) -> Path:
    """Two retail tasks; on each, Budgeted asks one long question (r 16, v 9: cost 1.9),
    Budgeted + MGR one short one (r 0, v 2: cost 1.8), Unrestricted two (cost 3.4), No-ask none."""
    convs = []
    for task in ("t1", "t2"):
        convs += [
            conversation("retail", task, "budgeted@1", "m1",
                         [("discretionary", LONG_Q, 16, 9), ("answer", "Done.", None, None)]),
            conversation("retail", task, "budgeted+mgr@1", "m1",
                         [("discretionary", SHORT_Q, 0, 2), ("answer", "Done.", None, None)]),
            conversation("retail", task, "unrestricted", "m2",
                         [("discretionary", "Shall I also check your address?", 4, 5),
                          ("discretionary", "Shall I also check your email?", 4, 5)]),
            conversation("retail", task, "no-ask", "m2", [("answer", "Done.", None, None)])]
    return write_study(tmp_path / "study", convs)


def _burden_labels(keys: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """ann1: question burden = the full cost's choice, overall always same; ann2: on equal
    pairs the value-alone choice for questions (same on the first) and the full cost's choice
    overall; on different pairs the full cost's choice for questions, the other overall."""
    first_equal = next(k["pair_id"] for k in keys if k["set"] == "equal")
    ann1, ann2 = [], []
    for k in keys:
        full = k["higher"]["full"]
        other = "b" if full == "a" else "a"
        ann1.append({"pair_id": k["pair_id"], "question_burden": full.upper(),
                     "overall_burden": "same"})
        if k["set"] == "equal":
            question = "same" if k["pair_id"] == first_equal else k["higher"]["value"].upper()
            ann2.append({"pair_id": k["pair_id"], "question_burden": question,
                         "overall_burden": full})
        else:
            ann2.append({"pair_id": k["pair_id"], "question_burden": full,
                         "overall_burden": other.upper(), "comment": "ignored"})
    return ann1, ann2


def test_burden_export_is_blinded_and_ranks_by_each_score(burden_study: Path) -> None:
    result = invoke("validation", "export", "burden", burden_study, "--pairs", 2, "--seed", 3)
    assert result.exit_code == 0, result.output
    folder = burden_study / "validation" / "burden"
    shown, keys = read(folder / "to_annotate.jsonl"), read(folder / "key.jsonl")
    assert sorted(k["set"] for k in keys) == ["different", "different", "equal", "equal"]
    for row in shown:
        assert set(row) == {"pair_id", "conversation_a", "conversation_b"}
        text = row["conversation_a"] + row["conversation_b"]
        for hidden in ("budgeted", "unrestricted", "m1", "m2", "secret policy"):
            assert hidden not in text
    for k in keys:
        if k["set"] == "equal":  # Budgeted against Budgeted + MGR on one task
            side = {k[s]["variant"]: s for s in ("a", "b")}
            long, short = side["budgeted@1"], side["budgeted+mgr@1"]
            assert k[long]["cost"] == pytest.approx(1 + 16 / 20 + (1 - 0.9))
            assert k[short]["cost"] == pytest.approx(1 + 0 + (1 - 0.2))
            assert k["higher"] == {"full": long, "value": short, "effort": long, "words": long}
            assert (k[long]["words"], k[short]["words"]) == (22, 2)
        else:
            assert "unrestricted" in {k["a"]["variant"], k["b"]["variant"]}
            assert {k["a"]["requests"], k["b"]["requests"]} == {1, 2}
    again = tuple((burden_study / "validation" / "burden" / n).read_text()
                  for n in ("to_annotate.jsonl", "key.jsonl"))
    assert invoke("validation", "export", "burden", burden_study, "--pairs", 2, "--seed",
                  3).exit_code == 0
    assert again == tuple((folder / n).read_text() for n in ("to_annotate.jsonl", "key.jsonl"))


def test_burden_agreement_by_hand_and_the_reexport_refusal(burden_study: Path,
                                                           tmp_path: Path) -> None:
    assert invoke("validation", "export", "burden", burden_study, "--pairs", 2).exit_code == 0
    folder = burden_study / "validation" / "burden"
    keys = read(folder / "key.jsonl")
    ann1, ann2 = _burden_labels(keys)
    scored = invoke("validation", "score", "burden", burden_study,
                    "--labels", write_labels(tmp_path / "ann1.jsonl", ann1),
                    "--labels", write_labels(tmp_path / "ann2.jsonl", ann2), "--n-boot", 500)
    assert scored.exit_code == 0, scored.output
    assert "Table 4" in scored.output and "Equal counts (2 pairs)" in scored.output
    assert sorted(p.name for p in (folder / "labels").iterdir()) == ["ann1.jsonl", "ann2.jsonl"]

    _, data = v.table4_section(burden_study, n_boot=500)
    cell = {(r["set"], r["question"], r["ranking"]): r for r in data["rows"]}

    def estimate(*key: str) -> float:
        return cell[key]["agreement"]["estimate"]

    # equal pairs, question burden: ann1 agrees with the full cost on 2 of 2, ann2 answered
    # "same" once and chose the other conversation once: 2 of 3
    assert estimate("equal", "question_burden", "full") == pytest.approx(2 / 3)
    assert estimate("equal", "question_burden", "value") == pytest.approx(1 / 3)
    assert estimate("equal", "question_burden", "effort") == pytest.approx(2 / 3)
    assert estimate("equal", "question_burden", "words") == pytest.approx(2 / 3)
    # overall: ann1 always "same"; ann2 follows the full cost on both pairs
    assert estimate("equal", "overall_burden", "full") == 1.0
    assert estimate("equal", "overall_burden", "value") == 0.0
    assert cell["equal", "overall_burden", "full"]["answers"] == 2
    # different pairs: count by hand from the key (every answer for questions follows full)
    diff = [k for k in keys if k["set"] == "different"]
    for ranking in ("full", "value", "effort", "words"):
        ranked = [k for k in diff if k["higher"][ranking]]
        hits = sum(2 * (k["higher"][ranking] == k["higher"]["full"]) for k in ranked)
        if ranked:
            assert estimate("different", "question_burden", ranking) == \
                pytest.approx(hits / (2 * len(ranked)))
        overall = sum(k["higher"][ranking] != k["higher"]["full"] for k in ranked)
        if ranked:
            assert estimate("different", "overall_burden", ranking) == \
                pytest.approx(overall / len(ranked))
    assert estimate("different", "question_burden", "full") == 1.0
    for row in data["rows"]:
        if row["agreement"]:
            assert row["agreement"]["low"] <= row["agreement"]["estimate"] \
                <= row["agreement"]["high"]
    same = {(s["set"], s["question"]): (s["same"], s["answers"]) for s in data["same"]}
    assert same == {("equal", "question_burden"): (1, 4), ("equal", "overall_burden"): (2, 4),
                    ("different", "question_burden"): (0, 4),
                    ("different", "overall_burden"): (2, 4)}

    before = (folder / "to_annotate.jsonl").read_text()
    refused = invoke("validation", "export", "burden", burden_study, "--pairs", 1)
    assert refused.exit_code == 2
    assert "already holds annotators' labels" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert (folder / "to_annotate.jsonl").read_text() == before


def test_bad_or_unknown_labels_are_refused_with_file_and_line(burden_study: Path,
                                                              tmp_path: Path) -> None:
    assert invoke("validation", "export", "burden", burden_study, "--pairs", 2).exit_code == 0
    bad = write_labels(tmp_path / "bad.jsonl", [
        {"pair_id": "pair-0000", "question_burden": "A", "overall_burden": "B"},
        {"pair_id": "pair-0001", "question_burden": "maybe", "overall_burden": "A"}])
    result = invoke("validation", "score", "burden", burden_study, "--labels", bad)
    assert result.exit_code == 2
    assert f"{bad}:2: question_burden='maybe' must be one of a, b, same" in result.output
    unknown = write_labels(tmp_path / "unknown.jsonl", [
        {"pair_id": "pair-9999", "question_burden": "A", "overall_burden": "B"}])
    result = invoke("validation", "score", "burden", burden_study, "--labels", unknown)
    assert result.exit_code == 2 and f"{unknown}:1: unknown pair_id 'pair-9999'" in result.output
    twice = write_labels(tmp_path / "twice.jsonl", [
        {"pair_id": "pair-0000", "question_burden": "A", "overall_burden": "B"}] * 2)
    assert "labelled twice" in invoke("validation", "score", "burden", burden_study,
                                      "--labels", twice).output
    assert not list((burden_study / "validation" / "burden" / "labels").iterdir())
    # nothing stored, nothing measured: the score command says so and fails
    result = invoke("validation", "score", "burden", burden_study)
    assert result.exit_code == 1 and "no labels yet" in result.output


def test_sections_print_commands_that_run_as_printed(burden_study: Path,
                                                     tmp_path: Path) -> None:
    lines, data = v.table4_section(burden_study)
    assert data["status"] == "not exported" and "Not measured" in "\n".join(lines)
    assert "%" not in "\n".join(lines)  # no agreement printed that was not measured
    words = shlex.split(data["command"])
    assert words[:3] == ["prour", "validation", "export"]
    assert invoke(*words[1:]).exit_code == 0
    lines, data = v.table4_section(burden_study)
    assert data["status"] == "not labelled"
    keys = read(burden_study / "validation" / "burden" / "key.jsonl")
    ann1, _ = _burden_labels(keys)
    write_labels(burden_study / "validation" / "burden" / "labels" / "ann1.jsonl", ann1)
    result = invoke(*shlex.split(data["command"])[1:])
    assert result.exit_code == 0, result.output
    assert "Table 4" in result.output
    for section in (v.table10_section, v.table11_section):
        lines, data = section(burden_study)
        assert data["status"] == "not exported" and data["command"] in "\n".join(lines)
    lines, data = v.table4_section(None)
    assert data["status"] == "no study"


# ---- Table 10: judge against annotators -----------------------------------------------------


@pytest.fixture
def request_study(tmp_path: Path) -> Path:
    """Four tasks (two retail, two airline), two conversations each, two judged questions in
    each conversation, with distinct texts and spread scores."""
    scores = [(2, 9), (3, 8), (8, 3), (14, 6)]
    convs = []
    for domain, task in (("retail", "r1"), ("retail", "r2"), ("airline", "a1"),
                         ("airline", "a2")):
        for n, (variant, backbone) in enumerate((("budgeted@1", "m1"),
                                                 ("budgeted+mgr@1", "m2"))):
            turns = [("discretionary", f"Question {k} number {n} on {task}?",
                      *scores[2 * n + k]) for k in range(2)]
            convs.append(conversation(domain, task, variant, backbone,
                                      [("required", "Your zip code, please?", 1, 8), *turns]))
    return write_study(tmp_path / "study", convs)


def test_table10_agreement_by_hand(request_study: Path, tmp_path: Path) -> None:
    result = invoke("validation", "export", "requests", request_study, "--pairs", 6)
    assert result.exit_code == 0, result.output
    folder = request_study / "validation" / "requests"
    shown, keys = read(folder / "to_annotate.jsonl"), read(folder / "key.jsonl")
    assert {k["dimension"] for k in keys} == {"readability", "value"}
    assert sum(k["dimension"] == "value" for k in keys) == 6
    for row, k in zip(shown, keys):
        assert "budgeted" not in json.dumps({x: y for x, y in row.items()
                                             if x not in ("request_a", "request_b")})
        assert "Your zip code" in row["context_a"]  # the conversation before the request
        name = "reading_effort" if k["dimension"] == "readability" else "value"
        gap = k["a"][name] - k["b"][name]
        better = gap < 0 if name == "reading_effort" else gap > 0
        assert k["judge"] == ("tie" if abs(gap) <= 1 else "a" if better else "b")
    # ann1 labels as the judge; ann2 as the judge on the even pairs of each dimension
    flip = {"a": "B", "b": "tie", "tie": "A"}
    ann1 = [{"pair_id": k["pair_id"], "label": k["judge"].upper()} for k in keys]
    ann2 = [{"pair_id": k["pair_id"], "label": k["judge"] if int(k["pair_id"][-3:]) % 2 == 0
             else flip[k["judge"]]} for k in keys]
    # a second judge: the first judge's reading effort, the value mirrored (10 - v)
    for k in keys:
        for side in ("a", "b"):
            append_jsonl(request_study / "second_judge.jsonl", {
                "id": k[side]["id"], "first": {}, "error": None,
                "second": {"reading_effort": k[side]["reading_effort"],
                           "value": 10 - k[side]["value"]}})
    scored = invoke("validation", "score", "requests", request_study, "--n-boot", 300,
                    "--labels", write_labels(tmp_path / "ann1.jsonl", ann1),
                    "--labels", write_labels(tmp_path / "ann2.jsonl", ann2))
    assert scored.exit_code == 0, scored.output
    _, data = v.table10_section(request_study, n_boot=300)
    for dimension in ("readability", "value"):
        members = [k for k in keys if k["dimension"] == dimension]
        n = len(members)
        agree2 = sum(int(k["pair_id"][-3:]) % 2 == 0 for k in members)
        got = data["dimensions"][dimension]
        assert got["pairs"] == n
        assert got["results"]["judge"]["estimate"] == pytest.approx((1 + agree2 / n) / 2)
        assert got["results"]["human"]["estimate"] == pytest.approx(agree2 / n)
        mirrored = {"a": "b", "b": "a", "tie": "tie"}
        second = [k["judge"] if dimension == "readability" else mirrored[k["judge"]]
                  for k in members]
        labels2 = {r["pair_id"]: r["label"].lower() for r in ann2}
        expected = np.mean([np.mean([s == k["judge"] for s, k in zip(second, members)]),
                            np.mean([s == labels2[k["pair_id"]]
                                     for s, k in zip(second, members)])])
        assert got["results"]["second"]["estimate"] == pytest.approx(expected)
        for domain in ("retail", "airline"):
            part = [k for k in members if k["domain"] == domain]
            if part:
                hits = sum(int(k["pair_id"][-3:]) % 2 == 0 for k in part)
                assert got["results"][f"domain:{domain}"]["estimate"] == \
                    pytest.approx((1 + hits / len(part)) / 2)
                assert got["domain_pairs"][domain] == len(part)


# ---- Table 11: request classification -------------------------------------------------------


@pytest.fixture
def class_study(tmp_path: Path) -> Path:
    convs = [conversation("retail", f"c{t}", "budgeted@2", "m1", [
        ("answer", f"Your order {t} has shipped.", None, None),
        ("required", f"Please confirm your name and zip code for case {t}.", 2, 8),
        ("discretionary", f"Would you prefer a refund or an exchange for case {t}?", 4, 6)])
        for t in range(4)]
    return write_study(tmp_path / "study", convs)


def _kappa(x: list[str], y: list[str]) -> float:
    """κ = (p_o − p_e) / (1 − p_e), written out over the labels used."""
    n = len(x)
    p_o = sum(a == b for a, b in zip(x, y)) / n
    p_e = sum((x.count(k) / n) * (y.count(k) / n) for k in set(x) | set(y))
    return (p_o - p_e) / (1 - p_e)


def test_table11_agreement_and_kappa_by_hand(class_study: Path, tmp_path: Path) -> None:
    result = invoke("validation", "export", "classification", class_study, "--cases", 10,
                    "--seed", 1)
    assert result.exit_code == 0, result.output
    assert "4 answer, 3 required, 3 discretionary" in result.output
    folder = class_study / "validation" / "classification"
    shown, keys = read(folder / "to_annotate.jsonl"), read(folder / "key.jsonl")
    assert len(keys) == 10 and set(shown[0]) == {"case_id", "domain", "context", "message"}
    classifier = [k["classifier"] for k in keys]
    # A1 changes the first discretionary case to required and the first answer to
    # discretionary; A2 calls the first required case "inform" (an answer)
    a1, a2 = list(classifier), list(classifier)
    a1[classifier.index("discretionary")] = "required"
    a1[classifier.index("answer")] = "discretionary"
    a2[classifier.index("required")] = "answer"
    labels = [write_labels(tmp_path / f"{name}.jsonl", [
        {"case_id": k["case_id"], "label": "inform" if name == "a2" and x == "answer"
         and k["classifier"] == "required" else x} for k, x in zip(keys, given)])
        for name, given in (("a1", a1), ("a2", a2))]
    scored = invoke("validation", "score", "classification", class_study, "--n-boot", 300,
                    "--labels", labels[0], "--labels", labels[1])
    assert scored.exit_code == 0, scored.output
    assert "Three labels" in scored.output and "Cohen's κ" in scored.output
    _, data = v.table11_section(class_study, n_boot=300)
    got = {k: r["estimate"] for k, r in data["results"].items()}
    assert got["three:human:agreement"] == pytest.approx(7 / 10)  # 2 + 1 changed cases
    assert got["three:A1:agreement"] == pytest.approx(8 / 10)
    assert got["three:A2:agreement"] == pytest.approx(9 / 10)
    assert got["three:classifier:agreement"] == pytest.approx(0.85)
    assert got["three:human:kappa"] == pytest.approx(_kappa(a1, a2))
    assert got["three:classifier:kappa"] == pytest.approx(
        (_kappa(classifier, a1) + _kappa(classifier, a2)) / 2)
    disc = [[x == "discretionary" for x in labs] for labs in (classifier, a1, a2)]
    assert got["binary:A1:agreement"] == pytest.approx(8 / 10)
    assert got["binary:A2:agreement"] == 1.0
    assert got["binary:human:kappa"] == pytest.approx(_kappa(disc[1], disc[2]))
    assert got["binary:classifier:kappa"] == pytest.approx(
        (_kappa(disc[0], disc[1]) + _kappa(disc[0], disc[2])) / 2)
    assert data["results"]["three:human:agreement"]["n_boot"] == 300


# ---- Table 12: the second judge -------------------------------------------------------------


def _scripted_judge() -> ScriptedLLM:
    """Every rating 3 (r = 10) and value 6, except an unparsable reply for "FAIL" requests."""

    def reply(messages: list[dict[str, Any]]) -> str:
        if "FAIL" in messages[-1]["content"].split("[Request to judge]")[-1]:
            return "not json"
        ratings = dict.fromkeys(("goal_clarity", "single_ask", "answer_effort", "actionability",
                                 "conciseness"), 3)
        criteria = dict.fromkeys(("needed", "not_in_context", "not_lookup", "precise"), True)
        return json.dumps({**ratings, **criteria, "value": 6})

    return ScriptedLLM(rules=[(r"\[Request to judge\]", reply)])


def test_second_judge_scores_once_and_resumes(request_study: Path) -> None:
    study = v.load_study(request_study)
    sample = v.study_questions(study, 5, seed=2)
    assert len(sample) == 5 and [q["id"] for q in sample] == sorted(q["id"] for q in sample)
    assert all("Your zip code" in q["context"] and q["text"].startswith("Question")
               for q in sample)  # discretionary only, with the judge's context
    assert v.sample_questions(study.lines, 5, 2)[0]["id"] == sample[0]["id"]
    sample[1]["text"] += " FAIL"
    out = request_study / "second_judge.jsonl"
    llm = _scripted_judge()
    counts = v.score_second_judge(sample, RequestJudge(llm, 1), out, "judge-2")
    assert counts == {"scored": 4, "failed": 1, "skipped": 0}
    rows = read(out)
    failed = [r for r in rows if r["second"] is None]
    assert len(failed) == 1 and failed[0]["error"] and failed[0]["id"] == sample[1]["id"]
    assert all(r["second"] == {"reading_effort": 10.0, "value": 6.0}
               for r in rows if r["second"])
    # a second call asks only for the failed question; a third scores nothing new
    sample[1]["text"] = sample[1]["text"].replace(" FAIL", "")
    again = _scripted_judge()
    assert v.score_second_judge(sample, RequestJudge(again, 1), out) == \
        {"scored": 1, "failed": 0, "skipped": 4}
    assert again.calls["chat_requests"] == 1
    idle = _scripted_judge()
    assert v.score_second_judge(sample, RequestJudge(idle, 1), out) == \
        {"scored": 0, "failed": 0, "skipped": 5}
    assert idle.calls["chat"] == 0 and len(read(out)) == 6
    assert v.table12(read(out), n_boot=50)["questions"] == 5
    with pytest.raises(v.ValidationInputError, match="outside this sample"):
        v.score_second_judge(v.study_questions(study, 2, seed=9), RequestJudge(idle, 1), out)


def _row(backbone: str, variant: str, first: tuple[float, float],
         second: tuple[float, float] | None) -> dict[str, Any]:
    return {"id": f"{backbone}-{variant}-{first}-{second}", "backbone": backbone,
            "domain": "retail", "variant": variant,
            "first": {"reading_effort": first[0], "value": first[1]},
            "second": None if second is None else {"reading_effort": second[0],
                                                   "value": second[1]},
            "error": None if second else "judge failed"}


def test_table12_by_hand() -> None:
    rows = [_row("X", "budgeted@1", (2, 6), (4, 5)), _row("X", "budgeted@1", (4, 8), (4, 7)),
            _row("X", "budgeted+mgr@1", (6, 9), (8, 7)), _row("Y", "budgeted@1", (8, 5), (8, 4)),
            _row("Y", "budgeted+mgr@1", (10, 5), (14, 6)),
            _row("Y", "budgeted+mgr@1", (12, 7), (12, 8)), _row("Y", "budgeted@1", (1, 1), None)]
    found = v.table12(rows, n_boot=400, seed=0)
    assert found["questions"] == 6 and found["failed"] == 1
    value, effort = found["dimensions"]["value"], found["dimensions"]["reading_effort"]
    assert value["mean_first"] == pytest.approx(10 * 40 / 6)
    assert value["mean_second"] == pytest.approx(10 * 37 / 6)
    assert value["mean_abs_diff"] == pytest.approx(10 * 7 / 6)  # |1|,1,2,1,1,1
    assert effort["mean_first"] == pytest.approx(5 * 42 / 6)
    assert effort["mean_second"] == pytest.approx(5 * 50 / 6)
    assert effort["mean_abs_diff"] == pytest.approx(5 * 8 / 6)  # 2,0,2,0,4,0
    # second-judge efforts 4, 4, 8, 8, 14, 12 rank 1.5, 1.5, 3.5, 3.5, 6, 5 against 1..6
    assert effort["rank_corr"] == pytest.approx(
        np.corrcoef([1, 2, 3, 4, 5, 6], [1.5, 1.5, 3.5, 3.5, 6, 5])[0, 1])
    effects = {e["contrast"]: e for e in found["effects"]}
    mgr = effects["Budgeted + MGR − Budgeted"]
    assert mgr["cells"] == 2
    # first judge: X 9 − (6 + 8)/2 = 2, Y (5 + 7)/2 − 5 = 1 -> 1.5 points -> 15 on 0-100
    assert mgr["results"]["first:value"].estimate == pytest.approx(15.0)
    # second judge: X 7 − 6 = 1, Y 7 − 4 = 3 -> 2 -> 20
    assert mgr["results"]["second:value"].estimate == pytest.approx(20.0)
    # effort, first: X 6 − 3 = 3, Y 11 − 8 = 3 -> 3 × 5 = 15
    assert mgr["results"]["first:reading_effort"].estimate == pytest.approx(15.0)
    assert mgr["results"]["first:value"].low <= 15.0 <= mgr["results"]["first:value"].high
    assert "no backbone and domain" in effects["Budgeted − Unrestricted"]["note"]
    lines, data = v.table12_section(rows, n_boot=400)
    text = "\n".join(lines)
    assert "| Mean, first judge | 66.7 | 35.0 |" in text and data["status"] == "scored"
    lines, data = v.table12_section([], study=Path("/some/study"))
    assert data["status"] == "not run" and "prour validation judge /some/study" in lines[2]


def test_second_judge_command_through_the_cli(request_study: Path, tmp_path: Path) -> None:
    register_script("validation-second-judge", _scripted_judge)
    recipe = tmp_path / "second.yaml"
    recipe.write_text("name: second\nmodels:\n  judge:\n    backend: scripted\n"
                      "    script: validation-second-judge\n")
    assert invoke("validation", "export", "requests", request_study, "--pairs", 2).exit_code == 0
    first = invoke("validation", "judge", request_study, "--recipe", recipe, "--questions", 4)
    assert first.exit_code == 0, first.output
    assert "sample: 4 scored, 0 failed, 0 already scored" in first.output
    assert "Table 10 requests:" in first.output
    assert (request_study / "validation" / "requests" / "second_judge.jsonl").is_file()
    second = invoke("validation", "judge", request_study, "--recipe", recipe, "--questions", 4)
    assert "sample: 0 scored, 0 failed, 4 already scored" in second.output
    assert len(read(request_study / "second_judge.jsonl")) == 4
    table = invoke("validation", "table12", request_study, "--n-boot", 100)
    assert table.exit_code == 0 and "| Questions | 4 | 4 |" in table.output


def test_one_annotator_gives_no_human_agreement_and_three_are_refused(class_study: Path,
                                                                      tmp_path: Path) -> None:
    assert invoke("validation", "export", "classification", class_study, "-n", 6).exit_code == 0
    keys = read(class_study / "validation" / "classification" / "key.jsonl")
    same = [{"case_id": k["case_id"], "label": k["classifier"]} for k in keys]
    only = invoke("validation", "score", "classification", class_study, "--n-boot", 100,
                  "--labels", write_labels(tmp_path / "solo.jsonl", same))
    assert only.exit_code == 0, only.output
    assert "| Human–human | – (needs two annotators) | – (needs two annotators) |" in only.output
    assert "| Classifier–A1 | 100.0 [100.0, 100.0] |" in only.output
    _, data = v.table11_section(class_study, n_boot=100)
    assert "three:human:agreement" not in data["results"]
    for name in ("second", "third"):
        write_labels(class_study / "validation" / "classification" / "labels" / f"{name}.jsonl",
                     same)
    lines, data = v.table11_section(class_study, n_boot=100)
    assert data["status"] == "error" and "Table 11 compares two" in data["error"]
    assert "%" not in "\n".join(lines).replace("(%)", "")


def test_an_export_with_nothing_to_pair_is_refused(tmp_path: Path) -> None:
    study = write_study(tmp_path / "study", [
        conversation("retail", "t1", "no-ask", "m1", [("answer", "Done.", None, None)])])
    for kind in ("burden", "requests"):
        result = invoke("validation", "export", kind, study)
        assert result.exit_code == 2 and "no pair to export" in result.output
    assert not (study / "validation" / "burden" / "key.jsonl").exists()


def test_pairs_of_a_large_study_are_sampled_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    from prour.eval.attention import analysis
    from prour.eval.attention.analysis import ConversationRecord, count_pairs, sample_count_pairs

    def record(task: str, k: int, questions: int) -> ConversationRecord:
        requests = [{"discretionary": True, "atomic_questions": 1, "reading_effort": k % 7,
                     "value": k % 5, "fallback": False} for _ in range(questions)]
        return ConversationRecord("budgeted@1", f"m{k}", "retail", task, 0, 1.0, requests)

    records = [record(task, k, 1 + k % 3) for task in ("t1", "t2") for k in range(12)]
    records.append(record("t3", 0, 0))  # asks nothing: never paired
    for equal in (True, False):
        listed = set(count_pairs(records, "full", equal=equal))
        assert all(records[i].task_id == records[j].task_id for i, j in listed)
        monkeypatch.setattr(analysis, "ENUMERATE_LIMIT", 0)  # force the sampling branch
        drawn, possible = sample_count_pairs(records, 15, np.random.default_rng(4), "full",
                                             equal=equal)
        assert possible >= len(listed) and len(drawn) == 15
        unordered = {tuple(sorted(p)) for p in drawn}
        assert len(unordered) == 15 and unordered <= listed  # valid, no repeats
        monkeypatch.undo()
        again, _ = sample_count_pairs(records, 15, np.random.default_rng(4), "full",
                                      equal=equal)
        assert {tuple(sorted(p)) for p in again} <= listed
