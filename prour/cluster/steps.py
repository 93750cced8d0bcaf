"""The serve stage's row of the chain (:mod:`prour.stages` puts it first): ``prour serve``
starts one vLLM server per served model id and writes the endpoints file the later stages read;
what it installs, loads and places (vLLM, the served weights, the GPUs they sit on).

Nothing heavy is imported here: what a row needs it imports inside its functions.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from prour.step import GPU_EXTRA, Extra, File, Stage, Step
from prour.step import RECIPE_OPTION as _R

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


def _endpoints(recipe: Recipe) -> File:
    from prour.cluster.endpoints import endpoints_path

    return File("endpoints_file", endpoints_path(recipe))


def _serving(recipe: Recipe) -> bool:
    """The endpoints file says the servers are ready."""
    from prour.cluster.endpoints import EndpointsError, read_endpoints

    try:
        record = read_endpoints(_endpoints(recipe).path)
    except EndpointsError:
        return False
    return record is not None and record.get("status") == "ready"


def serve_python(recipe: Recipe) -> str:
    """The python ``prour serve`` starts vLLM with: ``serve.python``, $PROUR_VLLM_PYTHON, this."""
    return recipe.serve.python or os.environ.get("PROUR_VLLM_PYTHON") or sys.executable


def served_ids(recipe: Recipe) -> set[str]:
    """Model ids ``prour serve`` starts for this recipe."""
    from prour.cluster.recipe import served_roles

    return {model_id for model_id, roles in served_roles(recipe).items() if roles}


def _serve_extras(recipe: Recipe) -> tuple[Extra, ...]:
    if not served_ids(recipe):
        return ()
    return (Extra("vllm", "serve.models", f"install the gpu extra ({GPU_EXTRA}) or set "
                  "serve.python / $PROUR_VLLM_PYTHON to a python that has vLLM (on a CPU "
                  "node `make vllm-env` builds one: .venv-vllm/bin/python)",
                  serve_python(recipe)),)


def _served_weights(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    from prour.cluster.recipe import served_models

    wanted = served_ids(recipe)
    return tuple((spec.path or model_id, f"serve.models.{model_id}")
                 for model_id, spec in served_models(recipe).items() if model_id in wanted)


def _server_gpus(recipe: Recipe) -> dict[str, int]:
    from prour.cluster.recipe import served_models

    wanted = served_ids(recipe)
    return {f"serve.models.{model_id}.gpus": max(spec.gpus) + 1
            for model_id, spec in served_models(recipe).items() if model_id in wanted and spec.gpus}


def _nothing_to_serve(recipe: Recipe) -> str | None:
    from prour.cluster.recipe import nothing_to_serve

    return nothing_to_serve(recipe)


# ---- the stage -----------------------------------------------------------------------------------


SERVE = Stage("serve", "vLLM servers for the recipe's frozen models", (
    Step("serve", "start one server per served model id; write the endpoints file",
         ("serve", *_R), writes=lambda r: (_endpoints(r),), done=_serving),
), placement="servers", slurm="serve", extras=_serve_extras, weights=_served_weights,
    gpus=_server_gpus, skip=_nothing_to_serve, long_running=True, refuse_idle=True)
