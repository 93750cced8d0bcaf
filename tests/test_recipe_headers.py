"""The commands a recipe's header comment gives run as printed, as the README's do
(tests/test_readme_commands.py): every ``prour`` command of every recipe header parses with the
CLI's own parser, and the recipe it names loads with its ``--set`` items and passes ``prour
validate`` (every stage's checks of its values, :mod:`prour.recipe_checks`). The CPU rehearsals'
headers are then carried out in a fresh folder as a user pastes them, with the installed
``prour``: recipes/rehearsal.yaml's used to die 1 s into its first step on the vLLM server's
``No module named 'vllm'`` (no word of ``make vllm-env`` or ``$PROUR_VLLM_PYTHON``).

What the header's own lines make is linked in, not remade: ``make vllm-env``'s venv is the one
the tests use, ``prour tiny-model ./runs/tiny-model``'s model is the session's warm tiny model
(the same code, fewer steps), and ``prour run`` runs with ``--dry-run`` appended, which checks
this node for the whole chain (vLLM in the serve python, weights, files) and exits 2 on a
problem; the whole chain itself is tests/cli/test_rehearsal.py's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from test_readme_commands import Command, commands_in, parse_error, recipe_error

from prour.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
CPU_REHEARSALS = ("rehearsal.yaml", "ask-less-rehearsal.yaml")  # their headers run on this node
LINE = re.compile(r"^#\s{3}(\S.*)$")


def header_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, shell text) of the indented lines of the comment a recipe opens with (a
    line ending in a backslash continues on the next)."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.startswith("#"):
            break
        match = LINE.match(raw)
        if pending is not None:
            start, text = pending
            body = raw.lstrip("#").strip()
            pending = None
            if body.endswith("\\"):
                pending = (start, f"{text} {body[:-1].rstrip()}")
            else:
                found.append((start, f"{text} {body}"))
            continue
        if match is None:
            continue
        text = match.group(1).strip()
        if text.endswith("\\"):
            pending = (number, text[:-1].rstrip())
        else:
            found.append((number, text))
    return found


def header_commands(path: Path) -> list[Command]:
    """The ``prour`` commands of a recipe's header, each naming its file and line."""
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    return [Command(command.line, command.text, command.argv, name)
            for number, text in header_lines(path) for command in commands_in(text, number)]


def test_every_recipe_header_command_parses_and_names_a_recipe_that_validates():
    from prour.preflight import check_protocol, check_recipe
    from prour.stages import run_stages

    commands = [command for path in RECIPES for command in header_commands(path)]
    assert len(commands) >= 10, [c.where() for c in commands]
    refused = [f"{c.where()}: {error}" for c in commands
               if (error := parse_error(c.argv) or recipe_error(c.argv))]
    assert not refused, "\n".join(refused)
    for command in commands:
        argv = list(command.argv)
        if "--recipe" not in argv:
            continue
        sets = [argv[at + 1] for at, word in enumerate(argv[:-1]) if word == "--set"]
        recipe = load_recipe(ROOT / argv[argv.index("--recipe") + 1], sets)
        problems = check_recipe(recipe, run_stages(recipe), whole_run=True) + \
            check_protocol(recipe)
        assert not problems, (command.where(), [p.line() for p in problems])


def test_the_header_lines_are_found_as_a_reader_sees_them(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("# Intro.\n#   make x   # once\n#   - a bullet of prose\n"
                    "#   prour eval --recipe R \\\n#     --set a=1\n# more prose\n"
                    "name: r\n#   prour collect --recipe R\n")
    assert header_lines(path) == [(2, "make x   # once"), (3, "- a bullet of prose"),
                                  (4, "prour eval --recipe R --set a=1")]
    assert [(c.line, c.argv) for c in header_commands(path)] == [
        (4, ("eval", "--recipe", "R", "--set", "a=1"))]


def _script(path: Path) -> str:
    """The header's shell lines as a bash script, each as printed but for the steps whose
    products are linked in (module docstring)."""
    lines = ["set -euo pipefail"]
    for _, text in header_lines(path):
        words = shlex.split(text, comments=True)
        if not words:
            continue
        if words[:2] == ["make", "vllm-env"] or words[:2] == ["prour", "tiny-model"]:
            lines.append(f": linked in, not remade: {shlex.quote(text)}")
        elif words[0] == "prour" and words[1] == "run":
            lines.append(f"{text.split('#')[0].strip()} --dry-run")
        else:
            lines.append(text)
    return "\n".join(lines) + "\n"


@pytest.mark.vllm
@pytest.mark.parametrize("name", CPU_REHEARSALS)
def test_a_cpu_rehearsals_header_runs_as_printed(tmp_path, name, vllm_python, warm_tiny_model):
    from installed_prour import prour_script

    work = tmp_path / "work"  # the repository's root as a user has it, with the recipes
    (work / "runs").mkdir(parents=True)
    (work / "recipes").symlink_to(ROOT / "recipes")
    (work / ".venv-vllm").symlink_to(vllm_python.parent.parent)
    (work / "runs" / "tiny-model").symlink_to(warm_tiny_model)
    script = _script(ROOT / "recipes" / name)
    assert "export PROUR_VLLM_PYTHON=" in script and "--dry-run" in script, script
    env = {key: value for key, value in os.environ.items() if key != "PROUR_VLLM_PYTHON"}
    env["PATH"] = f"{prour_script().parent}{os.pathsep}{env['PATH']}"  # the installed prour
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "0 problem(s) on this node" in done.stdout, output[-4000:]
    # without the header's export, the same run is refused at once, naming the fix
    unset = subprocess.run(["bash", "-c", script.replace("export PROUR_VLLM_PYTHON=",
                                                         "UNUSED=")],
                           cwd=work, env=env, capture_output=True, text=True, timeout=600,
                           check=False)
    assert unset.returncode == 2, unset.stdout + unset.stderr
    assert "`vllm` is not importable by" in unset.stdout and "make vllm-env" in unset.stdout, \
        unset.stdout[-4000:]
