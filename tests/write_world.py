"""A scripted world on real tau2 retail train tasks whose early write changes the database.

Every episode (whatever the task): the user opens as Yusuf Rossi; the agent looks up his user id
(decision 0), returns an item of his delivered order #W2378156 (decision 1, a WRITE: the order
becomes "return requested"), says so and offers to check a product (decision 2); the user asks
it to; the agent reads the product's details (decision 3, a long result), reads his user details
(decision 4), then wraps up (decision 5) and the user stops.

The scripted decomposer routes decision 1 to clarify (its goal readings disagree), decision 4 to
verify (every reading finds the candidates equally likely: EU = ln 3) and the rest to act. The
prompt budget is set from the data so that decision 4's verify prompt keeps only the newest user
message, the product call and its result (truncation keeps the newest user message and what
follows it): truncation drops the return, but the verifier's environment must have it.

Expected values here are recomputed with tau2's own API, not with prour's replay code.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.config.router import RouterConfig
from prour.data.collect import (
    EpisodeFactories,
    collect_trajectories,
    load_trajectories,
    trajectory_id,
)
from prour.data.decisions import DecisionCache, decomposer_fingerprint
from prour.data.extract import Router, decision_states, extract_instances, write_dataset
from prour.data.normalize import load_goals, normalize_tasks
from prour.data.truncate import PolicyTokens
from prour.env.agents import LLMAgent
from prour.env.domains import load_tasks
from prour.env.environment import tool_schemas
from prour.env.trajectory import Trajectory
from prour.env.users import LLMUser
from prour.llm.scripted import ScriptedLLM
from prour.rollout.query import query_prompt
from prour.router.decomposer import Decomposer

ORDER = "#W2378156"
USER = {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}
FIND_CALL = {"name": "find_user_id_by_name_zip", "arguments": USER}
RETURN_CALL = {"name": "return_delivered_order_items",
               "arguments": {"order_id": ORDER, "item_ids": ["4202497723"],
                             "payment_method_id": "credit_card_9513926"}}
PRODUCT_CALL = {"name": "get_product_details", "arguments": {"product_id": "6945232052"}}
USER_CALL = {"name": "get_user_details", "arguments": {"user_id": "yusuf_rossi_9620"}}
OPENING = "Hi, I am Yusuf Rossi with zip 19122. I want to return something."
WRAP_UP = "Your return is registered. Anything else?"
RETURN_DONE = "The return is requested. Shall I check the product as well?"
CHECK_IT = "Yes, please check the product."
THRESHOLDS = (0.25, 0.20)
VERIFY_STEP, CLARIFY_STEP = 4, 1


def _tool_call(call: dict) -> str:
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def canonical(call: dict) -> str:
    return json.dumps({"tool": call["name"], "arguments": call["arguments"]}, sort_keys=True,
                      separators=(",", ":"))


def agent_llm() -> ScriptedLLM:
    """Rules newest-first: the latest tool result decides the next call."""
    return ScriptedLLM([("tool get_user_details returned", WRAP_UP),
                        ("tool get_product_details returned", _tool_call(USER_CALL)),
                        (CHECK_IT, _tool_call(PRODUCT_CALL)),
                        ("tool return_delivered_order_items returned", RETURN_DONE),
                        ("tool find_user_id_by_name_zip returned", _tool_call(RETURN_CALL))],
                       default=_tool_call(FIND_CALL))


def user_llm() -> ScriptedLLM:
    return ScriptedLLM([(r"Anything else\?[^\n]*\Z", "###STOP###"),
                        (r"check the product as well\?[^\n]*\Z", CHECK_IT)], default=OPENING)


GOALS = ["I want to exchange items of my order.", "I want to know my order status."]
CANDIDATES = [json.dumps({"tool": "respond", "arguments": {}}),
              json.dumps({"tool": "get_order_details", "arguments": {"order_id": ORDER}}),
              json.dumps({"tool": "find_user_id_by_name_zip", "arguments": USER})]


def _route_scorer(context: str, target: str) -> list[float]:
    """Uniform after the product read (verify), split by goal after the id lookup (clarify),
    everyone prefers ``respond`` otherwise (act)."""
    candidate = json.loads(target.removesuffix("<|im_end|>"))
    if "get_product_details returned" in context and "get_user_details returned" not in context:
        return [-1.0]
    goal = context.rsplit("Assume the customer's goal is: ", 1)[1].split("\n", 1)[0]
    if ("find_user_id_by_name_zip returned" in context
            and "return_delivered_order_items returned" not in context):
        best = "get_order_details" if "exchange" in goal else "find_user_id_by_name_zip"
    else:
        best = "respond"
    return [0.0 if candidate["tool"] == best else -10.0]


def decomposer_llm() -> ScriptedLLM:
    return ScriptedLLM(rules=[(r"The customer's goal, in one sentence:", GOALS),
                              (r"Propose one plausible next action", CANDIDATES)],
                       scorer=_route_scorer)


def _normalizer_llm() -> ScriptedLLM:
    def reply(messages: list[dict]) -> str:
        text = messages[-1]["content"].rsplit("Instructions:", 1)[1].rsplit("Rewritten:", 1)[0]
        return " ".join(text.replace("You are", "My name is").replace("You ", "I ").split())

    return ScriptedLLM(rules=[(r"Rewritten:", reply)])


@dataclass
class World:
    folder: Path
    trajectories: list[Trajectory]
    budget: int
    instances: list  # the Instance objects extraction built, both splits
    rows: list[dict]  # both splits, written and read back with pyarrow


def verify_budget(traj: Trajectory, tokens: PolicyTokens, cfg: DataConfig) -> int:
    """The budget that keeps exactly the newest user message and the (call, result) pair after
    it in the verify prompt."""
    history = decision_states(traj, cfg)[VERIFY_STEP].history
    assert history[-3]["content"] == CHECK_IT
    assert history[-2]["tool_calls"][0]["function"]["name"] == PRODUCT_CALL["name"]
    return tokens.chat(query_prompt("verify", history[-3:]))


def build_world(folder: Path, tiny_model_dir: Path) -> World:
    """Collect two episodes, normalize their goals, extract rows (through the real writer)."""
    from prour.data.dataset import read_rows, split_path

    cfg = DataConfig(num_trajectories=2, trial_seeds=[0], concurrency=1, val_ratio=0.5,
                     teacher=False)
    tasks = load_tasks("retail", "train")[:2]
    factories = EpisodeFactories(lambda: LLMAgent(agent_llm(), EnvConfig()),
                                 lambda: LLMUser(user_llm(), EnvConfig()),
                                 None, cfg)
    collect_trajectories(tasks, factories, cfg, folder / "traj.jsonl", progress=False,
                         limits=EnvConfig())
    normalize_tasks(tasks, "retail", _normalizer_llm(), folder / "goals.jsonl",
                    "scripted:normalizer", cfg)
    trajectories = load_trajectories(folder / "traj.jsonl", "error")
    tokens = PolicyTokens(tiny_model_dir)
    cfg = cfg.model_copy(update={"max_prompt_tokens": verify_budget(trajectories[0], tokens, cfg)})
    config = RouterConfig()
    llm = decomposer_llm()
    router = Router(lambda d: Decomposer(llm, tool_schemas(d), config, thresholds=THRESHOLDS),
                    "scripted:decomposer", decomposer_fingerprint(config), THRESHOLDS)
    instances, summary = extract_instances(
        trajectories, load_goals(folder / "goals.jsonl", cfg.on_bad_line), router,
        DecisionCache(folder / "decisions.jsonl", cfg.on_bad_line), tokens, cfg, progress=False)
    write_dataset(instances, summary, folder / "dataset", {})
    rows = [r for s in ("train", "validation") for r in read_rows(split_path(folder / "dataset", s))]
    built = [i for split in ("train", "validation") for i in instances[split]]
    return World(folder, trajectories, cfg.max_prompt_tokens, built, rows)


# ---------------------------------------------------------------- independent recomputation


def decision_message(traj: Trajectory, step: int) -> int:
    """Index in ``traj.messages`` of the agent's ``step``-th decision (greeting excluded)."""
    by_index = {s.message_index: s for s in traj.steps}
    decisions = [i for i, m in enumerate(traj.messages)
                 if m["role"] == "assistant" and i in by_index
                 and by_index[i].kind in ("agent_message", "agent_tool_call")
                 and not by_index[i].meta.get("greeting")]
    return decisions[step]


def replayed_hash(traj: Trajectory, step: int) -> str:
    """DB hash after replaying, with tau2's API, every tool call before the decision."""
    calls = [call["function"] for message in traj.messages[1:decision_message(traj, step)]
             for call in message.get("tool_calls") or []]
    return tau2_hash([{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls])


def tau2_hash(calls: list[dict]) -> str:
    """DB hash of a fresh retail environment after ``calls``, with tau2's API only."""
    from tau2.data_model.message import ToolCall
    from tau2.domains.retail.environment import get_environment

    env = get_environment()
    for i, call in enumerate(calls):
        env.get_response(ToolCall(id=f"c{i}", requestor="assistant", **call))
    return hashlib.sha256(f"{env.get_db_hash()}|{env.get_user_db_hash()}".encode()).hexdigest()


def order_status_after_return() -> str:
    """The order's status after the episode's return, read with tau2's API."""
    from tau2.data_model.message import ToolCall
    from tau2.domains.retail.environment import get_environment

    env = get_environment()
    for i, call in enumerate((RETURN_CALL, {"name": "get_order_details",
                                            "arguments": {"order_id": ORDER}})):
        out = env.get_response(ToolCall(id=f"c{i}", requestor="assistant", **call))
    return json.loads(out.content)["status"]


def trajectory_of(world: World, row: dict) -> Trajectory:
    return next(t for t in world.trajectories
                if trajectory_id(t) == row["extra_info"]["trajectory_id"])
