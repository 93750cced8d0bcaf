"""``prour run``: the recipe's whole chain on one node, from the table of stages (DESIGN.md §6).

Each step of :mod:`prour.stages` gets a state from its outputs and its stamp
(``<run_dir>/.prour/steps/<step>.json``: the values of the recipe keys it depends on,
:attr:`~prour.stages.Step.keys`, its command and times):

- ``done``: its outputs are complete and were made with the recipe's values (a step done by its
  outputs but never stamped, run by hand, is adopted: stamped with the current values);
- ``stale``: done, but with other values, or it reads what a stale step wrote, or what a step
  that ran after it wrote; ``--rerun-stale`` moves its outputs aside and runs it again;
- ``partial``: some of its outputs exist (its command resumes); ``pending``: none do;
- ``skipped``: the recipe leaves it out (say why); ``gate``: the review gate waits for a person.

``prour run`` holds ``run_dir``'s lock (:mod:`prour.runlock`) from before it loads anything: a
second run on the folder is refused at once, writing nothing there. Pending and partial steps run
in order, each as a child ``prour`` process that dies with the runner (:mod:`prour.interrupt`)
and whose output goes to the terminal and to ``<run_dir>/logs/<step>.log``; a step whose folder
another live command holds is ``refused`` before it starts (nothing written, exit 2), as is one
whose own command refuses its setup (exit 2); before a step the runner starts the vLLM
servers it calls and stops those it does not (:class:`~prour.run_servers.StepServers`), except the train stage's
under ``serve.colocate_train: false``: another node serves them (``prour serve``) and the step
waits for the recipe's endpoints file to list them ready. The first failure stops the run, naming
the step, its exit code and its log.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour import interrupt
from prour.files import write_atomic
from prour.run_servers import StepServers, runner_endpoints
from prour.run_state import (
    DONE,
    GATE,
    PARTIAL,
    PENDING,
    SKIPPED,
    STALE,
    Row,
    flat_values,
    folder_in_use,
    read_stamp,
    skip_reason,
    step_row,
    table,
    write_stamp,
)
from prour.run_summary import serving_problems, step_servers
from prour.stages import (
    STAGES,
    Step,
    served_elsewhere,
    stage_names,
    steps,
    writer_of,
)

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

RUN_RECORD = "run.json"  # <run_dir>/.prour/run.json: the recipe and --set items of the last run
FAILED_EXIT, USAGE_EXIT = 1, 2  # 2: a setup refused up front (a step's, or a folder in use)
INTERRUPTED_EXIT = interrupt.INTERRUPTED_EXIT
POLL_S = 0.5
# The command the review gate prints when set (``prour slurm submit --recipe R --approve-labels``
# in a Slurm job); else the runner's own command line with ``--approve-labels``.
APPROVE_COMMAND_ENV = "PROUR_APPROVE_COMMAND"


class RunError(RuntimeError):
    """A setup or usage error of ``prour run`` (exit 2): an unknown name, a bad recipe."""


def valid_names() -> list[str]:
    return [*stage_names(), *(step.name for step in steps() if step.name not in stage_names())]


def _expand(name: str) -> list[str]:
    """The step names a stage or step name stands for; an unknown name lists the valid ones."""
    name = name.strip()
    for stage in STAGES:
        if stage.name == name:
            return [step.name for step in stage.steps]
    if any(step.name == name for step in steps()):
        return [name]
    from prour.registry import unknown_name

    raise RunError(unknown_name("stage or step", name, valid_names()))


def select(first: str | None = None, last: str | None = None,
           only: Iterable[str] | None = None) -> list[str]:
    """The step names ``--from``/``--to``/``--only`` ask for, in chain order."""
    order = [step.name for step in steps()]
    if only:
        wanted = {name for item in only for part in item.split(",") if part.strip()
                  for name in _expand(part)}
        return [name for name in order if name in wanted]
    start = order.index(_expand(first)[0]) if first else 0
    end = order.index(_expand(last)[-1]) if last else len(order) - 1
    if start > end:
        raise RunError(f"--from {first} comes after --to {last} in the chain: "
                       f"{' -> '.join(order)}")
    return order[start:end + 1]


# ---- running the chain ------------------------------------------------------------------------------


Hook = Callable[["Recipe"], Any]


@dataclass
class RunOptions:
    """What ``prour run`` was asked (``continue_command``: the command the gate message prints
    with ``--approve-labels``; ``hooks``: step name -> (before, after), before returning extra
    arguments for the step's command, as ``prour demo`` adds its own steps)."""

    recipe_path: str
    overrides: list[str] = field(default_factory=list)
    names: list[str] | None = None  # selected step names (None: all)
    dry_run: bool = False
    rerun_stale: bool = False
    approve_labels: bool = False
    continue_command: list[str] | None = None
    hooks: dict[str, tuple[Hook | None, Hook | None]] = field(default_factory=dict)
    python: str = sys.executable


def _say(text: str) -> None:
    print(text, flush=True)


class Runner:
    """One pass over the chain for one recipe (see the module docstring)."""

    def __init__(self, recipe: Recipe, options: RunOptions, say: Callable[[str], None] = _say):
        self.recipe, self.options, self.say = recipe, options, say
        self.run_dir = recipe.resolved_run_dir()
        self.servers = StepServers(recipe, runner_endpoints(recipe), say)
        self.ran: set[str] = set()
        self.refused: dict[str, str] = {}  # step -> why it did not start (exit 2)
        self.child: subprocess.Popen | None = None

    # -- what to run --
    def selected(self, rows: Sequence[Row]) -> list[Row]:
        names = self.options.names
        return [row for row in rows if names is None or row.step.name in names]

    def command(self, step: Step, partial: bool = False, extra: Sequence[str] = ()) -> list[str]:
        """The step's ``prour`` arguments as this run gives them."""
        sets = [part for item in self.options.overrides for part in ("--set", item)]
        added = [*extra, *(step.resume if partial else ())]
        if step.takes_recipe:
            if step_servers(self.recipe, step) and not served_elsewhere(self.recipe, step):
                sets += ["--set", f"endpoints_file={self.servers.path}"]
            return step.argv(self.recipe, self.options.recipe_path, [*added, *sets])
        return step.argv(self.recipe, self.options.recipe_path, added)

    def dry_run(self, rows: Sequence[Row]) -> int:
        for row in self.selected(rows):
            self.say(_row_line(row))
            if row.state in (PENDING, PARTIAL, STALE) and not row.step.is_gate:
                self.say(f"      prour {shlex.join(self.command(row.step, row.state == PARTIAL))}")
                served = step_servers(self.recipe, row.step)
                how = ("reads from the endpoints file (served on another node)"
                       if served_elsewhere(self.recipe, row.step) else "serves")
                for model_id, roles in served.items():
                    self.say(f"      {how} {model_id} (roles {', '.join(roles)})")
                if row.step.serves_itself:  # its serving groups, cells and servers
                    from prour.cluster.study import describe_study

                    for line in describe_study(self.recipe):
                        self.say(f"      {line}")
        self._estimates(rows)
        return 2 if self._node_plan() else 0

    def _estimates(self, rows: Sequence[Row]) -> None:
        """The run-time estimates (:mod:`prour.estimate`) of the steps this run would start."""
        from prour.estimate import chain_estimates

        todo = [row.step.name for row in self.selected(rows)
                if row.state in (PENDING, PARTIAL, STALE)]
        for line in chain_estimates(self.recipe, todo):
            self.say(line)

    def _node_plan(self) -> int:
        """The dry run's view of this node for the selected steps (:mod:`prour.run_summary`):
        the servers with their command lines, each stage's GPU memory plan, and what preflight
        finds missing (each step's own check stops it before it starts); returns how many
        problems it found (the dry run then exits 2: a broken setup)."""
        from prour.run_summary import node_plan

        lines, problems = node_plan(self.recipe, self.options.names)
        for line in lines:
            self.say(line)
        for problem in problems:
            self.say(f"problem: {problem}")
        self.say(f"{len(problems)} problem(s) on this node for these steps"
                 + (": each step checks again before it starts" if problems else ""))
        return len(problems)

    def refusals(self) -> list[str]:
        """What refuses this run before it starts anything (no server, no step, no file):
        :func:`~prour.run_summary.run_refusals` of the selected steps, those to run."""
        from prour.run_summary import run_refusals

        to_run = [row.step for row in self.selected(table(self.recipe))
                  if row.state in (PENDING, PARTIAL, STALE) and not row.step.is_gate]
        return run_refusals(self.recipe, self.options.names, to_run)

    def run(self) -> int:
        """Walk the selected steps; the exit code of ``prour run``."""
        rows = table(self.recipe)
        if self.options.dry_run:
            return self.dry_run(rows)
        stale = [row for row in self.selected(rows) if row.state == STALE]
        if stale and not self.options.rerun_stale:
            for row in stale:
                self.say(f"== {row.step.name}: stale ({row.why})")
            again = [*(self.options.continue_command or _argv()), "--rerun-stale"]
            self.say(f"{len(stale)} step(s) were made with other recipe values and were not "
                     f"rerun: {', '.join(r.step.name for r in stale)}; rerun them (their outputs "
                     f"are moved to {self.run_dir / '.prour' / 'stale'}):\n  {shlex.join(again)}")
            return FAILED_EXIT
        self._record_run()  # what `prour status` reloads: the last run that went ahead
        started = time.time()
        try:
            return self._walk()
        finally:
            self.servers.stop_all()
            self._where_and_how_long(started)

    def _where_and_how_long(self, started: float) -> None:
        """The end table: what ran where and how long each step took (:mod:`prour.run_summary`)."""
        from prour.run_summary import run_table

        self.say(run_table(self.recipe, read_stamp, self.options.names, started, skip_reason,
                           refused=self.refused))

    def _walk(self) -> int:
        done_rows: dict[str, Row] = {}
        flat = flat_values(self.recipe)
        names = self.options.names
        for step in steps():
            row = step_row(self.recipe, step, done_rows, flat)
            done_rows[step.name] = row
            if names is not None and step.name not in names:
                continue
            code = self._one(row)
            if code is not None:
                return code
            done_rows[step.name] = step_row(self.recipe, step, done_rows, flat)
        self.say(f"prour run: every step asked for is done ({self.run_dir})")
        return 0

    def _one(self, row: Row) -> int | None:
        """Do what ``row`` needs; an exit code stops the run (None: go on)."""
        step = row.step
        if row.state == SKIPPED:
            self.say(f"== {step.name}: skipped ({row.why})")
            return None
        if row.state == DONE:
            if read_stamp(self.recipe, step) is None and not step.is_gate:
                write_stamp(self.recipe, step, None, time.time(), time.time(), adopted=True)
            self.say(f"== {step.name}: skipped (done{': ' + row.why if row.why else ''})")
            return None
        if row.state == GATE:
            return self._gate(step)
        if row.state == STALE:
            if not (self.options.rerun_stale or row.upstream in self.ran):
                self.say(f"== {step.name}: stale ({row.why}); rerun with --rerun-stale")
                return FAILED_EXIT
            self._move_aside(step)
        return self._execute(step, partial=row.state == PARTIAL)

    def _gate(self, step: Step) -> int | None:
        if step.approval is not None:  # a gate whose row says how it passes (the taxonomy's)
            return self._approval_gate(step)
        from prour.router.review import approve, describe_counts, label_counts, labels_files

        calibration = self.recipe.router.calibration
        by = ("--approve-labels" if self.options.approve_labels else
              "router.calibration.approve_labels" if calibration.approve_labels else None)
        topped_up = self._topped_up()
        if by == "--approve-labels" and topped_up:
            by = None  # a person approves what they reviewed, not what this run labelled since
        if by:
            counts = approve(self.recipe, by)
            among = f" ({topped_up} labelled after the review among them)" if topped_up else ""
            self.say(f"== {step.name}: labels approved by {by}{among}: "
                     + "; ".join(f"{split} {describe_counts(c)}" for split, c in counts.items()))
            return None
        self.servers.stop_all()
        again = self._approving_command()
        lines = [(f"== {step.name}: the chain stops at the review gate; review the annotator's "
                  "labels (a wrong one: set its `corrected` field to act, clarify or verify):")]
        if topped_up:
            lines.append(f"   the dev mix was short after the review: {topped_up} more dev "
                         "states were labelled (router.calibration.short_mix: annotate), "
                         "review them")
        for path in labels_files(self.recipe).values():
            counts = label_counts(path) if path.is_file() else None
            lines.append(f"   {path}: {describe_counts(counts) if counts else 'missing'}")
        lines.append(f"   then approve them and continue:\n   {shlex.join(again)}")
        self.say("\n".join(lines))
        return 0

    def _approving_command(self) -> list[str]:
        """The command a gate's message prints: this run's with ``--approve-labels``."""
        # a Slurm job names the command that approves for the whole submission instead
        again = (shlex.split(os.environ[APPROVE_COMMAND_ENV]) if os.environ.get(APPROVE_COMMAND_ENV)
                 else [*(self.options.continue_command or _argv()), "--approve-labels"])
        if again.count("--approve-labels") > 1:  # this run had it (a top-up stopped it again)
            again.remove("--approve-labels")
        return again

    def _approval_gate(self, step: Step) -> int | None:
        """A gate whose row says how it passes (:attr:`Step.approval`): ``--approve-labels`` or
        its recipe key approves what its files hold; without them the run stops, naming the
        files to review and the command that approves them and goes on."""
        rule = step.approval
        by = "--approve-labels" if self.options.approve_labels else rule.unattended(self.recipe)
        if by:
            try:
                said = rule.approve(self.recipe, by)
            except ValueError as exc:
                self.say(f"== {step.name}: failed: {exc}")
                return FAILED_EXIT
            self.say(f"== {step.name}: labels approved by {by}: {said}")
            return None
        self.servers.stop_all()
        lines = [(f"== {step.name}: the chain stops at the review gate; review the annotator's "
                  f"labels (a wrong one: set its `corrected` field to {rule.correct}):"),
                 *(f"   {line}" for line in rule.waiting(self.recipe)),
                 f"   then approve them and continue:\n   {shlex.join(self._approving_command())}"]
        self.say("\n".join(lines))
        return 0

    def _topped_up(self) -> int:
        """Dev states this run's annotation labelled because a review's corrections left the dev
        mix short (0: none, or the annotation did not run in this run)."""
        from prour.router.review import review_mix

        path, labelled = review_mix(self.recipe)
        if not self.recipe.router.calibration.dev_states or \
                writer_of(self.recipe, path).name not in self.ran:
            return 0
        return labelled

    def _move_aside(self, step: Step) -> None:
        """Move a stale step's outputs under ``.prour/stale/<time>/`` (nothing is deleted)."""
        aside = self.run_dir / ".prour" / "stale" / time.strftime("%Y%m%dT%H%M%S")
        for out in step.cleared(self.recipe):
            if out.path.exists():
                try:
                    target = aside / out.path.relative_to(self.run_dir)
                except ValueError:
                    target = aside / out.path.name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(out.path, target)
                self.say(f"   moved stale {out.path} -> {target}")

    def _execute(self, step: Step, partial: bool) -> int | None:
        from prour.cluster.serve import ServeError

        before, after = self.options.hooks.get(step.name, (None, None))
        extra = list(before(self.recipe) or []) if before else []
        argv = self.command(step, partial, extra)
        printed = shlex.join(["prour", *argv])
        held = folder_in_use(self.recipe, step)
        if held:  # before its log, its servers or its weights: it would be refused after them
            self.refused[step.name] = held
            self.say(f"== {step.name}: refused: {held}")
            return USAGE_EXIT
        unservable = serving_problems(self.recipe, step)  # before a server starts, not after
        if unservable:
            self.refused[step.name] = unservable[0]
            self.say(f"== {step.name}: refused: its servers cannot start: "
                     + "; ".join(unservable))
            return USAGE_EXIT
        started = time.time()
        self.say(f"== {step.name}: start{' (resumes)' if partial else ''}: {printed}")
        try:
            self.servers.ensure(step)
        except ServeError as exc:
            self.say(f"== {step.name}: failed after {time.time() - started:.0f} s: {exc}")
            return FAILED_EXIT
        code = self._launch(step, argv, printed, started, self._as_run(extra))
        if code is None and after:
            after(self.recipe)
        return code

    def _as_run(self, extra: Sequence[str]) -> Recipe:
        """The recipe as a step ran it: with the ``--set`` items a hook added (the run's own
        ``--set`` items follow them on its command line, so they win)."""
        items = [extra[i + 1] for i, part in enumerate(extra[:-1]) if part == "--set"]
        if not items:
            return self.recipe
        from prour.recipes import load_recipe

        return load_recipe(self.options.recipe_path, [*items, *self.options.overrides])

    def _launch(self, step: Step, argv: list[str], printed: str, started: float,
                ran_with: Recipe | None = None) -> int | None:
        """Run the step's child, check its outputs (as the step ran: ``ran_with``) and stamp it;
        an exit code stops the run."""
        log = self.run_dir / "logs" / f"{step.name}.log"
        code, cause = self._child(argv, log)
        seconds = time.time() - started
        if code != 0 or cause:
            if code == INTERRUPTED_EXIT and not cause:  # a server that died: failed
                self.say(f"== {step.name}: interrupted after {seconds:.0f} s (log {log}); "
                         "a rerun resumes")
                return INTERRUPTED_EXIT
            if code == USAGE_EXIT and not cause:  # its command refused to start (its error line)
                self.refused[step.name] = f"its command exited {code}"
                self.say(f"== {step.name}: refused after {seconds:.0f} s: its command refused "
                         f"its setup or its folder (exit code {code}); log {log}")
                return USAGE_EXIT
            write_stamp(self.recipe, step, printed, started, time.time(), failed=code or 1)
            self.say(f"== {step.name}: failed after {seconds:.0f} s, exit code {code}"
                     f"{': ' + cause if cause else ''}; log {log}")
            return FAILED_EXIT
        if not step.is_done(ran_with or self.recipe):
            write_stamp(self.recipe, step, printed, started, time.time(), failed=0)
            missing = [str(f.path) for f in step.writes(self.recipe)]
            self.say(f"== {step.name}: failed after {seconds:.0f} s: its command exited 0 but "
                     f"its outputs are not complete ({', '.join(missing)}); log {log}")
            return FAILED_EXIT
        write_stamp(self.recipe, step, printed, started, time.time())
        self.ran.add(step.name)
        self.say(f"== {step.name}: done in {seconds:.0f} s")
        return None

    def _child(self, argv: list[str], log: Path) -> tuple[int, str | None]:
        """Run ``prour argv``, its output to the terminal and ``log``; a server that dies
        meanwhile stops it (the cause is returned)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with _open_log(log) as sink:
            sink.write(f"$ prour {shlex.join(argv)}\n".encode())
            sink.flush()
            self.child = subprocess.Popen([self.options.python, "-m", "prour.cli.main", *argv],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True,
                                          env={**os.environ, **interrupt.step_env()})
            tee = threading.Thread(target=_tee, args=(self.child.stdout, sink), daemon=True)
            tee.start()
            cause = None
            # a signal is passed on to the child; leaving the block after one waits for it, then
            # the tee copies the child's last lines (its report of what it saved) before we go on
            try:
                with interrupt.child(self.child, f"prour {argv[0]} ({log.stem})"):
                    while self.child.poll() is None:
                        cause = self.servers.dead()
                        if cause:
                            _stop_child(self.child, signal.SIGTERM)
                            break
                        time.sleep(POLL_S)
            finally:
                tee.join(5)
            code = self.child.wait()
        return code, cause

    def saved(self) -> str:
        """What an interrupted run kept (``prour.interrupt``'s report)."""
        done = sorted(self.ran, key=[s.name for s in steps()].index)
        return (f"{len(done)} step(s) finished in this run ({', '.join(done) or 'none'}), each "
                f"stamped in {self.run_dir / '.prour' / 'steps'}; the running step's log is in "
                f"{self.run_dir / 'logs'}; `prour run` again skips what is done and resumes the "
                "rest")

    def _record_run(self) -> None:
        """``.prour/run.json``: how to reload this recipe (``prour status`` reads it)."""
        record = {"recipe": str(Path(self.options.recipe_path).resolve()),
                  "overrides": self.options.overrides, "run_dir": str(self.run_dir),
                  "cwd": os.getcwd(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_atomic(self.run_dir / ".prour" / RUN_RECORD, json.dumps(record, indent=2) + "\n")


def _open_log(path: Path):
    """The step's log, appended to while its child runs."""
    return open(path, "ab")  # the child's output is appended until it exits


def _tee(stream: Any, sink: Any) -> None:
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    for line in iter(stream.readline, b""):
        sink.write(line)
        sink.flush()
        if out is not None:
            out.write(line)
            out.flush()
        else:
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()


def _stop_child(child: subprocess.Popen, signum: int, grace_s: float = 30.0) -> None:
    """Signal the child's process group; KILL it after ``grace_s``."""
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        return
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()


def _argv() -> list[str]:
    return ["prour", *sys.argv[1:]]


def _row_line(row: Row) -> str:
    why = f"  ({row.why})" if row.why else ""
    return f"  {row.stage.name + '/' + row.step.name:<28} {row.state:<8}{why}"


def table_text(rows: Sequence[Row]) -> str:
    """The step table as ``prour run --dry-run`` and ``prour status`` print it."""
    return "\n".join(_row_line(row) for row in rows)
