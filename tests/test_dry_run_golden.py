"""The chain as ``prour run --dry-run`` prints it for paper.yaml and rehearsal.yaml, held against
the text it printed before the steps moved into their packages (tests/golden/).

What may differ between two machines or two runs is put in words first: the run folder, this
checkout, the interpreter, the home folder, the host's endpoints file, the ports the servers
would take. The python that would run vLLM is this interpreter (``$PROUR_VLLM_PYTHON``, which
`make test` points at the vLLM venv, is set to it): the flags a server command gets depend on
the vLLM version that python has, a fact of the machine, not of the chain. Lines of the setup
check (``problem: ...``: weights, GPUs and extras this machine lacks) are left out for the same
reason. To take a change of the chain that is meant, write the files anew with
``python tests/test_dry_run_golden.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
RECIPES = ("paper", "rehearsal")


def dry_run(recipe: str, run_dir: Path) -> str:
    """What ``prour run --dry-run`` prints for ``recipes/<recipe>.yaml``, in machine-free words."""
    done = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "run", "--recipe", f"recipes/{recipe}.yaml",
         "--dry-run", "--set", f"run_dir={run_dir}"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PROUR_VLLM_PYTHON": sys.executable})
    assert done.returncode in (0, 2), done.stderr[-2000:]  # 2: it found setup problems
    text = done.stdout + done.stderr
    for value, word in ((str(run_dir), "<RUN>"), (str(ROOT), "<REPO>"),
                        (sys.executable, "<PYTHON>"), (str(Path.home()), "<HOME>")):
        text = text.replace(value, word)
    text = re.sub(r"endpoints/[^ /]+\.json", "endpoints/<HOST>.json", text)
    text = re.sub(r"--port \d+", "--port <PORT>", text)
    text = re.sub(r"\S+/bin/python[\d.]* -m vllm", "<SERVE_PYTHON> -m vllm", text)
    return "".join(line for line in text.splitlines(keepends=True)
                   if not re.match(r"(problem: |\d+ problem\(s\) )", line))


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_dry_run_prints_the_chain_as_before(recipe: str, tmp_path: Path) -> None:
    expected = (GOLDEN / f"dry_run_{recipe}.txt").read_text()
    assert dry_run(recipe, tmp_path / "run") == expected


if __name__ == "__main__":
    import tempfile

    for name in RECIPES:
        with tempfile.TemporaryDirectory() as folder:
            (GOLDEN / f"dry_run_{name}.txt").write_text(dry_run(name, Path(folder) / "run"))
        print(f"wrote {GOLDEN / f'dry_run_{name}.txt'}")
