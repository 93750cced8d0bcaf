"""``prour demo`` walks the chain through ``prour run``'s runner: the smoke recipe's steps in table
order, with the demo's additions as hooks around them (no command runs here: the runner's launch
of each child is recorded)."""

from __future__ import annotations

from pathlib import Path

from prour import runner as runner_module
from prour.cli import demo as demo_cli


def test_the_demo_runs_the_smoke_chain_in_table_order(monkeypatch, tmp_path: Path) -> None:
    ran: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(demo_cli, "_stage", lambda title, args: ran.append((title, args)) or 0.0)
    monkeypatch.setattr(runner_module.Runner, "_launch",
                        lambda self, step, argv, *rest: ran.append((step.name, argv)))
    monkeypatch.setattr(demo_cli, "_tiny_model", lambda *args: None)
    monkeypatch.setattr(demo_cli, "_summary", lambda *args: None)
    monkeypatch.setitem(demo_cli.DEMO_ADDITIONS, "train",
                        (lambda loaded: ["--resume", "--set", "train.total_steps=1"],
                         demo_cli.DEMO_ADDITIONS["train"][1]))
    recipe = str(demo_cli.DEFAULT_RECIPE)
    demo_cli.demo(recipe=recipe, warm=False, overrides=[f"run_dir={tmp_path}"])
    assert [title for title, _ in ran] == [
        "collect-retail", "normalize", "extract", "dataset card", "train", "training report",
        "export", "eval", "posthoc", "report"]  # smoke.yaml: nothing to serve, fixed
    # thresholds; base's episodes get the post-hoc AU/EU (Figure 6), prour records its own
    args = dict(ran)
    mine = ["--set", f"run_dir={tmp_path}"]
    assert args["collect-retail"] == ["collect", "--recipe", recipe, *mine]
    assert args["train"] == ["train", "--recipe", recipe, "--resume", "--set",
                             "train.total_steps=1", *mine]  # the user's --set last: it wins
    assert args["eval"] == ["eval", "--recipe", recipe, *mine, "--checkpoint",
                             str(tmp_path / "checkpoints")]  # train.output_dir: <run_dir>/checkpoints
    assert args["report"] == ["report", str(tmp_path / "eval")]  # the chain's own report folder
    assert args["dataset card"] == ["data", "stats", str(tmp_path / "data" / "dataset")]
