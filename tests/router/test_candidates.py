"""Strict action parsing against real tau2 retail schemas, canonical form, de-duplication."""

from __future__ import annotations

import json

import pytest

from prour.env.environment import tool_schemas
from prour.router.candidates import (
    ToolCatalog,
    canonical_json,
    collect_candidates,
    parse_action,
    render_tools,
)


@pytest.fixture(scope="module")
def catalog() -> ToolCatalog:
    return ToolCatalog(tool_schemas("retail"))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not_json"),
        ('{"tool": "respond", "arguments": {}} trailing', "not_json"),
        ('```json\n{"tool": "respond", "arguments": {}}\n```', "not_json"),
        ('[{"tool": "respond", "arguments": {}}]', "not_object"),
        ('{"tool": "respond"}', "wrong_keys"),
        ('{"tool": "respond", "arguments": {}, "note": ""}', "wrong_keys"),
        ('{"name": "respond", "arguments": {}}', "wrong_keys"),
        ('{"tool": "respond", "tool": "respond", "arguments": {}}', "duplicate_key"),
        ('{"tool": 3, "arguments": {}}', "tool_not_string"),
        ('{"tool": "respond", "arguments": "{}"}', "arguments_not_object"),
        ('{"tool": "respond", "arguments": {"content": "hi"}}', "respond_with_arguments"),
        ('{"tool": "delete_database", "arguments": {}}', "unknown_tool"),
        ('{"tool": "get_order_details", "arguments": {}}', "schema"),  # required order_id missing
        ('{"tool": "get_order_details", "arguments": {"order_id": 5}}', "schema"),  # wrong type
        ('{"tool": "get_order_details", "arguments": {"order_id": "#W1", "x": 1}}', "schema"),
        (
            (
                '{"tool": "return_delivered_order_items", "arguments": {"order_id": "#W1", '
                '"item_ids": "1", "payment_method_id": "p"}}'
            ),
            "schema",
        ),  # item_ids must be an array
    ],
)
def test_invalid_samples_say_why(catalog: ToolCatalog, text: str, reason: str) -> None:
    parsed = parse_action(text, catalog)
    assert not parsed.valid and parsed.reason == reason


def test_valid_samples_are_canonical(catalog: ToolCatalog) -> None:
    parsed = parse_action(
        ' {"arguments": {"zip": "28236", "last_name": "Kovacs", "first_name": "Mei"},\n'
        '  "tool": "find_user_id_by_name_zip"} ',
        catalog,
    )
    assert parsed.canonical == (
        '{"arguments":{"first_name":"Mei","last_name":"Kovacs","zip":"28236"},'
        '"tool":"find_user_id_by_name_zip"}'
    )
    assert parse_action('{"tool":"respond","arguments":{}}', catalog).canonical == (
        '{"arguments":{},"tool":"respond"}'
    )
    assert (
        canonical_json({"b": [1, {"d": "é", "c": 2}], "a": None})
        == '{"a":null,"b":[1,{"c":2,"d":"é"}]}'
    )


def test_collect_dedups_in_first_seen_order_and_counts(catalog: ToolCatalog) -> None:
    get = {"tool": "get_order_details", "arguments": {"order_id": "#W1"}}
    samples = [
        json.dumps(get),
        "<think>\nmaybe respond\n</think>\n" + '{"tool": "respond", "arguments": {}}',
        json.dumps(get, indent=2),  # same action, other whitespace
        "<think>never closed",  # no answer after thinking
        '{"tool": "get_order_details", "arguments": {"order_id": "#W1"}',
    ]
    found = collect_candidates(samples, catalog)
    assert found.candidates == [canonical_json(get), '{"arguments":{},"tool":"respond"}']
    assert found.invalid == {"not_json": 2} and found.n_samples == 5 and found.n_invalid == 2


def test_render_tools_lists_every_tool_and_respond(catalog: ToolCatalog) -> None:
    for detail in ("full", "brief"):
        text = render_tools(catalog, detail)
        assert all(name in text for name in catalog.names) and "respond" in text
    assert '"required":["order_id"]' in render_tools(catalog, "full")
    assert "get_order_details(order_id: string)" in render_tools(catalog, "brief")
    assert len(render_tools(catalog, "brief")) < len(render_tools(catalog, "full")) / 3


def test_catalog_rejects_a_tool_called_respond() -> None:
    with pytest.raises(ValueError, match="reserved"):
        ToolCatalog([{"type": "function", "function": {"name": "respond", "parameters": {}}}])
