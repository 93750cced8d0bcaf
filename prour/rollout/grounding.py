"""Deterministic check that a verifier answer cites evidence (no model involved).

An answer counts as grounded when it contains at least one of:

* ``tool``: the name of a tool the verifier called successfully *and* a value that this call
  returned (a string of 3+ characters or a number, matched as a whole token);
* ``computation``: an arithmetic expression ``a op b … = c`` that evaluates to ``c`` (to within
  a cent) whose inputs appear in a tool result or in the dialogue (small counts, integers up to
  10, may be unobserved, but at least one input must be observed);
* ``policy``: a quoted span (in ``"…"`` or ``“…”``) of at least four words that occurs verbatim,
  up to case and whitespace, in the domain policy.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

INSUFFICIENT = "insufficient evidence"
SMALL_COUNT = 10  # integers up to this may enter a computation unobserved (quantities, bags)

Evidence = Literal["tool", "computation", "policy"]

_NUMBER = r"\$?\d[\d,]*(?:\.\d+)?"
_EXPRESSION = re.compile(
    rf"(?P<lhs>\(?\s*{_NUMBER}\s*\)?(?:\s*[-+*/×]\s*\(?\s*{_NUMBER}\s*\)?)+)\s*=\s*(?P<rhs>-?{_NUMBER})"
)
_NUMBER_TOKEN = re.compile(r"(?<![\w.])-?\$?\d[\d,]*(?:\.\d+)?(?![\w])")
_QUOTE = re.compile(r"\"([^\"]+)\"|“([^”]+)”")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


@dataclass(frozen=True)
class ToolEvidence:
    """One successful tool call seen by the verifier: its name and verbatim output."""

    name: str
    output: str


def _leaves(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def output_values(output: str) -> set[str]:
    """Citable values of a tool output: JSON scalars (numbers in their usual spellings) or the text."""
    try:
        parsed = json.loads(output)
    except (json.JSONDecodeError, TypeError):
        parsed = output
    values: set[str] = set()
    for leaf in _leaves(parsed):
        if isinstance(leaf, bool) or leaf is None:
            continue
        if isinstance(leaf, (int, float)):
            values.update({str(leaf), f"{leaf:.2f}", f"{leaf:,.2f}"})
            if float(leaf).is_integer():
                values.add(str(int(leaf)))
        elif isinstance(leaf, str) and len(leaf.strip()) >= 3:
            values.add(leaf.strip())
    return values


def _mentions(answer: str, value: str) -> bool:
    pattern = rf"(?<![\w.]){re.escape(value)}(?![\w])"
    return re.search(pattern, answer, flags=re.IGNORECASE) is not None


def cites_tool(answer: str, evidence: Iterable[ToolEvidence]) -> bool:
    """True if the answer names a called tool and quotes a value that call returned."""
    for item in evidence:
        if not _mentions(answer, item.name):
            continue
        if any(_mentions(answer, v) for v in output_values(item.output)):
            return True
    return False


def _to_float(token: str) -> float:
    return float(token.replace("$", "").replace(",", ""))


def _evaluate(expression: str) -> float | None:
    """Evaluate ``+ - * /`` over numbers with Python precedence; None if it is anything else."""
    clean = re.sub(
        _NUMBER, lambda m: repr(_to_float(m.group())), expression.replace("×", "*")
    ).strip()
    try:
        tree = ast.parse(clean, mode="eval")
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported expression node {type(node).__name__}")

    try:
        return walk(tree)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_in(text: str) -> set[float]:
    """All numbers written in ``text`` (``$1,234.50`` → 1234.5), rounded to cents."""
    found = set()
    for token in _NUMBER_TOKEN.findall(text):
        try:
            found.add(round(_to_float(token), 2))
        except ValueError:
            continue
    return found


def shows_computation(answer: str, known_numbers: set[float]) -> bool:
    """True if the answer holds a correct ``inputs = result`` line whose inputs are all observed."""
    for match in _EXPRESSION.finditer(answer):
        value = _evaluate(match.group("lhs"))
        if value is None:
            continue
        result = _to_float(match.group("rhs"))
        inputs = [round(_to_float(t), 2) for t in re.findall(_NUMBER, match.group("lhs"))]
        if abs(value - result) <= 0.01 + 1e-9 * abs(result) and _inputs_observed(
            inputs, known_numbers
        ):
            return True
    return False


def _inputs_observed(inputs: list[float], known_numbers: set[float]) -> bool:
    """At least one input was observed and the rest were too or are small counts (integers <= 10)."""
    observed = [x in known_numbers for x in inputs]
    counts = [x.is_integer() and 0 <= x <= SMALL_COUNT for x in inputs]
    return any(observed) and all(o or c for o, c in zip(observed, counts))


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


def quotes_policy(answer: str, policy: str, min_words: int = 4) -> bool:
    """True if a quoted span of the answer (``min_words``+ words) is found verbatim in the policy."""
    norm_policy = _normalize(policy)
    for match in _QUOTE.finditer(answer):
        span = _normalize(match.group(1) or match.group(2)).strip(" .,;:")
        if len(span.split()) >= min_words and span in norm_policy:
            return True
    return False


def grounding(
    answer: str, evidence: list[ToolEvidence], policy: str, context: str = ""
) -> Evidence | None:
    """Which kind of evidence the answer cites (checked tool, computation, policy), or None."""
    if is_insufficient(answer):
        return None
    if cites_tool(answer, evidence):
        return "tool"
    known = numbers_in(context)
    for item in evidence:
        known |= numbers_in(item.output)
    if shows_computation(answer, known):
        return "computation"
    if quotes_policy(answer, policy):
        return "policy"
    return None


def is_insufficient(answer: str) -> bool:
    """True if the answer is (a spelling of) the abstention ``insufficient evidence``."""
    return _normalize(answer).strip(" .!\"'") == INSUFFICIENT
