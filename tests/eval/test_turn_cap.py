"""The turn cap counts steps as tau2 does and cut episodes show in every report (issue 17, item 3).

Airline test task 44 (20 reference actions) is driven by the replay world of ``eval_world``: the
agent replays the reference actions, the scheduled decomposer routes clarify after the agent's
2nd, 4th, 6th and 8th tool result, the generator asks and the user answers. Step counts are
recomputed here from the stored messages alone, as tau2's Orchestrator counts them: every
agent or user message is one step, every batch of tool results answering one message is one
step, the greeting is not counted.
"""

from __future__ import annotations

import pytest
from eval_world import TAU_AU, TAU_EU, counted_steps, replay_llms

from prour.build import Builder
from prour.config import TAU2_MAX_STEPS, Recipe
from prour.config.eval import EvalConfig
from prour.config.router import RouterConfig
from prour.env.trajectory import read_jsonl, read_trajectories
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, Evaluation
from prour.eval.report import write_report

TASK = ("airline", "44")
ASK_AFTER = (2, 4, 6, 8)  # four clarify questions, each costs two steps (question, answer)


def _evaluate(run_dir, methods: list[str], env: dict) -> tuple[list[dict], dict]:
    domain, task_id = TASK
    cfg = EvalConfig(methods=methods, seeds=[0], domains=[domain], tasks=[f"{domain}:{task_id}"],
                     concurrency=1, judge=False)
    router = RouterConfig(n_interpretations=2, n_actions=2, tau_au=TAU_AU, tau_eu=TAU_EU,
                          tool_detail="brief")
    recipe = Recipe(name="turn-cap", env=env, eval=cfg, router=router,
                    train={"rollout": {"max_response_tokens": 64}})
    llms = replay_llms(domain, task_id, ASK_AFTER)
    Evaluation(recipe, run_dir, progress=False, builder=Builder(recipe, llms)).run()
    lines = list(read_jsonl(run_dir / RESULTS_FILE))
    episodes = {t.agent: t for t in read_trajectories(run_dir / EPISODES_FILE)}
    return lines, episodes


def test_airline_44_with_four_questions_scores_one_under_the_default_cap(tmp_path):
    [line], episodes = _evaluate(tmp_path, ["prour"], {})
    messages = episodes["prour"].messages
    calls = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
    asked = [m["content"] for m in messages if m["role"] == "assistant"
             and "Which color would you like" in (m.get("content") or "")]
    assert calls == 20 and len(asked) == 4 and line["steps"]["clarify"] == 4
    # opening + 20 × (call, results) + 4 × (question, answer) + closing + user stop
    assert counted_steps(messages) == 1 + 2 * 20 + 2 * 4 + 1 + 1 == line["tau2_steps"]
    assert line["tau2_steps"] > 30  # the old cap of 30 turns cut this episode at 0
    assert Recipe(name="d").env.max_steps == TAU2_MAX_STEPS
    assert (line["termination"], line["reward"], line["success"]) == ("user_stop", 1.0, True)


def test_tau2_default_cap_is_what_prour_uses():
    from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS

    assert Recipe(name="d").env.max_steps == TAU2_MAX_STEPS == DEFAULT_MAX_STEPS
    assert Recipe(name="d").env.max_errors == DEFAULT_MAX_ERRORS


def _cut_column(markdown: str) -> dict[str, int]:
    section = markdown.split("## Pass@1 (%) and interaction cost")[1].split("\n## ")[0]
    rows = [[c.strip() for c in row.strip("|").split("|")]
            for row in section.splitlines() if row.startswith("| ")]
    header, body = rows[0], rows[2:]
    return {row[0]: int(row[header.index("Cut")]) for row in body}


def test_a_tight_cap_cuts_the_asking_episode_and_the_report_counts_it(tmp_path):
    # prour needs 51 steps, base (no questions) 43: a cap of 45 cuts prour's episode only
    cap = 45
    lines, episodes = _evaluate(tmp_path / "run", ["base", "prour"], {"max_steps": cap})
    by_method = {line["method"]: line for line in lines}
    prour, base = by_method["prour"], by_method["base"]
    assert (prour["termination"], prour["reward"], prour["success"]) == ("max_steps", 0.0, False)
    assert (base["termination"], base["reward"]) == ("user_stop", 1.0)
    # the cut falls on the first turn that reaches the cap, never between a call and its result
    cut_messages = episodes["prour"].messages
    assert cap <= counted_steps(cut_messages) == prour["tau2_steps"] <= cap + 1
    last = cut_messages[-1]
    assert last["role"] == "tool" or not last.get("tool_calls")
    assert counted_steps(episodes["base"].messages) == base["tau2_steps"] == 43
    written = write_report([tmp_path / "run"], tmp_path / "report", n_boot=200)
    shown = _cut_column(written["markdown"].read_text())
    expected = {method: sum(line["termination"] == "max_steps" for line in lines
                            if line["method"] == method) for method in ("base", "prour")}
    assert shown == expected == {"base": 0, "prour": 1}


# Steps after each turn: opening 1; calls 3, 5; question 6, answer 7; calls 9, 11; 12, 13; ...;
# calls 27 .. 49 (after the last question, one call per two steps); closing 50; user stop 51.
@pytest.mark.parametrize("cap, termination, steps", [(30, "max_steps", 31),
                                                     (51, "max_steps", 51),
                                                     (52, "user_stop", 51)])
def test_cut_exactly_when_the_steps_reach_the_cap(tmp_path, cap, termination, steps):
    # a call and its results are one turn (30 is passed at 31); as in tau2, the cap is also
    # checked after the user's stop, so 51 steps under a cap of 51 end as cut
    [line], episodes = _evaluate(tmp_path, ["prour"], {"max_steps": cap})
    assert (line["termination"], line["tau2_steps"]) == (termination, steps)
    assert counted_steps(episodes["prour"].messages) == steps
