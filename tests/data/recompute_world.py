"""A scripted world on real tau2 train tasks, for the data recomputation suite.

Every model answers by a rule stated here, so a test can recompute what the pipeline must produce
from the raw trajectories alone:

- agent: tau2's reference actions replayed in order (:class:`~prour.env.agents.OracleAgent`);
- teacher: asks ``TQ<r>: ...`` right after the r-th tool result when r % 4 == 1 (after the 1st,
  5th, 9th ... result), else says NO;
- user: the oracle user, who also answers every teacher question (``Answer to TQ<r>.``);
- normalizer: the faithful scripted rewriter of ``data_scripts``;
- decomposer: K = 5 goal readings, 3 candidate actions, scores that route a state by the number
  r of tool results in its history (:func:`expected_mode`): r % 3 == 0 → all candidates equally
  likely under every reading (AU = 0, EU = ln 3) → verify; r % 3 == 1 → reading A prefers the
  first candidate, reading B the second (AU ≈ 0.67) → clarify; r % 3 == 2 → every reading prefers
  ``respond`` (AU ≈ EU ≈ 0) → act, under thresholds (τ_AU, τ_EU) = (0.25, 0.20).

Tasks (seed 0): retail 30 (a return after long order and product details: the newest tool result
alone exceeds the small budgets) and airline 39 (reservation writes before later decisions).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import data_scripts
from loguru import logger as tau2_logger

from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.config.router import RouterConfig
from prour.data.collect import EpisodeFactories, collect_trajectories, load_trajectories
from prour.data.decisions import DecisionCache, decomposer_fingerprint
from prour.data.extract import Router, extract_instances, write_dataset
from prour.data.normalize import load_goals, normalize_tasks
from prour.data.truncate import PolicyTokens
from prour.env.agents import OracleAgent
from prour.env.domains import load_tasks
from prour.env.environment import tool_schemas
from prour.env.users import OracleUser, UserTurn
from prour.llm.scripted import ScriptedLLM, render_prompt
from prour.router.decomposer import Decomposer

tau2_logger.disable("tau2")

TASKS = {"retail": ["30"], "airline": ["39"]}
SEEDS = [0]
THRESHOLDS = (0.25, 0.20)
ROUTES = ("verify", "clarify", "act")  # by the number of tool results in the history, mod 3
TOOL_RESULT = re.compile(r"^tool \S+ returned: ", re.MULTILINE)
QUESTION = re.compile(r"TQ(\d+):")


def expected_mode(n_tool_results: int) -> str:
    """The route the scripted decomposer gives a state with this many tool results."""
    return ROUTES[n_tool_results % 3]


def teacher_asks_after(n_tool_results: int) -> bool:
    """The teacher's schedule: a question right after the 1st, 5th, 9th ... tool result."""
    return n_tool_results % 4 == 1


def _tool_results(text: str) -> int:
    return len(TOOL_RESULT.findall(text))


def teacher_reply(messages: list[dict]) -> str:
    n = _tool_results(render_prompt(messages))
    if teacher_asks_after(n):
        return f"YES [QUESTION]TQ{n}: shall I go on with step {n} as planned?[/QUESTION]"
    return "NO"


class AnsweringUser(OracleUser):
    """The oracle user, answering the teacher's questions instead of stopping."""

    def respond(self, messages: list[dict], tools: list[dict]) -> UserTurn:
        asked = QUESTION.match((messages[-1].get("content") or "") if messages else "")
        if asked and messages[-1].get("role") == "assistant":
            return UserTurn(content=f"Answer to TQ{asked.group(1)}: yes, go on.")
        return super().respond(messages, tools)


READINGS = ["reading A: the customer wants the first option.",
            "reading B: the customer wants the second option."]
CANDIDATES = [json.dumps({"tool": "respond", "arguments": {}}),
              json.dumps({"tool": "calculate", "arguments": {"expression": "1 + 1"}}),
              json.dumps({"tool": "transfer_to_human_agents", "arguments": {"summary": "world"}})]
CANONICAL = [json.dumps(json.loads(c), sort_keys=True, separators=(",", ":")) for c in CANDIDATES]


def route_scorer(context: str, target: str) -> list[float]:
    """Summed log-likelihood of a candidate: 0 for the preferred one, -10 for the others; -1
    for every candidate in verify states."""
    history, goal = context.split("Conversation so far:", 1)[1].rsplit(
        "Assume the customer's goal is: ", 1)
    mode = expected_mode(_tool_results(history))
    if mode == "verify":
        return [-1.0]
    best = CANONICAL[1] if mode == "clarify" and "reading B" in goal.split("\n", 1)[0] else \
        CANONICAL[0]
    return [0.0 if target.removesuffix("<|im_end|>") == best else -10.0]


def decomposer_llm() -> ScriptedLLM:
    return ScriptedLLM(rules=[(r"The customer's goal, in one sentence:", READINGS),
                              (r"Propose one plausible next action", CANDIDATES)],
                       scorer=route_scorer)


def collect(folder: Path) -> None:
    """Episodes into ``folder/traj.jsonl`` and normalized goals into ``folder/goals.jsonl``."""
    teacher = ScriptedLLM(rules=[(r"Conversation so far", teacher_reply)])
    for domain, ids in TASKS.items():
        tasks = [t for t in load_tasks(domain, "train") if t.id in ids]
        cfg = DataConfig(domain=domain, num_trajectories=len(tasks) * len(SEEDS),
                         trial_seeds=SEEDS, concurrency=1)
        factories = EpisodeFactories(OracleAgent, AnsweringUser, teacher, cfg)
        collect_trajectories(tasks, factories, cfg, folder / "traj.jsonl", progress=False,
                             limits=EnvConfig())
        normalize_tasks(tasks, domain, data_scripts.normalizer_llm(), folder / "goals.jsonl",
                        "scripted:normalizer", cfg)


def extract(folder: Path, tokens: PolicyTokens, budget: int) -> Path:
    """Extract ``folder/dataset-<budget>`` (decisions cached in ``folder``, shared by budgets)."""
    cfg = DataConfig(val_ratio=0.3, split_seed=0, max_prompt_tokens=budget, concurrency=1)
    config = RouterConfig()
    llm = decomposer_llm()
    router = Router(lambda d: Decomposer(llm, tool_schemas(d), config, thresholds=THRESHOLDS),
                    "scripted:decomposer", decomposer_fingerprint(config), THRESHOLDS)
    instances, summary = extract_instances(
        load_trajectories(folder / "traj.jsonl", cfg.on_bad_line),
        load_goals(folder / "goals.jsonl", cfg.on_bad_line), router,
        DecisionCache(folder / "decisions.jsonl", cfg.on_bad_line), tokens, cfg, progress=False)
    out = folder / f"dataset-{budget}"
    write_dataset(instances, summary, out, {"max_prompt_tokens": budget})
    return out
