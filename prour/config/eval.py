"""The ``eval`` recipe section: which methods run where, decoding, and the attention protocol.

One place for each hyperparameter: decomposer budget and invocation frequency are the router's
(``router.budget``, ``router.every_n``); episode limits and the agent's and user's decoding are
``env``'s; the query generator's response length and thinking are training's
(``train.rollout.max_response_tokens``, ``train.rollout.enable_thinking``), only its temperature
differs here; the verifier answers as in training (``reward.verifier_max_steps``,
``reward.responder_temperature``, ``reward.responder_max_tokens``).
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from prour.config.attention import (
    AttentionConfig,
    Variant,
    check_policy_options,
    variant_of,
)
from prour.config.domains import DomainName, SplitName
from prour.registry import unknown_name
from prour.section import Section

# The names of prour.eval.methods.METHODS (a test keeps the two equal), known here so that a
# recipe naming an unknown method fails when it loads.
METHOD_NAMES = ("base", "prour", "clarify-only", "verify-only", "llm-router", "oracle",
                "ig-clarifier", "ask-before-plan", "verifiagent", "saber", "sage-agent")
# Those that route with a router (the decomposer or the LLM router), whose budget and frequency
# a trade-off sweep varies (tests/test_architecture.py holds it equal to the registry's).
ROUTED_METHODS = ("prour", "clarify-only", "verify-only", "llm-router")


# Evaluation protocols: named presets of (domains, split, seeds). ``paper``: the Prour paper's
# Table 1 (section 4, A.2.1), tau2's ``base`` retail split (114 tasks: τ-bench v1's 115 test tasks
# with the maintainers' corrections) and airline's 50, Pass@1 over 3 seeds; ``v1-test``: the same
# on τ-bench v1's own test tasks, converted (split ``v1-test``: the 96 of 115 retail and 50 of 50
# airline tasks whose reference actions tau2's tools take); ``tau3``: the paper's Table 4 on
# τ³-bench's tasks (split ``tau3``: its retail and airline tasks, 113 of 114 and 50, and the 114
# telecom tasks it shares with tau2); ``tau2-test``: tau2's RL test split. Each packaged split's
# data file lists the tasks it leaves out (prour/env/data, docs/evaluation.md).
PROTOCOLS: dict[str, dict[str, Any]] = {
    "paper": {"domains": ["retail", "airline"], "split": "base", "seeds": [0, 1, 2]},
    "v1-test": {"domains": ["retail", "airline"], "split": "v1-test", "seeds": [0, 1, 2]},
    "tau3": {"domains": ["retail", "airline", "telecom"], "split": "tau3", "seeds": [0, 1, 2]},
    "tau2-test": {"domains": ["retail", "airline", "telecom"], "split": "test",
                  "seeds": [0, 1, 2]},
}
ProtocolName = Literal[tuple(PROTOCOLS)]  # type: ignore[valid-type]


def check_method_name(name: str) -> str:
    """``name`` if it is a method; else a ValueError listing the valid ones and the closest."""
    if name not in METHOD_NAMES:
        raise ValueError(unknown_name("method", name, METHOD_NAMES))
    return name


def parse_variant(text: str) -> tuple[str, int | None]:
    """``"budgeted@2"`` → ``("budgeted", 2)``; ``"no-ask"`` → ``("no-ask", None)``; a variant's
    own options (``voi-gate(c=0.5)``) are left out (:func:`prour.config.attention.variant_of`
    keeps them)."""
    variant = variant_of(text)
    return variant.policy, variant.budget


# The router keys a trade-off sweep varies (eval.sweep, ``prour eval --sweep KEY=V1,V2``).
SWEEP_KEYS = ("router.budget", "router.every_n")


def sweep_label(point: dict[str, int | None] | None) -> str | None:
    """``budget=2 every_n=1`` (``budget=inf`` for unlimited) of a sweep point; None: no point."""
    if point is None:
        return None
    return " ".join(f"{key.split('.', 1)[1]}={'inf' if v is None else v}"
                    for key, v in point.items())


# The share of errored episodes past which a run of episodes failed (eval.max_error_fraction and
# data.max_error_fraction: the same rule for evaluation and collection).
MAX_ERROR_FRACTION = 0.1


class SaberConfig(Section):
    """The ``saber`` baseline (prour.eval.baselines.saber): confirmation gate on tau2's WRITE tools,
    targeted reflection, context cleaning."""

    # The review decodes as every baseline's decision module (router.llm_router_*).
    reflection: bool = True  # review each mutating proposal against the policy before asking
    clean_context: bool = True  # the task agent sees stale tool results as short stubs


class SageAgentConfig(Section):
    """The ``sage-agent`` baseline (prour.eval.baselines.sage_agent): EVPI questions about the
    parameters of the agent's candidate tool calls."""

    samples: int = Field(4, ge=1)  # candidate calls the agent's model adds per tool-call step
    temperature: float = Field(1.0, gt=0)  # their sampling temperature
    ask_cost: float = Field(0.1, ge=0)  # cost of any question: EVPI must exceed it to ask
    repeat_cost: float = Field(1.0, ge=0)  # added per earlier question about the same aspect


# The chain's trade-off sweeps (eval.tradeoff): the router key each one varies, and the folder
# under run_dir its evaluation runs into (a run folder of its own beside run_dir/eval, so that
# the main evaluation's plan, resume keys and done-check stay its own).
TRADEOFF_SWEEPS = {"budget": "router.budget", "every_n": "router.every_n"}
TRADEOFF_FOLDERS = {"budget": "eval-budget", "every_n": "eval-every-n"}


class TradeoffConfig(Section):
    """The prour paper's trade-off sweeps (Figures 5 and 8, A.2.3) as steps of ``prour run``:
    after the main evaluation, ``methods`` run once per value of ``budget`` (router.budget,
    Figure 5) and once per value of ``every_n`` (router.every_n, Figure 8), each sweep into its
    own folder (:data:`TRADEOFF_FOLDERS`); the main evaluation's episodes are the point of the
    recipe's own router settings. An empty list leaves its step out."""

    run: bool = True  # false: prour run skips both sweeps (the report says they did not run)
    methods: list[str] = Field(default_factory=lambda: ["prour"])  # routed methods (METHOD_NAMES)
    budget: list[int | None] = Field(default_factory=list)  # router.budget values (null: unlimited)
    every_n: list[int] = Field(default_factory=list)  # router.every_n values

    @field_validator("methods")
    @classmethod
    def _routed_methods(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one method")
        for name in value:
            if check_method_name(name) not in ROUTED_METHODS:
                raise ValueError(f"{name} routes with no router: a sweep of router.budget and "
                                 "router.every_n leaves it unchanged (list routed methods, e.g. "
                                 "prour, clarify-only, verify-only, llm-router)")
        return list(dict.fromkeys(value))

    @field_validator("budget", "every_n")
    @classmethod
    def _values(cls, value: list[int | None], info: Any) -> list[int | None]:
        least = 1 if info.field_name == "every_n" else 0
        if len(set(value)) != len(value):
            raise ValueError(f"values repeat: {value}")
        for v in value:
            if v is not None and v < least:
                raise ValueError(f"{v!r} is not an integer >= {least}")
        return value

    def sweeps(self) -> dict[str, list[int | None]]:
        """name (``budget``, ``every_n``) -> its values, for the sweeps this recipe runs."""
        if not self.run:
            return {}
        return {name: list(getattr(self, name)) for name in TRADEOFF_SWEEPS
                if getattr(self, name)}


class EvalConfig(Section):
    """Settings of ``prour eval`` (prour paper section 4 and A.2.1; ask-less paper protocol)."""

    methods: list[str] = Field(default_factory=lambda: ["base", "prour"])  # from METHOD_NAMES
    # A named preset of domains, split and seeds (PROTOCOLS); keys given explicitly win.
    protocol: ProtocolName | None = None
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2])  # one trial per seed and task
    domains: list[DomainName] = Field(default_factory=lambda: ["retail", "airline"])
    split: SplitName = "test"
    tasks: list[str] | None = None  # only these ids: "retail:5" or a bare id (every domain)
    max_tasks: int | None = Field(None, ge=1)  # first N tasks of each domain's split
    # Episodes run at the same time, all methods, checkpoints and sweep points together: one
    # queue (prour.eval.queue) keeps each model it calls at its own limit besides this one.
    concurrency: int = Field(4, ge=1)
    # In-flight limits per model: a role (generator, agent, ...) or a model id (served or
    # models.<role>.model) -> the most requests to it in flight at once; a served model is held
    # at its serve.models.<id>.max_num_seqs. An in-process (hf) model has only this limit.
    max_in_flight: dict[str, int] = Field(default_factory=dict)
    # Where a trained (or hf) query generator runs: hf loads it in process (CPU, tests); vllm
    # serves the checkpoint eval is given with vLLM as one more server, served name
    # "exported-generator" (its settings: serve.models.exported-generator), and eval sends the
    # generator's requests to the URL the endpoints file gives it (prour.cluster.recipe).
    generator_backend: Literal["hf", "vllm"] = "hf"
    # The query generator decodes greedily in evaluation (paper: 0.0, training samples at 0.8);
    # None: the training temperature, train.rollout.temperature.
    generator_temperature: float | None = Field(0.0, ge=0)
    retry_errors: bool = True  # a rerun also repeats episodes that ended in an error
    # `prour eval` exits non-zero, naming the most common error, when more than this share of its
    # episodes ended in an error (an unreachable server, a missing model): such a run measures
    # nothing. 0.1 lets an odd timeout through; the report still marks its cell.
    max_error_fraction: float = Field(MAX_ERROR_FRACTION, ge=0, le=1)
    # Attention protocol: None runs without a gate. ``attention_policies`` lists variants
    # ("no-ask", "budgeted@2", ...) run in turn, each under attention's other settings.
    attention: AttentionConfig | None = None
    attention_policies: list[str] = Field(default_factory=list)
    judge: bool = True  # score delivered requests with models.judge after each episode
    # request labels: models.judge, models.classifier (a model of its own) or rules
    classifier: Literal["judge", "classifier", "heuristic"] = "judge"
    saber: SaberConfig = Field(default_factory=SaberConfig)  # the saber baseline's settings
    sage_agent: SageAgentConfig = Field(default_factory=SageAgentConfig)  # sage-agent's settings
    # Trade-off sweep (paper Figures 5 and 8, A.2.3): values of router.budget (null: unlimited)
    # and router.every_n; the methods with a router run once per point of their grid (every
    # combination), all into one run folder; each result line records its point (``sweep``).
    sweep: dict[str, list[int | None]] = Field(default_factory=dict)
    # The chain's sweeps for Figures 5 and 8 (prour run's eval-budget and eval-every-n steps).
    tradeoff: TradeoffConfig = Field(default_factory=TradeoffConfig)

    @model_validator(mode="before")
    @classmethod
    def _apply_protocol(cls, data: Any) -> Any:
        """Fill ``domains``, ``split`` and ``seeds`` from ``protocol`` where not given."""
        if not isinstance(data, dict) or data.get("protocol") is None:
            return data
        preset = PROTOCOLS.get(data["protocol"])
        if preset is None:
            raise ValueError(unknown_name("eval.protocol", data["protocol"], tuple(PROTOCOLS)))
        return {**preset, **data}

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one method")
        for name in value:
            check_method_name(name)
        return list(dict.fromkeys(value))

    @field_validator("seeds")
    @classmethod
    def _some_seeds(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("list at least one seed")
        if len(set(value)) != len(value):
            raise ValueError(f"seeds repeat: {value}")
        return value

    @field_validator("max_in_flight")
    @classmethod
    def _limits(cls, value: dict[str, int]) -> dict[str, int]:
        for key, limit in value.items():
            if limit < 1:
                raise ValueError(f"eval.max_in_flight.{key}: {limit!r} is not an integer >= 1")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweep_keys(cls, value: dict[str, list[int | None]]) -> dict[str, list[int | None]]:
        for key, values in value.items():
            if key not in SWEEP_KEYS:
                raise ValueError(unknown_name("eval.sweep key", key, SWEEP_KEYS))
            if not values:
                raise ValueError(f"eval.sweep.{key}: list at least one value")
            if len(set(values)) != len(values):
                raise ValueError(f"eval.sweep.{key}: values repeat: {values}")
            least = 1 if key == "router.every_n" else 0
            for v in values:
                if (v is None and key == "router.every_n") or (v is not None and v < least):
                    raise ValueError(f"eval.sweep.{key}: {v!r} is not an integer >= {least}")
        return {key: list(value[key]) for key in SWEEP_KEYS if key in value}

    def sweep_points(self) -> list[dict[str, int | None] | None]:
        """Every combination of the ``sweep`` values (``[None]`` without a sweep), in order."""
        if not self.sweep:
            return [None]
        keys = list(self.sweep)
        return [dict(zip(keys, combo)) for combo in itertools.product(*self.sweep.values())]

    @model_validator(mode="after")
    def _variants_fit(self) -> EvalConfig:
        if self.attention_policies and self.attention is None:
            raise ValueError("attention_policies needs an `attention` section (its other settings)")
        threshold = self.attention.voi_threshold if self.attention else None
        for text in self.attention_policies:
            variant = variant_of(text)
            check_policy_options(variant.policy, variant.budget,
                                 variant.option("c") if variant.option("c") is not None
                                 else threshold)
        return self

    def variants(self) -> list[AttentionConfig | None]:
        """One attention setting per variant to run (``[None]`` without the protocol)."""
        if self.attention is None:
            return [None]
        if not self.attention_policies:
            return [self.attention]
        return [self.attention.model_copy(update=variant_of(text).settings())
                for text in self.attention_policies]

    def variant_labels(self) -> list[str | None]:
        """The label of each of :meth:`variants` (``budgeted@2``, ``voi-gate(c=0.5)``; None
        without the protocol): what result lines and episode keys name the variant by."""
        if self.attention is None:
            return [None]
        if not self.attention_policies:
            return [Variant(self.attention.policy, self.attention.budget).label]
        return [variant_of(text).label for text in self.attention_policies]
