"""The one registry type: names, lazy ``module:attr`` entries, unknown names with "did you mean"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prour.registry import Registry, did_you_mean, lazy_exports


def test_get_returns_the_registered_object_and_names_keep_order() -> None:
    registry: Registry[int] = Registry("colour", {"red": 1, "green": 2})
    registry.register("blue", 3)
    assert registry.get("green") == 2
    assert registry.names() == ["red", "green", "blue"]
    assert "blue" in registry and "pink" not in registry


def test_unknown_name_lists_the_valid_ones_and_the_closest() -> None:
    registry = Registry("backend", {"hf": 1, "openai": 2, "scripted": 3})
    with pytest.raises(ValueError) as info:
        registry.get("scriptd")
    assert str(info.value) == (
        "unknown backend 'scriptd'; valid: hf, openai, scripted. Did you mean 'scripted'?"
    )
    with pytest.raises(ValueError, match=r"valid: hf, openai, scripted\.$"):
        registry.check("zzz")  # nothing close: no hint


def test_registering_a_name_twice_needs_replace() -> None:
    registry = Registry("agent", {"llm": 1})
    with pytest.raises(ValueError, match="agent 'llm' is already registered"):
        registry.register("llm", 2)
    registry.register("llm", 2, replace=True)
    assert registry.get("llm") == 2


def test_lazy_entry_is_imported_only_when_used(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "prour_lazy_probe.py").write_text("class Thing:\n    size = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("thing", {"probe": "prour_lazy_probe:Thing.size"})
    assert registry.check("probe") == "probe"
    assert "prour_lazy_probe" not in sys.modules
    assert registry.get("probe") == 7
    assert "prour_lazy_probe" in sys.modules
    monkeypatch.delitem(sys.modules, "prour_lazy_probe")


def test_lazy_entry_must_name_module_and_attribute() -> None:
    with pytest.raises(ValueError, match="must look like 'module:attr'"):
        Registry("thing", {"bad": "no_colon_here"}).get("bad")


def test_did_you_mean_can_name_several() -> None:
    assert did_you_mean("task_12", ["task_10", "task_123", "other"], n=2) == (
        " Did you mean 'task_123' or 'task_10'?"  # closest first
    )
    assert did_you_mean("xyz", ["alpha"]) == ""


def test_every_named_choice_uses_the_one_registry() -> None:
    from prour.config.attention import POLICIES
    from prour.env.agents import AGENTS
    from prour.env.users import USERS
    from prour.eval.methods import METHODS
    from prour.llm.registry import BACKENDS
    from prour.llm.scripted import SCRIPTS

    for registry in (AGENTS, USERS, POLICIES, METHODS, BACKENDS, SCRIPTS):
        assert isinstance(registry, Registry)
    assert BACKENDS.names() == ["hf", "openai", "scripted"]
    with pytest.raises(ValueError, match="unknown method 'prou'.*Did you mean 'prour'"):
        METHODS.get("prou")


def test_lazy_exports_load_a_name_on_first_use_and_refuse_unknown_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "prour_export_probe.py").write_text("def answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    getter = lazy_exports("pkg", {"prour_export_probe": ("answer",)})
    assert "prour_export_probe" not in sys.modules
    assert getter("answer")() == 42
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'answr'"):
        getter("answr")
    monkeypatch.delitem(sys.modules, "prour_export_probe")
