"""data.verify_target = reference (paper A.2.1: the target is the reference next action a_t*).

Real tau2 train tasks of the three domains, two per domain, each with at least two reference
actions of the agent; episodes collected with a scripted agent that interleaves extra read-only
lookups with the reference actions, takes independent reference actions out of order, puts two
calls in one turn, and (one task per domain) makes a WRITE the reference does not hold. The target
of every decision is written out by hand below from the task's reference actions (quoted in the
comments) and the script, not recomputed with the code under test.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import recompute_world as world
from loguru import logger

from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.config.router import RouterConfig
from prour.data.card import card_markdown, dataset_card
from prour.data.collect import EpisodeFactories, collect_trajectories, load_trajectories
from prour.data.decisions import DecisionCache, decomposer_fingerprint
from prour.data.extract import Router, decision_states, extract_instances, target_of, write_dataset
from prour.data.truncate import PolicyTokens
from prour.env.agents import LLMAgent
from prour.env.domains import get_task, load_tasks
from prour.env.environment import tool_schemas
from prour.env.users import LLMUser
from prour.llm.scripted import ScriptedLLM
from prour.router.decomposer import Decomposer

logger.disable("tau2")

CHECK = "I have done that part. Shall I go on?"
CLOSING = "Thank you, your request is complete."
OPENING = "Hi, I need help with my account."
TELECOM_A = ("[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|"
             "break_apn_mms_setting|break_app_both_permissions|data_mode_off|data_usage_exceeded|"
             "unseat_sim_card|user_abroad_roaming_disabled_off[PERSONA:Hard]")
TELECOM_B = TELECOM_A.replace("roaming_disabled_off", "roaming_disabled_on")


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def target(name: str, **arguments) -> tuple[str, None]:
    return json.dumps({"tool": name, "arguments": arguments}, sort_keys=True,
                      separators=(",", ":")), None


REPLY = (None, "verify_reply")
OFF = (None, "verify_off_reference")

# retail 76, reference: cancel_pending_order #W8367380 (ordered by mistake), then #W1242543
# (no longer needed): two independent cancels, taken here in the other order.
R76_A = {"order_id": "#W8367380", "reason": "ordered by mistake"}
R76_B = {"order_id": "#W1242543", "reason": "no longer needed"}
# retail 69, reference: find_user_id_by_name_zip, get_user_details, get_order_details, cancel.
R69_FIND = {"first_name": "Emma", "last_name": "Smith", "zip": "10192"}
R69_CANCEL = {"order_id": "#W2417020", "reason": "no longer needed"}
STRAY_ADDRESS = {"user_id": "emma_smith_8564", "address1": "1 Test Street", "address2": "",
                     "city": "Austin", "state": "TX", "country": "USA", "zip": "78701"}
# airline 9, reference: cancel_reservation NQNU5R, search_direct_flight JFK→MCO 2024-05-22.
A9_SEARCH = {"origin": "JFK", "destination": "MCO", "date": "2024-05-22"}
# airline 1, reference: get_user_details raj_sanchez_7340, get_reservation_details Q69X3R.
# telecom A and B, agent reference: refuel_data C1001/L1002 2.0 GB, enable_roaming C1001/L1002
# (the user's own reference actions, toggle_airplane_mode ..., are not the agent's).
LINE = {"customer_id": "C1001", "line_id": "L1002"}

# (domain, task) → the agent's turns (a list of calls, or a text reply) and each decision's target
CASES = {
    ("retail", "76"): (
        [[call("get_order_details", order_id="#W8367380")],  # extra read
         [call("cancel_pending_order", **R76_B)],  # the second reference action first
         CHECK,
         [call("cancel_pending_order", **R76_A)],
         CLOSING],
        [target("cancel_pending_order", **R76_A), target("cancel_pending_order", **R76_A),
         target("cancel_pending_order", **R76_A), target("cancel_pending_order", **R76_A),
         REPLY]),
    ("retail", "69"): (
        [[call("find_user_id_by_name_zip", **R69_FIND)],
         [call("get_order_details", order_id="#W2417020"),  # two calls in one turn, swapped
          call("get_user_details", user_id="emma_smith_8564")],
         [call("list_all_product_types")],  # extra read
         [call("modify_user_address", **STRAY_ADDRESS)],  # a write the reference does not hold
         [call("cancel_pending_order", **R69_CANCEL)],
         CLOSING],
        [target("find_user_id_by_name_zip", **R69_FIND),
         target("get_user_details", user_id="emma_smith_8564"),
         target("cancel_pending_order", **R69_CANCEL),
         target("cancel_pending_order", **R69_CANCEL),  # its history is still on the path
         OFF, OFF]),
    ("airline", "9"): (
        [[call("get_reservation_details", reservation_id="NQNU5R")],  # extra read
         [call("search_direct_flight", **A9_SEARCH)],  # the second reference action first
         CHECK,
         [call("cancel_reservation", reservation_id="NQNU5R")],
         CLOSING],
        [target("cancel_reservation", reservation_id="NQNU5R")] * 4 + [REPLY]),
    ("airline", "1"): (
        [[call("get_reservation_details", reservation_id="Q69X3R")],  # second reference first
         CHECK,
         [call("cancel_reservation", reservation_id="Q69X3R")],  # a write the reference lacks
         [call("get_user_details", user_id="raj_sanchez_7340")],
         CLOSING],
        [target("get_user_details", user_id="raj_sanchez_7340")] * 3 + [OFF, OFF]),
    ("telecom", TELECOM_A): (
        [[call("get_customer_by_id", customer_id="C1001")],  # extra read
         [call("enable_roaming", **LINE)],  # the second reference action first
         [call("get_details_by_id", id="L1002"), call("refuel_data", gb_amount=2.0, **LINE)],
         CLOSING],
        [target("refuel_data", gb_amount=2.0, **LINE)] * 3 + [REPLY]),
    ("telecom", TELECOM_B): (
        [[call("refuel_data", gb_amount=2.0, **LINE)],
         CHECK,
         [call("suspend_line", reason="test", **LINE)],  # a write the reference does not hold
         [call("enable_roaming", **LINE)],
         CLOSING],
        [target("refuel_data", gb_amount=2.0, **LINE), target("enable_roaming", **LINE),
         target("enable_roaming", **LINE), OFF, OFF]),
}


def scripted_agent(turns: list) -> LLMAgent:
    replies = iter(turns)

    def reply(messages: list[dict]) -> str:
        turn = next(replies, CLOSING)
        if isinstance(turn, str):
            return turn
        return "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in turn)

    return LLMAgent(ScriptedLLM(rules=[(r".", reply)]), EnvConfig())


def user_reply(messages: list[dict]) -> str:
    said = messages[-1].get("content") or "" if messages else ""
    if "complete" in said:
        return "###STOP###"
    return "Yes, go ahead." if CHECK in said else OPENING


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference-targets")
    path = folder / "traj.jsonl"
    for (domain, task_id), (turns, _) in CASES.items():
        cfg = DataConfig(domain=domain, num_trajectories=1, trial_seeds=[0], concurrency=1,
                         teacher=False)
        tasks = [t for t in load_tasks(domain, "train") if t.id == task_id]
        factories = EpisodeFactories(
            lambda turns=turns: scripted_agent(turns),
            lambda: LLMUser(ScriptedLLM(rules=[(r".", user_reply)]), EnvConfig()), None, cfg)
        collect_trajectories(tasks, factories, cfg, path, progress=False, limits=EnvConfig())
    return folder, {(t.domain, t.task_id): t for t in load_trajectories(path, "error")}


def test_the_tasks_and_episodes_are_the_scripted_ones(episodes) -> None:
    _, trajectories = episodes
    assert set(trajectories) == set(CASES)
    for key, (turns, _) in CASES.items():
        actions = get_task(*key).evaluation_criteria.actions
        assert sum(a.requestor == "assistant" for a in actions) >= 2
        made = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                for m in trajectories[key].messages if m.get("role") == "assistant"
                for c in m.get("tool_calls") or []]
        assert made == [c for turn in turns if not isinstance(turn, str) for c in turn], key
    telecom = get_task("telecom", TELECOM_A).evaluation_criteria.actions
    assert [a.name for a in telecom if a.requestor == "assistant"] == ["refuel_data",
                                                                       "enable_roaming"]
    assert sum(a.requestor == "user" for a in telecom) >= 5  # left out of the agent's path


@pytest.mark.parametrize("key", list(CASES), ids=lambda k: f"{k[0]}-{k[1][:12]}")
def test_every_decision_gets_the_hand_written_reference_target(episodes, key) -> None:
    _, trajectories = episodes
    cfg = DataConfig(max_decisions=64, verify_target="reference")
    states = decision_states(trajectories[key], cfg)
    assert [target_of(s, "verify", {}, cfg) for s in states] == CASES[key][1]


def test_the_card_counts_verify_targets_per_domain(episodes, tmp_path, tiny_model_dir) -> None:
    """Every state routed verify (the decomposer finds all candidates equally likely under every
    reading); the card's per-domain counts equal the tallies of the hand-written targets."""
    folder, _ = episodes
    candidates = [json.dumps({"tool": "respond", "arguments": {}}),
                  json.dumps({"tool": "transfer_to_human_agents", "arguments": {"summary": "a"}}),
                  json.dumps({"tool": "transfer_to_human_agents", "arguments": {"summary": "b"}})]
    llm = ScriptedLLM(rules=[(r"The customer's goal, in one sentence:", world.READINGS),
                             (r"Propose one plausible next action", candidates)],
                      scorer=lambda context, target: [-1.0])
    config = RouterConfig()
    router = Router(lambda d: Decomposer(llm, tool_schemas(d), config, thresholds=world.THRESHOLDS),
                    "scripted:all-verify", decomposer_fingerprint(config), world.THRESHOLDS)
    cfg = DataConfig(max_decisions=64, verify_target="reference", max_prompt_tokens=100_000,
                     split_by="trajectory", val_ratio=0.5, concurrency=1)
    instances, summary = extract_instances(
        load_trajectories(folder / "traj.jsonl", "error"), {}, router,
        DecisionCache(tmp_path / "decisions.jsonl", "error"), PolicyTokens(tiny_model_dir), cfg,
        progress=False)
    write_dataset(instances, summary, tmp_path / "dataset", {})
    card = dataset_card(tmp_path / "dataset")
    # by hand, from CASES: retail 76 4 targets + 1 reply, 69 4 targets + 2 off; airline 9 4 + 1
    # reply, 1 3 + 2 off; telecom A 3 + 1 reply, B 3 + 2 off
    expected = {"retail": {"target": 8, "verify_reply": 1, "verify_off_reference": 2},
                "airline": {"target": 7, "verify_reply": 1, "verify_off_reference": 2},
                "telecom": {"target": 6, "verify_reply": 1, "verify_off_reference": 2}}
    assert card["extraction"]["verify_targets"] == expected
    assert card["extraction"]["routes"] == {"verify": 30}
    rows = Counter(i.domain for split in instances.values() for i in split)
    assert rows == {"retail": 8, "airline": 7, "telecom": 6}
    markdown = card_markdown(card)
    for line in (("Verify targets (retail): 8 of 11 verify states; dropped: "
                 "2 verify_off_reference, 1 verify_reply."),
                 ("Verify targets (airline): 7 of 10 verify states; dropped: "
                 "2 verify_off_reference, 1 verify_reply."),
                 ("Verify targets (telecom): 6 of 9 verify states; dropped: "
                 "2 verify_off_reference, 1 verify_reply.")):
        assert line in markdown
