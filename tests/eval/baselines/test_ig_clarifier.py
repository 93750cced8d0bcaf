"""``ig-clarifier`` end to end on 2 retail + 2 airline tasks with scripted models.

The scripted clarifier (``models.generator``) answers YES with a question until the question
was asked, then NO; so the clarifier's own decision makes the first turn a question and every
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


def test_ig_clarifier_asks_when_the_clarifier_says_yes(tmp_path) -> None:
    run = run_method("ig-clarifier", tmp_path, llms={"generator": clarifier_llm()})
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
        assert run.calls(domain, task) == {"generator.chat": 4, "agent.chat": 3, "user.chat": 4}
        assert run.line(domain, task)["steps"] == {"act": 3, "clarify": 1, "verify": 0}
    assert {run.line(*k.split(":"))["score"] for k in ("retail:65", "airline:26")} == {1.0}
    assert run.label == "ig-clarifier"
    check_report(run)


def test_a_swapped_generator_labels_the_report_row(tmp_path) -> None:
    """``--set models.generator…`` swaps the clarifier; the report row names it."""
    default = ModelConfig(backend="scripted", script="eval-generator")
    swapped = {"generator": {"backend": "scripted", "script": "clarifier-32b"}}
    run = run_method("ig-clarifier", tmp_path, llms={"generator": clarifier_llm()},
                     models=swapped, default_generator=default)
    assert run.label == "ig-clarifier (generator clarifier-32b)"
    assert {line["generator"] for line in run.lines} == {"clarifier-32b"}
    assert "| ig-clarifier (generator clarifier-32b) |" in run.markdown


def test_prour_eval_set_generator_labels_the_row(tmp_path) -> None:
    """Through the CLI: ``--set models.generator.script=…`` is a swap, the recipe file's own
    generator the default."""
    import yaml
    from eval_world import recipe, register_scripts
    from typer.testing import CliRunner

    from prour.cli.main import app
    from prour.llm.scripted import register_script

    register_scripts()
    register_script("swapped-clarifier", clarifier_llm)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe(str(tmp_path), methods=["ig-clarifier", "base"],
                                          domains=["retail"], tasks=["retail:65"])))
    run, report = tmp_path / "run", tmp_path / "report"
    for args in (["eval", "--recipe", str(path), "--out", str(run), "--no-progress",
                  "--set", "models.generator.script=swapped-clarifier"],
                 ["report", str(run), "--out", str(report), "--n-boot", "20"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output + repr(result.exception)
    labels = [s["label"] for s in json.loads((report / "report.json").read_text())["systems"]]
    assert labels == ["ig-clarifier (generator swapped-clarifier)", "base"]  # base has none
