"""Domains a user brings without editing prour: the interface they fill in and its registry.

tau2 ships retail, airline and telecom, and prour reads them from tau2's own modules. A domain
whose data no package ships (the Ask-Less paper's Ambiguous WebShop and Ambiguous BrowseComp-Plus,
say) is described by a :class:`DomainPlugin` and added with :func:`register_domain`; from then on
every part of prour that takes a domain name (task selection, environments, tool schemas, the
READ-only toolset, the agent's policy, scoring, the recipe's ``eval.domains`` and
``data.domain``) takes its name as it takes ``retail``.

The plugin is built with tau2's own classes, as tau2's domains are:

- ``environment``: a zero-argument factory returning a fresh ``tau2.environment.environment.
  Environment`` in the domain's default state, whose ``tools`` is a ``ToolKitBase`` subclass
  over a tau2 ``DB`` model; each tool is a method marked ``@is_tool(ToolType.READ)`` (a look-up:
  the verifier may call it) or ``@is_tool(ToolType.WRITE)`` (a change to the database);
- ``tasks``: tau2 ``Task`` objects (mappings in tau2's task JSON are validated into them, and a
  zero-argument callable returning either is called on first use): the user scenario the
  simulated customer plays, the reference actions and the evaluation criteria;
- ``splits``: split name -> task ids, ``base`` (every task a stage may run) required; None means
  ``{"base": every task}``;
- ``policy``: the text the task agent works under; None means the environment's
  ``get_policy()``;
- ``score``: ``score(task, trajectory) -> (reward, breakdown)`` with the reward in [0, 1] (None
  when it cannot be computed) and a JSON-ready breakdown; None means tau2's offline evaluators
  through :func:`prour.env.scoring.score_episode`, which replay the episode on fresh
  environments from the factory. Either way an episode that ended early (an error, the step
  cap) scores 0 before the scorer is asked, as tau2 scores it.

A recipe registers its domains with a top-level ``plugins`` list of Python modules, each
defining ``register()`` (which calls :func:`register_domain`). prour imports the modules and
calls their ``register()`` before it validates the recipe's sections, every time a recipe is
read: each stage runs in a process of its own that reads the recipe again, so each registers
the domains again. Registering an equal plugin twice does nothing, so ``register()`` may run
any number of times. Build the plugin once, at module level, and keep its factory and callables
module-level functions, so that two registrations compare equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prour.config.domains import (
    DOMAIN_SPECS,
    DomainSpec,
    add_domain,
    domain_spec,
    remove_domain,
)

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment

    from prour.env.trajectory import Trajectory

__all__ = ["DomainPlugin", "Scorer", "register_domain", "registered_domains",
           "unregister_domain"]

Scorer = Callable[["Task", "Trajectory"], "tuple[float | None, dict[str, Any]]"]
TaskSource = Sequence[Any] | Callable[[], Sequence[Any]]


@dataclass(frozen=True)
class DomainPlugin:
    """A domain a user brings (module docstring: what each field holds and its default)."""

    name: str
    environment: Callable[[], Environment]
    tasks: TaskSource
    splits: Mapping[str, Sequence[str]] | None = None
    policy: str | None = None
    score: Scorer | None = None
    # cache of the parsed tasks and splits (not part of the definition)
    _loaded: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f"domain {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip() or self.name != self.name.strip():
            raise ValueError(f"a domain name must be a non-empty word, got {self.name!r}")
        if ":" in self.name:  # eval.tasks names a task "domain:id"
            raise ValueError(f"{where}: a domain name must not contain ':'")
        if not callable(self.environment):
            raise TypeError(f"{where}: environment must be a zero-argument factory of a tau2 "
                            f"Environment, got {type(self.environment).__name__}")
        if not callable(self.tasks) and (isinstance(self.tasks, (str, bytes, Mapping))
                                         or not isinstance(self.tasks, Sequence)):
            raise TypeError(f"{where}: tasks must be a list of tau2 Tasks or a zero-argument "
                            f"callable returning one, got {type(self.tasks).__name__}")
        if self.splits is not None:
            _check_splits(where, self.splits)
        if self.policy is not None and not isinstance(self.policy, str):
            raise TypeError(f"{where}: policy must be a string, got {type(self.policy).__name__}")
        if self.score is not None and not callable(self.score):
            raise TypeError(f"{where}: score must be a function (task, trajectory) -> "
                            f"(reward, breakdown), got {type(self.score).__name__}")

    @property
    def split_names(self) -> tuple[str, ...]:
        """The split names a recipe may pick (``base`` first when the splits are not given)."""
        return tuple(self.splits) if self.splits is not None else ("base",)

    @property
    def source(self) -> str:
        """The module that defines the environment factory (what an error names)."""
        return getattr(self.environment, "__module__", None) or "?"

    def new_environment(self) -> Environment:
        """A fresh environment from the factory, checked to be a tau2 Environment."""
        from tau2.environment.environment import Environment

        env = self.environment()
        if not isinstance(env, Environment):
            raise TypeError(f"domain {self.name!r}: the environment factory returned "
                            f"{type(env).__name__}, not a tau2 Environment")
        return env

    def tasks_by_id(self) -> dict[str, Task]:
        """The domain's tasks by id, validated once (a duplicate id is an error)."""
        if "tasks" not in self._loaded:
            from pydantic import ValidationError
            from tau2.data_model.tasks import Task

            items = self.tasks() if callable(self.tasks) else self.tasks
            tasks: dict[str, Task] = {}
            for index, item in enumerate(items):
                try:
                    task = item if isinstance(item, Task) else Task.model_validate(item)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(part) for part in err["loc"]) or "the task"
                    raise ValueError(f"domain {self.name!r}: task {index} is not a tau2 Task "
                                     f"({where}: {err['msg']})") from None
                if task.id in tasks:
                    raise ValueError(f"domain {self.name!r}: task id {task.id!r} appears twice")
                tasks[task.id] = task
            if not tasks:
                raise ValueError(f"domain {self.name!r} has no tasks")
            self._loaded["tasks"] = tasks
        return self._loaded["tasks"]

    def task_splits(self) -> dict[str, tuple[str, ...]]:
        """Split name -> task ids; each id must be a task of the domain."""
        if "splits" not in self._loaded:
            tasks = self.tasks_by_id()
            splits = ({name: tuple(ids) for name, ids in self.splits.items()}
                      if self.splits is not None else {"base": tuple(tasks)})
            for name, ids in splits.items():
                missing = [task_id for task_id in ids if task_id not in tasks]
                if missing:
                    raise ValueError(f"domain {self.name!r}: split {name!r} names task ids "
                                     f"that are not among its tasks: {missing[:5]}")
            self._loaded["splits"] = splits
        return self._loaded["splits"]

    def agent_policy(self) -> str:
        """The policy text the agent works under: ``policy``, else the environment's own."""
        return self.policy if self.policy is not None else self.new_environment().get_policy()

    def score_episode(self, task: Task,
                      trajectory: Trajectory) -> tuple[float | None, dict[str, Any]]:
        """``score(task, trajectory)``, its result checked: a reward in [0, 1] or None, and a
        mapping."""
        if self.score is None:
            raise ValueError(f"domain {self.name!r} has no scoring function of its own")
        result = self.score(task, trajectory)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(f"domain {self.name!r}: score must return (reward, breakdown), got "
                            f"{result!r}")
        reward, breakdown = result
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
                    or not 0.0 <= reward <= 1.0:
                raise ValueError(f"domain {self.name!r}: score returned reward {reward!r}; "
                                 "it must be a number in [0, 1] or None")
            reward = float(reward)
        if not isinstance(breakdown, Mapping):
            raise TypeError(f"domain {self.name!r}: score must return a mapping as its "
                            f"breakdown, got {type(breakdown).__name__}")
        return reward, dict(breakdown)


def _check_splits(where: str, splits: Any) -> None:
    if not isinstance(splits, Mapping):
        raise TypeError(f"{where}: splits must map a split name to task ids, got "
                        f"{type(splits).__name__}")
    if "base" not in splits:
        raise ValueError(f"{where}: splits must include 'base' (every task a stage may run); "
                         f"got {', '.join(map(str, splits)) or 'none'}")
    for name, ids in splits.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{where}: a split name must be a non-empty string without ':', "
                             f"got {name!r}")
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) \
                or not all(isinstance(task_id, str) for task_id in ids):
            raise TypeError(f"{where}: split {name!r} must be a list of task ids (strings)")


def register_domain(plugin: DomainPlugin, replace: bool = False) -> DomainPlugin:
    """Add ``plugin`` to prour's domain table; returns the plugin registered under its name.

    Registering an equal plugin again does nothing. Another definition under a registered name
    is an error unless ``replace`` (which also drops what prour cached for the old one); the
    shipped domains cannot be replaced.
    """
    if not isinstance(plugin, DomainPlugin):
        raise TypeError(f"register_domain takes a DomainPlugin, got {type(plugin).__name__}")
    known = plugin.name in DOMAIN_SPECS
    if add_domain(DomainSpec(plugin.name, tau2_splits=(), plugin=plugin), replace) and known:
        forget_cached()  # a new definition under a name prour may have cached
    return domain_spec(plugin.name).plugin


def unregister_domain(name: str) -> DomainPlugin:
    """Take a registered domain out of the table (and prour's caches); returns its plugin."""
    spec = remove_domain(name)
    forget_cached()
    return spec.plugin


def registered_domains() -> dict[str, DomainPlugin]:
    """The registered domains by name, in registration order."""
    return {name: spec.plugin for name, spec in DOMAIN_SPECS.items() if spec.plugin is not None}


def forget_cached() -> None:
    """Drop what prour cached per domain name (tasks, splits, policy, tool schemas and types,
    the reference environment, the write actions of the protocol check), so that a name
    registered anew is read afresh."""
    import sys

    for module_name in ("prour.env.domains", "prour.env.environment", "prour.eval.protocol"):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()
