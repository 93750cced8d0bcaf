"""Strict parsing, schema validation, canonical form and de-duplication of candidate actions.

A candidate is one JSON object with exactly the keys ``tool`` and ``arguments``; ``tool`` names a
tool of the domain (its OpenAI function schema validates ``arguments``) or ``respond`` with an
empty arguments object. Argument names the schema does not declare are rejected too (the tau2
tool would fail on them). Invalid samples are counted by reason and dropped, never resampled.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from prour.llm.toolcalls import split_thinking

RESPOND = "respond"
ACTION_KEYS = frozenset({"tool", "arguments"})


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, non-ASCII kept: one string per distinct action."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise _DuplicateKey(repeated[0])
    return dict(pairs)


class _DuplicateKey(ValueError):
    pass


def _function(schema: dict[str, Any]) -> dict[str, Any]:
    """The ``function`` part of an OpenAI tool schema (or the schema itself if already bare)."""
    return schema.get("function", schema)


class ToolCatalog:
    """The domain's tools by name, each with a compiled validator for its arguments."""

    def __init__(self, tools: Sequence[dict[str, Any]]):
        self.schemas: dict[str, dict[str, Any]] = {}
        self.validators: dict[str, Draft202012Validator] = {}
        for schema in tools:
            fn = _function(schema)
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"tool schema without a name: {json.dumps(schema)[:200]}")
            if name == RESPOND:
                raise ValueError(f"a domain tool may not be called {RESPOND!r} (reserved)")
            params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
            params.setdefault("additionalProperties", False)
            Draft202012Validator.check_schema(params)
            self.schemas[name] = schema
            self.validators[name] = Draft202012Validator(params)

    @property
    def names(self) -> list[str]:
        return list(self.schemas)


@dataclass(frozen=True)
class ParsedAction:
    """Outcome of parsing one sample: ``canonical`` when valid, else the ``reason`` it is not."""

    canonical: str | None
    reason: str | None = None
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.canonical is not None


def _invalid(reason: str, detail: str = "") -> ParsedAction:
    return ParsedAction(canonical=None, reason=reason, detail=detail)


def _decode(text: str) -> tuple[Any, ParsedAction | None]:
    """Strict JSON decoding (whole text, no duplicate keys); an error outcome on failure."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys), None
    except _DuplicateKey as exc:
        return None, _invalid("duplicate_key", str(exc))
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, _invalid("not_json", str(exc))


def parse_action(text: str, catalog: ToolCatalog) -> ParsedAction:
    """Parse one model sample into a canonical action, or say why it is invalid."""
    obj, error = _decode(text.strip())
    if error is not None:
        return error
    if not isinstance(obj, dict):
        return _invalid("not_object", type(obj).__name__)
    if set(obj) != ACTION_KEYS:
        return _invalid("wrong_keys", ",".join(sorted(obj)))
    tool, arguments = obj["tool"], obj["arguments"]
    if not isinstance(tool, str):
        return _invalid("tool_not_string", repr(tool)[:80])
    if not isinstance(arguments, dict):
        return _invalid("arguments_not_object", type(arguments).__name__)
    if tool == RESPOND:
        if arguments:
            return _invalid("respond_with_arguments", ",".join(sorted(arguments)))
    elif tool not in catalog.validators:
        return _invalid("unknown_tool", tool)
    else:
        error = best_match(catalog.validators[tool].iter_errors(arguments))
        if error is not None:
            return _invalid("schema", f"{tool}: {error.message}")
    return ParsedAction(canonical=canonical_json({"tool": tool, "arguments": arguments}))


def answer_text(raw: str) -> str:
    """The answer part of a sample: what follows its think block (nothing if it never closes)."""
    return split_thinking(raw)[1].strip()


@dataclass
class CandidateSet:
    """De-duplicated valid actions in first-seen order, plus invalid counts by reason."""

    candidates: list[str] = field(default_factory=list)
    invalid: Counter[str] = field(default_factory=Counter)
    n_samples: int = 0

    @property
    def n_invalid(self) -> int:
        return sum(self.invalid.values())


def collect_candidates(samples: Iterable[str], catalog: ToolCatalog) -> CandidateSet:
    """Parse every sample, count the invalid ones, and keep each valid action once."""
    result = CandidateSet()
    seen: set[str] = set()
    for sample in samples:
        result.n_samples += 1
        parsed = parse_action(answer_text(sample), catalog)
        if not parsed.valid:
            result.invalid[parsed.reason or "invalid"] += 1
        elif parsed.canonical not in seen:
            seen.add(parsed.canonical)
            result.candidates.append(parsed.canonical)
    return result


def _without_titles(node: Any) -> Any:
    """Drop pydantic's ``title`` strings from a JSON schema: they repeat the names, cost tokens."""
    if isinstance(node, dict):
        return {
            key: _without_titles(value)
            for key, value in node.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_without_titles(v) for v in node]
    return node


def _type_name(schema: dict[str, Any]) -> str:
    """A short type for a signature: ``string``, ``array of string``, ``object``, ``any``."""
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type_name(schema.get('items') or {})}"
    return kind if isinstance(kind, str) else "any"


def _signature(name: str, fn: dict[str, Any]) -> str:
    """``name(arg: type, opt?: type): first sentence of the description``."""
    params = fn.get("parameters") or {}
    required = set(params.get("required") or [])
    args = [
        f"{arg}{'' if arg in required else '?'}: {_type_name(spec)}"
        for arg, spec in (params.get("properties") or {}).items()
    ]
    description = " ".join(str(fn.get("description", "")).split())
    first = description.split(". ")[0].rstrip(".")
    return f"- {name}({', '.join(args)}): {first}."


def render_tools(catalog: ToolCatalog, detail: str) -> str:
    """Tools for prompts, one line each: ``full`` gives each argument JSON schema, ``brief`` a
    typed signature (for small context windows); ``respond`` is listed last."""
    if detail not in ("full", "brief"):
        raise ValueError(f"tool detail must be 'full' or 'brief', got {detail!r}")
    lines = []
    for name, schema in catalog.schemas.items():
        fn = _function(schema)
        if detail == "brief":
            lines.append(_signature(name, fn))
            continue
        params = _without_titles(fn.get("parameters") or {"type": "object", "properties": {}})
        description = " ".join(str(fn.get("description", "")).split())
        lines.append(f"- {name}: {description} Arguments schema: {canonical_json(params)}")
    lines.append(f"- {RESPOND}(): reply to the user in words, without a tool; arguments {{}}.")
    return "\n".join(lines)
