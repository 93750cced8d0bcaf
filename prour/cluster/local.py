"""A single-node Slurm under a temporary folder, for tests and for trying the sbatch path locally.

Installs Debian's ``slurmctld slurmd slurm-client munge`` when missing (root only), starts munged
(unless one already answers), slurmctld and slurmd in the foreground as our own children with a
private ``slurm.conf``, and stops them by PID. Clients find the cluster through ``SLURM_CONF``.
The settings are the ones measured in DESIGN §5: no systemd, no cgroups, a 1 s scheduler tick.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from prour.files import write_atomic

logger = logging.getLogger(__name__)

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged", "munge")
NODE = "localhost"
PARTITION = "debug"
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")

# KillWait: Slurm's default 30 s between a cancelled job's SIGTERM and SIGKILL, the time prour's
# commands have to say what they saved and exit (prour.interrupt); 10 s was too short on 2 busy cores
CONF_TEMPLATE = """\
# Slurm written by prour.cluster.local (no systemd, no cgroups, no accounting); %n is the node's
# name, so that several slurmd daemons on one machine keep their own spool, PID and log files.
ClusterName=prour-local
SlurmctldHost={ctld_host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
MinJobAge=3600
KillWait=30
InactiveLimit=0
SlurmdTimeout=60
{nodes}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""

NODE_LINE = "NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started on this machine (the reason says why)."""


def missing_binaries() -> list[str]:
    """Slurm/munge programs not found on PATH (or in /usr/sbin)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in BINARIES if shutil.which(name, path=search) is None]


def binary(name: str) -> str:
    """Full path of a Slurm/munge program (sbin folders included)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which(name, path=search)
    if found is None:
        raise SlurmUnavailable(f"{name} not found on PATH or in /usr/sbin")
    return found


def install_packages(timeout_s: float = 900.0) -> None:
    """``apt-get install`` the Slurm packages (root only); idempotent."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"missing {missing_binaries()} and not root (cannot apt-get install)"
        )
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"missing {missing_binaries()} and no apt-get on this machine")
    install = ["apt-get", "install", "-y", "-qq", *PACKAGES]
    done = _apt(install, timeout_s)
    if done.returncode != 0:  # a stale package index is the usual cause: refresh it once
        _apt(["apt-get", "update", "-qq"], timeout_s)
        done = _apt(install, timeout_s)
    if done.returncode != 0 or missing_binaries():
        raise SlurmUnavailable(
            f"apt-get install {' '.join(PACKAGES)} failed:\n{done.stderr[-2000:]}"
        )


def _apt(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def memory_mb() -> int:
    """Memory Slurm may advertise for the node: 90% of MemTotal, in MiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.9)
    raise SlurmUnavailable("cannot read MemTotal from /proc/meminfo")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def munge_works() -> bool:
    """Whether a munged answers on this machine (a credential can be made and decoded)."""
    try:
        cred = subprocess.run([binary("munge"), "-n"], capture_output=True, timeout=10, check=False)
        if cred.returncode != 0:
            return False
        back = subprocess.run(
            [binary("unmunge")], input=cred.stdout, capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError, SlurmUnavailable):
        return False
    return back.returncode == 0


class LocalSlurm:
    """Slurm daemons under ``root``; ``start()`` then ``stop()`` (both by PID)."""

    ctld_host = NODE
    ctld_addr = "127.0.0.1"

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self.munged_pid: int | None = None  # set only when we started munged ourselves

    def env(self) -> dict[str, str]:
        """Environment for Slurm clients (sbatch, squeue, ...) that talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def ensure_installed(self) -> None:
        install_packages()

    def start(self, timeout_s: float = 60.0) -> LocalSlurm:
        """Start munged (if needed), slurmctld and slurmd; wait until the node is idle."""
        if os.geteuid() != 0:
            raise SlurmUnavailable("the local cluster runs its daemons as root")
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", [binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._start_slurmds()
        self._save_pids()
        try:
            self.wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise
        logger.info("local Slurm up under %s (SLURM_CONF=%s)", self.root, self.conf)
        return self

    def _start_munge(self) -> None:
        """Reuse a running munged, else start one as the munge user and remember its PID."""
        if munge_works():
            return
        if not MUNGE_KEY.exists():
            subprocess.run(
                [binary("mungekey"), "--create", "--keyfile", str(MUNGE_KEY)], check=True
            )
            shutil.chown(MUNGE_KEY, "munge", "munge")
        MUNGE_RUN.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_RUN, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", binary("munged")], check=True, timeout=30)
        pid_file = MUNGE_RUN / "munged.pid"
        deadline = time.monotonic() + 10
        while not munge_works():
            if time.monotonic() > deadline:
                raise SlurmUnavailable("munged started but does not answer `munge -n`")
            time.sleep(0.1)
        self.munged_pid = int(pid_file.read_text().strip()) if pid_file.exists() else None

    def nodes(self) -> dict[str, str]:
        """The cluster's nodes, name to address."""
        return {NODE: "127.0.0.1"}

    def _write_conf(self) -> None:
        nodes = self.nodes()
        for sub in ("state", "log", *(f"spool/{name}" for name in nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # the CPUs and memory are shared: every node advertises the whole machine
        lines = [
            NODE_LINE.format(name=name, addr=addr, cpus=os.cpu_count() or 1, memory_mb=memory_mb())
            for name, addr in nodes.items()
        ]
        write_atomic(
            self.conf,
            CONF_TEMPLATE.format(
                ctld_host=self.ctld_host,
                ctld_addr=self.ctld_addr,
                nodes="\n".join(lines),
                node_list=",".join(nodes),
                partition=PARTITION,
                root=self.root,
                ctld_port=free_port(),
                slurmd_port=free_port(),
            )
        )

    def _start_slurmds(self) -> None:
        self._spawn("slurmd", [binary("slurmd"), "-D", "-N", NODE, "-f", str(self.conf)])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (open while it runs)
        self._logs.append(log)
        self._procs[name] = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _save_pids(self) -> None:
        pids = {name: proc.pid for name, proc in self._procs.items()}
        write_atomic(self.root / "pids.json", json.dumps({**pids, "munged": self.munged_pid}))

    def wait_idle(self, timeout_s: float) -> None:
        """Poll ``sinfo`` until every node reports idle; raise with the daemon logs otherwise."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(
                        f"{name} exited with {proc.returncode}:\n{self.log_tail()}"
                    )
            done = subprocess.run(
                [binary("sinfo"), "-h", "-N", "-o", "%N %t"],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if all(states.get(node) == "idle" for node in self.nodes()):
                return
            time.sleep(0.5)
        raise SlurmUnavailable(
            f"nodes not idle after {timeout_s:g} s (states {states!r}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts)

    def _queued_jobs(self) -> list[str]:
        """Ids of this cluster's queued or running jobs."""
        queue = subprocess.run(
            [binary("squeue"), "-h", "-o", "%A"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return sorted(set(queue.stdout.split()))

    def cancel_all(self, timeout_s: float = 30.0) -> None:
        """Cancel this cluster's jobs and wait until the queue is empty (job processes gone)."""
        jobs = self._queued_jobs()
        if not jobs:
            return
        subprocess.run(
            [binary("scancel"), *jobs], env=self.env(), capture_output=True, timeout=10, check=False
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._queued_jobs():
                return
            time.sleep(0.5)
        logger.warning("jobs still queued after scancel: %s", jobs)

    def stop(self) -> None:
        """Cancel jobs, then stop slurmd, slurmctld and (if ours) munged by PID."""
        ctld = self._procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.cancel_all()
            except (OSError, subprocess.SubprocessError, SlurmUnavailable) as exc:
                logger.warning("could not cancel the local jobs: %s", exc)
        # the slurmd daemons first (every process but slurmctld), then slurmctld
        for name in sorted(self._procs, key=lambda name: name == "slurmctld"):
            stop_process(self._procs.pop(name))
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self.munged_pid is not None:
            kill_pid(self.munged_pid)
            self.munged_pid = None

    def stop_detached(self) -> None:
        """Stop a cluster started by another process, from the PIDs it saved in ``pids.json``."""
        pids = json.loads((self.root / "pids.json").read_text())
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError, SlurmUnavailable) as exc:
            logger.warning("could not cancel the local jobs: %s", exc)
        for name in sorted(pids, key=lambda name: (name == "slurmctld", name == "munged")):
            if pids[name]:
                kill_pid(int(pids[name]))
        (self.root / "pids.json").unlink()


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """TERM a child, then KILL it if it outlives ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def kill_pid(pid: int, grace_s: float = 10.0) -> None:
    """TERM a process we started but do not hold a handle to, then KILL it if needed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> None:
    """``python -m prour.cluster.local install | start DIR | stop DIR`` (as root)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m prour.cluster.local", description=__doc__)
    parser.add_argument("action", choices=("install", "start", "stop"))
    parser.add_argument("dir", nargs="?", help="folder for slurm.conf, state, spool and logs")
    args = parser.parse_args(argv)
    if args.action == "install":
        install_packages()
        return
    if not args.dir:
        parser.error(f"{args.action} needs DIR")
    cluster = LocalSlurm(args.dir)
    if args.action == "start":
        cluster.ensure_installed()
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop_detached()


if __name__ == "__main__":  # pragma: no cover
    main()
