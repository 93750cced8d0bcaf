"""Rendering the sbatch templates and planning a submission (no Slurm needed).

Rendered scripts are checked by bash itself (`bash -n`) and run under bash with a stand-in
`prour` to see the command each job really runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import write_recipe

from prour.cluster.jobs import dry_run_text
from prour.cluster.slurm import (
    BLOCK_END,
    BLOCK_START,
    TEMPLATES,
    RenderError,
    SubmitRequest,
    default_templates_dir,
    plan_submission,
    render_directives,
    render_script,
)
from prour.config import ConfigError
from prour.recipes import load_recipe

RAY_NCCL_VARIABLES = (
    "RAY_ADDRESS",
    "RAY_PORT",
    "RAY_TMPDIR",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_DEBUG",
    "NCCL_P2P_DISABLE",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "CUDA_VISIBLE_DEVICES",
    "VLLM_HOST_IP",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "SLURM_JOB_NODELIST",
    "head_ip",
)


def verl_train(nnodes: int, gpus: int, mini_batch_states: int) -> dict:
    """A verl train section whose batch arithmetic fits the GPUs: 16 states, each keeping one
    sample per data-parallel rank (verl splits every state's kept samples over the ranks)."""
    ranks = nnodes * gpus
    return {
        "backend": "verl",
        "rollout": {"n": ranks, "keep": ranks},
        "ppo": {"mini_batch_states": mini_batch_states},
        "verl": {"nnodes": nnodes, "n_gpus_per_node": gpus},
    }


def base_recipe(tmp_path: Path, **sections) -> dict:
    data = {
        "name": "unit",
        "run_dir": str(tmp_path / "run"),
        "models": {"generator": {"backend": "hf", "path": "Qwen/Qwen3-1.7B"}},
    }
    data.update(sections)
    return data


def plan(tmp_path: Path, data: dict, stages=None, overrides=(), **asked) -> tuple:
    """The recipe and the jobs of a submission (``stages=None``: the chain)."""
    path = write_recipe(tmp_path / "recipe.yaml", data)
    loaded = load_recipe(path, list(overrides), cluster=True)
    request = SubmitRequest(path, None if stages is None else list(stages), tmp_path / "run",
                            list(overrides), tmp_path, **asked)
    return loaded, plan_submission(loaded, request)


def run_script(script: str, tmp_path: Path, name: str) -> tuple[list[str], str]:
    """Run a rendered job script with a stand-in `prour` that records its arguments; returns
    them and what the script printed."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "prour").write_text('#!/bin/bash\nprintf "%s\\n" "$@" >> "$PROUR_ARGS_OUT"\n')
    (fake_bin / "prour").chmod(0o755)
    out = tmp_path / f"args-{name}"
    out.unlink(missing_ok=True)
    path = tmp_path / f"{name}.sbatch"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "PROUR_ARGS_OUT": str(out),
           "SLURM_JOB_ID": "99"}
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    return out.read_text().splitlines(), done.stdout


def bash_syntax_ok(script: str, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(script)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_multinode_script_names_every_ray_and_nccl_variable(tmp_path: Path) -> None:
    train = verl_train(nnodes=4, gpus=8, mini_batch_states=16)  # 512 samples over 32 GPUs
    slurm = {
        "defaults": {"partition": "gpu", "account": "proj"},
        "env": {"NCCL_SOCKET_IFNAME": "ib0"},
        "ray_port": 6400,
    }
    _, submission = plan(tmp_path, base_recipe(tmp_path, train=train, slurm=slurm),
                         stages=["train"])
    (train_plan,) = submission.plans
    assert train_plan.template.endswith("train_multinode.sbatch")
    script = train_plan.script
    bash_syntax_ok(script, tmp_path, "train.sbatch")
    missing = [name for name in RAY_NCCL_VARIABLES if name not in script]
    assert not missing, f"multi-node script does not name {missing}"
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "PROUR_GPUS_PER_NODE=8",
        "RAY_PORT=6400",
        "export NCCL_SOCKET_IFNAME=ib0",
        (f"PROUR_COMMAND=(run --recipe {tmp_path / 'recipe.yaml'} "
         f"--set run_dir={tmp_path / 'run'} --only train)"),
    ):
        assert line in script.splitlines(), line
    code = [re.sub(r"\s+#\s.*$", "", ln) for ln in script.splitlines() if not ln.startswith("#")]
    code = [ln for ln in code if "REPLACE_ME" in ln]
    assert code == [] and train_plan.notes == []


def test_node_count_lives_in_train_verl_only(tmp_path: Path) -> None:
    train = verl_train(nnodes=2, gpus=4, mini_batch_states=4)
    with pytest.raises(ConfigError) as info:
        plan(
            tmp_path,
            base_recipe(tmp_path, train=train, slurm={"train": {"nodes": 3}}),
            stages=["train"],
        )
    assert info.value.key == "slurm.train.nodes"


@pytest.mark.parametrize("template", sorted(set(TEMPLATES.values())))
def test_templates_are_valid_bash_and_fill_every_setting(template: str, tmp_path: Path) -> None:
    """Each template parses as bash, and every PROUR_* it reads is set by the rendered block."""
    text = (default_templates_dir() / template).read_text()
    bash_syntax_ok(text, tmp_path, template)
    train = verl_train(nnodes=2, gpus=4, mini_batch_states=4) if "multinode" in template else {}
    stage = next(s for s, name in TEMPLATES.items() if name == template).replace("_multinode", "")
    stage = {"stage": "collect"}.get(stage, stage)  # stage.sbatch serves the one-command stages
    data = base_recipe(tmp_path, train=train, serve={"models": {"big": {"gpus": [0]}}})
    data["models"]["verifier"] = {"backend": "openai", "model": "big"}
    _, submission = plan(tmp_path, data, stages=[stage])
    script = submission.plans[0].script
    bash_syntax_ok(script, tmp_path, f"rendered-{template}")
    block = script[script.index(BLOCK_START) : script.index(BLOCK_END)]
    body = script[script.index(BLOCK_END) :]
    defined = set(re.findall(r"^(PROUR_\w+)=", block, re.MULTILINE))
    used = set(re.findall(r"\$\{?#?(PROUR_\w+)\b(?!:[-=])", body))  # ${X:-default} may stay unset
    assert used <= defined, f"{template} reads {sorted(used - defined)} that rendering never sets"


def test_directives_drop_unset_site_values_and_keep_the_rest() -> None:
    lines = [
        "#!/bin/bash",
        "#SBATCH --partition=REPLACE_ME",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --mem=200G",
        "#SBATCH --exclusive",
        "",
        "echo hi",
    ]
    out, notes = render_directives(
        lines, {"mem": "4G", "gpus-per-node": "", "qos": "high"}, ["--requeue"]
    )
    assert out == [
        "#!/bin/bash",
        "#SBATCH --mem=4G",
        "#SBATCH --exclusive",
        "#SBATCH --qos=high",
        "#SBATCH --requeue",
        "",
        "echo hi",
    ]
    assert notes == ["--partition not set (slurm.*.partition): the cluster default applies"]


def test_render_refuses_a_template_without_settings_block_or_with_leftovers() -> None:
    with pytest.raises(RenderError, match="no '# >>> prour settings'"):
        render_script("#!/bin/bash\necho hi\n", "t.sbatch", {}, [], {}, {}, [])
    text = f"#!/bin/bash\n{BLOCK_START}\n{BLOCK_END}\ncd REPLACE_ME\n"
    with pytest.raises(RenderError, match="line 4 still holds REPLACE_ME"):
        render_script(text, "t.sbatch", {}, [], {}, {}, [])


def test_the_chain_stops_at_the_review_gate_until_the_labels_are_approved(
    tmp_path: Path,
) -> None:
    """No --stages: from an empty run folder, the jobs up to the calibrate stage (its job ends
    at the gate) and the command that approves; --approve-labels: the rest of the chain."""
    data = base_recipe(tmp_path, train={}, slurm={"setup": []})
    loaded, gated = plan(tmp_path, data)
    assert [(p.stage, p.after) for p in gated.plans] == [
        ("collect", None), ("normalize", "collect"), ("calibrate", "normalize")]
    approve = f"prour slurm submit --recipe {tmp_path / 'recipe.yaml'} --approve-labels"
    assert gated.gate == approve
    text = dry_run_text(gated, loaded)
    assert "JOB_CALIBRATE=$(sbatch --parsable --dependency=afterok:$JOB_NORMALIZE " \
        "--kill-on-invalid-dep=yes" in text
    assert f"# the chain stops at the review gate (calibrate); after the review: {approve}" in text
    assert text.count("#!/bin/bash") == 3
    assert not (tmp_path / "run").exists()  # a dry run writes nothing
    # the calibrate job's log ends with the command that continues the chain on Slurm
    calls, log = run_script(gated.plans[-1].script, tmp_path, "calibrate")
    assert calls[-2:] == ["--only", "calibrate"]
    assert log.splitlines()[-1] == ("[prour] on Slurm, once the labels named above are reviewed, "
                                    f"approve them and submit the rest of the chain with: {approve}")
    assert not run_script(gated.plans[0].script, tmp_path, "collect")[1].endswith(f"{approve}\n")
    _, rest = plan(tmp_path, data, approve_labels=True)
    chain = ["collect", "normalize", "calibrate", "extract", "train", "export", "eval", "report"]
    assert [p.stage for p in rest.plans] == chain and rest.gate is None
    assert all(p.command[-3:] == ["--only", p.stage, "--approve-labels"] for p in rest.plans)
    # collected and normalized already: the approved chain starts at the gate's stage
    trajectories = Path(loaded.data.trajectories)
    trajectories.parent.mkdir(parents=True)

    def episodes(domain: str, n: int) -> str:  # stored episodes, one per resume key
        return "".join(json.dumps({"domain": domain, "task_id": str(i), "seed": 0,
                                   "agent": "teacher", "termination": "user_stop"}) + "\n"
                       for i in range(n))

    trajectories.write_text(episodes("retail", loaded.data.num_trajectories))
    airline = tmp_path / "run" / "data" / "airline_trajectories.jsonl"
    airline.write_text(episodes("airline", loaded.router.calibration.test_episodes))
    dev = tmp_path / "run" / "data" / "calibration_dev_trajectories.jsonl"
    dev.write_text(episodes("retail", loaded.router.calibration.dev_episodes))
    goals = Path(loaded.data.goals)
    from prour.env.domains import select_tasks
    tasks = select_tasks(loaded.data.domain, loaded.data.split, max_tasks=loaded.data.max_tasks)
    goals.write_text('{"id": 1}\n' * len(tasks))
    _, rest = plan(tmp_path, data, approve_labels=True)
    assert [p.stage for p in rest.plans] == chain[2:]
    # thresholds in the recipe: nothing to calibrate, no gate, the whole chain at once
    _, whole = plan(tmp_path, {**data, "router": {"tau_au": 0.1, "tau_eu": 0.2}})
    assert [p.stage for p in whole.plans] == [s for s in chain if s != "calibrate"]
    assert whole.gate is None


def test_each_job_serves_what_its_stage_calls_and_serve_goes_alone(tmp_path: Path) -> None:
    """Every job asks for the GPUs of the servers its own steps call; a serve job (held until
    cancelled) cannot be combined with the jobs that serve for themselves."""
    data = base_recipe(
        tmp_path, serve={"models": {"big": {"gpus": [0, 1], "tensor_parallel_size": 2},
                                    "small": {"gpus": [0], "gpu_memory_utilization": 0.05}}},
        train={},
    )
    data["models"]["verifier"] = {"backend": "openai", "model": "big"}
    data["models"]["agent"] = {"backend": "openai", "model": "small"}
    data["models"]["user"] = {"backend": "openai", "model": "small"}
    _, submission = plan(tmp_path, data, stages=["collect", "train"])
    gpus = {p.stage: [ln for ln in p.script.splitlines() if ln.startswith("#SBATCH --gpus")]
            for p in submission.plans}
    assert gpus == {"collect": ["#SBATCH --gpus-per-node=1"],  # agent and user: small on GPU 0
                    "train": ["#SBATCH --gpus-per-node=2"]}  # the verifier: big on GPUs 0-1
    with pytest.raises(ValueError, match="submit serve alone"):
        plan(tmp_path, data, stages=["serve", "train"])
    _, alone = plan(tmp_path, data, stages=["serve"])
    assert alone.plans[0].template.endswith("serve.sbatch")


def test_eval_without_a_trained_checkpoint_is_refused_unless_asked_for(tmp_path: Path) -> None:
    data = base_recipe(tmp_path, train={})
    with pytest.raises(ValueError) as info:
        plan(tmp_path, data, stages=["eval"])
    message = str(info.value)
    assert f"there is none at {tmp_path / 'run' / 'checkpoints'}" in message
    assert f"prour slurm submit --recipe {tmp_path / 'recipe.yaml'}" in message
    assert "--checkpoint DIR" in message and "--base-model" in message
    _, base = plan(tmp_path, data, stages=["eval"], base_model=True)
    assert base.plans[0].command[-4:] == ["--set", "train=null", "--only", "eval"]
    given = str(tmp_path / "elsewhere")
    _, named = plan(tmp_path, data, stages=["eval"], checkpoint=given, rerun_stale=True)
    assert named.plans[0].command[-5:] == ["--set", f"train.output_dir={given}", "--only", "eval",
                                           "--rerun-stale"]
    # an exported final step at train.output_dir is a trained checkpoint
    final = tmp_path / "run" / "checkpoints" / "step_2010"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    _, found = plan(tmp_path, data, stages=["eval"])
    assert found.plans[0].command[-2:] == ["--only", "eval"]
    # with train submitted too, eval evaluates what it trains
    _, chained = plan(tmp_path, base_recipe(tmp_path / "other", train={}),
                      stages=["train", "export", "eval"])
    assert [p.stage for p in chained.plans] == ["train", "export", "eval"]


def test_stage_time_limits_come_from_the_recipe(tmp_path: Path) -> None:
    data = base_recipe(tmp_path, train={}, slurm={"defaults": {"time": "01:00:00"},
                                                   "collect": {"time": "2-00:00:00"}})
    _, submission = plan(tmp_path, data, approve_labels=True)
    times = {p.stage: next(ln for ln in p.script.splitlines() if ln.startswith("#SBATCH --time"))
             for p in submission.plans}
    assert times["collect"] == "#SBATCH --time=2-00:00:00"
    assert {t for s, t in times.items() if s != "collect"} == {"#SBATCH --time=01:00:00"}


def test_cli_dry_run_and_bad_stage(tmp_path: Path) -> None:
    path = write_recipe(tmp_path / "recipe.yaml", base_recipe(tmp_path))
    cmd = [sys.executable, "-m", "prour.cli.main", "slurm", "submit", "--recipe", str(path)]
    done = subprocess.run(
        [*cmd, "--dry-run", "--stages", "train,eval"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert "JOB_EVAL=$(sbatch --parsable --dependency=afterok:$JOB_TRAIN" in done.stdout
    assert "JOB_SERVE" not in done.stdout
    # ... and, as warnings (each job checks its own node), what the submitted stages lack here:
    # the policy's weights (no models folder) and eval's roles; no GPU line.
    assert done.returncode == 0, done.stderr
    checks = {line.split(": ")[2] for line in done.stderr.splitlines()
              if line.startswith("warning: preflight")}
    assert checks == {"models", "weights"}, done.stderr
    assert "warning: preflight on this node: weights: model 'Qwen/Qwen3-1.7B' " in done.stderr
    bad = subprocess.run(
        [*cmd, "--stages", "train,evl"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert bad.returncode == 2 and "unknown ['evl']" in bad.stderr


def test_every_stage_in_pipeline_order_with_its_command(tmp_path: Path) -> None:
    """Any subset of the stages, submitted in any order, runs in pipeline order; each job runs
    `prour run --only STAGE` on the run folder with the submission's overrides."""
    data = base_recipe(
        tmp_path, serve={"models": {"big": {"gpus": [0]}}}, slurm={"setup": []}, train={}
    )
    data["models"]["verifier"] = {"backend": "openai", "model": "big"}
    everything = [
        "report", "eval", "export", "train", "extract", "calibrate", "normalize", "collect"
    ]
    loaded, submission = plan(tmp_path, data, stages=everything, overrides=["env.max_steps=4"])
    plans = submission.plans
    assert [(p.stage, p.after, p.dependency) for p in plans] == [
        ("collect", None, None),
        ("normalize", "collect", "afterok"),
        ("calibrate", "normalize", "afterok"),
        ("extract", "calibrate", "afterok"),
        ("train", "extract", "afterok"),
        ("export", "train", "afterok"),
        ("eval", "export", "afterok"),
        ("report", "eval", "afterok"),
    ]
    assert submission.gate is None  # stages asked for by name: no gate of the chain's own
    text = dry_run_text(submission, loaded)
    assert "JOB_REPORT=$(sbatch --parsable --dependency=afterok:$JOB_EVAL" in text
    run = tmp_path / "run"
    recipe_args = ["--recipe", str(tmp_path / "recipe.yaml"), "--set", f"run_dir={run}",
                   "--set", "env.max_steps=4"]
    for stage_plan in plans:
        calls, _ = run_script(stage_plan.script, tmp_path, stage_plan.stage)
        assert calls == ["run", *recipe_args, "--only", stage_plan.stage], stage_plan.stage
        assert Path(stage_plan.status_path).read_text().endswith("rc=0\n")
        assert f"#SBATCH --output={run}/slurm/logs/{stage_plan.stage}-%j.out" in stage_plan.script


def test_stage_resources_come_from_their_own_section_then_the_defaults(tmp_path: Path) -> None:
    data = base_recipe(
        tmp_path,
        slurm={"defaults": {"mem": "8G", "partition": "cpu"}, "collect": {"gpus_per_node": 1}},
    )
    _, submission = plan(tmp_path, data, stages=["collect", "report"])
    collect, report = (p.script.splitlines() for p in submission.plans)
    assert "#SBATCH --gpus-per-node=1" in collect and "#SBATCH --mem=8G" in collect
    assert not any(line.startswith("#SBATCH --gpus") for line in report)
    assert "#SBATCH --partition=cpu" in report and "#SBATCH --cpus-per-task=8" in report
