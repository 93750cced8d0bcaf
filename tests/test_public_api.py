"""The names code outside the package calls keep working: each resolves to the function that
defines it, whether it is re-exported lazily (router, eval.attention) or imported directly."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

# public dotted name -> (module that defines it, its name there)
PUBLIC = {
    "prour.router.decompose": ("prour.router.uncertainty", "decompose"),
    "prour.router.route": ("prour.router.routing", "route"),
    "prour.router.calibrate": ("prour.router.calibration", "calibrate"),
    "prour.rollout.parse_query": ("prour.rollout.query", "parse_query"),
    "prour.eval.attention.conversation_cost": ("prour.eval.attention.cost", "conversation_cost"),
    "prour.env.scoring.score_episode": ("prour.env.scoring", "score_episode"),
    "prour.data.schema.state_from_row": ("prour.data.schema", "state_from_row"),
}


@pytest.mark.parametrize("dotted", sorted(PUBLIC))
def test_a_public_name_is_the_function_that_defines_it(dotted: str) -> None:
    package, _, name = dotted.rpartition(".")
    home, defined = PUBLIC[dotted]
    found = getattr(importlib.import_module(package), name)
    assert callable(found)
    assert (found.__module__, found.__qualname__) == (home, defined)
    assert found is getattr(importlib.import_module(home), defined)


def test_the_public_functions_still_compute() -> None:
    import math

    from prour.router import decompose, route

    # two certain samples that disagree: each entropy 0, their mean a fair coin (ln 2 nats)
    split = decompose([[1.0, 0.0], [0.0, 1.0]])
    assert split.eu == pytest.approx(0.0, abs=1e-12)
    assert split.au == pytest.approx(math.log(2))
    assert route(split, tau_au=0.5, tau_eu=0.5) == "clarify"
    assert route(split, tau_au=0.9, tau_eu=0.5) == "act"


def test_an_unknown_name_of_a_lazy_package_is_an_attribute_error() -> None:
    import prour.router

    with pytest.raises(AttributeError, match="module 'prour.router' has no attribute 'decompse'"):
        prour.router.decompse  # noqa: B018


def test_importing_a_lazy_package_loads_none_of_its_submodules() -> None:
    probe = ("import sys, prour.router, prour.eval.attention, prour.env, prour.rewards; "
             "print(sorted(m for m in sys.modules if m.startswith('prour.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout))
    assert {"prour.router.calibration", "prour.router.uncertainty", "prour.env.runner",
            "prour.eval.attention.cost", "prour.rewards.reward"}.isdisjoint(loaded)
