"""Evaluation protocols as named presets: what each sets, that explicit keys win, that reports
name protocol, split, seeds and task counts, and (slow) that the oracle solves the ``paper``
protocol's 164 tasks through ``prour eval``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from prour.cli.main import app
from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.env.domains import split_task_ids
from prour.eval.harness import RESULTS_FILE, Evaluation, load_result_lines
from prour.eval.report import write_report


@pytest.mark.parametrize(("protocol", "domains", "split", "sizes"), [
    ("paper", ["retail", "airline"], "base", [114, 50]),
    ("v1-test", ["retail", "airline"], "v1-test", [96, 50]),
    ("tau3", ["retail", "airline", "telecom"], "tau3", [113, 50, 114]),
    ("tau2-test", ["retail", "airline", "telecom"], "test", [40, 20, 40]),
])
def test_a_protocol_sets_domains_split_and_seeds(protocol: str, domains: list[str], split: str,
                                                 sizes: list[int]) -> None:
    cfg = EvalConfig(protocol=protocol)
    assert (cfg.domains, cfg.split, cfg.seeds) == (domains, split, [0, 1, 2])
    assert [len(split_task_ids(d, cfg.split)) for d in cfg.domains] == sizes


def test_keys_given_explicitly_win_over_the_protocol() -> None:
    cfg = EvalConfig(protocol="paper", seeds=[0], domains=["airline"])
    assert (cfg.domains, cfg.split, cfg.seeds) == (["airline"], "base", [0])
    assert EvalConfig().split == "test" and EvalConfig().protocol is None


def test_an_unknown_protocol_names_the_key_and_the_closest() -> None:
    with pytest.raises(ValidationError, match=r"eval.protocol 'papr'.*paper.*Did you mean 'paper'"):
        EvalConfig(protocol="papr")


def test_the_report_header_names_protocol_split_seeds_and_task_counts(tmp_path: Path) -> None:
    """Two retail and one airline task of the paper protocol, two seeds, by the oracle."""
    cfg = EvalConfig(protocol="paper", methods=["oracle"], seeds=[0, 1],
                     tasks=["retail:0", "retail:1", "airline:0"], concurrency=2, judge=False)
    run = tmp_path / "run"
    Evaluation(Recipe(name="paper-head", env={"max_steps": 200}, eval=cfg), run,
               progress=False).run()
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["protocol"] == "paper"
    assert provenance["task_counts"] == {"retail": 2, "airline": 1}
    text = write_report([run], tmp_path / "report", n_boot=50)["markdown"].read_text()
    assert f"- run `{run}`" in text
    assert "protocol `paper` (split base); seeds 0, 1; tasks: retail 2, airline 1" in text


@pytest.mark.slow
@pytest.mark.full  # 164 episodes (one seed to keep it to minutes: the oracle is deterministic)
def test_prour_eval_with_the_paper_protocol_solves_all_164_tasks_by_oracle(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "paper-oracle", "run_dir": str(tmp_path / "run"),
                                      "env": {"max_steps": 200},
                                      "eval": {"protocol": "paper", "judge": False}}))
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "--recipe", str(recipe), "--method", "oracle",
                                      "--seeds", "0", "--concurrency", "2", "--out", str(out),
                                      "--no-progress"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    lines = list(load_result_lines(out / RESULTS_FILE).values())
    assert len(lines) == 164
    assert {d: sum(line["domain"] == d for line in lines) for d in ("retail", "airline")} == {
        "retail": 114, "airline": 50}
    assert [line["task_id"] for line in lines if line["score"] != 1.0] == []
    text = write_report([out], tmp_path / "report", n_boot=50)["markdown"].read_text()
    assert "protocol `paper` (split base); seeds 0; tasks: retail 114, airline 50" in text
