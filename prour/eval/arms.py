"""One arm of an evaluation (a method, under an attention variant, at an ``eval.sweep`` point,
with the training checkpoint its query generator loads) and the checkpoints ``--checkpoint``
names: their training run, their step, the recipe that points ``models.generator`` at one.

With ``--checkpoint DIR`` the query generator is an HF folder written by the local trainer or a
merged verl checkpoint, found by :func:`prour.train.checkpoint.resolve_checkpoint`;
:func:`prour.train.checkpoint.select_checkpoints` picks several saved steps of one training run
for a sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.config import ModelConfig, Recipe
from prour.config.eval import sweep_label
from prour.config.router import RouterConfig

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.attention import AttentionConfig


def variant_name(attention: AttentionConfig | None) -> str | None:
    """``policy@N`` (or the bare policy) of an attention setting; None without one."""
    if attention is None:
        return None
    from prour.eval.attention.analysis import method_name

    return method_name(attention.policy, attention.budget)


@dataclass(frozen=True)
class GeneratorCheckpoint:
    """A query generator that is a training checkpoint: the training run's name (from the
    recipe it saved), the step its folder resolved to, that HF folder, and the run's output
    folder (``root``: what a rerun must name again)."""

    name: str
    step: int | None
    path: str
    root: str

    @property
    def label(self) -> str:
        """``<training run> step N``: how results and reports name this generator."""
        return self.name if self.step is None else f"{self.name} step {self.step}"

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "step": self.step, "path": self.path, "root": self.root}


@dataclass(frozen=True)
class Arm:
    """One evaluated configuration: a method, optionally under an attention variant, and the
    checkpoint its generator is (methods that use one, evaluated with ``--checkpoint``)."""

    method: str
    attention: Any = None  # AttentionConfig | None
    checkpoint: GeneratorCheckpoint | None = None
    # The eval.sweep point (router key, value) pairs this arm runs under (None: no sweep).
    point: tuple[tuple[str, int | None], ...] | None = None
    # The attention variant's label (eval.attention_policies, options included: voi-gate(c=0.5));
    # None: named from ``attention`` (policy@N)
    label: str | None = None
    # A study's axis values this arm runs under ((axis, value) pairs; None: not a study)
    axes: tuple[tuple[str, str], ...] | None = None
    # A study grid's task set where it is not eval.split (the same task id names another task
    # there, so the set is part of the key; None: eval.split's tasks)
    split: str | None = None

    @property
    def variant(self) -> str | None:
        return self.label if self.label is not None else variant_name(self.attention)

    @property
    def sweep(self) -> dict[str, int | None] | None:
        return dict(self.point) if self.point is not None else None

    def router(self, base: RouterConfig) -> RouterConfig:
        """``base`` with this arm's sweep point applied (``router.budget``, ``router.every_n``)."""
        if self.point is None:
            return base
        return base.model_copy(update={k.split(".", 1)[1]: v for k, v in self.point})

    @property
    def key(self) -> str:
        """Stored as the trajectory's agent name (part of the resume key); a checkpoint's step
        is part of it, so one run folder holds every step of a sweep."""
        key = self.method if self.variant is None else f"{self.method}/{self.variant}"
        if self.point is not None:
            key += f" [{sweep_label(self.sweep)}]"
        if self.checkpoint is not None and self.checkpoint.step is not None:
            key += f" [step {self.checkpoint.step}]"
        if self.axes:
            key += " <" + " ".join(f"{axis}={value}" for axis, value in self.axes) + ">"
        if self.split is not None:
            key += f" [split {self.split}]"
        return key


def checkpoint_model(path: str | Path, base: ModelConfig | None = None) -> ModelConfig:
    """An ``hf`` model config for a checkpoint, keeping dtype/device of an ``hf`` base config."""
    from prour.train.checkpoint import resolve_checkpoint

    folder = resolve_checkpoint(path)
    keep = base if base is not None and base.backend == "hf" else None
    return ModelConfig(backend="hf", path=str(folder.resolve()),
                       dtype=keep.dtype if keep else "auto", device=keep.device if keep else "auto",
                       max_model_len=keep.max_model_len if keep else None)


def with_checkpoint(recipe: Recipe, checkpoint: str | Path | None) -> Recipe:
    """The recipe with ``models.generator`` pointing at a checkpoint's HF folder; under
    ``eval.generator_backend: vllm`` an ``openai`` generator is kept: ``prour eval`` has pointed
    it at the server that loads the checkpoint (:mod:`prour.cluster.recipe`)."""
    if checkpoint is None:
        return recipe
    generator = recipe.models.get("generator")
    if recipe.eval.generator_backend == "vllm" and generator is not None \
            and generator.backend == "openai":
        return recipe  # already the server of this checkpoint (prour eval connects it)
    models = dict(recipe.models)
    models["generator"] = checkpoint_model(checkpoint, models.get("generator"))
    return recipe.model_copy(update={"models": models})


TRAINING_RECIPES = ("recipe.resolved.yaml", "verl/recipe.yaml")
"""Where a training output folder keeps its recipe: the run's one resolved recipe (both backends),
then where verl runs of an older prour kept theirs."""


def training_run(folder: Path) -> tuple[str, Path] | None:
    """(recipe name, output folder) of the training run a checkpoint folder belongs to: the
    nearest of the folder and its parents (up to four levels) that holds the run's recipe."""
    from prour.config import ConfigError
    from prour.recipes import load_recipe

    for candidate in [folder, *folder.parents][:5]:
        for name in TRAINING_RECIPES:
            path = candidate / name
            if path.is_file():
                try:
                    return load_recipe(path).name, candidate
                except ConfigError:  # a recipe this prour no longer reads: the folder's name
                    continue
    return None


def checkpoint_generators(checkpoint: str | Path,
                          steps: list[str] | None) -> list[GeneratorCheckpoint]:
    """The checkpoints ``--checkpoint`` (and ``--steps``: ``all`` or numbers) name, in step
    order, each with its training run's name and the step it resolved to."""
    from prour.train.checkpoint import checkpoint_step, resolve_checkpoint, select_checkpoints

    given = Path(checkpoint).expanduser().resolve()
    if steps:
        folders = list(select_checkpoints(given, steps).values())
    else:
        folders = [resolve_checkpoint(given)]
    run = training_run(folders[0])
    name, root = run if run is not None else (given.name, given)
    return [GeneratorCheckpoint(name, checkpoint_step(f), str(f), str(root)) for f in folders]
