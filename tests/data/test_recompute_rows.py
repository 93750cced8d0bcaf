"""Training rows recomputed from the raw trajectories alone (issue 17, data half).

The real collect → normalize → extract runs once on the scripted world of
:mod:`recompute_world` (real tau2 tasks) and is extracted at four prompt budgets. Every row is then
recomputed from ``traj.jsonl`` and ``goals.jsonl`` read as plain JSON, by the definitions of
DESIGN §3 and paper A.2.1, WITHOUT prour's extraction or truncation code:

- decisions: the task agent's messages and tool calls (not the greeting, not the task's initial
  history, not the teacher's questions), the first 16 of each trajectory;
- history: every message before the decision that the agent saw (no system prompt, no user-side
  tool traffic); mode by the world's routing rule; target: G* (clarify) or the canonical JSON of
  the decision's tool call (verify; a text reply gives no verify row);
- truncation: the prompt ``query_prompt(mode, kept)`` counted with the policy tokenizer itself
  fits the budget; the *anchor* is the newest user message and everything after it (the newest
  turn when the history has no user message); the kept history is the longest suffix of whole
  turns that fits and holds the anchor (one more turn does not fit), and only when the anchor
  alone does not fit, the anchor with each tool result cut to its head and marked
  ``[… truncated N characters …]`` (one cap for all; one more character does not fit); a state
  whose anchor does not fit even with every result cut to the bare marker has no row and is
  counted ``over_budget`` in the card; a tool result never appears without the call that
  produced it;
- environment: every tool call before the decision replayed on a fresh tau2 environment with
  tau2's own code (results compared with the recorded ones), hashed with tau2's DB hashes; the
  environment the reward builds from the row (:func:`prour.data.schema.state_from_row` →
  :func:`~prour.data.schema.decision_environment`, what ``prour.rewards`` uses) must hash the same.
  At every budget some verify row's truncation left a WRITE out of the prompt, so a replay of the
  kept history alone would give another database.

Timing: about 40 s on one core (collect 2 episodes, 4 extractions, recomputation); most of it is
tau2 building and hashing environments, in extraction (one per trajectory, hashed at each row
whose tool traffic grew) and here (one per trajectory plus one per verify state for the reward
path).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import recompute_world as world

from prour.data.schema import check_row, decision_environment, state_from_row
from prour.rollout.query import query_prompt  # the template text: the spec of a prompt

BUDGETS = (700, 1400, 2000, 2600)
MAX_DECISIONS = 16
EXCERPT = re.compile(r"\A(?P<head>.*)\[… truncated (?P<n>\d+) characters …\]\Z", re.DOTALL)


@dataclass
class State:
    """One decision recomputed from the raw trajectory."""

    tid: str
    step: int
    mode: str
    target: str | None
    history: list[dict]
    tau2_hash: tuple[str, str]


@dataclass
class World:
    folder: Path
    states: dict[tuple[str, int], State]
    rows: dict[int, list[dict]]  # budget → rows of both splits
    cards: dict[int, dict]
    tokenizer: object


def canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def is_decision(step: dict) -> bool:
    meta = step.get("meta") or {}
    return (step["kind"] in ("agent_message", "agent_tool_call") and not step.get("initial")
            and not meta.get("greeting") and "teacher_query" not in meta)


def agent_saw(message: dict, step: dict | None) -> bool:
    if message["role"] == "system" or step is None:
        return False
    return step["kind"] != "user_tool_call" and not (
        step["kind"] == "tool_result" and step.get("requestor") == "user")


def fresh_environment(domain: str, task_id: str):
    """The task's environment from tau2 itself (the world's tasks have no initial state)."""
    module = __import__(f"tau2.domains.{domain}.environment", fromlist=["get_environment"])
    task = next(t for t in module.get_tasks("train") if t.id == task_id)
    assert task.initial_state is None, "the world's tasks start from the domain's database"
    return module.get_environment()


def replay(env, messages: list[dict], recorded: dict[str, str]) -> None:
    """Run every tool call of ``messages`` on ``env`` with tau2's own code; each result must be
    the recorded one."""
    from tau2.data_model.message import ToolCall

    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            out = env.get_response(ToolCall(
                id=call["id"], name=fn["name"], arguments=json.loads(fn["arguments"]),
                requestor="user" if message["role"] == "user" else "assistant"))
            assert out.content == recorded[call["id"]], f"replaying {fn['name']} {call['id']}"


def tau2_hash(env) -> tuple[str, str]:
    return env.get_db_hash(), env.get_user_db_hash()


def recompute_states(traj: dict, goals: dict[tuple[str, str], str]) -> list[State]:
    """Every decision of one trajectory; the environment is replayed along the whole episode and
    hashed right before each verify decision."""
    by_index = {s["message_index"]: s for s in traj["steps"]}
    messages = traj["messages"]
    tid = f"{traj['domain']}/{traj['task_id']}/s{traj['seed']}/{traj['agent']}"
    decisions = [i for i in sorted(by_index) if is_decision(by_index[i])][:MAX_DECISIONS]
    env, replayed = fresh_environment(traj["domain"], traj["task_id"]), 0
    recorded = {m.get("tool_call_id"): m["content"] for m in messages if m["role"] == "tool"}
    states = []
    for step, j in enumerate(decisions):
        history = [m for i, m in enumerate(messages[:j]) if agent_saw(m, by_index.get(i))]
        mode = world.expected_mode(sum(m["role"] == "tool" for m in history))
        calls = messages[j].get("tool_calls") or []
        target, db = None, ("", "")  # act, or verify before a text reply (dropped by default)
        if mode == "clarify":
            target = goals[(traj["domain"], traj["task_id"])]
        elif mode == "verify" and calls:
            fn = calls[0]["function"]
            target = canonical({"tool": fn["name"], "arguments": json.loads(fn["arguments"])})
            replay(env, messages[replayed:j], recorded)
            replayed, db = j, tau2_hash(env)
        states.append(State(tid, step, mode, target, history, db))
    return states


def read_world(folder: Path) -> dict[tuple[str, int], State]:
    goals = {}
    for line in (folder / "goals.jsonl").read_text().splitlines():
        g = json.loads(line)
        goals[(g["domain"], g["task_id"])] = g["goal"]
    states = {}
    for line in (folder / "traj.jsonl").read_text().splitlines():
        for s in recompute_states(json.loads(line), goals):
            states[(s.tid, s.step)] = s
    return states


@pytest.fixture(scope="module")
def recomputed(tmp_path_factory, tiny_model_dir) -> World:
    from transformers import AutoTokenizer

    from prour.data.truncate import PolicyTokens

    folder = tmp_path_factory.mktemp("recompute")
    world.collect(folder)
    tokens = PolicyTokens(tiny_model_dir)
    rows, cards = {}, {}
    for budget in BUDGETS:
        out = world.extract(folder, tokens, budget)
        rows[budget] = [r for split in ("train", "validation")
                        for r in pq.read_table(out / f"{split}.parquet").to_pylist()]
        cards[budget] = json.loads((out / "card.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return World(folder, read_world(folder), rows, cards, tokenizer)


def prompt_tokens(w: World, mode: str, history: list[dict]) -> int:
    ids = w.tokenizer.apply_chat_template(query_prompt(mode, history), add_generation_prompt=True,
                                          tokenize=True, enable_thinking=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def turn_starts(history: list[dict]) -> list[int]:
    """Where whole turns start: a tool result belongs to the turn of its call."""
    return [i for i, m in enumerate(history) if m["role"] != "tool"]


def orphan_results(history: list[dict]) -> list[str]:
    """Tool results whose call is not earlier in the same history."""
    called, orphans = set(), []
    for m in history:
        called |= {c["id"] for c in m.get("tool_calls") or []}
        if m["role"] == "tool" and m.get("tool_call_id") not in called:
            orphans.append(m.get("tool_call_id"))
    return orphans


def marked_head(text: str, keep: int) -> str:
    """The spec of an excerpt: the first ``keep`` characters and the marker."""
    return text[:keep] + f"[… truncated {len(text) - keep} characters …]"


def anchor(history: list[dict]) -> list[dict]:
    """The newest user message and everything after it (no user message: the newest turn)."""
    users = [i for i, m in enumerate(history) if m["role"] == "user"]
    return history[users[-1] if users else turn_starts(history)[-1]:]


def fits_at_all(w: World, budget: int, state: State) -> bool:
    """Whether the anchor fits with every tool result cut to the bare marker."""
    newest = anchor(state.history)
    bare = [{**m, "content": marked_head(m["content"], 0)} if m["role"] == "tool"
            and m["content"] else m for m in newest]
    if not any(m["role"] == "tool" for m in newest) and newest[0]["role"] != "user":
        bare = [{**m, "content": marked_head(m["content"], 0)} if m["content"] else m
                for m in newest]
    return prompt_tokens(w, state.mode, bare) <= budget


def excerpt_problems(w: World, budget: int, state: State, kept: list[dict]) -> list[str]:
    """The anchor alone is over budget: it stays with each tool result cut to a marked head,
    the longest head that fits (one cap for all results after the newest user message)."""
    newest = anchor(state.history)
    if prompt_tokens(w, state.mode, newest) <= budget:
        return ["excerpted although the anchor (newest user message onward) fits whole"]
    if len(kept) != len(newest):
        return [f"kept {len(kept)} messages, the newest turn has {len(newest)}"]
    heads = {}
    for i, (mine, row) in enumerate(zip(newest, kept)):
        cut = EXCERPT.match(row.get("content") or "")
        if row == mine:
            continue
        if mine["role"] != "tool" and (mine["role"] == "user" or any(
                m["role"] == "tool" for m in newest)):
            return [f"message {i} of the anchor (not a tool result) was changed"]
        if not cut or row != {**mine, "content": marked_head(mine["content"], len(cut["head"]))}:
            return [f"message {i} is not a marked head of the recorded one"]
        heads[i] = len(cut["head"])
    if len(set(heads.values())) != 1:
        return [f"the results of the anchor are cut to different lengths {heads}"]
    keep = next(iter(heads.values())) + 1
    longer = [{**m, "content": marked_head(m["content"], keep)} if i in heads else m
              for i, m in enumerate(newest)]
    if prompt_tokens(w, state.mode, longer) <= budget:
        return [f"a head of {keep} characters fits too (not maximal)"]
    return []


def history_problems(w: World, budget: int, state: State, extra: dict) -> list[str]:
    """The row's history, truncation flags and token count against the recomputed ones."""
    kept = json.loads(extra["history"])
    problems = [f"tool result {c} without its call" for c in orphan_results(kept)]
    users = [m for m in state.history if m["role"] == "user"]
    if users and users[-1] not in kept:
        problems.append("the newest user message is not kept")
    full_fits = prompt_tokens(w, state.mode, state.history) <= budget
    if extra["truncated"] == full_fits:
        problems.append(f"truncated={extra['truncated']} but the full prompt fits={full_fits}")
    dropped = len(state.history) - len(kept)
    if extra["dropped_messages"] != dropped:
        problems.append(f"dropped_messages {extra['dropped_messages']} != {dropped}")
    if kept == state.history[dropped:]:
        starts = turn_starts(state.history)
        if dropped and dropped not in starts:
            problems.append(f"the kept history starts inside a turn (message {dropped})")
        earlier = [s for s in starts if s < dropped]
        if earlier and prompt_tokens(w, state.mode, state.history[earlier[-1]:]) <= budget:
            problems.append("not maximal: one more whole turn fits")
        if len(kept) < len(anchor(state.history)):
            problems.append("whole turns of the anchor were dropped")
    else:
        problems += excerpt_problems(w, budget, state, kept)
    tokens = prompt_tokens(w, state.mode, kept)
    if not tokens == extra["prompt_tokens"] <= budget:
        problems.append(f"prompt_tokens {extra['prompt_tokens']}, recounted {tokens}, "
                        f"budget {budget}")
    return problems


def row_problems(w: World, budget: int, row: dict) -> list[str]:
    extra = row["extra_info"]
    state = w.states.get((extra["trajectory_id"], extra["step"]))
    if state is None or state.target is None:
        return [f"no {extra['mode']} row expected"]
    problems = check_row(row)  # the schema's own check, orphan tool results included
    if extra["mode"] != state.mode:
        problems.append(f"mode {extra['mode']} != {state.mode}")
    if row["reward_model"]["ground_truth"] != state.target:
        problems.append("target differs from the recomputed one")
    problems += history_problems(w, budget, state, extra)
    prompt = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
    if prompt != query_prompt(state.mode, json.loads(extra["history"])):
        problems.append("prompt is not the template around the row's history")
    return problems


def expected_rows(w: World, budget: int) -> set[tuple[str, int]]:
    return {key for key, s in w.states.items() if s.target is not None
            and fits_at_all(w, budget, s)}


def test_rows_match_their_recomputation_at_every_budget(recomputed: World) -> None:
    report = {}
    for budget in BUDGETS:
        rows = recomputed.rows[budget]
        expected = expected_rows(recomputed, budget)
        assert {(r["extra_info"]["trajectory_id"], r["extra_info"]["step"]) for r in rows} == \
            expected, f"budget {budget}: the rows are not the recomputed states"
        over = sum(s.target is not None for s in recomputed.states.values()) - len(expected)
        dropped = recomputed.cards[budget]["extraction"]["dropped"].get("over_budget", 0)
        assert dropped == over, f"budget {budget}: the card counts {dropped} over budget"
        problems = [f"{r['extra_info']['state_id']}: {p}" for r in rows
                    for p in row_problems(recomputed, budget, r)]
        report[budget] = problems
    assert report == {b: [] for b in BUDGETS}


def test_no_tool_result_lacks_its_call(recomputed: World) -> None:
    orphans = {budget: sum(bool(orphan_results(json.loads(r["extra_info"]["history"])))
                           for r in recomputed.rows[budget]) for budget in BUDGETS}
    assert orphans == {b: 0 for b in BUDGETS}


def test_the_world_exercises_routes_truncation_and_excerpts(recomputed: World) -> None:
    modes = Counter(s.mode for s in recomputed.states.values())
    assert set(modes) == {"verify", "clarify", "act"}
    truncated = {b: sum(r["extra_info"]["truncated"] for r in recomputed.rows[b]) for b in BUDGETS}
    assert truncated[700] >= truncated[1400] >= truncated[2600] > 0
    excerpted = {b: sum(any(EXCERPT.match(m["content"] or "")
                            for m in json.loads(r["extra_info"]["history"]))
                        for r in recomputed.rows[b]) for b in BUDGETS}
    assert excerpted[700] > 0 and excerpted[1400] > 0
    over = {b: recomputed.cards[b]["extraction"]["dropped"].get("over_budget", 0)
            for b in BUDGETS}
    assert over[700] > 0 and over[2600] == 0, over  # states that cannot fit are dropped
    for budget in BUDGETS:  # the card counts the rows holding an excerpt
        card = recomputed.cards[budget]["splits"]
        assert sum(s["excerpted"] for s in card.values()) == excerpted[budget]
    lost = {b: sum(bool(dropped_writes(r["extra_info"])) for r in recomputed.rows[b]
                   if r["extra_info"]["mode"] == "verify") for b in BUDGETS}
    assert all(lost.values()), lost  # the prompt alone would give the verifier a wrong database


def dropped_writes(extra: dict) -> list[str]:
    """WRITE calls (tau2's ToolType) before the decision that truncation left out of the prompt."""
    from prour.env.environment import tool_types

    def calls(field: str) -> list[str]:
        return [c["function"]["name"] for m in json.loads(extra[field])
                for c in m.get("tool_calls") or []]

    before, kept = calls("env_history"), calls("history")
    writes = tool_types(extra["domain"])
    return [name for name in before[:len(before) - len(kept)] if writes.get(name) == "write"]


def test_verify_environments_equal_a_full_tau2_replay(recomputed: World) -> None:
    """The reward's environment of every verify row, rebuilt from the row, has the DB hash of
    the full replay; the row's recorded hash is that of the same replay."""
    rows = [r for b in BUDGETS for r in recomputed.rows[b] if r["extra_info"]["mode"] == "verify"]
    by_state: dict[str, list[dict]] = {}
    for row in rows:
        by_state.setdefault(row["extra_info"]["state_id"], []).append(row["extra_info"])
    for state_id, extras in by_state.items():  # budgets differ only in the truncated history
        assert len({(e["env_history"], e["db_hash"]) for e in extras}) == 1, state_id
    outcome = Counter()
    for row in {r["extra_info"]["state_id"]: r for r in rows}.values():
        extra = row["extra_info"]
        mine = recomputed.states[(extra["trajectory_id"], extra["step"])].tau2_hash
        recorded = hashlib.sha256(f"{mine[0]}|{mine[1]}".encode()).hexdigest()  # schema's db_hash
        try:
            env = decision_environment(state_from_row(row))
        except ValueError:
            outcome["replay error"] += len(by_state[extra["state_id"]])
            continue
        same = tau2_hash(env) == mine and extra["db_hash"] == recorded
        outcome["match" if same else "mismatch"] += len(by_state[extra["state_id"]])
    verify_states = [s for s in recomputed.states.values() if s.mode == "verify" and s.target]
    assert outcome == {"match": len(rows)} and len(by_state) == len(verify_states)
