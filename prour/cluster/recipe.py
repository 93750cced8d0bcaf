"""The servers a recipe's ``openai`` roles without a ``base_url`` need, as the cluster commands
read them (``load_recipe(..., cluster=True)`` runs :func:`check_served_roles`).

``serve.models`` lists the servers when given, and then every such role must name one of them.
When it is empty, each distinct model id of those roles gets one server with the defaults of
:class:`~prour.config.cluster.ServedModel` (roles that share a model id share a server)."""

from __future__ import annotations

from pathlib import Path

from prour.config import ConfigError, Recipe
from prour.config.cluster import ServedModel
from prour.registry import did_you_mean


def unserved_roles(recipe: Recipe) -> dict[str, str]:
    """Role -> model id of every ``openai`` role without a ``base_url`` (the roles to serve)."""
    return {
        role: str(cfg.model)
        for role, cfg in recipe.models.items()
        if cfg.backend == "openai" and not cfg.base_url
    }


def served_models(recipe: Recipe) -> dict[str, ServedModel]:
    """Model id -> server: the ``serve.models`` entries some role uses, or one default server per
    model id to serve. An entry no role names is not a server: a recipe that extends another and
    changes its models (gpu-smoke, rehearsal) inherits the base's entries, merged key by key."""
    used = dict.fromkeys(unserved_roles(recipe).values())
    if recipe.serve.models:
        return {model_id: spec for model_id, spec in recipe.serve.models.items()
                if model_id in used}
    return {model_id: ServedModel() for model_id in used}


def served_roles(recipe: Recipe) -> dict[str, list[str]]:
    """Model id -> the ``openai`` roles without a fixed ``base_url`` that it serves."""
    users: dict[str, list[str]] = {model_id: [] for model_id in served_models(recipe)}
    for role, model_id in unserved_roles(recipe).items():
        if model_id in users:
            users[model_id].append(role)
    return users


def nothing_to_serve(recipe: Recipe) -> str | None:
    """Why ``prour serve`` would start no server for this recipe, or ``None`` when it starts some."""
    if any(served_roles(recipe).values()):
        return None
    how = [
        f"models.{role}: " + (f"base_url {cfg.base_url}" if cfg.backend == "openai" else cfg.backend)
        for role, cfg in recipe.models.items()
    ]
    return (
        f"nothing to serve: no openai role of recipe {recipe.name!r} lacks a base_url "
        f"({'; '.join(how) or 'no models'}); `prour serve` starts a vLLM server for each openai "
        f"role without base_url"
    )


def check_served_roles(recipe: Recipe, source: str | None = None) -> None:
    """Every ``openai`` role without a ``base_url`` must name a model in ``serve.models`` (when
    that list is given; without it every such model is served)."""
    served = recipe.serve.models
    if not served:
        return
    for role, cfg in recipe.models.items():
        if cfg.backend != "openai" or cfg.base_url or cfg.model in served:
            continue
        listing = ", ".join(served) or "none"
        raise ConfigError(
            f"models.{role}.model",
            f"{cfg.model!r} has no base_url and is not served by this recipe (serve.models: "
            f"{listing}); add it under serve.models or set models.{role}.base_url."
            f"{did_you_mean(cfg.model, served)}",
            source,
        )


# ---- eval's query generator served by vLLM (eval.generator_backend: vllm) ----------------------

EXPORTED_GENERATOR = "exported-generator"
"""The served name of the checkpoint eval evaluates when ``eval.generator_backend`` is ``vllm``;
``serve.models.exported-generator`` holds its server's settings (its path is always the
checkpoint's folder)."""


def serves_generator(recipe: Recipe) -> bool:
    """Whether eval's query generator is an ``hf`` model that this recipe has vLLM serve
    (``eval.generator_backend: vllm``); an ``openai`` generator is served as any other role."""
    generator = recipe.models.get("generator")
    return (recipe.eval.generator_backend == "vllm" and generator is not None
            and generator.backend == "hf")


def with_served_generator(recipe: Recipe, folder: str | Path) -> Recipe:
    """The recipe as eval runs it under ``eval.generator_backend: vllm``: ``models.generator`` an
    ``openai`` role of the served name :data:`EXPORTED_GENERATOR` (its URL taken from the
    endpoints file), and that server in ``serve.models`` loading ``folder`` (the exported
    checkpoint) with ``serve.models.exported-generator``'s settings; without that entry, the
    ``hf`` generator's dtype and context length. Unchanged when the recipe serves no generator."""
    from prour.config import ModelConfig

    if not serves_generator(recipe):
        return recipe
    base = recipe.models["generator"]
    spec = recipe.serve.models.get(EXPORTED_GENERATOR)
    if spec is None:
        given = {"dtype": base.dtype, "max_model_len": base.max_model_len}
        spec = ServedModel(**{k: v for k, v in given.items() if v is not None})
    spec = spec.model_copy(update={"path": str(folder)})
    generator = ModelConfig(backend="openai", model=EXPORTED_GENERATOR,
                            max_model_len=spec.max_model_len,
                            max_concurrency=recipe.eval.concurrency)
    serve = recipe.serve.model_copy(
        update={"models": {**recipe.serve.models, EXPORTED_GENERATOR: spec}})
    return recipe.model_copy(update={"models": {**recipe.models, "generator": generator},
                                     "serve": serve})


def connect_served_generator(recipe: Recipe, folder: str | Path) -> Recipe:
    """:func:`with_served_generator` with ``models.generator``'s URL read from the recipe's
    endpoints file, which must list a ready server :data:`EXPORTED_GENERATOR` loading
    ``folder``; :class:`~prour.cluster.endpoints.EndpointsError` naming the file otherwise."""
    from prour.cluster.endpoints import (
        EndpointsError,
        apply_endpoints,
        endpoints_path,
        read_endpoints,
    )

    served = with_served_generator(recipe, folder)
    if served is recipe:
        return recipe
    path = endpoints_path(recipe)
    record = read_endpoints(path)
    server = (record or {}).get("servers", {}).get(EXPORTED_GENERATOR) \
        if record and record["status"] == "ready" else None
    how = ("start it with `prour serve` on this recipe once the checkpoint is exported, or run "
           "eval through `prour run` (it serves what eval calls)")
    if server is None:
        raise EndpointsError(
            f"eval.generator_backend is vllm, but the endpoints file {path} has no ready server "
            f"{EXPORTED_GENERATOR!r} ({record['status'] if record else 'missing'}); {how}")
    if Path(server.get("path") or "").resolve() != Path(folder).resolve():
        raise EndpointsError(
            f"eval.generator_backend is vllm: server {EXPORTED_GENERATOR!r} in {path} serves "
            f"{server.get('path')}, not the checkpoint eval evaluates ({folder}); {how}")
    return apply_endpoints(served, record)


def generator_folder(recipe: Recipe) -> str:
    """The local folder of the ``hf`` generator's weights (what a recipe without training has
    vLLM serve for eval), its path as given when no local copy is found (preflight names it)."""
    from prour.llm.weights import ModelNotFound, local_weights

    path = str(recipe.models["generator"].path)
    try:
        return str(local_weights(path, recipe.models_dir, "models.generator.path"))
    except ModelNotFound:
        return path


def eval_concurrency(recipe: Recipe) -> int:
    """Episodes run at once: ``eval.concurrency``, lowered to the smallest ``max_num_seqs`` that
    ``serve.models`` gives the model ids of the ``openai`` roles the evaluation calls (a server
    without one sets no cap). An episode has one request in flight at a time, so episodes past
    a server's sequence slots would only queue on it."""
    from prour.eval.methods import eval_roles

    caps = []
    for role in eval_roles(recipe.eval):
        cfg = recipe.models.get(role)
        spec = recipe.serve.models.get(str(cfg.model)) if cfg and cfg.backend == "openai" else None
        if spec is not None and spec.max_num_seqs is not None:
            caps.append(spec.max_num_seqs)
    return min([recipe.eval.concurrency, *caps])
