"""Tool schemas and types against tau2's toolkits, task environments, tool execution errors."""

from __future__ import annotations

import json

import pytest

from prour.env.domains import DOMAINS, get_task
from prour.env.environment import (
    db_hash,
    execute_tool_call,
    make_env,
    new_environment,
    read_only_tool_names,
    tool_schemas,
    tool_types,
    user_tool_schemas,
)

DATA_SAVER_TASK = (
    "[mobile_data_issue]data_saver_mode_on|user_abroad_roaming_enabled_off[PERSONA:Easy]"
)


@pytest.mark.parametrize("domain", DOMAINS)
def test_read_only_tools_are_tau2_read_tools(domain: str) -> None:
    from tau2.environment.toolkit import ToolType

    toolkit = new_environment(domain).tools
    expected = {name for name in toolkit.tools if toolkit.tool_type(name) is ToolType.READ}
    assert read_only_tool_names(domain) == expected
    assert set(tool_types(domain)) == set(toolkit.tools)


def test_read_only_tools_by_hand() -> None:
    retail = read_only_tool_names("retail")
    assert {"get_order_details", "get_user_details", "find_user_id_by_email"} <= retail
    assert not {"cancel_pending_order", "calculate", "transfer_to_human_agents"} & retail
    assert tool_types("airline")["book_reservation"] == "write"
    assert tool_types("telecom", "user")["toggle_airplane_mode"] == "write"
    assert "run_speed_test" in read_only_tool_names("telecom", "user")


@pytest.mark.parametrize("domain", DOMAINS)
def test_tool_schemas_are_openai_functions(domain: str) -> None:
    schemas = tool_schemas(domain)
    # tau2's own order (Environment.get_tools), the order its LLMAgent offers them in
    assert [s["function"]["name"] for s in schemas] == [
        tool.name for tool in new_environment(domain).get_tools()]
    for schema in schemas:
        assert schema["type"] == "function"
        assert schema["function"]["parameters"]["type"] == "object"
        assert schema["function"]["description"]
    schemas[0]["function"]["name"] = "edited"  # callers get copies
    assert tool_schemas(domain)[0]["function"]["name"] != "edited"
    json.dumps(schemas)


def test_user_tools_only_in_telecom() -> None:
    assert len(user_tool_schemas("telecom")) == 30
    assert user_tool_schemas("retail") == [] and user_tool_schemas("airline") == []


def test_make_env_applies_the_task_initial_state() -> None:
    task = get_task("telecom", DATA_SAVER_TASK)
    plain, _ = execute_tool_call(make_env("telecom"), "check_data_restriction_status", {}, "user")
    prepared, _ = execute_tool_call(
        make_env("telecom", task), "check_data_restriction_status", {}, "user"
    )
    assert plain == "Data Saver mode is OFF."
    assert prepared == "Data Saver mode is ON (limits data usage)."


def test_successful_read_returns_the_record_verbatim() -> None:
    env = make_env("retail")
    observation, is_error = execute_tool_call(env, "get_order_details", {"order_id": "#W6390527"})
    assert not is_error
    record = env.tools.db.orders["#W6390527"].model_dump()
    assert json.loads(observation) == json.loads(json.dumps(record))
    same, _ = execute_tool_call(env, "get_order_details", '{"order_id": "#W6390527"}')
    assert same == observation  # arguments given as a JSON string are decoded


@pytest.mark.parametrize(
    ("name", "arguments", "requestor", "expected"),
    [
        ("no_such_tool", {}, "assistant", "Error: Tool 'no_such_tool' not found."),
        (
            "get_order_details",
            {},
            "assistant",
            "missing 1 required positional argument: 'order_id'",
        ),
        (
            "get_order_details",
            {"order_id": "#W6390527", "extra": 1},
            "assistant",
            "got an unexpected keyword argument 'extra'",
        ),
        ("get_order_details", {"order_id": "#nope"}, "assistant", "Error: Order not found"),
        (
            "get_order_details",
            ["#W6390527"],
            "assistant",
            "Error: the arguments of tool 'get_order_details' must be a JSON object, got list",
        ),
        ("get_order_details", "{not json", "assistant", "must be a JSON object, got str"),
        ("", {}, "assistant", "Error: the tool call has no tool name"),
        (None, {}, "assistant", "Error: the tool call has no tool name"),
        ("get_order_details", {"order_id": "#W6390527"}, "user", "Error: User tools not available"),
    ],
)
def test_bad_calls_become_error_observations(name, arguments, requestor, expected) -> None:
    observation, is_error = execute_tool_call(make_env("retail"), name, arguments, requestor)
    assert is_error
    assert observation.startswith("Error: ")
    assert expected in observation


def test_agent_cannot_call_user_tools_and_back() -> None:
    env = make_env("telecom", get_task("telecom", DATA_SAVER_TASK))
    assert execute_tool_call(env, "toggle_data", {}, "assistant") == (
        "Error: Tool 'toggle_data' not found.",
        True,
    )
    observation, is_error = execute_tool_call(
        env, "get_customer_by_id", {"customer_id": "C1001"}, "user"
    )
    assert is_error and "not found" in observation


def test_db_hash_changes_only_on_writes() -> None:
    env = make_env("airline")
    before = db_hash(env)
    execute_tool_call(env, "get_user_details", {"user_id": "noah_muller_9847"})
    assert db_hash(env) == before
    observation, is_error = execute_tool_call(
        env, "send_certificate", {"user_id": "noah_muller_9847", "amount": 50}
    )
    assert not is_error, observation
    assert db_hash(env) != before
    assert db_hash(make_env("airline")) == before
