"""Fuzzing ``prour import tau2`` (fuzz_readers.READERS: tau2-results): a tau2 results file made
by tau2's own models on a real retail task, then keys of its ``info``, ``tasks`` and
``simulations`` dropped or set to any value, a simulation pointed at a task the file does not
define, the task list emptied, or the bytes cut. Each run imports (every simulation counted as
added or already there) or ends in one error line naming the file. Examples per test: 25 in CI
(profile ``ci``), 200 under the ``full`` marker (tests/fuzz/conftest.py)."""

from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from fuzz_readers import check_cli, invoke
from hypothesis import given
from hypothesis import strategies as st
from jsonl_inputs import JSON_VALUES


@functools.cache
def results_file() -> str:
    """A valid tau2 results file (tau2's Results model) of two trials on retail task 5."""
    from tau2.data_model.message import AssistantMessage, UserMessage
    from tau2.data_model.simulation import (
        AgentInfo,
        Info,
        Results,
        SimulationRun,
        TerminationReason,
        UserInfo,
    )
    from tau2.environment.environment import EnvironmentInfo

    from prour.env.domains import get_task

    task = get_task("retail", "5")
    messages = [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
                UserMessage(role="user", content="Thanks. ###STOP###")]
    sims = [SimulationRun(id=f"sim-{trial}", task_id=task.id, timestamp="t", start_time="s",
                          end_time="e", duration=1.0,
                          termination_reason=TerminationReason.USER_STOP, reward_info=None,
                          messages=messages, trial=trial, seed=10 + trial)
            for trial in range(2)]
    info = Info(git_commit="abc", num_trials=2, max_steps=100, max_errors=10,
                user_info=UserInfo(implementation="user_simulator", llm="user-model"),
                agent_info=AgentInfo(implementation="llm_agent", llm="<b>agent</b>|model"),
                environment_info=EnvironmentInfo(domain_name="retail", policy="p"), seed=7)
    return Results(info=info, tasks=[task], simulations=sims).model_dump_json()


PATHS = ("info", "info.environment_info", "info.environment_info.domain_name", "info.agent_info",
         "info.agent_info.llm", "info.user_info.implementation", "info.seed", "tasks",
         "tasks.0", "tasks.0.id", "simulations", "simulations.0", "simulations.0.task_id",
         "simulations.1.task_id", "simulations.0.messages", "simulations.0.messages.0",
         "simulations.0.messages.0.role", "simulations.0.seed", "simulations.1.seed",
         "simulations.0.termination_reason", "simulations.0.duration", "simulations.0.trial",
         "simulations.1.skipped", "simulations.0.reward_info")
CHANGES = st.lists(st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(PATHS)),
    st.tuples(st.just("set"), st.sampled_from(PATHS), JSON_VALUES),
    st.tuples(st.just("set"), st.sampled_from(["simulations.0.task_id", "simulations.1.task_id"]),
              st.sampled_from(["6", "no-such-task"])),
    st.tuples(st.just("set"), st.just("tasks"), st.just([]))), max_size=3)


def _change(data: Any, change: tuple) -> None:
    *parents, last = change[1].split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) and part.isdigit() and \
            int(part) < len(node) else node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        if change[0] == "drop":
            node.pop(int(last))
        else:
            node[int(last)] = change[2]
    elif isinstance(node, dict):
        if change[0] == "drop":
            node.pop(last, None)
        else:
            node[last] = change[2]


def test_import_tau2_on_fuzzed_results(fuzz, tmp_path: Path) -> None:
    @fuzz
    @given(CHANGES, st.one_of(st.none(), st.floats(0, 1)))
    def run(changes: list[tuple], cut: float | None) -> None:
        data = json.loads(results_file())
        for change in changes:
            _change(data, change)
        text = json.dumps(data, indent=1)
        text = text if cut is None else text[:int(len(text) * cut)]
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            path = Path(folder) / "results.json"
            path.write_text(text)
            result = invoke("import", "tau2", path, "--run-dir", Path(folder) / "run")
            if check_cli(result, [path]) is not None:
                return
            added, already = map(int, re.search(r"(\d+) trajectories added .*\((\d+) already",
                                                result.output).groups())
            simulations = [s for s in data["simulations"] if not s.get("skipped")]
            assert added + already == len(simulations)  # every simulation counted

    run()


def test_a_simulation_of_a_task_the_file_lacks_is_one_line(tmp_path: Path) -> None:
    data = json.loads(results_file())
    data["simulations"][1]["task_id"] = "no-such-task"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    result = invoke("import", "tau2", path, "--run-dir", tmp_path / "run")
    line = check_cli(result, [path])
    assert line is not None and "simulations[1] (id 'sim-1') runs task 'no-such-task'" in line
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()  # nothing half-written
