"""The verifier's deterministic evidence check, on hand-written answers."""

from __future__ import annotations

from prour.rollout.grounding import (
    ToolEvidence,
    cites_tool,
    grounding,
    is_insufficient,
    numbers_in,
    output_values,
    quotes_policy,
    shows_computation,
)

ORDER = ToolEvidence(
    "get_order_details",
    '{"order_id": "#W1", "status": "pending", "items": [{"price": 342.81, "item_id": "4202497723"}]}',
)
POLICY = "Before taking any action that updates the database, you must obtain explicit user confirmation."


def test_output_values_flattens_json_and_spells_numbers():
    values = output_values(ORDER.output)
    assert {"#W1", "pending", "342.81", "4202497723"} <= values
    assert "status" not in values  # keys are not evidence
    assert output_values("yusuf_rossi_9620") == {"yusuf_rossi_9620"}
    assert {"305", "305.00"} <= output_values('{"total": 305}')


def test_tool_citation_needs_the_name_and_a_returned_value():
    assert cites_tool('get_order_details(order_id="#W1") returned status "pending".', [ORDER])
    assert not cites_tool("The order is pending.", [ORDER])  # value without the tool
    assert not cites_tool("get_order_details says the order is cancelled.", [ORDER])  # wrong value
    assert not cites_tool("get_order_details returned 4202497", [ORDER])  # partial id is no match


def test_computation_must_be_correct_and_use_observed_inputs():
    known = numbers_in('{"price": 150} {"price": 155}')
    assert known == {150.0, 155.0}
    assert shows_computation("Total = $150 + $155 = $305", known)
    assert shows_computation("1,150.50 - 150.50 = 1000", numbers_in("paid 1,150.50 and 150.50"))
    assert not shows_computation("Total = 150 + 155 = 300", known)  # wrong result
    assert not shows_computation("Total = 150 + 156 = 306", known)  # input never observed
    assert not shows_computation("The total is 305", known)  # no inputs shown
    assert shows_computation("150 * 3 = 450", known)  # a small count may be unobserved
    assert not shows_computation("2 + 3 = 5", known)  # but something must come from evidence


def test_policy_quote_must_be_verbatim_and_long_enough():
    assert quotes_policy('The policy says "you must obtain explicit user confirmation".', POLICY)
    assert quotes_policy("Policy: “Before taking any ACTION that updates the database”", POLICY)
    assert not quotes_policy('"you must obtain"', POLICY)  # fewer than four words
    assert not quotes_policy('"you must obtain written user confirmation"', POLICY)  # not in policy


def test_grounding_kinds_and_abstention():
    assert grounding('get_order_details returned "pending"', [ORDER], POLICY) == "tool"
    assert grounding("342.81 * 2 = 685.62", [ORDER], POLICY) == "computation"
    assert grounding('"you must obtain explicit user confirmation"', [], POLICY) == "policy"
    assert grounding("It is probably pending.", [ORDER], POLICY) is None
    assert grounding("insufficient evidence", [ORDER], POLICY) is None
    assert is_insufficient("Insufficient evidence.") and not is_insufficient(
        "insufficient evidence here"
    )
