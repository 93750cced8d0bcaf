"""Submitting rendered stages with ``sbatch`` and reading back their state.

``submit`` chains the stages with ``--dependency`` and writes ``<run_dir>/slurm_jobs.json``
(stage -> job id, script, log, status file). ``summarize`` asks ``sacct`` and, where accounting
is disabled, ``scontrol show job``; the status files the scripts write give exit codes and times
even after Slurm has forgotten a job. All Slurm calls go through one runner so tests can fake it.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.cluster.submission import StagePlan, Submission, SubmitRequest
from prour.files import write_atomic
from prour.stages import stage_names

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

logger = logging.getLogger(__name__)

SCHEMA = "prour.slurm_jobs/1"
MANIFEST = "slurm_jobs.json"  # in the run folder
Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
FAILED = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
NEVER_SATISFIED = "DependencyNeverSatisfied"
JOB_VARS = {stage: f"JOB_{stage.upper()}" for stage in stage_names()}


class SubmitError(RuntimeError):
    """sbatch refused a stage (the message names it and quotes sbatch)."""


def run_command(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; a missing program reads as a failed command."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")


# ---- submission -----------------------------------------------------------------------------


def sbatch_command(plan: StagePlan, dependency_id: str | None, kill_on_invalid: bool) -> list[str]:
    """``sbatch --parsable [--dependency=...] script`` for one stage."""
    cmd = ["sbatch", "--parsable"]
    if plan.after is not None:
        cmd.append(f"--dependency={plan.dependency}:{dependency_id}")
        if kill_on_invalid:
            cmd.append("--kill-on-invalid-dep=yes")
    return [*cmd, str(plan.script_path)]


def dry_run_text(submission: Submission, recipe: Recipe) -> str:
    """The sbatch commands as a runnable shell snippet, followed by every rendered script."""
    plans = submission.plans
    lines = [
        "# prour slurm submit --dry-run: nothing was written or submitted.",
        "# The commands, as they would run (job ids flow through shell variables):",
    ]
    for plan in plans:
        dep = f"${JOB_VARS[plan.after]}" if plan.after else None
        cmd = shlex.join(sbatch_command(plan, "DEP", recipe.slurm.kill_on_invalid_dep))
        if dep:
            cmd = cmd.replace(":DEP", f":{dep}")
        lines.append(f"{JOB_VARS[plan.stage]}=$({cmd} | cut -d';' -f1)")
    if submission.gate:
        lines.append(f"# the chain stops at the review gate ({plans[-1].stage}); after the "
                     f"review: {submission.gate}")
    for plan in plans:
        lines += [
            "",
            f"# ===== {plan.script_path} (from {plan.template}) =====",
            plan.script.rstrip(),
        ]
        lines += [f"# note: {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"


def write_scripts(plans: Sequence[StagePlan]) -> None:
    """Write the rendered scripts and clear status files left by an earlier submission."""
    for plan in plans:
        write_atomic(plan.script_path, plan.script)
        plan.script_path.chmod(0o755)
        Path(plan.log_pattern).parent.mkdir(parents=True, exist_ok=True)
        plan.status_path.parent.mkdir(parents=True, exist_ok=True)
        for old in plan.status_path.parent.glob(f"{plan.stage}*"):
            if old.name == plan.stage or old.name.startswith(f"{plan.stage}."):
                old.unlink()


def _job_id(done: subprocess.CompletedProcess[str]) -> str:
    """The id ``sbatch --parsable`` printed (``id`` or ``id;cluster``)."""
    return done.stdout.strip().splitlines()[-1].split(";")[0]


EARLIER = "before-review"


def earlier_entries(run_dir: Path) -> list[dict[str, Any]]:
    """The jobs of the submission that stopped at the review gate, kept when the chain continues
    past it (``status`` then shows the whole chain), their status files moved aside so that the
    new jobs' own do not replace them; [] after any other submission."""
    try:
        before = load_manifest(run_dir)
    except (OSError, ValueError):
        return []
    if not before.get("gate"):
        return []
    kept = []
    for entry in before["stages"]:
        status = entry.get("status_file")
        if status and Path(status).is_file():
            moved = Path(status).parent / EARLIER / Path(status).name
            moved.parent.mkdir(parents=True, exist_ok=True)
            Path(status).replace(moved)
            status = str(moved)
        kept.append({**entry, "label": f"{entry['stage']} ({EARLIER})", "status_file": status})
    return [*before.get("earlier", []), *kept]


def submit(
    recipe: Recipe,
    request: SubmitRequest,
    submission: Submission,
    runner: Runner = run_command,
) -> dict[str, Any]:
    """Write and submit the stages in order; returns (and saves) the manifest."""
    plans = submission.plans
    earlier = earlier_entries(request.run_dir) if request.approve_labels else []
    write_scripts(plans)
    ids: dict[str, str] = {}
    for plan in plans:
        cmd = sbatch_command(plan, ids.get(plan.after or ""), recipe.slurm.kill_on_invalid_dep)
        done = runner(cmd)
        if done.returncode != 0 or not done.stdout.strip():
            cancel_jobs(list(ids.values()), runner)
            kept = (
                f"; cancelled the jobs already submitted ({', '.join(ids.values())})" if ids else ""
            )
            raise SubmitError(
                f"sbatch refused stage {plan.stage!r} (exit {done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}{kept}"
            )
        ids[plan.stage] = _job_id(done)
        logger.info("submitted %s as job %s", plan.stage, ids[plan.stage])
    manifest = {
        "schema": SCHEMA,
        "recipe": str(request.recipe_path),
        "name": recipe.name,
        "run_dir": str(request.run_dir),
        "workdir": str(request.workdir),
        "overrides": request.overrides,
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "stages": [manifest_entry(plan, ids) for plan in plans],
        "gate": submission.gate,
        "earlier": earlier,
    }
    path = request.run_dir / MANIFEST
    write_atomic(path, json.dumps(manifest, indent=2) + "\n")
    record_provenance(recipe, request)
    return manifest


def record_provenance(recipe: Recipe, request: SubmitRequest) -> None:
    """Resolved recipe, commit and versions of the submission, in ``<run_dir>/slurm``."""
    from prour.provenance import write_provenance

    write_provenance(
        request.run_dir / "slurm",
        recipe,
        extra={"stages": request.stages or "chain", "overrides": request.overrides},
    )


def manifest_entry(plan: StagePlan, ids: dict[str, str]) -> dict[str, Any]:
    """Stage -> job id, script, log and status paths, and the command the job runs."""
    job = ids[plan.stage]
    return {
        "stage": plan.stage,
        "job_id": job,
        "script": str(plan.script_path),
        "log": plan.log_pattern.replace("%j", job),
        "status_file": str(plan.status_path),
        "depends_on": f"{plan.dependency}:{ids[plan.after]}" if plan.after else None,
        "command": plan.command,
        "tasks": [],
    }


def cancel_jobs(job_ids: Sequence[str], runner: Runner) -> None:
    if job_ids:
        runner(["scancel", *job_ids])


# ---- state ----------------------------------------------------------------------------------


@dataclass
class JobRecord:
    """What Slurm says about one job or array task."""

    state: str
    exit_code: int | None = None
    reason: str | None = None


def _state_word(text: str) -> str:
    """``CANCELLED by 0`` / ``CANCELLED+`` -> ``CANCELLED``."""
    return text.split()[0].rstrip("+") if text.strip() else "UNKNOWN"


def _exit_code(text: str | None) -> int | None:
    """``1:0`` -> 1; ``0:15`` (killed by signal 15) -> 143, as a shell reports it."""
    if not text or ":" not in text:
        return None
    code, _, signal = text.partition(":")
    if signal.isdigit() and int(signal) > 0:
        return 128 + int(signal)
    return int(code) if code.isdigit() else None


def expand_indices(spec: str) -> list[int]:
    """Array task ids ``0-3,5,7-9%2`` (or ``[0-3]``) -> [0, 1, 2, 3, 5, 7, 8, 9]."""
    spec = spec.strip("[]").split("%", 1)[0]
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def parse_sacct(text: str) -> dict[str, JobRecord]:
    """``sacct -n -P -X --format=JobID,State,ExitCode`` lines -> records by ``id`` / ``id_task``."""
    records: dict[str, JobRecord] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3:
            continue
        job, state, code = parts[:3]
        record = JobRecord(_state_word(state), _exit_code(code))
        base, _, task = job.partition("_")
        if task.startswith("["):
            for index in expand_indices(task):
                records[f"{base}_{index}"] = record
        else:
            records[job] = record
    return records


def parse_scontrol(text: str) -> dict[str, JobRecord]:
    """``scontrol show job -o`` lines -> records by ``id`` (arrays: ``arrayid_task``)."""
    records: dict[str, JobRecord] = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" not in fields:
            continue
        record = JobRecord(
            _state_word(fields.get("JobState", "")),
            _exit_code(fields.get("ExitCode")),
            fields.get("Reason") if fields.get("Reason") not in (None, "None") else None,
        )
        array, task = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        if array and task:
            for index in expand_indices(task):
                records[f"{array}_{index}"] = record
        else:
            records[fields["JobId"]] = record
    return records


def query_jobs(job_ids: Sequence[str], runner: Runner) -> tuple[dict[str, JobRecord], str]:
    """Records for the jobs from sacct, else from scontrol; also says which source answered."""
    ids = ",".join(job_ids)
    done = runner(["sacct", "-n", "-P", "-X", "-j", ids, "--format=JobID,State,ExitCode"])
    if done.returncode == 0 and done.stdout.strip():
        return parse_sacct(done.stdout), "sacct"
    logger.info("sacct unavailable (%s); asking scontrol", done.stderr.strip() or "no output")
    records: dict[str, JobRecord] = {}
    for job in job_ids:
        shown = runner(["scontrol", "show", "job", "-o", job])
        if shown.returncode == 0:
            records.update(parse_scontrol(shown.stdout))
        elif shown.returncode == 127 or "fatal" in shown.stderr:  # no usable Slurm client here
            logger.info("scontrol unavailable: %s", shown.stderr.strip())
            break
    return records, "scontrol" if records else "status files"


def read_status_file(path: str | Path | None) -> dict[str, str]:
    """``key=value`` lines a script wrote (job, node, start, end, rc); {} when absent."""
    if not path:
        return {}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@dataclass
class UnitStatus:
    """One job or array task: its state, exit code, log and times."""

    stage: str
    label: str  # "train", "eval[1] seed 0 retail"
    job: str
    state: str
    exit_code: int | None
    log: str
    reason: str | None = None
    start: float | None = None
    end: float | None = None

    @property
    def failed(self) -> bool:
        cancelled_by_hand = self.state == "CANCELLED" and self.reason != NEVER_SATISFIED
        return self.state in FAILED or cancelled_by_hand


def unit_status(
    stage: str, label: str, job: str, log: str, status_file: str | None, record: JobRecord | None
) -> UnitStatus:
    """Merge the script's own status file with what Slurm knows."""
    own = read_status_file(status_file)
    rc = int(own["rc"]) if own.get("rc", "").lstrip("-").isdigit() else None
    if record is not None and record.state not in ACTIVE and record.state != "COMPLETED":
        state = record.state  # Slurm knows better: timeout, OOM, cancelled, node failure
    elif rc is not None:
        state = "COMPLETED" if rc == 0 else "FAILED"
    elif record is not None:
        state = record.state
    else:
        state = "LOST" if own.get("start") else "NEVER_RAN"
    ran = rc is not None or bool(own.get("start")) or state not in ("CANCELLED", "NEVER_RAN")
    exit_code = rc if rc is not None else (record.exit_code if record and ran else None)
    return UnitStatus(
        stage,
        label,
        job,
        state,
        exit_code,
        log,
        record.reason if record else None,
        float(own["start"]) if own.get("start") else None,
        float(own["end"]) if own.get("end") else None,
    )


def stage_units(entry: dict[str, Any], records: dict[str, JobRecord]) -> list[UnitStatus]:
    """The units of one manifest entry: the job itself, or each array task."""
    job = entry["job_id"]
    if not entry.get("tasks"):
        return [
            unit_status(
                entry["stage"],
                entry.get("label") or entry["stage"],
                job,
                entry["log"],
                entry.get("status_file"),
                records.get(job),
            )
        ]
    units = []
    for task in entry["tasks"]:
        label = f"{entry['stage']}[{task['index']}] seed {task['seed']} {task['domain']}"
        units.append(
            unit_status(
                entry["stage"],
                label,
                f"{job}_{task['index']}",
                task["log"],
                task.get("status_file"),
                records.get(f"{job}_{task['index']}"),
            )
        )
    return units


@dataclass
class RunStatus:
    """Every unit of a submission, the first failed one, and the stages that never ran."""

    manifest: dict[str, Any]
    units: list[UnitStatus]
    source: str
    failed: UnitStatus | None = None
    never_ran: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[UnitStatus]:
        """Every failed unit, in manifest order (``failed`` is the first)."""
        return [unit for unit in self.units if unit.failed]

    @property
    def finished(self) -> bool:
        return all(u.state not in ACTIVE for u in self.units)

    @property
    def at_gate(self) -> str | None:
        """The command that approves the labels and continues, when every job of a chain that
        stops at the review gate is COMPLETED."""
        gate = self.manifest.get("gate")
        done = bool(self.units) and all(u.state == "COMPLETED" for u in self.units)
        return gate if gate and done else None


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


STEP_FAILED = re.compile(r"^== \S+: (failed|refused)\b")  # prour run's line for a step that
# failed, or did not start (its folder in use by another command, its setup refused)


def failure_cause(log: Path) -> str | None:
    """Why a stage failed, from its log: the last ``error:`` line a prour command printed, else
    the line ``prour run`` printed for the step that failed (a server that died is named there),
    else the last exception line of a traceback, else the last line; None without a log."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return None
    lines = [line for line in lines if line]
    for pattern in (re.compile(r"^error: "), STEP_FAILED, EXCEPTION_LINE):
        found = [line for line in lines if pattern.match(line)]
        if found:
            return found[-1]
    return lines[-1] if lines else None


def load_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The manifest of a run folder (or the manifest file itself)."""
    path = Path(run_dir)
    path = path if path.is_file() else path / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: submit with `prour slurm submit` first")
    manifest = json.loads(path.read_text())
    if manifest.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a prour Slurm manifest (schema {manifest.get('schema')!r})")
    return manifest


def summarize(manifest: dict[str, Any], runner: Runner = run_command) -> RunStatus:
    """States of every job (those before the review gate first, when the chain continued past
    it); names the first failed unit and the stages that never ran."""
    entries = [*manifest.get("earlier", []), *manifest["stages"]]
    records, source = query_jobs([e["job_id"] for e in entries], runner)
    per_entry = [stage_units(entry, records) for entry in entries]
    units = [unit for group in per_entry for unit in group]
    failed = next((u for u in units if u.failed), None)
    never = [
        entry["stage"]
        for entry, group in zip(entries, per_entry, strict=True)
        if all(u.state in ("NEVER_RAN", "CANCELLED") and u.start is None for u in group)
    ]
    return RunStatus(manifest, units, source, failed, never)
