"""Recipe schema: one pydantic model per component, checked when a recipe loads, before any model.

Every error names the dotted key (``models.agent.backend``), the value and what is allowed.
Stage sections (router, reward, data, train, eval, ...) are pydantic models defined next to the
code that uses them and collected into :class:`Recipe` here.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

# Stage sections live next to the code that uses them; they import their base from prour.section.
from prour.config.cluster import ServeConfig, SlurmConfig
from prour.config.data import DataConfig
from prour.config.domains import register_plugins
from prour.config.eval import EvalConfig
from prour.config.rewards import RewardConfig
from prour.config.router import RouterConfig
from prour.config.study import StudyConfig
from prour.config.taxonomy import TaxonomyConfig
from prour.config.train import TrainConfig
from prour.registry import unknown_name
from prour.section import ConfigError, Section, shown_key

__all__ = ["ConfigError", "EnvConfig", "ModelConfig", "Recipe", "Section", "parse_recipe"]

BACKENDS = ("hf", "openai", "scripted")
MODEL_ROLES = (
    "agent",  # task agent (tool calling)
    "user",  # user simulator (evaluation and collection)
    "strict_user",  # strict user simulator (training responder)
    "decomposer",  # goal interpretations, candidate actions, scoring
    "verifier",  # read-only ReAct verifier
    "teacher",  # teacher query generator during collection
    "generator",  # the query generator being trained / evaluated (the policy)
    "ig_clarifier",  # the IG-Clarifier baseline's clarifier: its own trained checkpoint
    "normalizer",  # goal normalization
    "annotator",  # calibration labels
    "router",  # prompted LLM router ablation
    "judge",  # attention-cost judge
    "classifier",  # request classifier of the attention protocol (absent: the judge's model)
    "second_judge",  # a judge of another model family re-scoring a sample (ask-less Table 12)
    "nl_judge",  # judge of tau2's natural-language assertions (absent: models.judge)
)


class ModelConfig(Section):
    """A model behind one of the backends.

    ``hf``: ``path`` is a local HF folder or a hub id whose weights are local (the recipe's
    ``models_dir``, ``$PROUR_MODELS_DIR`` or the HF cache; never downloaded), loaded in process.
    ``openai``: ``base_url`` of an OpenAI-compatible server and the served ``model`` name; the API
    key is read from the environment variable named by ``api_key_env``, never from the recipe.
    Without ``base_url`` the URL comes from the recipe's endpoints file written by ``prour serve``.
    ``scripted``: ``script`` names a rules file or a registered script (tests only).
    """

    backend: Literal["hf", "openai", "scripted"] = "hf"
    path: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    # File holding the key (wins over api_key_env; relative to run_dir); filled from the endpoints
    # file for served roles (prour.llm.run_key), so a recipe rarely sets it.
    api_key_file: str | None = None
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "auto"
    device: str = "auto"
    max_concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)
    # seconds one request may take over all its attempts and backoff waits (None: only
    # max_retries bounds them); prour.llm.retry
    retry_budget_s: float | None = Field(None, gt=0)
    max_model_len: int | None = Field(None, ge=16)
    script: str | None = None
    # Filled from the endpoints file for a served role and left out of the recipe's dumps (so
    # out of the steps' stamps): the URLs of its server's further replicas, which the client
    # spreads requests over with base_url's, and the sequence slots of all its replicas together
    # (the eval queue's limit for the model; the client's, where above max_concurrency).
    replica_urls: list[str] = Field(default_factory=list, exclude=True)
    server_slots: int | None = Field(None, ge=1, exclude=True)

    @field_validator("backend", mode="before")
    @classmethod
    def _known_backend(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in BACKENDS:
            raise ValueError(unknown_name("backend", value, BACKENDS))
        return value

    def model_post_init(self, context: Any, /) -> None:
        if self.backend == "hf" and not self.path:
            raise ValueError("backend 'hf' needs `path` (a local HF folder or a hub id)")
        if self.backend == "openai" and not self.model:
            raise ValueError(
                "backend 'openai' needs `model` (the served name) and a `base_url`, given here or "
                "taken from the endpoints file that `prour serve` writes"
            )


# Episode limits as tau2 counts them (tau2 26.3, tau2/orchestrator/orchestrator.py): every
# Orchestrator.step() adds one step, i.e. one agent message (text or tool calls), one user
# message, or one batch of tool results; the greeting and a task's prior history do not count.
# The cap is checked only when the next message is not for the environment, so a call is never
# cut from its result, and an episode that reaches it ends with termination max_steps (reward 0).
# The values are tau2's DEFAULT_MAX_STEPS / DEFAULT_MAX_ERRORS (tau2/config.py), which `tau2 run`
# uses; tau2's run_task() and Orchestrator() default to 100 steps. The paper states no cap.
TAU2_MAX_STEPS = 200
TAU2_MAX_ERRORS = 10


class EnvConfig(Section):
    """One tau2 episode, in collection and in evaluation alike: its limits and how the task agent
    (``models.agent``) and the user simulator (``models.user``) decode.

    Which tasks run is each stage's choice (``data.domain``/``data.split``, ``eval.domains``/
    ``eval.split``): the paper collects on the train split and evaluates on the test split.
    """

    # tau2 steps (agent and user messages, tool-result batches) before the episode is cut
    max_steps: int = Field(TAU2_MAX_STEPS, ge=1)
    max_errors: int = Field(TAU2_MAX_ERRORS, ge=1)  # tool errors before the episode is cut
    agent_temperature: float = Field(0.01, ge=0)  # task agent (paper: 0.01)
    agent_max_tokens: int = Field(1024, ge=1)  # task agent reply / tool call length
    user_temperature: float = Field(1.0, ge=0)  # user simulator (paper: 1.0)
    user_max_tokens: int = Field(512, ge=1)  # user simulator message length
    # The simulated customer's regime (the ask-less paper's Table 25 compares two): standard is
    # tau2's user simulator as it is; guarded adds that the customer volunteers nothing the
    # agent has not asked for (prour.env.users.GUARDED_GUIDELINES), so a missing detail reaches
    # the agent only through a question.
    user_regime: Literal["standard", "guarded"] = "standard"


class ProtocolConfig(Section):
    """The ``protocol`` section: what a broken protocol rule (:mod:`prour.eval.protocol`) does."""

    # error: `prour validate` (with or without --preflight), `prour run` and every stage's
    # preflight stop with one `protocol:` line per broken rule; warn: the lines are printed as
    # warnings and the report header names the rules the study deliberately breaks.
    on_breach: Literal["error", "warn"] = "error"
    # The content check (prour.eval.protocol.shared_writes): eval tasks that perform a write action
    # (same tool, same arguments) some training or calibration-reserve task performs too. Always
    # stated as a note; more such eval tasks than this is a `shared-writes` breach, which follows
    # on_breach. None: never a breach.
    max_shared_write_tasks: int | None = Field(None, ge=0)


# The one path rule. ``run_dir`` is relative to the working directory; every other relative path
# in a recipe, the keys below, is relative to ``run_dir``; ``${name}`` in any of them is the
# recipe's name. Each becomes absolute when the recipe validates, so a stage uses it as it is and
# the resolved recipe a stage records reads back the same from any folder. Not paths of the run:
# model names (``models.*.path``, ``serve.models.*.path``, ``data.tokenizer``: a hub id or a model
# folder, looked up as prour/llm/weights.py says), ``models.*.script`` (a registered script or a
# rules file) and ``serve.python`` (a program).
PATH_KEYS = (
    "models_dir",
    "models.*.api_key_file",
    "endpoints_file",
    "router.thresholds_file",
    "router.calibration.dev_states",
    "router.calibration.test_states",
    "router.calibration.out_dir",
    "data.trajectories",
    "data.goals",
    "data.decisions",
    "data.dataset_dir",
    "train.train_file",
    "train.val_file",
    "train.output_dir",
    "eval.attention.cache_dir",
    "serve.log_dir",
    "slurm.templates_dir",
)


def run_path(value: str, base: Path, name: str) -> str:
    """``value`` (``${name}`` filled in, ``~`` expanded) as an absolute path, a relative one taken
    from ``base``."""
    path = Path(value.replace("${name}", name)).expanduser()
    return os.path.normpath(path if path.is_absolute() else base / path)


def _name_stays_under(name: str, run_dir: str) -> None:
    """``name`` is one folder name, so that ``${name}`` in ``run_dir`` (``runs/${name}``) or any
    other path key names a folder under the part before it: a name with ``/``, ``..`` or
    nothing at all would put the run elsewhere (``../x`` outside ``runs/``, ``.`` on ``runs/``
    itself), which a :class:`ConfigError` on ``name`` refuses when the recipe loads."""
    if name.strip() and name not in (os.curdir, os.pardir) and not set(name) & {"/", "\\", "\0"}:
        return
    template = run_dir if "${name}" in run_dir else "runs/${name}"
    base = os.path.normpath(template.split("${name}", 1)[0] or ".")
    placed = os.path.normpath(template.replace("${name}", name.replace("\0", "")))
    raise ConfigError("name", f"{name!r} would put a path with ${{name}} ({template}) at "
                      f"{placed}, not in a folder of its own under {base}; a recipe name is one "
                      "folder name (no '/', '..' or empty name)")


def _with_path(node: Any, parts: list[str], fix: Any) -> Any:
    """A copy of section ``node`` whose key ``parts`` went through ``fix`` (unset keys stay)."""
    head, *rest = parts
    if head == "*":  # every entry of a mapping (models.*.api_key_file)
        return {name: _with_path(entry, rest, fix) for name, entry in node.items()}
    value = getattr(node, head)
    if value is None:
        return node
    new = fix(value) if not rest else _with_path(value, rest, fix)
    return node.model_copy(update={head: new})


class Recipe(Section):
    """A whole run: models by role, environment, seed, output folder, and stage sections.

    Its paths follow the one path rule (:data:`PATH_KEYS`): once validated, ``run_dir`` and every
    path key are absolute.
    """

    name: str
    # Python modules whose register() adds domains of the user's own (prour.env.plugins); they
    # are imported and registered before the sections below are validated, in every process
    # that reads the recipe.
    plugins: list[str] = []
    seed: int = 0
    run_dir: str = "runs/${name}"
    models: dict[str, ModelConfig] = {}
    # Local folder of hub-id weights (<models_dir>/Qwen/Qwen3-1.7B or <models_dir>/Qwen3-1.7B);
    # None: $PROUR_MODELS_DIR. Lookup order: prour/llm/weights.py. Nothing is downloaded.
    models_dir: str | None = None
    env: EnvConfig = EnvConfig()
    # Written by `prour serve`: base URLs of served models (None: <run_dir>/endpoints.json).
    endpoints_file: str | None = None
    router: RouterConfig = Field(default_factory=RouterConfig)  # decomposer, routing, calibration
    reward: RewardConfig = Field(default_factory=RewardConfig)  # information-gain reward
    data: DataConfig = Field(default_factory=DataConfig)  # collect, normalize, extract
    train: TrainConfig | None = None  # DAPO (local or verl); required by `prour train`
    eval: EvalConfig = Field(default_factory=EvalConfig)  # methods, seeds, attention protocol
    serve: ServeConfig = Field(default_factory=ServeConfig)  # vLLM servers for frozen models
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)  # sbatch resources per stage
    # What a broken protocol rule (prour.eval.protocol: eval tasks among training tasks, dev states
    # from training trajectories, train/validation sharing a task, a baseline on the trained
    # checkpoint) does: `error` stops preflight, `warn` prints it and the report header says so.
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig)
    # A study: axes (backbones, user simulators, role variants) x grids of methods and attention
    # variants, run through one eval queue into <run_dir>/study (prour.config.study)
    study: StudyConfig | None = None
    # The uncertainty taxonomy of the collected trajectories (paper A.1: Table 5, Figure 2)
    taxonomy: TaxonomyConfig = Field(default_factory=TaxonomyConfig)
    # The recipe file and the `key=value` overrides it was loaded with (prour.recipes.load_recipe),
    # so that a hint names the command on the same recipe as the user typed it.
    _origin: tuple[str, tuple[str, ...]] | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _register_plugins(cls, data: Any) -> Any:
        """Import ``plugins`` and call their register() first, so that the domain names of the
        sections may be the ones they register."""
        if isinstance(data, dict) and data.get("plugins"):
            from prour.env.domains import quiet_tau2  # the domain table's loaders (no tau2)

            quiet_tau2()  # plugin modules build on tau2, which logs as it is imported
            register_plugins(data["plugins"])
        return data

    @field_validator("models")
    @classmethod
    def _known_roles(cls, value: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for role in value:
            if role not in MODEL_ROLES:
                raise ValueError(unknown_name("model role", role, MODEL_ROLES))
        return value

    @model_validator(mode="after")
    def _axis_values_fit(self) -> Recipe:
        """Each study axis value's models (each a whole model config, replacing the recipe's)
        and env (laid over the recipe's) are valid; a wrong one is named by its dotted key
        under ``study.axes``."""
        if self.study is None:
            return self
        for axis, values in self.study.axes.items():
            for name, value in values.items():
                where = f"study.axes.{axis}.{name}.set"
                for role, model in value.set.get("models", {}).items():
                    if role not in MODEL_ROLES:
                        raise ConfigError(f"{where}.models",
                                          unknown_name("model role", role, MODEL_ROLES))
                    _checked(ModelConfig, model, f"{where}.models.{role}")
                if "env" in value.set:
                    _checked(EnvConfig, merge_recipe(self.env.model_dump(), value.set["env"]),
                             f"{where}.env")
        return self

    @model_validator(mode="after")
    def _one_path_rule(self) -> Recipe:
        _name_stays_under(self.name, self.run_dir)
        run_dir = Path(run_path(self.run_dir, Path.cwd(), self.name))
        self.__dict__["run_dir"] = str(run_dir)  # no assignment: that would validate again

        def fix(value: str) -> str:
            return run_path(value, run_dir, self.name)

        for key in PATH_KEYS:
            head, *rest = key.split(".")
            value = getattr(self, head)
            if value is not None:
                self.__dict__[head] = fix(value) if not rest else _with_path(value, rest, fix)
        return self

    def recipe_args(self) -> list[str]:
        """``--recipe PATH`` and the ``--set`` items this recipe was loaded with (a hint's tail)."""
        if self._origin is None:  # built in code, not from a file
            return ["--recipe", "RECIPE"]
        path, items = self._origin
        return ["--recipe", path, *(part for item in items for part in ("--set", item))]

    def resolved_run_dir(self) -> Path:
        """The run folder (absolute: the path rule applied when the recipe validated)."""
        return Path(self.run_dir)

    def origin(self) -> tuple[str, tuple[str, ...]] | None:
        """(recipe file, ``key=value`` overrides) it was loaded from; None when built in code."""
        return self._origin


def _checked(section: type[Section], data: Any, where: str) -> None:
    """Validate ``data`` as ``section``; a ConfigError names ``where`` and the key inside it."""
    if not isinstance(data, dict):
        raise ConfigError(where, f"must be a mapping, got {type(data).__name__}")
    try:
        section.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        inner = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{where}.{inner}" if inner else where,
                          err["msg"].removeprefix("Value error, ")) from None


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def first_error(exc: ValidationError, source: str | None = None) -> ConfigError:
    """Turn pydantic's first error into a :class:`ConfigError` naming the dotted key."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if p not in ("function-after", "function-before"))
    inner = err.get("ctx", {}).get("error")
    if isinstance(inner, ConfigError):  # a section's own check: its key is relative to the section
        text = str(inner).removeprefix(f"{inner.source}: " if inner.source else "")
        return ConfigError(_dotted(loc + tuple(inner.key.split("."))), text.removeprefix(f"{shown_key(inner.key)}: "), source)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key (check its spelling and the section it sits in)"
    if "input" in err and err["type"] not in ("missing", "extra_forbidden"):
        message = f"{message} (got {err['input']!r})"
    return ConfigError(_dotted(loc), message, source)


def parse_recipe(data: dict[str, Any], source: str | None = None) -> Recipe:
    """Validate a recipe mapping; raises :class:`ConfigError` on the first problem."""
    if not isinstance(data, dict):
        raise ConfigError("<root>", f"a recipe must be a mapping, got {type(data).__name__}", source)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise first_error(exc, source) from None


def read_recipe_data(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of a YAML recipe with its ``extends`` chain merged in (base first).

    ``extends: <file>`` (relative to the recipe) reads that recipe first and lays this one over
    it, mappings merged key by key (a mapping tagged ``!replace`` replaces the base's whole),
    any other value replaced. Reads no file but the recipe and
    those it extends; :func:`prour.recipes.load_recipe` is the loader that calls this.
    """
    if not path.is_file():
        where = f" (extended by {seen[-1]})" if seen else ""
        raise ConfigError("<file>", f"recipe file not found: {path}{where}")
    try:
        data = yaml.load(path.read_text(), Loader=_RecipeLoader) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        what = " ".join(filter(None, (getattr(exc, "context", None),
                                      getattr(exc, "problem", None)))) or str(exc)
        raise ConfigError("<yaml>", f"not valid YAML at{line}: {' '.join(what.split())}",
                          str(path)) from None
    data = unshared(data)
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base = data.pop("extends")
    if not isinstance(base, str) or not base:
        raise ConfigError("extends", f"must name a recipe file, got {base!r}", str(path))
    base_path = (path.parent / base).resolve()
    if base_path in seen or base_path == path.resolve():
        raise ConfigError("extends", f"recipes extend each other in a cycle at {base}", str(path))
    return merge_recipe(read_recipe_data(base_path, (*seen, path.resolve())), data)


class Replacing(dict):
    """A mapping a recipe marks ``!replace``: laid over the recipe it extends, it replaces that
    recipe's mapping whole instead of being merged into it (a rehearsal's own backbone panel
    instead of the paper's eight)."""


class _RecipeLoader(yaml.SafeLoader):
    """YAML's safe loader plus the ``!replace`` tag on a mapping."""


_RecipeLoader.add_constructor(
    "!replace", lambda loader, node: Replacing(loader.construct_mapping(node, deep=True)))


def unshared(value: Any) -> Any:
    """A copy in which no mapping or list is shared: YAML aliases (``agent: *tiny``) become
    separate copies, so that an override of one role's key leaves the other roles alone."""
    if isinstance(value, dict):
        return type(value)({key: unshared(item) for key, item in value.items()})
    if isinstance(value, list):
        return [unshared(item) for item in value]
    return value


def merge_recipe(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``: nested mappings merged (a :class:`Replacing` one replaces),
    every other value replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Replacing):
            out[key] = dict(value)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_recipe(out[key], value)
        else:
            out[key] = value
    return out


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` in a nested mapping; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(item, "an override must look like key.sub=value")
    key, raw = item.split("=", 1)
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(key, f"cannot set below {part!r}: it is not a mapping")
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        if not raw.isprintable():  # a control character: YAML reads it in no quoting either
            bad = next(c for c in raw if not c.isprintable())
            raise ConfigError(key, f"--set {item!r}: the value holds the character {bad!r}, "
                              "which YAML does not read; leave it out") from None
        text = f"{key}='{raw.replace(chr(39), chr(39) * 2)}'"  # a YAML string, ' doubled
        shell = f'"{text}"' if not set(text) & set('"$`\\!') else shlex.quote(text)
        raise ConfigError(key, f"--set {item!r}: the value is not valid YAML ({problem}); "
                          f"to pass it as text, quote it: --set {shell}") from None
