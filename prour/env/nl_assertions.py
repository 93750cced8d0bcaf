"""tau2's natural-language assertion check without tau2's LLM stack: the judge's prompt and the
shape of its reply, read from the installed tau2, and the check's value from the verdicts.

tau2 scores a task's ``nl_assertions`` in ``tau2.evaluator.evaluator_nl_assertions``: its
``NLAssertionsEvaluator.evaluate_nl_assertions`` sends one model (tau2's default: the
``DEFAULT_LLM_NL_ASSERTIONS`` of ``tau2.config``, at its temperature) a system prompt and a
user prompt that holds the whole conversation (one ``role: content`` line per message) and the
list of assertions, parses the reply as JSON and makes one verdict per entry of its result
list; ``calculate_reward`` gives 1 when every verdict is met, else 0. That module imports
litellm at load, which prour's lean install leaves out, so, as :mod:`prour.env.prompts` does for
the agent's and the user's prompts, the system prompt (a string literal), the user prompt (an
f-string over the conversation and the assertions) and the reply's field names (the keys tau2
reads where it builds each verdict) are read from the module's source without running it.
tests/env/test_nl_assertions.py runs tau2's own evaluator (litellm from the dev install) and
checks that the prompts built here are the ones it sends.

Where prour is stricter than tau2: a reply must grade as many outcomes as the task has
assertions and each ``metExpectation`` must be a JSON boolean (tau2 takes what comes: a reply
that grades nothing counts as all met there); a reply that is not so is asked again
(:func:`prour.llm.strict_json.ask_json`) rather than scored.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Any

from prour.env.prompts import _literal, _module_path

MODULE = "tau2.evaluator.evaluator_nl_assertions"
EVALUATOR = "NLAssertionsEvaluator"
METHOD = "evaluate_nl_assertions"
VERDICT = "NLAssertionCheck"  # tau2's record of one verdict, built from one entry of the reply


@dataclass(frozen=True)
class NLPrompt:
    """tau2's judge prompt: the system text, and the user text as literal pieces and the names
    of the values tau2 formats between them (``None`` for a literal piece)."""

    system: str
    user: tuple[tuple[str, str | None], ...]

    def user_text(self, **values: Any) -> str:
        """The user prompt with ``values`` formatted in as the f-string does (``format(v, "")``)."""
        missing = sorted({name for _, name in self.user if name is not None} - set(values))
        if missing:
            raise ValueError(f"tau2's NL-assertion prompt needs the value(s) {missing}")
        return "".join(text if name is None else format(values[name], "")
                       for text, name in self.user)


@dataclass(frozen=True)
class ReplyFormat:
    """Where tau2 reads the verdicts in the judge's JSON reply: the list's key, and in each
    entry the keys of the assertion graded, whether it was met and the reasoning."""

    results: str
    assertion: str
    met: str
    reasoning: str


@functools.cache
def _method() -> tuple[str, ast.FunctionDef]:
    """(source path, the evaluator's method that holds the prompts and reads the reply)."""
    path = _module_path(MODULE)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == EVALUATOR:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == METHOD:
                    return str(path), item
    raise RuntimeError(_moved(str(path), f"{EVALUATOR}.{METHOD}"))


def _moved(path: str, what: str) -> str:
    return (f"{path}: tau2 no longer defines {what} as prour reads it (the NL-assertion judge's "
            "prompt and reply format come from there; prour/env/nl_assertions.py needs updating)")


def _assigned(function: ast.FunctionDef, name: str) -> ast.expr | None:
    """The value of the one plain assignment ``name = ...`` in the function's body."""
    for node in ast.walk(function):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            return node.value
    return None


def _fstring_pieces(node: ast.expr | None) -> tuple[tuple[str, str | None], ...] | None:
    """An f-string made of literal text and plain ``{name}`` fields, as pieces; else None."""
    if not isinstance(node, ast.JoinedStr):
        return None
    pieces: list[tuple[str, str | None]] = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            pieces.append((value.value, None))
        elif (isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name)
              and value.conversion == -1 and value.format_spec is None):
            pieces.append(("", value.value.id))
        else:
            return None
    return tuple(pieces)


@functools.cache
def nl_prompt() -> NLPrompt:
    """tau2's NL-assertion judge prompt (``system_prompt`` and ``user_prompt`` of
    ``NLAssertionsEvaluator.evaluate_nl_assertions``), read from the installed tau2's source."""
    path, function = _method()
    system = _assigned(function, "system_prompt")
    system_text = _literal(system) if system is not None else None
    user = _fstring_pieces(_assigned(function, "user_prompt"))
    if system_text is None or user is None:
        raise RuntimeError(_moved(path, f"{METHOD}'s system_prompt literal and user_prompt "
                                  "f-string"))
    return NLPrompt(system_text, user)


@functools.cache
def reply_format() -> ReplyFormat:
    """The reply's keys as tau2 reads them: ``result_data.get("<results>", [])`` and, per entry,
    ``NLAssertionCheck(nl_assertion=result["<a>"], met=result["<m>"], justification=
    result["<r>"])``."""
    path, function = _method()
    for node in ast.walk(function):
        if not (isinstance(node, ast.ListComp) and isinstance(node.elt, ast.Call)
                and isinstance(node.elt.func, ast.Name) and node.elt.func.id == VERDICT
                and len(node.generators) == 1):
            continue
        source = node.generators[0].iter
        keys = {keyword.arg: keyword.value.slice.value for keyword in node.elt.keywords
                if isinstance(keyword.value, ast.Subscript)
                and isinstance(keyword.value.slice, ast.Constant)
                and isinstance(keyword.value.slice.value, str)}
        if (isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute)
                and source.func.attr == "get" and source.args
                and isinstance(source.args[0], ast.Constant)
                and isinstance(source.args[0].value, str)
                and {"nl_assertion", "met", "justification"} <= set(keys)):
            return ReplyFormat(source.args[0].value, keys["nl_assertion"], keys["met"],
                               keys["justification"])
    raise RuntimeError(_moved(path, f"the {VERDICT}(...) list built from the judge's reply"))


def conversation_text(messages: list[Any]) -> str:
    """The conversation as tau2 shows it to the judge: one ``role: content`` line per tau2
    message (a message without text shows ``None``, as in tau2)."""
    return "\n".join(f"{message.role}: {message.content}" for message in messages)


def judge_messages(messages: list[Any], assertions: list[str]) -> list[dict[str, str]]:
    """The chat tau2 sends its NL-assertion judge for a conversation (tau2 messages, as
    :func:`prour.env.scoring.to_tau2_messages` gives them) and a task's assertions."""
    prompt = nl_prompt()
    user = prompt.user_text(trajectory_str=conversation_text(messages),
                            nl_assertions=assertions)
    return [{"role": "system", "content": prompt.system}, {"role": "user", "content": user}]


def parse_verdicts(data: dict[str, Any], assertions: int) -> list[dict[str, Any]]:
    """The verdicts of a parsed judge reply, one ``{assertion, met, reasoning}`` per graded
    outcome in the reply's order; a ValueError says what is wrong (for the judge to retry)."""
    fmt = reply_format()
    results = data.get(fmt.results)
    if not isinstance(results, list):
        raise ValueError(f"expected a list under {fmt.results!r}")  # noqa: TRY004
    if len(results) != assertions:
        raise ValueError(f"{fmt.results!r} grades {len(results)} outcome(s); the input lists "
                         f"{assertions}: grade each expected outcome once")
    verdicts = []
    for i, entry in enumerate(results):
        where = f"{fmt.results}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")  # noqa: TRY004
        missing = [k for k in (fmt.assertion, fmt.met, fmt.reasoning) if k not in entry]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
        met = entry[fmt.met]
        if not isinstance(met, bool):
            message = f"{where}.{fmt.met} must be true or false, got {met!r}"
            raise ValueError(message)  # noqa: TRY004 - the judge is told and asked again
        verdicts.append({"assertion": str(entry[fmt.assertion]), "met": met,
                         "reasoning": str(entry[fmt.reasoning])})
    return verdicts


def nl_check(verdicts: list[dict[str, Any]]) -> float:
    """tau2's NL-assertion check: 1 when every verdict is met, else 0."""
    return 1.0 if all(verdict["met"] for verdict in verdicts) else 0.0


def tau2_judge_temperature() -> float:
    """The temperature tau2 samples its NL-assertion judge at (``tau2.config``)."""
    from prour.env.domains import require_tau2

    require_tau2()
    from tau2.config import DEFAULT_LLM_NL_ASSERTIONS_ARGS

    return float(DEFAULT_LLM_NL_ASSERTIONS_ARGS.get("temperature", 0.0))


def tau2_judge_model() -> str:
    """tau2's own default NL-assertion judge model (``tau2.config``), named in reports."""
    from prour.env.domains import require_tau2

    require_tau2()
    from tau2.config import DEFAULT_LLM_NL_ASSERTIONS

    return str(DEFAULT_LLM_NL_ASSERTIONS)
