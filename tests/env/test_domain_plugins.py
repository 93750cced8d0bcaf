"""A domain a user brings, registered through the recipe's ``plugins`` (prour.env.plugins).

The domain is tests/env/toy_domain.py, a toy shop defined here and not in prour. A recipe naming
the module accepts ``eval.domains: [toy]``; every loader of prour's domain table works on it; and
the real ``prour eval`` (a child process that reads the recipe again) runs the Ask-Less
attention policies on it with scripted models. The scripted agent looks the catalogue up, asks
two discretionary questions (the colour, gift wrapping), orders MUG-BLUE and closes; a blocked
question makes it order at once. The VoI reviewer (the agent's model) values the colour question
0.8 and the wrapping question 0.2, so ``voi-gate(c=0.5)`` vetoes the second.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import toy_domain
import yaml

from prour.config import ConfigError, parse_recipe
from prour.config.domains import DOMAINS, domain_names
from prour.env import domains as domain_table
from prour.env.plugins import DomainPlugin, register_domain, unregister_domain
from prour.recipes import load_recipe

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DOCS = REPO / "docs" / "evaluation.md"

@pytest.fixture(autouse=True, scope="module")
def _table_left_as_found() -> Any:
    """Domains these tests register are taken out again, so later tests see the shipped ones."""
    before = set(domain_names())
    yield
    for name in set(domain_names()) - before:
        unregister_domain(name)


# ---- the scripted world ------------------------------------------------------------------------

Q_COLOR = "Which color would you like for the mug?"
Q_WRAP = "Would you like gift wrapping as well?"
CLOSING = "Your order is placed. Your request is complete."
AGENT_CALLS = [("list_products", {}), ("place_order", {"sku": "MUG-BLUE"})]  # in every episode
GATE_NOTE = "system: Your last message to the customer was not sent"


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


# Rules are searched in the rendered prompt (prour.llm.scripted), the first match answers.
AGENT = {"rules": [
    # the VoI reviewer and the MGR self-review run on the agent's model
    {"pattern": r'"voi".*\[Draft question\]\s*Which color',
     "reply": '{"voi": 0.8, "reason": "the colour decides the order"}'},
    {"pattern": r'"voi"', "reply": '{"voi": 0.2, "reason": "wrapping changes nothing"}'},
    {"pattern": r"\[Draft question\]",
     "reply": '{"decision": "approve", "question": "", "reason": "needed"}'},
    {"pattern": r"tool place_order returned", "reply": CLOSING},
    {"pattern": re.escape(GATE_NOTE) + r"[^\n]*\Z", "reply": _call(*AGENT_CALLS[1])},
    {"pattern": r"assistant: Would you like gift wrapping", "reply": _call(*AGENT_CALLS[1])},
    {"pattern": r"assistant: Which color", "reply": Q_WRAP},
    {"pattern": r"tool list_products returned", "reply": Q_COLOR},
    {"pattern": r".", "reply": _call(*AGENT_CALLS[0])},
]}
# The user's view has the agent as `user` (roles flipped); its system prompt holds the scenario.
USER = {"rules": [
    {"pattern": r"(?:complete\.|contact us again[^\n]*)\s*\Z", "reply": "###STOP###"},
    {"pattern": r"a mug from the shop.*How can I help you today\?\s*\Z",
     "reply": "Hi, I would like to buy a mug."},
    {"pattern": r"How can I help you today\?\s*\Z", "reply": "Hi, I would like to buy a scarf."},
    {"pattern": r"\?\s*\Z", "reply": "Blue, please, and no wrapping."},
], "default": "Thanks."}
JUDGEMENT = {"goal_clarity": 4, "single_ask": 5, "answer_effort": 4, "actionability": 5,
             "conciseness": 4, "needed": True, "not_in_context": True, "not_lookup": True,
             "precise": True, "value": 6}
JUDGE = {"rules": [{"pattern": r"\[Request to judge\]", "reply": json.dumps(JUDGEMENT)}]}

POLICIES = ["no-ask", "unrestricted", "frugal", "budgeted@1", "budgeted+mgr@1",
            "voi-gate(c=0.5)"]
# Discretionary requests each policy lets through, from the script above: both questions
# without a limit, none under no-ask, the colour question alone under a budget of 1 or the gate.
DELIVERED = {"no-ask": 0, "unrestricted": 2, "frugal": 2, "budgeted@1": 1, "budgeted+mgr@1": 1,
             "voi-gate(c=0.5)": 1}


def _recipe(folder: Path, **eval_section: Any) -> Path:
    models = {}
    for role, script in (("agent", AGENT), ("user", USER), ("judge", JUDGE)):
        path = folder / f"{role}.yaml"
        path.write_text(yaml.safe_dump(script))
        models[role] = {"backend": "scripted", "script": str(path)}
    recipe = {"name": "toy-plugin", "plugins": ["toy_domain"], "run_dir": str(folder / "run"),
              "models": models, "env": {"max_steps": 30},
              "eval": {"methods": ["base"], "seeds": [0], "domains": ["toy"], "split": "test",
                       "concurrency": 2, "classifier": "heuristic",
                       "attention": {"policy": "unrestricted"}, "attention_policies": POLICIES,
                       **eval_section}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _child_env() -> dict[str, str]:
    """The child finds the plugin module through PYTHONPATH, as a user's would."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def expected_reward(task_id: str) -> float:
    """tau2's DB and ACTION checks, worked out by hand: the agent's calls are the task's reference
    actions exactly (same writes: same final database; every reference call made), or not."""
    [task] = [t for t in toy_domain.TASKS if t.id == task_id]
    actions = task.evaluation_criteria.actions
    reference = sorted((a.name, json.dumps(a.arguments, sort_keys=True)) for a in actions)
    made = sorted((name, json.dumps(args, sort_keys=True)) for name, args in AGENT_CALLS)
    return 1.0 if reference == made else 0.0


# ---- the recipe --------------------------------------------------------------------------------


def test_a_recipe_naming_the_plugin_accepts_its_domain(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path))
    assert recipe.plugins == ["toy_domain"]
    assert recipe.eval.domains == ["toy"] and recipe.eval.split == "test"
    assert "toy" in domain_names() and "toy" not in DOMAINS  # registered, not shipped
    # registering it again (every read of the recipe does) changes nothing
    assert register_domain(toy_domain.DOMAIN) is toy_domain.DOMAIN
    assert load_recipe(_recipe(tmp_path)).eval.domains == ["toy"]


@pytest.mark.parametrize(("change", "message"), [
    ({"eval": {"domains": ["toyy"]}},
     ("eval.domains.0: unknown domain 'toyy'; valid: retail, airline, telecom, toy. "
      "Did you mean 'toy'? (got 'toyy')")),
    ({"plugins": ["toy_domian"]},
     ("plugins[0]: no module named 'toy_domian' on the Python path; a plugin module must be "
      "importable by every prour process (installed, or in a folder on PYTHONPATH)")),
    ({"plugins": ["toy_domain", "json"]},
     "plugins[1]: plugin module 'json' ("),
    ({"plugins": "toy_domain"},
     "plugins: must be a list of Python module names, got 'toy_domain'"),
])
def test_a_bad_domain_or_plugin_is_one_line_naming_the_key(tmp_path: Path, change: dict,
                                                           message: str) -> None:
    data = yaml.safe_load(_recipe(tmp_path).read_text())
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigError) as caught:
        parse_recipe(data, "recipe.yaml")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"recipe.yaml: {message}")
    if "json" in message:
        assert text.endswith("defines no register() function")


def test_without_the_plugin_the_domain_is_unknown(tmp_path: Path) -> None:
    """In a fresh process nothing registers ``toy`` unless the recipe names the module."""
    data = yaml.safe_load(_recipe(tmp_path).read_text())
    del data["plugins"]
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(data))
    code = ("import sys; from prour.recipes import load_recipe\n"
            "try:\n    load_recipe(sys.argv[1])\nexcept ValueError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, env=_child_env(), check=True, timeout=120)
    assert out.stdout.strip() == (f"{path}: eval.domains.0: unknown domain 'toy'; valid: retail, "
                                  "airline, telecom. (got 'toy')")


def test_a_register_that_fails_is_named_with_its_error(tmp_path: Path) -> None:
    module = tmp_path / "clashing_plugin.py"
    module.write_text("from prour.env.plugins import DomainPlugin, register_domain\n"
                      "def register():\n"
                      "    register_domain(DomainPlugin('retail', dict, []))\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"^plugins\[0\]: clashing_plugin.register\(\) "
                                              r"failed: ValueError: domain 'retail' is shipped"):
            parse_recipe({"name": "x", "plugins": ["clashing_plugin"]})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("clashing_plugin", None)


# ---- the domain table works on it as on retail -------------------------------------------------


def test_every_loader_of_the_domain_table_reads_the_plugin() -> None:
    from prour.env.environment import (
        make_env,
        new_environment,
        read_only_tool_names,
        tool_schemas,
        tool_types,
        user_tool_schemas,
    )

    toy_domain.register()
    assert domain_table.check_domain("toy") == "toy"
    assert domain_table.domain_spec("toy").splits == ("base", "test", "train")
    assert domain_table.split_sizes("toy") == {"base": 4, "test": 2, "train": 2}
    assert [t.id for t in domain_table.select_tasks("toy", "base", {"2", "3"})] == ["2", "3"]
    assert [t.id for t in domain_table.select_tasks("toy", "base", max_tasks=1)] == ["1"]
    assert domain_table.task_split("toy", "3") == "train"
    task = domain_table.get_task("toy", "1")
    task.user_scenario.persona = "edited"
    assert domain_table.get_task("toy", "1").user_scenario.persona is None  # a fresh copy
    with pytest.raises(ValueError, match="unknown task id '9' in domain 'toy'"):
        domain_table.get_task("toy", "9")
    with pytest.raises(ValueError, match=r"unknown split 'v1-train'; valid: base, test, train"):
        domain_table.load_tasks("toy", "v1-train")
    assert domain_table.domain_policy("toy") == toy_domain.POLICY
    assert tool_types("toy") == {"list_products": "read", "place_order": "write"}
    assert read_only_tool_names("toy") == {"list_products"}
    assert [s["function"]["name"] for s in tool_schemas("toy")] == ["list_products",
                                                                    "place_order"]
    assert user_tool_schemas("toy") == []
    assert new_environment("toy").tools.db.products["MUG-BLUE"].stock == 3
    assert make_env("toy", task).tools.db.orders == {}
    with pytest.raises(ValueError, match="tau2 has no module"):
        domain_table.domain_module("toy")


def _episode(domain: str, task_id: str, calls: list[tuple[str, dict]]) -> Any:
    """One real episode on ``domain`` whose agent makes ``calls`` then closes."""
    from prour.config import EnvConfig
    from prour.env.agents import AgentTurn
    from prour.env.runner import run_episode
    from prour.env.users import ScriptedUser
    from prour.llm.toolcalls import ToolCall

    class Caller:
        name, model_name = "caller", None

        def reset(self, domain: str, task_view: Any) -> str:
            self.left = list(calls)
            return task_view.policy

        def act(self, messages: list, tools: list) -> AgentTurn:
            if self.left:
                name, arguments = self.left.pop(0)
                return AgentTurn(tool_calls=[ToolCall(name, arguments, id=f"c{len(self.left)}")])
            return AgentTurn(content=CLOSING)

    task = domain_table.get_task(domain, task_id)
    return run_episode(domain, task, Caller(), ScriptedUser(["I want a mug."]),
                       limits=EnvConfig(max_steps=20))


def test_tau2s_evaluators_score_the_plugin_domain() -> None:
    toy_domain.register()
    for task_id in ("1", "2"):
        traj = _episode("toy", task_id, AGENT_CALLS)
        assert traj.reward == expected_reward(task_id)
        assert traj.reward_breakdown["basis"] == ["DB", "ACTION"]
    assert expected_reward("1") == 1.0 and expected_reward("2") == 0.0
    assert _episode("toy", "1", AGENT_CALLS[:1]).reward == 0.0  # no order: DB and ACTION fail


def test_a_scoring_function_of_the_domains_own_replaces_tau2s() -> None:
    """Share of the task's reference calls the agent made; an early ending still scores 0."""
    from prour.env.scoring import score_episode

    def share(task: Any, trajectory: Any) -> tuple[float, dict]:
        wanted = {a.name for a in task.evaluation_criteria.actions}
        made = {c["function"]["name"] for m in trajectory.messages for c in m.get("tool_calls")
                or []}
        return len(wanted & made) / len(wanted), {"made": sorted(made)}

    graded = DomainPlugin("toy-graded", toy_domain.environment, toy_domain.TASKS, score=share)
    register_domain(graded)
    try:
        traj = _episode("toy-graded", "1", AGENT_CALLS[:1])
        assert (traj.reward, traj.reward_breakdown) == (0.5, {"made": ["list_products"]})
        traj.termination = "max_steps"
        assert score_episode("toy-graded", domain_table.get_task("toy-graded", "1"),
                             traj)[0] == 0.0
    finally:
        unregister_domain("toy-graded")
    assert "toy-graded" not in domain_names()


def test_a_definition_prour_cannot_use_is_refused_with_the_reason() -> None:
    env = toy_domain.environment
    with pytest.raises(ValueError, match="splits must include 'base'"):
        DomainPlugin("shop", env, toy_domain.TASKS, splits={"test": ["1"]})
    with pytest.raises(ValueError, match="must not contain ':'"):
        DomainPlugin("my:shop", env, toy_domain.TASKS)
    with pytest.raises(TypeError, match="environment must be a zero-argument factory"):
        DomainPlugin("shop", "toy_domain.environment", toy_domain.TASKS)  # type: ignore[arg-type]
    register_domain(toy_domain.DOMAIN)
    with pytest.raises(ValueError, match="'toy' is already registered with another definition "
                                         r"\(by toy_domain\); pass replace=True"):
        register_domain(DomainPlugin("toy", env, toy_domain.TASKS[:1]))
    with pytest.raises(ValueError, match="'retail' is shipped with prour"):
        register_domain(DomainPlugin("retail", env, toy_domain.TASKS))
    register_domain(DomainPlugin("shop", env, toy_domain.TASKS, splits={"base": ["1", "7"]}))
    try:
        with pytest.raises(ValueError, match=r"split 'base' names task ids .*\['7'\]"):
            domain_table.load_tasks("shop", "base")
    finally:
        unregister_domain("shop")
    register_domain(DomainPlugin("shop", env, toy_domain.TASKS))
    assert len(domain_table.load_tasks("shop", "base")) == 4
    register_domain(DomainPlugin("shop", env, toy_domain.TASKS[:1]), replace=True)
    assert [t.id for t in domain_table.load_tasks("shop", "base")] == ["1"]  # read afresh
    unregister_domain("shop")
    register_domain(DomainPlugin("shop", dict, toy_domain.TASKS))
    try:
        with pytest.raises(TypeError, match="returned dict, not a tau2 Environment"):
            domain_table.domain_policy("shop")
    finally:
        unregister_domain("shop")


# ---- prour eval on the plugin domain, as a child process ---------------------------------------


@pytest.fixture(scope="module")
def toy_eval(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    """``python -m prour.cli.main eval`` on the toy domain, every attention policy."""
    from prour.eval.harness import RESULTS_FILE, load_result_lines

    folder = tmp_path_factory.mktemp("toy_eval")
    recipe = _recipe(folder)
    run = folder / "run" / "eval"
    done = subprocess.run([sys.executable, "-m", "prour.cli.main", "eval", "--recipe",
                           str(recipe), "--out", str(run), "--no-progress"],
                          capture_output=True, text=True, env=_child_env(), timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return run, load_result_lines(run / RESULTS_FILE)


def test_prour_eval_runs_every_attention_policy_on_the_plugin_domain(toy_eval) -> None:
    _, lines = toy_eval
    by_policy: dict[str, dict[str, dict]] = {}
    for line in lines.values():
        assert line["domain"] == "toy" and not line["error"], line
        by_policy.setdefault(line["variant"], {})[line["task_id"]] = line
    assert sorted(by_policy) == sorted(POLICIES)
    for policy, tasks in by_policy.items():
        assert sorted(tasks) == ["1", "2"]  # the test split
        for task_id, line in tasks.items():
            assert line["termination"] == "user_stop", line
            assert line["score"] == expected_reward(task_id), (policy, task_id)
            attention = line["attention"]
            assert attention["discretionary"] == DELIVERED[policy], (policy, attention)
            assert len([r for r in attention["requests"] if r["discretionary"]]) == \
                DELIVERED[policy]
    assert any(line["score"] == 1.0 for line in lines.values())
    for policy in ("budgeted@1", "budgeted+mgr@1"):
        for line in by_policy[policy].values():
            assert line["attention"]["discretionary"] <= 1
            assert line["attention"]["spent"] == 1 and line["attention"]["blocked"] == 1
    for line in by_policy["voi-gate(c=0.5)"].values():
        assert (line["attention"]["reviews"], line["attention"]["vetoes"]) == (2, 1)


def test_the_run_records_where_the_domain_came_from(toy_eval) -> None:
    run, _ = toy_eval
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["plugins"] == {"toy_domain": str(HERE / "toy_domain.py")}
    resolved = yaml.safe_load((run / "recipe.resolved.yaml").read_text())
    assert resolved["plugins"] == ["toy_domain"] and resolved["eval"]["domains"] == ["toy"]
    episodes = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    tools = Counter(c["function"]["name"] for e in episodes for m in e["messages"]
                    if m.get("role") == "assistant" for c in m.get("tool_calls") or [])
    assert tools == {"list_products": 12, "place_order": 12}  # 6 policies x 2 tasks, once each


def test_the_installed_console_script_runs_it_too(tmp_path: Path) -> None:
    """``.venv/bin/prour`` (no working directory on its path): one policy, one task."""
    script = Path(sys.executable).parent / "prour"
    assert script.is_file(), f"{script} is missing: the package's console script"
    recipe = _recipe(tmp_path, attention_policies=["budgeted@1"], tasks=["toy:1"])
    run = tmp_path / "out"
    done = subprocess.run([str(script), "eval", "--recipe", str(recipe), "--out", str(run),
                           "--no-progress"], capture_output=True, text=True, env=_child_env(),
                          cwd=tmp_path, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert (line["domain"], line["task_id"], line["variant"]) == ("toy", "1", "budgeted@1")
    assert line["score"] == expected_reward("1") == 1.0
    assert line["attention"]["discretionary"] == 1


# ---- the docs' example is a working plugin -----------------------------------------------------


def test_the_docs_example_registers_a_working_domain(tmp_path: Path) -> None:
    text = DOCS.read_text()
    section = text.split("## Bringing a domain of your own", 1)[1]
    [code] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:1]
    module = tmp_path / "docs_shop.py"
    module.write_text(code)
    sys.path.insert(0, str(tmp_path))
    try:
        recipe = parse_recipe({"name": "docs", "plugins": ["docs_shop"],
                               "eval": {"domains": ["shop"], "split": "base"}})
        assert recipe.eval.domains == ["shop"]
        from prour.env.environment import read_only_tool_names, tool_types

        kinds = set(tool_types("shop").values())
        assert kinds == {"read", "write"} and read_only_tool_names("shop")
        assert domain_table.load_tasks("shop", "base")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("docs_shop", None)
        unregister_domain("shop")
    assert "plugins:" in section and "Ambiguous WebShop" in section
