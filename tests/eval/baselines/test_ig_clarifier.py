"""``ig-clarifier`` end to end on 2 retail + 2 airline tasks with scripted models.

The scripted clarifier (``models.ig_clarifier``, the baseline's own trained clarifier; never
``models.generator``, prour's) answers YES with a question until the question was asked, then NO; so the clarifier's own decision makes the first turn a question and every
later one an act turn of the scripted task agent (tool call, its own question, closing).
"""

from __future__ import annotations

import json

from eval_world import CLARIFY_ANSWER, CLARIFY_Q, TASKS
from method_run import check_report, run_method

from prour.config import ModelConfig
from prour.llm.scripted import ScriptedLLM

ASK = f"YES [QUESTION]{CLARIFY_Q}[/QUESTION]"


def clarifier_llm() -> ScriptedLLM:
    """YES with the question while it is unasked, NO afterwards."""

    def reply(messages: list[dict]) -> str:
        text = "\n".join(str(m.get("content") or "") for m in messages)
        return "NO" if CLARIFY_ANSWER in text else ASK

    return ScriptedLLM(rules=[(r"must ask the user something", reply)])


CLARIFIER = {"ig_clarifier": {"backend": "scripted", "script": "ig-clarifier-ckpt"}}


def test_ig_clarifier_asks_when_the_clarifier_says_yes(tmp_path) -> None:
    run = run_method("ig-clarifier", tmp_path, llms={"ig_clarifier": clarifier_llm()},
                     models=CLARIFIER)
    for key in TASKS:
        domain, task = key.split(":")
        assert run.turns(domain, task) == ["clarify", "act", "act", "act"]
        steps = run.agent_steps(domain, task)
        assert [s.meta["query"]["kind"] for s in steps] == ["ask", "none", "none", "none"]
        assert all(s.meta["decision"] == {"router": "ig-clarifier", "route": "clarify"}
                   for s in steps)
        messages = run.episode(domain, task).messages
        assert messages[steps[0].message_index] == {"role": "assistant", "content": CLARIFY_Q}
        # one clarifier call per decision, the agent on the three act turns, the user's four
        # replies (opening, answer to the question, answer to the agent's question, stop)
        assert run.calls(domain, task) == {"ig_clarifier.chat": 4, "agent.chat": 3,
                                           "user.chat": 4}
        assert run.line(domain, task)["steps"] == {"act": 3, "clarify": 1, "verify": 0}
    assert {run.line(*k.split(":"))["score"] for k in ("retail:65", "airline:26")} == {1.0}
    assert run.label == "ig-clarifier"
    assert {line["question_writer"] for line in run.lines} == {"ig-clarifier-ckpt"}
    assert "| ig-clarifier | `ig-clarifier-ckpt` |" in run.markdown
    check_report(run)


def test_a_swapped_generator_leaves_the_clarifier_alone(tmp_path) -> None:
    """``--set models.generator…`` (and ``--checkpoint``) swap prour's generator only: the
    ig-clarifier row keeps its label and its clarifier, which the generator never replaces."""
    default = ModelConfig(backend="scripted", script="eval-generator")
    swapped = {"generator": {"backend": "scripted", "script": "clarifier-32b"}, **CLARIFIER}
    run = run_method("ig-clarifier", tmp_path, llms={"ig_clarifier": clarifier_llm()},
                     models=swapped, default_generator=default)
    assert run.label == "ig-clarifier"
    assert {line["generator"] for line in run.lines} == {None}
    assert {line["question_writer"] for line in run.lines} == {"ig-clarifier-ckpt"}
    assert all("generator.chat" not in run.calls(*k.split(":")) for k in TASKS)


def test_prour_eval_needs_the_clarifier_and_the_report_names_it(tmp_path) -> None:
    """Through the CLI: without ``models.ig_clarifier`` eval refuses ig-clarifier naming the key;
    ``--set models.ig_clarifier…`` gives it, and the report's question writers name it beside
    prour's generator (clarify-only) and base's none."""
    import yaml
    from eval_world import recipe, register_scripts
    from typer.testing import CliRunner

    from prour.cli.main import app
    from prour.llm.scripted import register_script

    register_scripts()
    register_script("trained-clarifier", clarifier_llm)
    path = tmp_path / "r.yaml"
    methods = ["ig-clarifier", "clarify-only", "base"]
    path.write_text(yaml.safe_dump(recipe(str(tmp_path), methods=methods,
                                          domains=["retail"], tasks=["retail:65"])))
    run, report = tmp_path / "run", tmp_path / "report"
    eval_args = ["eval", "--recipe", str(path), "--out", str(run), "--no-progress"]
    refused = CliRunner().invoke(app, eval_args)
    assert refused.exit_code != 0
    assert "models.ig_clarifier" in refused.output
    for args in ([*eval_args, "--set", "models.ig_clarifier.backend=scripted",
                  "--set", "models.ig_clarifier.script=trained-clarifier"],
                 ["report", str(run), "--out", str(report), "--n-boot", "20"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output + repr(result.exception)
    data = json.loads((report / "report.json").read_text())
    assert data["question_writers"] == {"ig-clarifier": ["trained-clarifier"],
                                        "clarify-only": ["eval-generator"], "base": []}
    markdown = (report / "report.md").read_text()
    assert "| ig-clarifier | `trained-clarifier` |" in markdown
    assert "| clarify-only | `eval-generator` |" in markdown
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["question_writers"] == {"ig-clarifier": "trained-clarifier",
                                              "clarify-only": "eval-generator", "base": None}
