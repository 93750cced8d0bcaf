"""The ``study`` recipe section: a grid of axes evaluated through the one eval queue.

A study names **axes** (``backbone``, ``simulator``, ``generator`` ...), each a set of named
values; a value lays a partial recipe over the run's recipe (``set``: the ``models`` of some
roles, the router's thresholds, the ``env`` section's user-simulator regime). Its **grids** each
take some values of each axis and run methods under attention variants on domains, tasks and
seeds; the study is the union of its grids, and an episode that several grids share (same
values, method, variant, task and seed) runs once. Every result line records the value of every
axis it ran under (``axes``), and each table of a report is a projection of those lines.

The ask-less paper's study (``recipes/ask-less.yaml``) has a ``backbone`` axis (the task
agent's model) and a ``simulator`` axis (the user simulator's regime, its Table 25); the Prour
paper's generalization tables vary the generator, the agent and the decomposer the same way.

A leaf of the recipe: nothing here loads a model; :mod:`prour.eval.study` runs it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from prour.config.attention import variant_of
from prour.config.domains import DomainName, SplitName
from prour.config.eval import check_method_name
from prour.section import Section

# The parts of a recipe an axis value may set: which model plays a role, the decomposer's
# thresholds (the Prour paper's Table 7 recalibrates them for another decomposer), the episode
# section (the user simulator's regime), and the servers of the models it names.
AXIS_SECTIONS = ("models", "router", "env", "serve")
ROUTER_KEYS = ("thresholds_file", "thresholds_model", "tau_au", "tau_eu")
SERVE_KEYS = ("models",)
STUDY_FOLDER = "study"  # the study's evaluation folder under run_dir


class AxisValue(Section):
    """One value of an axis: its name in a paper (published numbers beside it) and the partial
    recipe it lays over the run's (mappings merged key by key, as ``extends`` merges)."""

    paper: str | None = None  # the paper's name for it (e.g. the model "GPT-4.1")
    set: dict[str, Any] = Field(default_factory=dict)  # {models: {agent: {...}}, env: {...}}
    # The run's own trained query generator (its exported final checkpoint, served as the eval
    # step serves it) as models.generator: the Prour paper's "trained Qwen3-1.7B" of Tables 2-4
    trained: bool = False

    @model_validator(mode="after")
    def _one_generator(self) -> AxisValue:
        if self.trained and "generator" in self.set.get("models", {}):
            raise ValueError("trained: true is the run's own generator: set no models.generator "
                             "beside it")
        return self

    @field_validator("set")
    @classmethod
    def _known_parts(cls, value: dict[str, Any]) -> dict[str, Any]:
        for section, part in value.items():
            if section not in AXIS_SECTIONS:
                raise ValueError(f"an axis value may set {', '.join(AXIS_SECTIONS)}; not "
                                 f"{section!r}")
            if not isinstance(part, dict):
                raise ValueError(f"set.{section} must be a mapping")  # noqa: TRY004
            allowed = {"router": ROUTER_KEYS, "serve": SERVE_KEYS}.get(section)
            for key in part if allowed else ():
                if key not in allowed:
                    raise ValueError(f"set.{section}.{key}: an axis value may set only "
                                     f"{', '.join(f'{section}.{k}' for k in allowed)}")
        return value


class StudyGrid(Section):
    """One grid of the study: the axis values it takes, the methods and attention variants it
    runs, and its tasks and seeds (each unset key: the recipe's ``eval`` value)."""

    methods: list[str] = Field(default_factory=lambda: ["base"])  # eval methods
    policies: list[str] = Field(default_factory=list)  # attention variants (``budgeted@2``, ...)
    axes: dict[str, list[str]] = Field(default_factory=dict)  # axis -> values (absent: all)
    domains: list[DomainName] | None = None  # None: eval.domains
    split: SplitName | None = None  # None: eval.split
    tasks: list[str] | None = None  # None: eval.tasks ("domain:id" or a bare id)
    max_tasks: int | None = Field(None, ge=1)  # None: eval.max_tasks
    seeds: list[int] | None = None  # None: eval.seeds

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one method")
        return list(dict.fromkeys(check_method_name(name) for name in value))

    @field_validator("policies")
    @classmethod
    def _policies(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(variant_of(text).label for text in value))

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError(f"list distinct seeds, at least one (got {value})")
        return value


class StudyConfig(Section):
    """A study: its axes and grids, and what the chain runs of it."""

    run: bool = True  # false: prour run leaves the study's steps out (the report says so)
    # true: the recipe is the study alone (the ask-less paper evaluates models as they are:
    # nothing is collected or trained, and `prour run` walks only the study's steps)
    standalone: bool = False
    report: Literal["ask-less", "prour"] = "ask-less"  # the paper whose tables the report makes
    axes: dict[str, dict[str, AxisValue]] = Field(default_factory=dict)
    grids: dict[str, StudyGrid] = Field(default_factory=dict)
    # An endpoint (an openai model with a base_url of its own) whose key variable is not set:
    # error stops the study naming the axis value and the variable; skip leaves its cells out
    # with one line that says so.
    missing_key: Literal["error", "skip"] = "error"
    # The judge pass fails (and its step is not done) while more than this share of the
    # delivered requests stays unscored (the judge's model answered no valid JSON for them).
    max_judge_failures: float = Field(0.1, ge=0, le=1)
    # Table 12 of the ask-less paper: questions re-scored by models.second_judge (0: no pass).
    second_judge_sample: int = Field(0, ge=0)

    @field_validator("axes")
    @classmethod
    def _axes(cls, value: dict[str, dict[str, AxisValue]]) -> dict[str, dict[str, AxisValue]]:
        for axis, values in value.items():
            if not values:
                raise ValueError(f"axis {axis!r} lists no value")
            for name in values:
                if not name or any(c in name for c in "=<> "):
                    raise ValueError(f"axes.{axis}: value name {name!r} must be a word without "
                                     "spaces, '=', '<' or '>'")
        return value

    @model_validator(mode="after")
    def _grids_name_known_values(self) -> StudyConfig:
        if not self.grids:
            raise ValueError("grids: list at least one grid")
        for grid_name, grid in self.grids.items():
            for axis, names in grid.axes.items():
                if axis not in self.axes:
                    from prour.registry import unknown_name

                    raise ValueError(f"grids.{grid_name}.axes: "
                                     + unknown_name("axis", axis, tuple(self.axes)))
                for name in names:
                    if name not in self.axes[axis]:
                        from prour.registry import unknown_name

                        raise ValueError(f"grids.{grid_name}.axes.{axis}: "
                                         + unknown_name("value", name, tuple(self.axes[axis])))
        return self

    def grid_values(self, grid: str) -> dict[str, list[str]]:
        """Axis -> the values grid ``grid`` takes, in the study's axis and value order."""
        chosen = self.grids[grid].axes
        return {axis: [v for v in values if v in chosen.get(axis, values)]
                for axis, values in self.axes.items()}
