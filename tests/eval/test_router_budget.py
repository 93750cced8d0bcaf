"""Decomposer budget and invocation frequency (paper A.2.3) end to end, on real tau2 tasks.

The replay world of ``eval_world`` drives ``prour eval`` on retail test task 55 (13 reference
actions) and airline test task 44 (20): the agent replays the reference actions, and the
scheduled decomposer routes clarify whenever it runs right after a tool result (so every run of
the decomposer after the first call can put a question to the user). Everything expected is
recomputed from the stored episodes (episodes.jsonl): which agent decisions ran the decomposer,
how often the scripted decomposer model was called, and what results.jsonl and the report say.
"""

from __future__ import annotations

import pytest
from eval_world import TAU_AU, TAU_EU, replay_llms

from prour.build import Builder
from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.config.router import RouterConfig
from prour.env.trajectory import read_jsonl, read_trajectories
from prour.eval.agent import is_agent_turn
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, Evaluation
from prour.eval.report import write_report

TASKS = [("retail", "55"), ("airline", "44")]
ASK_ALWAYS = tuple(range(1, 64))  # the decomposer routes clarify after any tool result


def _evaluate(run_dir, domain: str, task_id: str, **router: object):
    cfg = EvalConfig(methods=["prour"], seeds=[0], domains=[domain],
                     tasks=[f"{domain}:{task_id}"], concurrency=1, judge=False)
    router_cfg = RouterConfig(n_interpretations=2, n_actions=2, tau_au=TAU_AU, tau_eu=TAU_EU,
                              tool_detail="brief", **router)
    recipe = Recipe(name="budget", eval=cfg, router=router_cfg,
                    train={"rollout": {"max_response_tokens": 64}})
    llms = replay_llms(domain, task_id, ASK_ALWAYS)
    Evaluation(recipe, run_dir, progress=False, builder=Builder(recipe, llms)).run()
    [line] = read_jsonl(run_dir / RESULTS_FILE)
    [episode] = read_trajectories(run_dir / EPISODES_FILE)
    return line, episode, llms["decomposer"]


def decisions(episode) -> list[dict]:
    """The meta of every agent decision of a stored episode, in order."""
    return [step.meta for step in episode.steps if is_agent_turn(step)]


def ran(episode) -> list[int]:
    """Indices of the decisions at which the decomposer ran (its decision record is stored)."""
    return [i for i, meta in enumerate(decisions(episode)) if not meta["decision"].get("skipped")]


@pytest.fixture(scope="module", params=TASKS, ids=lambda t: f"{t[0]}-{t[1]}")
def runs(request, tmp_path_factory):
    domain, task_id = request.param
    root = tmp_path_factory.mktemp(f"{domain}{task_id}")
    out = {name: _evaluate(root / name, domain, task_id, **router)
           for name, router in (("budget2", {"budget": 2}), ("every4", {"every_n": 4}))}
    return root, out


def test_budget_two_runs_the_decomposer_twice_then_the_base_agent_alone(runs) -> None:
    _, out = runs
    line, episode, decomposer = out["budget2"]
    metas = decisions(episode)
    assert len(metas) > 10 and ran(episode) == [0, 1]
    assert all(m["decision"] == {"skipped": True, "why": "budget"} for m in metas[2:])
    assert all(m["route"] == "act" and m["turn"] == "act" for m in metas[2:])
    # the second decision follows the first tool result: the only question of the episode
    assert [m["turn"] for m in metas[:2]] == ["act", "clarify"] and line["steps"]["clarify"] == 1
    # two chat calls (goal readings, candidate actions) and one scoring pass per decomposer run
    assert (decomposer.calls["chat"], decomposer.calls["score"]) == (2 * 2, 2)
    assert line["model_calls"]["decomposer.chat"] == 4
    assert line["router"] == {"budget": 2, "every_n": 1, "calls": 2, "skipped": len(metas) - 2}
    assert (line["termination"], line["reward"]) == ("user_stop", 1.0)


def test_every_four_runs_the_decomposer_at_decisions_0_4_8(runs) -> None:
    _, out = runs
    line, episode, decomposer = out["every4"]
    metas = decisions(episode)
    expected = list(range(0, len(metas), 4))
    assert len(expected) >= 3 and ran(episode) == expected
    assert all(m["decision"] == {"skipped": True, "why": "every_n"}
               for i, m in enumerate(metas) if i not in expected)
    asked = [i for i, m in enumerate(metas) if m["turn"] == "clarify"]
    assert asked and set(asked) <= set(expected)
    assert (decomposer.calls["chat"], decomposer.calls["score"]) == (2 * len(expected),
                                                                     len(expected))
    assert line["router"] == {"budget": None, "every_n": 4, "calls": len(expected),
                              "skipped": len(metas) - len(expected)}
    assert (line["termination"], line["reward"]) == ("user_stop", 1.0)


def _router_rows(markdown: str) -> dict[str, list[str]]:
    section = markdown.split("## Router budget and frequency")[1].split("\n## ")[0]
    rows = [[c.strip() for c in row.strip("|").split("|")]
            for row in section.splitlines() if row.startswith("| ")]
    return {row[0]: row[1:] for row in rows[2:]}


def test_the_report_shows_budget_frequency_and_calls_per_episode(runs) -> None:
    root, out = runs
    written = write_report([root / "budget2", root / "every4"], root / "report", n_boot=50)
    rows = _router_rows(written["markdown"].read_text())
    expected = {}
    for name, (_, episode, _) in out.items():
        metas = decisions(episode)
        calls = len(ran(episode))
        budget, every_n = ("2", "1") if name == "budget2" else ("unlimited", "4")
        expected[f"{name}:prour"] = [budget, every_n, f"{calls:.2f}",
                                     f"{len(metas) - calls:.2f}"]
    assert rows == expected
