"""Candidate actions for the decomposer's targets: the next reference call, ``respond``, or a
valid call of another tool with arguments built from its JSON schema and values seen in the
domain's transcripts.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

from prour.demo.transcripts import DecisionPoint


def scalar_leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(key, value) for every string or number leaf of a JSON value (list items keep their key)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from scalar_leaves(v, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from scalar_leaves(item, key)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield key, value


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow a local ``$ref`` and take the first non-null option of ``anyOf``."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = defs.get(ref.rsplit("/", 1)[-1], {})
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        typed = [o for o in options if o.get("type") != "null"]
        schema = _resolve(typed[0] if typed else options[0], defs)
    return schema


def schema_value(
    schema: dict[str, Any],
    key: str,
    pool: dict[str, list[Any]],
    rng: random.Random,
    defs: dict[str, Any],
    depth: int = 0,
) -> Any:
    """A plausible value for an argument: one seen under the same key, else one of its type."""
    schema = _resolve(schema, defs)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        item = schema_value(schema.get("items") or {}, key.rstrip("s"), pool, rng, defs, depth + 1)
        return [item]
    if kind == "object" or "properties" in schema:
        return schema_arguments(schema, pool, rng, defs, depth + 1)
    seen = next(
        (found for found in (_pooled(pool, k, kind) for k in _key_suffixes(key)) if found), []
    )
    if seen:
        return rng.choice(seen)
    if kind in ("integer", "number"):
        return rng.randint(1, 3)
    if kind == "boolean":
        return rng.random() < 0.5
    return f"{key}_{rng.randint(1, 9)}" if key else "value"


def _key_suffixes(key: str) -> list[str]:
    """``new_item_id`` → ``new_item_id``, ``item_id``, ``id``: where to look for seen values."""
    parts = key.split("_")
    return ["_".join(parts[i:]) for i in range(len(parts))]


def _pooled(pool: dict[str, list[Any]], key: str, kind: Any) -> list[Any]:
    return [v for v in pool.get(key, []) if _fits(v, kind)]


def _fits(value: Any, kind: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str) if kind in (None, "string") else False


def schema_arguments(
    schema: dict[str, Any],
    pool: dict[str, list[Any]],
    rng: random.Random,
    defs: dict[str, Any] | None = None,
    depth: int = 0,
    optional_rate: float = 0.0,
) -> dict[str, Any]:
    """Arguments for a JSON-schema object: every required property (optional ones at a rate)."""
    defs = {**(defs or {}), **(schema.get("$defs") or {})}
    if depth > 4:
        return {}
    required = set(schema.get("required") or [])
    return {
        key: schema_value(spec, key, pool, rng, defs, depth)
        for key, spec in (schema.get("properties") or {}).items()
        if key in required or rng.random() < optional_rate
    }


def value_pool(points: Sequence[DecisionPoint], per_key: int = 3) -> dict[str, list[Any]]:
    """The first ``per_key`` values seen under each key in tool calls and results.

    Few values per key on purpose: variants then reuse a small set the tiny model can learn to
    write, so its sampled variants stay well-formed (ids it cannot copy yet would not).
    """
    pool: dict[str, list[Any]] = {}
    for point in points:
        call = point.call
        leaves = list(scalar_leaves(call[1])) if call else []
        with contextlib.suppress(json.JSONDecodeError):
            leaves += list(scalar_leaves(json.loads(point.observation or "")))
        for key, value in leaves:
            seen = pool.setdefault(key, [])
            if key and value not in seen and len(seen) < per_key:
                seen.append(value)
    return pool


def variant_action(
    catalog: Any,
    pool: dict[str, list[Any]],
    rng: random.Random,
    names: Sequence[str] | None = None,
    tries: int = 6,
) -> str | None:
    """Canonical JSON of a valid call of a random tool (of ``names``, default all of the domain)
    with schema-built arguments."""
    from prour.router.candidates import canonical_json, parse_action

    for _ in range(tries):
        name = rng.choice(list(names or catalog.names))
        params = catalog.schemas[name].get("function", catalog.schemas[name]).get("parameters")
        arguments = schema_arguments(params or {}, pool, rng)
        parsed = parse_action(canonical_json({"tool": name, "arguments": arguments}), catalog)
        if parsed.valid:
            return parsed.canonical
    return None


def is_simple(canonical: str, max_arguments: int = 3) -> bool:
    """An action with at most ``max_arguments`` scalar arguments of modest length."""
    arguments = json.loads(canonical)["arguments"]
    return len(arguments) <= max_arguments and all(
        isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 40)
        for v in arguments.values()
    )


def as_sampled(canonical: str) -> str:
    """An action in the shape the action prompt shows: ``{"tool": …, "arguments": …}``.

    The tool comes first so that the arguments are written knowing the tool; the parser accepts
    any key order and canonicalizes.
    """
    action = json.loads(canonical)
    return json.dumps(
        {"tool": action["tool"], "arguments": action["arguments"]}, ensure_ascii=False
    )


def respond_action() -> str:
    """Canonical JSON of the decomposer's "answer the user" action."""
    from prour.router.candidates import RESPOND, canonical_json

    return canonical_json({"tool": RESPOND, "arguments": {}})


def next_action(point: DecisionPoint) -> str:
    """Canonical JSON of the decision: its first tool call, or ``respond`` for a text reply."""
    from prour.router.candidates import canonical_json

    call = point.call
    if call is None:
        return respond_action()
    return canonical_json({"tool": call[0], "arguments": call[1]})
