"""The servers of a study's cells (:mod:`prour.eval.study`): which served models each cell's
roles call, the **serving groups** (cells whose servers fit the node together, in study order:
a backbone the node holds only alone is served alone), and the vLLM servers of the group being
run (:class:`StudyServers`: those the next group calls are kept, the others stopped). API
endpoints and in-process models need no server and join any group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from prour.cluster.serve import ServerGroup, ServerPlan
    from prour.config import Recipe
    from prour.config.cluster import ServedModel
    from prour.eval.study import Cell


def cell_servers(recipe: Recipe, roles: Iterable[str]) -> dict[str, ServedModel]:
    """Model id -> server spec of the served models a cell's roles call."""
    from prour.cluster.recipe import served_models, served_roles

    called = set(roles)
    specs = served_models(recipe)
    return {model_id: specs[model_id] for model_id, users in served_roles(recipe).items()
            if called & set(users)}


@dataclass
class Group:
    """Cells served together: their recipes, episodes and the servers they call."""

    cells: list[Cell] = field(default_factory=list)
    servers: dict[str, ServedModel] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ", ".join(cell.label for cell in self.cells)


def serving_groups(recipe: Recipe, recipes: dict[Cell, Recipe],
                   roles: dict[Cell, tuple[str, ...]]) -> list[Group]:
    """Cells in study order, a new group whenever the next cell's servers would not fit the
    node beside the current group's (:func:`prour.cluster.gpu_plan.gpu_plan`)."""
    from prour.cluster.gpu_plan import gpu_plan

    groups: list[Group] = []
    for cell, cell_recipe_ in recipes.items():
        servers = cell_servers(cell_recipe_, roles[cell])
        joined = {**groups[-1].servers, **servers} if groups else None
        if joined is not None and (not servers or set(servers) <= set(groups[-1].servers)
                                   or gpu_plan(recipe, "serve", joined).fits):
            groups[-1].cells.append(cell)
            groups[-1].servers = joined
            continue
        groups.append(Group([cell], dict(servers)))
    return groups


class StudyServers:
    """The vLLM servers of the serving group being run: those the next group calls are kept,
    the others stopped, the missing ones started."""

    def __init__(self, recipe: Recipe, say: Callable[[str], None]):
        import threading

        self.recipe, self.say = recipe, say
        self.live: dict[str, ServerGroup] = {}
        self.stop_event = threading.Event()

    def ensure(self, plans: list[ServerPlan]) -> dict[str, Any]:
        """Serve exactly ``plans``; the endpoints record of the live servers."""
        from prour.cluster.serve import ServeError, ServerGroup, check_memory
        from prour.llm.run_key import ensure_run_key
        from prour.llm.weights import ModelNotFound

        wanted = {plan.model_id for plan in plans}
        for model_id in [m for m in self.live if m not in wanted]:
            self.live.pop(model_id).servers[model_id].stop()
            self.say(f"   stopped server {model_id}: the next group does not call it")
        missing = [plan for plan in plans if plan.model_id not in self.live]
        if missing:
            check_memory(self.recipe, plans)
            run_dir = self.recipe.resolved_run_dir()
            try:
                group = ServerGroup(missing, self.recipe.serve.python,
                                    self.recipe.serve.startup_timeout_s, self.recipe.models_dir,
                                    ensure_run_key(run_dir))
            except ModelNotFound as exc:
                raise ServeError(str(exc)) from None
            self.say(f"   serving {', '.join(p.model_id for p in missing)}")
            try:
                group.start(self.stop_event)
            except BaseException:
                group.stop()
                raise
            self.live.update({plan.model_id: group for plan in missing})
        return self.record()

    def record(self) -> dict[str, Any]:
        servers: dict[str, Any] = {}
        key_file = None
        for model_id, group in self.live.items():
            record = group.record("ready")
            servers[model_id] = record["servers"][model_id]
            key_file = record["key_file"] or key_file
        return {"status": "ready", "servers": servers, "key_file": key_file}

    def stop_all(self) -> None:
        for group in {id(g): g for g in self.live.values()}.values():
            group.stop()
        if self.live:
            self.say(f"   stopped server(s) {', '.join(self.live)}")
        self.live.clear()


def group_plans(recipes: dict[Cell, Recipe], roles: dict[Cell, tuple[str, ...]],
                group: Group) -> list[ServerPlan]:
    """The server plans of a group's cells (one per served model id)."""
    from prour.cluster.recipe import served_roles
    from prour.cluster.serve import plan_servers

    plans: dict[str, ServerPlan] = {}
    for cell in group.cells:
        served = {role for users in served_roles(recipes[cell]).values() for role in users}
        called = [role for role in roles[cell] if role in served]
        if called:
            for plan in plan_servers(recipes[cell], called):
                plans.setdefault(plan.model_id, plan)
    return list(plans.values())
