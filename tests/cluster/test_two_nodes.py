"""Two Slurm nodes on one machine, each slurmd in its own network namespace (prour.cluster.nodes).

Root only, as CI runs. The single-node session cluster is requested first: it installs Slurm when
missing and owns munged, which both clusters share.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import alive

pytestmark = [pytest.mark.slurm]

# a job of one task per node: each says which node ran it and the address it has there, then
# fetches a page from a server that listens on node 1's address only
JOB = """#!/bin/bash
srun --ntasks-per-node=1 bash -c 'echo "task $SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk "{{print \\$4}}")"'
srun -N1 -w node2 {python} -c "import urllib.request; print('fetched', urllib.request.urlopen('http://{addr}:{port}/page.txt', timeout=10).read().decode().strip())"
"""


def test_two_namespaced_nodes_run_one_job_and_leave_nothing_behind(
    slurm_cluster: Any, tmp_path: Path
) -> None:
    from prour.cluster.local import free_port
    from prour.cluster.nodes import MultiNodeSlurm

    cluster = MultiNodeSlurm(tmp_path / "cluster", count=2)
    cluster.start()
    pids = [proc.pid for proc in cluster._procs.values()]
    server = None
    try:
        nodes = cluster.nodes()
        assert list(nodes) == ["node1", "node2"]
        assert len(set(nodes.values())) == 2
        (tmp_path / "page.txt").write_text("served on node1\n")
        port = free_port()
        server = subprocess.Popen(
            cluster.in_node(
                "node1",
                [sys.executable, "-m", "http.server", str(port), "--bind", nodes["node1"],
                 "--directory", str(tmp_path)],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        script = tmp_path / "job.sh"
        script.write_text(JOB.format(python=sys.executable, addr=nodes["node1"], port=port))
        out = tmp_path / "job.out"
        time.sleep(1.0)  # the server binds its address
        done = subprocess.run(
            ["sbatch", "--wait", "-N2", "-o", str(out), str(script)],
            env=cluster.env(), capture_output=True, text=True, timeout=120, check=False,
        )
        log = out.read_text() if out.exists() else ""
        assert done.returncode == 0, done.stderr + log + cluster.log_tail()
        tasks = sorted(line.split()[1:] for line in log.splitlines() if line.startswith("task "))
        assert tasks == [["node1", f"{nodes['node1']}/24"], ["node2", f"{nodes['node2']}/24"]]
        assert "fetched served on node1" in log
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        cluster.stop()
    assert cluster.network.leftovers() == []
    assert [pid for pid in pids if alive(pid)] == []
