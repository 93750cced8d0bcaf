"""``prour reward probe`` on a one-row parquet, with scripted models and with the tiny model."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from prour.cli.main import app
from prour.llm.scripted import render_prompt, word_overlap_logprobs
from prour.rewards import belief_prompt

GOAL = "I want to cancel order #W1234567 because I ordered it by mistake."
HISTORY = [{"role": "user", "content": "Hello, I need help with an order."}]
runner = CliRunner()


def write_dataset(path, rows: int = 2) -> None:
    """A parquet of clarify rows as the data stage writes them (schema.Instance → write_rows)."""
    from prour.data.dataset import write_rows
    from prour.data.schema import Instance, tool_traffic_hash
    from prour.rollout.query import PROMPTS_VERSION, query_prompt

    db_hash = tool_traffic_hash("retail", "0", [])
    instances = [
        Instance(
            mode="clarify", domain="retail", task_id="0", trajectory_id="t", step=i,
            history=HISTORY, prompt=query_prompt("clarify", HISTORY), target=GOAL, au=0.4,
            eu=0.1, total=0.5, truncated=False, dropped_messages=0, prompt_tokens=90,
            target_tokens=20, decomposer_calls=3, prompts_version=PROMPTS_VERSION,
            env_history=[], db_hash=db_hash,
        )
        for i in range(rows)
    ]
    write_rows([instance.to_row(i) for i, instance in enumerate(instances)], path)


def values(output: str) -> dict[str, str]:
    return dict(re.findall(r"^([\w ]+):\s+(.*)$", output, flags=re.MULTILINE))


def test_probe_with_scripted_models(tmp_path):
    data, script, recipe = tmp_path / "d.parquet", tmp_path / "user.json", tmp_path / "r.yaml"
    write_dataset(data)
    script.write_text(
        json.dumps(
            {"rules": [{"pattern": "user: What do you", "reply": "Cancel order #W1234567."}]}
        )
    )
    policy_script = tmp_path / "policy.json"
    policy_script.write_text(json.dumps({"rules": []}))
    recipe.write_text(
        "name: probe\nmodels:\n"
        f"  generator: {{backend: scripted, script: {policy_script}}}\n"
        f"  strict_user: {{backend: scripted, script: {script}}}\n"
    )
    result = _probe(data, 1, "What do you want to do with the order?", "--recipe", recipe)
    assert result.exit_code == 0, result.output
    out = values(result.output)
    prior = sum(word_overlap_logprobs(render_prompt(belief_prompt("clarify", HISTORY)), GOAL))
    post = sum(
        word_overlap_logprobs(
            render_prompt(
                belief_prompt(
                    "clarify",
                    HISTORY,
                    "What do you want to do with the order?",
                    "Cancel order #W1234567.",
                )
            ),
            GOAL,
        )
    )
    assert out["state"] == "t#1:clarify (clarify)" and out["answer"] == "Cancel order #W1234567."
    assert float(out["l_prior"]) == pytest.approx(prior, abs=1e-4)
    assert float(out["l_post"]) == pytest.approx(post, abs=1e-4)
    assert float(out["R"]) == pytest.approx(post - prior, abs=1e-4) and post > prior


def test_probe_with_the_tiny_model_and_a_bad_row(tmp_path, tiny_model_dir):
    data = tmp_path / "d.parquet"
    write_dataset(data, rows=1)
    script, recipe = tmp_path / "user.json", tmp_path / "r.yaml"
    script.write_text(json.dumps({"default": "It is order #W1234567."}))
    recipe.write_text(  # the tiny model is the policy; the user simulator is scripted
        "name: probe\nmodels:\n"
        f"  generator: {{backend: hf, path: {tiny_model_dir}, device: cpu, dtype: float32}}\n"
        f"  strict_user: {{backend: scripted, script: {script}}}\n"
    )
    result = _probe(data, 0, "Which order is it?", "--recipe", recipe)
    assert result.exit_code == 0, result.output
    out = values(result.output)
    assert out["kind"] == "ask" and out["answer"] == "It is order #W1234567."
    assert float(out["R"]) == pytest.approx(float(out["l_post"]) - float(out["l_prior"]), abs=2e-4)
    assert float(out["l_prior"]) < 0 and int(out["target tokens"]) > 0
    result = _probe(data, 5, "Which order?", "--model", tiny_model_dir)
    assert result.exit_code == 2 and "out of range" in result.output


def _probe(data, row: int, query: str, flag: str, value):
    """``prour reward probe`` on one dataset row, with a recipe or a model folder."""
    return runner.invoke(
        app,
        ["reward", "probe", "--dataset", str(data), "--row", str(row), "--query", query,
         flag, str(value)],
    )


def test_probe_needs_models(tmp_path):
    data = tmp_path / "d.parquet"
    write_dataset(data, rows=1)
    result = runner.invoke(
        app, ["reward", "probe", "--dataset", str(data), "--row", "0", "--query", "Which?"]
    )
    assert result.exit_code == 2 and "--model" in result.output
