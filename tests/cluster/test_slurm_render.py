"""Rendering the sbatch templates and planning a submission (no Slurm needed).

Rendered scripts are checked by bash itself (`bash -n`), and the eval array script is run under
bash with a stand-in `prour` to see which seed and domain each task really gets.
"""

from __future__ import annotations

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


def plan(tmp_path: Path, data: dict, stages=("serve", "train", "eval"), overrides=()) -> tuple:
    path = write_recipe(tmp_path / "recipe.yaml", data)
    loaded = load_recipe(path, list(overrides), cluster=True)
    request = SubmitRequest(path, list(stages), tmp_path / "run", list(overrides), tmp_path)
    return loaded, plan_submission(loaded, request)


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
    _, plans = plan(tmp_path, base_recipe(tmp_path, train=train, slurm=slurm), stages=["train"])
    (train_plan,) = plans
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
        "PROUR_TRAIN_ARGS=(--backend verl)",
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
    _, plans = plan(tmp_path, base_recipe(tmp_path, train=train), stages=[stage])
    script = plans[0].script
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


def test_dry_run_shows_the_dependency_chain(tmp_path: Path) -> None:
    loaded, plans = plan(tmp_path, base_recipe(tmp_path))
    text = dry_run_text(plans, loaded)
    assert "JOB_SERVE=$(sbatch --parsable " in text
    assert (
        "JOB_TRAIN=$(sbatch --parsable --dependency=afterok:$JOB_SERVE --kill-on-invalid-dep=yes"
        in text
    )
    assert (
        "JOB_EVAL=$(sbatch --parsable --dependency=afterok:$JOB_TRAIN --kill-on-invalid-dep=yes"
        in text
    )
    assert text.count("#!/bin/bash") == 3
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_served_models_make_dependants_start_with_the_servers(tmp_path: Path) -> None:
    data = base_recipe(
        tmp_path, serve={"models": {"big": {"gpus": [0, 1], "tensor_parallel_size": 2}}}
    )
    data["models"]["verifier"] = {"backend": "openai", "model": "big"}
    loaded, plans = plan(tmp_path, data)
    assert [(p.stage, p.dependency) for p in plans] == [
        ("serve", None),
        ("train", "after"),
        ("eval", "afterok"),
    ]
    text = dry_run_text(plans, loaded)
    assert "--dependency=after:$JOB_SERVE" in text
    assert (
        'sbatch --parsable --dependency=afterany:$JOB_TRAIN:$JOB_EVAL --wrap "scancel --batch'
        in text
    )
    assert "#SBATCH --gpus-per-node=2" in plans[0].script
    assert "PROUR_WAIT_ENDPOINTS=3600" in plans[1].script


def test_eval_array_tasks_get_the_seed_and_domain_the_manifest_says(tmp_path: Path) -> None:
    data = base_recipe(
        tmp_path,
        eval={"seeds": [3, 5, 7], "domains": ["retail", "airline"]},
        slurm={"eval_max_parallel": 2, "setup": []},
    )
    _, plans = plan(tmp_path, data, stages=["eval"], overrides=["env.max_steps=4"])
    (eval_plan,) = plans
    assert "#SBATCH --array=0-5%2" in eval_plan.script.splitlines()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "prour").write_text('#!/bin/bash\necho "$@" > "$PROUR_ARGS_OUT"\n')
    (fake_bin / "prour").chmod(0o755)
    script = tmp_path / "eval.sbatch"
    script.write_text(eval_plan.script)
    for task in eval_plan.tasks:
        out = tmp_path / f"args-{task['index']}"
        env = {
            **os.environ,
            "PATH": f"{fake_bin}:{os.environ['PATH']}",
            "PROUR_ARGS_OUT": str(out),
            "SLURM_ARRAY_TASK_ID": str(task["index"]),
            "SLURM_JOB_ID": "99",
        }
        done = subprocess.run(
            ["bash", str(script)], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        args = out.read_text().split()
        assert args[args.index("--seeds") + 1] == str(task["seed"])
        assert args[args.index("--domains") + 1] == task["domain"]
        assert f"run_dir={tmp_path / 'run'}" in args and "env.max_steps=4" in args
        status = Path(task["status_file"]).read_text()
        assert "rc=0" in status and "job=99" in status
    assert [(t["seed"], t["domain"]) for t in eval_plan.tasks] == [
        (3, "retail"),
        (3, "airline"),
        (5, "retail"),
        (5, "airline"),
        (7, "retail"),
        (7, "airline"),
    ]


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
    checks = {line.split(": ")[2] for line in done.stderr.splitlines()}
    assert checks == {"models", "weights"}, done.stderr
    assert "warning: preflight on this node: weights: model 'Qwen/Qwen3-1.7B' " in done.stderr
    bad = subprocess.run(
        [*cmd, "--stages", "train,evl"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert bad.returncode == 2 and "unknown ['evl']" in bad.stderr


def test_every_stage_in_pipeline_order_with_its_command(tmp_path: Path) -> None:
    """Any subset of the nine stages, submitted in any order, runs in pipeline order; each data,
    export and report script runs its own `prour` command on the run folder."""
    data = base_recipe(
        tmp_path, serve={"models": {"big": {"gpus": [0]}}}, slurm={"setup": []}
    )
    data["models"]["verifier"] = {"backend": "openai", "model": "big"}
    everything = [
        "report", "eval", "export", "train", "extract", "calibrate", "normalize", "collect", "serve"
    ]
    loaded, plans = plan(tmp_path, data, stages=everything, overrides=["env.max_steps=4"])
    assert [(p.stage, p.after, p.dependency) for p in plans] == [
        ("serve", None, None),
        ("collect", "serve", "after"),
        ("normalize", "collect", "afterok"),
        ("calibrate", "normalize", "afterok"),
        ("extract", "calibrate", "afterok"),
        ("train", "extract", "afterok"),
        ("export", "train", "afterok"),
        ("eval", "export", "afterok"),
        ("report", "eval", "afterok"),
    ]
    text = dry_run_text(plans, loaded)
    assert "JOB_REPORT=$(sbatch --parsable --dependency=afterok:$JOB_EVAL" in text
    run = tmp_path / "run"
    recipe_args = ["--recipe", str(tmp_path / "recipe.yaml"), "--set", f"run_dir={run}",
                   "--set", "env.max_steps=4"]
    expected = {
        "collect": ["collect", *recipe_args, "--no-progress"],
        "normalize": ["normalize", *recipe_args],
        "calibrate": ["calibrate", *recipe_args],
        "extract": ["extract", *recipe_args, "--no-progress"],
        "export": ["train", "export", *recipe_args],
        "report": ["report", str(run / "eval")],
    }
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "prour").write_text('#!/bin/bash\nprintf "%s\\n" "$@" >> "$PROUR_ARGS_OUT"\n')
    (fake_bin / "prour").chmod(0o755)
    for stage_plan in plans:
        if stage_plan.stage not in expected:
            continue
        out = tmp_path / f"args-{stage_plan.stage}"
        script = tmp_path / f"{stage_plan.stage}.sbatch"
        script.write_text(stage_plan.script)
        env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "PROUR_ARGS_OUT": str(out)}
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stderr
        calls = out.read_text().splitlines()
        served = stage_plan.stage not in ("export", "report")  # these read no served model
        waits = ["endpoints", *recipe_args, "--wait", "3600"] if served else []
        assert calls == [*waits, *expected[stage_plan.stage]], stage_plan.stage
        assert Path(stage_plan.status_path).read_text().endswith("rc=0\n")
        assert f"#SBATCH --output={run}/slurm/logs/{stage_plan.stage}-%j.out" in stage_plan.script
    # eval evaluates what train wrote (train.output_dir defaults to <run_dir>/checkpoints) and
    # export turned into a Hugging Face folder
    eval_plan = next(p for p in plans if p.stage == "eval")
    assert f"PROUR_CHECKPOINT={run / 'checkpoints'}\n" in eval_plan.script


def test_stage_resources_come_from_their_own_section_then_the_defaults(tmp_path: Path) -> None:
    data = base_recipe(
        tmp_path,
        slurm={"defaults": {"mem": "8G", "partition": "cpu"}, "collect": {"gpus_per_node": 1}},
    )
    _, plans = plan(tmp_path, data, stages=["collect", "report"])
    collect, report = (p.script.splitlines() for p in plans)
    assert "#SBATCH --gpus-per-node=1" in collect and "#SBATCH --mem=8G" in collect
    assert not any(line.startswith("#SBATCH --gpus") for line in report)
    assert "#SBATCH --partition=cpu" in report and "#SBATCH --cpus-per-task=8" in report
