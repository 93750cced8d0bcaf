"""Every ``prour …`` command in README.md and the pages of docs/ parses with the CLI's own parser.

The commands are read from the files' code blocks (a line ending in a backslash continues on
the next) and from its inline code (a span may wrap across lines). Each is handed to the click
command tree that typer builds from ``prour.cli.main.app``: the subcommands are resolved and the
leaf makes its context, which checks option names, required options, choices and value types
without running anything. A span that only names a command (``prour calibrate``, as prose refers
to it) must resolve to one; anything with arguments is a command a reader may paste, so it must
parse whole. A command that names one of
this repository's recipes also loads it with its ``--set`` items, so a moved key fails too. A
failure names the file and line.

Synopsis notation is read as a person reads it: ``[--n 240]`` is the option it encloses, an
all-caps word (``R``, ``RUN_DIR``) or an ellipsis is a placeholder, and a placeholder given to a
numeric option stands for any valid number.
"""

from __future__ import annotations

import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from io import StringIO
from pathlib import Path

import pytest
import typer
import typer.main

from prour.cli.main import app

ROOT_DIR = Path(__file__).resolve().parents[1]
README = ROOT_DIR / "README.md"
DOCS = [README, *sorted((ROOT_DIR / "docs").glob("*.md"))]  # every file a reader takes commands from
SEPARATORS = {"|", "||", "&", "&&", ";"}
REDIRECTIONS = {">", ">>", "<", "2>", "2>>", "&>"}
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|…|\.\.\.|<[^>]*>)$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)


@dataclass(frozen=True)
class Command:
    """One ``prour`` invocation found in a markdown file: its line, its text, its arguments."""

    line: int
    text: str
    argv: tuple[str, ...]
    file: str = "README.md"

    def where(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}`"


def shell_words(text: str) -> list[str]:
    """Split a shell line into words and the separators between commands, comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = ""  # a `#` starts a comment only at the start of a word (below)
    words = []
    for word in lexer:
        if word.startswith("#"):
            break
        words.append(word)
    return words


def _unbracket(word: str) -> str:
    """``[--n`` -> ``--n``, ``240]`` -> ``240``, ``[--dry-run]`` -> ``--dry-run``; brackets
    inside a word stay (``NAME[,NAME]``)."""
    while word.startswith("[") and word.endswith("]"):
        word = word[1:-1]
    while word.startswith("[") and word.count("[") > word.count("]"):
        word = word[1:]
    while word.endswith("]") and word.count("]") > word.count("["):
        word = word[:-1]
    return word


def commands_in(text: str, line: int) -> list[Command]:
    """The ``prour`` commands of one shell line (pipes, ``&&``, ``;`` and ``&`` separate them)."""
    try:
        words = shell_words(text)
    except ValueError:  # an unclosed quote: prose, not a command line
        return []
    segments: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(word)
    found = []
    for segment in segments:
        while segment and ASSIGNMENT.match(segment[0]):
            segment = segment[1:]
        if not segment or segment[0] != "prour":  # the command word, after VAR=value words
            continue
        argv: list[str] = []
        rest = iter(segment[1:])
        for word in rest:
            if word in REDIRECTIONS:
                next(rest, None)  # the redirection's file
                continue
            word = _unbracket(word)
            if word:
                argv.append(word)
        if not argv:  # the program's name alone, as prose names it
            continue
        found.append(Command(line, shlex.join(["prour", *argv]), tuple(argv)))
    return found


def readme_commands(markdown: str) -> list[Command]:
    """Every ``prour`` command of a markdown text, in code blocks and in inline code."""
    found: list[Command] = []
    prose: list[tuple[int, str]] = []  # the current paragraph outside code blocks
    fence: str | None = None
    pending: tuple[int, str] | None = None  # a code line continued with a backslash

    def flush_prose() -> None:
        if not prose:
            return
        first = prose[0][0]
        joined = "\n".join(text for _, text in prose)
        for match in SPAN.finditer(joined):
            span = " ".join(match.group(2).split())
            found.extend(commands_in(span, first + joined.count("\n", 0, match.start())))
        prose.clear()

    for number, raw in enumerate(markdown.splitlines(), start=1):
        stripped = raw.strip()
        if fence is None and stripped.startswith(("```", "~~~")):
            flush_prose()
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
                continue
            start, text = pending if pending else (number, "")
            text = f"{text} {stripped}" if text else stripped
            if text.endswith("\\"):
                pending = (start, text[:-1].rstrip())
                continue
            pending = None
            found.extend(commands_in(text, start))
            continue
        if stripped:
            prose.append((number, raw))
        else:
            flush_prose()
    flush_prose()
    return found


ROOT = typer.main.get_command(app)


def _is_group(command: object) -> bool:
    return hasattr(command, "commands")


def _drop_ellipses(command: object, args: list[str]) -> list[str]:
    """``... `` after a command's arguments means "and more": only an option's value keeps one."""
    takes_value = {name for param in getattr(command, "params", ())
                   if not getattr(param, "is_flag", False) for name in param.opts}
    return [word for at, word in enumerate(args)
            if word not in ("...", "…") or (at and args[at - 1] in takes_value)]


def _parse(argv: list[str]) -> Exception | None:
    """Resolve the subcommands and make the leaf's context (options checked, nothing run)."""
    command, name, args, parent = ROOT, "prour", argv, None
    quiet = StringIO()
    try:
        with redirect_stdout(quiet), redirect_stderr(quiet):
            while True:
                if not _is_group(command):
                    args = _drop_ellipses(command, args)
                context = command.make_context(name, args, parent=parent)
                rest = [*context._protected_args, *context.args]
                if not _is_group(command) or not rest:
                    return None
                name, command, args = command.resolve_command(context, rest)
                parent = context
    except typer.Exit:  # --help: parsed, and printed its help
        return None
    except typer.TyperException as exc:
        return exc


def _placeholder_value(argv: list[str], param: object) -> int | None:
    """Where ``argv`` gives ``param`` a placeholder (``--seed S``), if it does."""
    opts = getattr(param, "opts", ())
    for at, word in enumerate(argv[:-1]):
        if word in opts and PLACEHOLDER.match(argv[at + 1]):
            return at + 1
    return None


def parse_error(argv: tuple[str, ...] | list[str]) -> str | None:
    """Why the CLI's parser refuses ``prour <argv>`` (None: it parses)."""
    argv = list(argv)
    command: object = ROOT
    names = 0
    while _is_group(command) and names < len(argv):  # a span that only names a command
        sub = command.commands.get(argv[names])
        if sub is None:
            break
        command, names = sub, names + 1
    if names == len(argv):
        return None
    for _ in range(len(argv)):
        error = _parse(argv)
        at = (_placeholder_value(argv, error.param)
              if isinstance(error, typer.BadParameter) else None)
        if at is None:
            return None if error is None else error.format_message()
        argv[at] = "1"  # a placeholder of a numeric option: any valid number
    return None


def recipe_error(argv: tuple[str, ...] | list[str]) -> str | None:
    """Why the recipe a command names (a file of this repository) refuses its ``--set`` items
    (a key that moved or a value of the wrong type), or None."""
    from prour.config import ConfigError
    from prour.recipes import load_recipe

    argv = list(argv)
    paths = [argv[at + 1] for at, word in enumerate(argv[:-1]) if word in ("--recipe", "-r")]
    recipe = ROOT_DIR / paths[0] if paths else None
    if recipe is None or not recipe.is_file():
        return None
    sets = [argv[at + 1] for at, word in enumerate(argv[:-1]) if word == "--set"
            and not PLACEHOLDER.match(argv[at + 1].partition("=")[2])]
    try:
        load_recipe(recipe, sets)
    except ConfigError as exc:
        return str(exc)
    return None


def documented_commands() -> list[Command]:
    """The ``prour`` commands of README.md and docs/*.md, each naming its file."""
    commands = []
    for path in DOCS:
        name = str(path.relative_to(ROOT_DIR))
        commands += [replace(command, file=name)
                     for command in readme_commands(path.read_text(encoding="utf-8"))]
    return commands


def test_the_readme_and_docs_commands_parse() -> None:
    assert len(DOCS) > 1, "docs/*.md not found"
    commands = documented_commands()
    assert len(commands) >= 40, f"found only {len(commands)} commands in README.md and docs/"
    refused = [f"{command.where()}: {error}" for command in commands
               if (error := parse_error(command.argv) or recipe_error(command.argv))]
    assert not refused, "stale commands in README.md or docs/:\n" + "\n".join(refused)


def test_the_readme_opens_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = text.split("```", 2)[1]
    assert [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line] == [
        "make demo", "make test"]


SAMPLE = """\
Intro with `prour env list | prour env show retail` and a wrapped
span `prour calibrate
states --recipe R` here, a mere `prour` and `prour/config.py`.

```bash
export PROUR_MODELS_DIR=/models   # not a prour command
prour slurm submit --recipe recipes/paper.yaml \\
  --set slurm.defaults.partition=gpu \\
  --dry-run            # a comment
prour serve --recipe R & prour report RUN_DIR [RUN_DIR ...] > out.txt
```

| `prour calibrate states --recipe R --split dev --from T.jsonl [--n 240] [--seed S]` | x |
"""


def test_a_stale_recipe_key_in_a_command_fails() -> None:
    assert recipe_error(["collect", "--recipe", "recipes/paper.yaml", "--set",
                         "data.num_trajectories=60"]) is None
    error = recipe_error(["collect", "--recipe", "recipes/paper.yaml", "--set",
                          "data.num_trajectoriez=60"])
    assert error is not None and "data.num_trajectoriez" in error, error
    assert recipe_error(["run", "--recipe", "R", "--set", "data.nope=1"]) is None  # placeholder


def test_commands_are_found_where_a_reader_sees_them() -> None:
    found = [(command.line, command.argv) for command in readme_commands(SAMPLE)]
    assert found == [
        (1, ("env", "list")),
        (1, ("env", "show", "retail")),
        (2, ("calibrate", "states", "--recipe", "R")),
        (7, ("slurm", "submit", "--recipe", "recipes/paper.yaml", "--set",
             "slurm.defaults.partition=gpu", "--dry-run")),
        (10, ("serve", "--recipe", "R")),
        (10, ("report", "RUN_DIR", "RUN_DIR", "...")),
        (13, ("calibrate", "states", "--recipe", "R", "--split", "dev", "--from", "T.jsonl",
              "--n", "240", "--seed", "S")),
    ]


@pytest.mark.parametrize(("argv", "expected"), [
    (["calibrate", "states", "--recipe", "R", "--split", "dev", "--from", "T.jsonl",
      "--n", "240", "--seed", "S"], None),
    (["calibrate"], None),  # named in prose: resolving is enough
    (["collect"], None),
    (["train", "export", "--recipe", "R"], None),
    (["collect", "--help"], None),
    (["calibrate", "states", "--split", "dev", "--from", "…"], "Missing option '--recipe'"),
    (["collect", "--recipe", "R", "--stages", "all"], "No such option: --stages"),
    (["colect", "--recipe", "R"], "No such command 'colect'"),
    (["calibrate", "states", "--recipe", "R", "--split", "dev", "--from", "T", "--n", "many"],
     "Invalid value for '--n'"),
    (["calibrate", "states", "--recipe", "R", "--split", "dev", "--from", "T", "--n", "0"],
     "Invalid value for '--n': Input should be greater than or equal to 1"),
])
def test_the_parser_refuses_what_the_cli_refuses(argv: list[str], expected: str | None) -> None:
    error = parse_error(argv)
    if expected is None:
        assert error is None
    else:
        assert error is not None and expected in error, error
