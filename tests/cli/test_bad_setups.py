"""Setups that used to end in a traceback (issue #23 item 7) end in one line naming the cause and
the fix, and the fix a line prints runs as printed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_error(result, code: int, *fragments: str) -> str:
    """Exit ``code`` without a traceback, with exactly one ``error:`` line holding the fragments."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("value", ["[unclosed", "{a: 1", "it's: [x"])
def test_a_set_value_that_is_not_yaml_names_the_item_and_the_quoting_that_passes(value):
    """The line names the --set item and its key; the quoted form it prints, run as printed,
    loads the text unchanged."""
    item = f"name={value}"
    line = one_error(invoke("validate", str(SMOKE), "--set", item), 2,
                     f"--set {item!r}", "name:", "not valid YAML")
    fix = shlex.split(line.split("quote it: ")[1])
    assert fix[0] == "--set"
    result = invoke("validate", str(SMOKE), *fix)
    assert result.exit_code == 0, result.output
    from prour.recipes import load_recipe

    assert load_recipe(SMOKE, fix[1:]).name == value


# ---- a weights folder with config.json but no weight files -----------------------------------

PAPER = SMOKE.parent / "paper.yaml"


def _weights_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: weights: ")]


def test_preflight_names_a_model_folder_without_weight_files(tmp_path, monkeypatch):
    """Every model of the paper in a models folder, but the 1.7B with config.json alone and the
    8B's index naming a shard that is not there: one line each (transformers would raise OSError
    at load time); with the files in place preflight has no weights line."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    models = tmp_path / "models"
    for hub_id in ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B"):
        (models / hub_id).mkdir(parents=True)
        (models / hub_id / "config.json").write_text("{}")
    (models / "Qwen/Qwen3-32B/model-00001-of-00001.safetensors").write_bytes(b"")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    (models / "Qwen/Qwen3-8B/model.safetensors.index.json").write_text(json.dumps(index))
    (models / "Qwen/Qwen3-8B/model-00001-of-00002.safetensors").write_bytes(b"")
    env = {"PROUR_MODELS_DIR": str(models)}
    result = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)], env=env)
    assert result.exit_code == 2 and "Traceback" not in result.output
    small, large = sorted(_weights_lines(result.output))
    assert small.startswith("error: weights: model 'Qwen/Qwen3-1.7B' (models.generator.path")
    assert f"folder {models / 'Qwen/Qwen3-1.7B'} holds no weight files" in small
    fix = shlex.split(small.split("download them with `")[1].rstrip("`"))
    assert fix == ["hf", "download", "Qwen/Qwen3-1.7B", "--local-dir",
                   str(models / "Qwen/Qwen3-1.7B")]
    assert large.startswith("error: weights: model 'Qwen/Qwen3-8B' (serve.models.Qwen/Qwen3-8B)")
    assert ("1 of 2 weight shard(s) named by model.safetensors.index.json are missing "
            "(model-00002-of-00002.safetensors)") in large
    (models / "Qwen/Qwen3-1.7B/model.safetensors").write_bytes(b"")
    (models / "Qwen/Qwen3-8B/model-00002-of-00002.safetensors").write_bytes(b"")
    again = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)], env=env)
    assert _weights_lines(again.output) == [], again.output


def test_a_tokenizer_folder_needs_no_weight_files(tmp_path):
    """extract reads data.tokenizer's tokenizer alone: a folder with tokenizer files passes."""
    from prour.preflight import check_weights
    from prour.recipes import load_recipe

    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text("{}")
    recipe = load_recipe(SMOKE, [f"data.tokenizer={folder}", f"run_dir={tmp_path / 'run'}"])
    assert check_weights(recipe, {"extract": ()}) == []
    (folder / "tokenizer_config.json").unlink()
    assert len(check_weights(recipe, {"extract": ()})) == 1


# ---- a backend answering HTTP 500 during normalize, calibrate or extract ---------------------


class _Broken(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that lists its model but fails every generation request."""

    posts = 0

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        type(self).posts += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"object": "error", "message": "No available memory for the cache "
                           "blocks\nsecond line", "code": 500}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that gave up mid-answer (the command stopped): nothing to report


@pytest.fixture
def broken_url():
    server = _QuietServer(("127.0.0.1", 0), _Broken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Broken.posts = 0
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _served_by(url: str) -> str:
    return json.dumps({"backend": "openai", "model": "m", "base_url": url, "max_retries": 1})


def _assert_names_the_failure(result, role: str, url: str, *command: str) -> None:
    """One line: the role, the URL and HTTP 500 with the server's message, and the rerun command
    (on the same recipe and --set items), which the CLI's own parser accepts."""
    line = one_error(result, 1, f"models.{role}", url, "HTTP 500",
                     "No available memory for the cache blocks second line")
    rerun = shlex.split(line.split("then rerun `")[1].split("`")[0])
    assert rerun[:len(command) + 1] == ["prour", *command], rerun
    assert "--recipe" in rerun and "--set" in rerun
    assert _Broken.posts >= 2  # a request and its one retry (max_retries: 1), at least


def test_normalize_against_a_server_answering_500(tmp_path, tiny_model_dir, broken_url):
    from test_data_cli import _recipe

    recipe = _recipe(tmp_path, tiny_model_dir)
    result = invoke("normalize", "--recipe", str(recipe),
                    "--set", f"models.normalizer={_served_by(broken_url)}")
    _assert_names_the_failure(result, "normalizer", broken_url, "normalize")


def test_extract_against_a_server_answering_500(tmp_path, tiny_model_dir, broken_url):
    """The data stage made with scripted models, then extract's decomposer fails on the server."""
    from test_data_cli import _recipe

    recipe = _recipe(tmp_path, tiny_model_dir)
    for command in ("collect", "normalize"):
        assert invoke(command, "--recipe", str(recipe)).exit_code == 0
    result = invoke("extract", "--recipe", str(recipe), "--no-progress",
                    "--set", f"models.decomposer={_served_by(broken_url)}")
    _assert_names_the_failure(result, "decomposer", broken_url, "extract")


def test_calibrate_against_a_server_answering_500(tmp_path, broken_url):
    from test_calibrate_cli import make_recipe

    recipe = make_recipe(tmp_path)
    result = invoke("calibrate", "--recipe", str(recipe), "--stage", "label",
                    "--set", f"models.annotator={_served_by(broken_url)}")
    _assert_names_the_failure(result, "annotator", broken_url, "calibrate", "--stage", "label")


# ---- a read-only or full run folder (root ignores file modes: a small mount makes them) -----

SCRIPTED_ROLES = ("agent", "user", "teacher")


@contextmanager
def tmpfs(folder: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A ``size`` tmpfs mounted at ``folder`` (remounted read-only when asked), unmounted after."""
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                   check=True)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _collect_recipe(tmp_path: Path, run_dir: Path) -> Path:
    import data_scripts as scripts
    import yaml

    files = scripts.write_script_files(tmp_path / "scripts")
    recipe = {"name": "disk", "run_dir": str(run_dir), "env": {"max_steps": 12},
              "models": {role: {"backend": "scripted", "script": str(files[role])}
                         for role in SCRIPTED_ROLES},
              "data": {"num_trajectories": 2, "trial_seeds": [0], "max_tasks": 2,
                       "concurrency": 1}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _prour(*args: str) -> subprocess.CompletedProcess:
    """The installed `prour` script in a child process (where a disk error is caught)."""
    from installed_prour import prour_argv

    return subprocess.run(prour_argv(*args), capture_output=True, text=True, timeout=300,
                          check=False)


def _one_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_a_read_only_run_folder_is_one_line(tmp_path):
    mount = tmp_path / "ro"
    with tmpfs(mount, "1m", read_only=True):
        proc = _prour("collect", "--recipe", str(_collect_recipe(tmp_path, mount / "run")),
                      "--no-progress")
    _one_line(proc, f"cannot write {mount / 'run'}", f"the file system ({mount}) is read-only",
              "point run_dir")


def test_a_full_run_folder_is_one_line_naming_the_file_and_the_space(tmp_path):
    """A 256 KiB tmpfs filled up to its last 16 KiB: the provenance fits, the first trajectory
    (a whole scripted episode) does not; the line names the file and the free space."""
    mount = tmp_path / "full"
    with tmpfs(mount, "256k"):
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError):  # write until the disk refuses
                while True:
                    os.write(fd, b"\0" * 4096)
            os.ftruncate(fd, os.fstat(fd).st_size - 16 * 1024)
        finally:
            os.close(fd)
        proc = _prour("collect", "--recipe", str(_collect_recipe(tmp_path, mount / "run")),
                      "--no-progress")
        saved = (mount / "run" / "data" / "trajectories.jsonl").read_text()
    line = _one_line(proc, f"cannot write {mount / 'run' / 'data' / 'trajectories.jsonl'}",
                     f"no space left on the device ({mount})", "free of 256 KiB",
                     "point run_dir at a larger disk")
    assert "0 KiB free" in line or "4 KiB free" in line or "8 KiB free" in line, line
    assert all(json.loads(row) for row in saved.splitlines())  # no torn line left behind


# ---- parquet inputs that are not readable ------------------------------------------------------


@pytest.mark.parametrize("content, reason", [
    (b"PAR1 cut off in the middle", "Parquet magic bytes not found"),
    (b"", "Parquet file size is 0 bytes"),
])
def test_preflight_reads_the_footer_of_parquet_inputs(tmp_path, content, reason):
    """train reads train.train_file and its validation parquet: a corrupt or empty train file is
    one path line naming the key, the file, pyarrow's reason and the command that writes it; a
    readable file (here: no rows, a valid footer) passes."""
    from prour.data.dataset import write_rows
    from prour.preflight import check_parquet, preflight
    from prour.recipes import load_recipe

    recipe = load_recipe(SMOKE, [f"run_dir={tmp_path / 'run'}"])
    dataset = tmp_path / "run" / "data" / "dataset"
    write_rows([], dataset / "validation.parquet")
    (dataset / "train.parquet").write_bytes(content)
    lines = [p.line() for p in preflight(recipe, ["train"]) if p.check == "path"]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"path: train.train_file: {dataset / 'train.parquet'} is not a "
                               f"readable parquet file ({reason}")
    fix = shlex.split(lines[0].split("write it again with `")[1].rstrip("`"))
    assert fix[:2] == ["prour", "extract"] and fix[fix.index("--recipe") + 1] == str(SMOKE)
    write_rows([], dataset / "train.parquet")
    assert check_parquet(recipe, "train") == []


# ---- hints that name a command run as printed ------------------------------------------------


def test_a_quoted_command_that_reads_a_recipe_gets_the_recipe_it_was_loaded_with():
    """The CLI's own tree says which commands take --recipe: those get the recipe file and its
    --set items; commands without one, unknown ones and complete ones are left as they are."""
    import typer

    from prour.cli.failures import complete_hints
    from prour.recipes import load_recipe

    def complete(text: str, recipe) -> str:
        return complete_hints(text, recipe, typer.main.get_command(app))

    recipe = load_recipe(SMOKE, ["seed=2"])
    tail = f"--recipe {SMOKE} --set seed=2"
    assert complete("run `prour calibrate --stage label` first", recipe) == (
        f"run `prour calibrate --stage label {tail}` first")
    assert complete("rerun `prour train export`, then run `prour eval`", recipe) == (
        f"rerun `prour train export {tail}`, then run `prour eval {tail}`")
    for kept in ("run `prour data stats runs/x`", "run `prour extract --recipe other.yaml`",
                 "run `prour no-such-command`", "run `prour report runs/x/eval`",
                 "models.generator is missing; `prour eval` needs it"):  # not a hint
        assert complete(kept, recipe) == kept
    assert complete_hints("run `prour eval`", recipe) == "run `prour eval`"  # no command runs


def test_the_uncalibrated_thresholds_hint_names_the_recipe(tmp_path):
    """Without router.tau_au/tau_eu and no thresholds file, a routing stage's preflight says to
    calibrate: on this recipe and its --set items, as the CLI prints it."""
    sets = [f"run_dir={tmp_path / 'run'}", "router.tau_au=null", "router.tau_eu=null"]
    result = invoke("extract", "--recipe", str(SMOKE), *(x for s in sets for x in ("--set", s)))
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: thresholds")]
    assert len(lines) == 1, result.output
    command = shlex.split(lines[0].split("run `")[1].split("`")[0])
    assert command == ["prour", "calibrate", "--recipe", str(SMOKE),
                       *(x for s in sets for x in ("--set", s))]


def test_endpoints_without_a_file_names_the_serve_command_of_this_recipe(tmp_path):
    run_dir = f"run_dir={tmp_path / 'run'}"
    line = one_error(invoke("endpoints", "--recipe", str(SMOKE), "--set", run_dir), 1,
                     f"{tmp_path / 'run' / 'endpoints.json'} does not exist")
    command = shlex.split(line.split("start the servers with `")[1].rstrip("`"))
    assert command == ["prour", "serve", "--recipe", str(SMOKE), "--set", run_dir]


def test_data_stats_names_extract_on_the_recipe_the_dataset_recorded(tmp_path):
    """`prour data stats` takes a folder, not a recipe: its "rerun `prour extract`" hint takes
    the resolved recipe extract recorded beside the parquet files, which loads as printed."""
    from prour.provenance import RECIPE_FILE, write_provenance
    from prour.recipes import load_recipe

    write_provenance(tmp_path, load_recipe(SMOKE, [f"run_dir={tmp_path / 'run'}"]))
    (tmp_path / "train.parquet").write_bytes(b"PAR1 cut")
    line = one_error(invoke("data", "stats", str(tmp_path)), 1, "not a readable parquet file")
    command = shlex.split(line.split("rerun `")[1].split("`")[0])
    assert command == ["prour", "extract", "--recipe", str(tmp_path / RECIPE_FILE)]
    assert load_recipe(command[-1]).run_dir == str(tmp_path / "run")


def test_the_download_hint_without_a_models_folder_names_real_folders(tmp_path, monkeypatch):
    """No models_dir and no $PROUR_MODELS_DIR: the hint downloads into ~/models and exports that
    folder (no placeholder); a model put where the hint says is then found."""
    from prour.llm.weights import ModelNotFound, local_weights

    monkeypatch.delenv("PROUR_MODELS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    with pytest.raises(ModelNotFound) as info:
        local_weights("Qwen/Qwen3-1.7B", None, "models.generator.path")
    message = str(info.value)
    assert "<" not in message
    download = shlex.split(message.split("with `")[1].split("`")[0])
    assert download == ["hf", "download", "Qwen/Qwen3-1.7B", "--local-dir",
                        "~/models/Qwen/Qwen3-1.7B"]
    export = message.split("then `")[1].split("`")[0]
    assert export == "export PROUR_MODELS_DIR=~/models"
    folder = Path(download[-1]).expanduser()  # what the shell makes of ~ in both commands
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.setenv("PROUR_MODELS_DIR", str(Path("~/models").expanduser()))
    assert local_weights("Qwen/Qwen3-1.7B", None) == str(folder)


def test_only_errors_of_the_disk_become_the_one_line():
    """A refused open names the file; a refused signal (no file) or any other errno stays an
    error for its own handler (the traceback it was)."""
    import errno

    from prour.cli.failures import disk_failure_line

    assert disk_failure_line(PermissionError(errno.EACCES, "Permission denied", "/x/y")) == (
        "cannot open /x/y: permission denied; make it accessible to this user or point run_dir "
        "(or the recipe key naming this path) at a folder that is")
    assert disk_failure_line(PermissionError(errno.EPERM, "Operation not permitted")) is None
    assert disk_failure_line(FileNotFoundError(errno.ENOENT, "No such file", "/x/y")) is None
