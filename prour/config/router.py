"""The ``router`` recipe section: decomposer, thresholds, budget, LLM router, calibration."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from prour.section import Section

RouteName = Literal["act", "clarify", "verify"]


class DevMix(Section):
    """Labelled dev states kept per route (paper A.2.2: 60 clarify, 90 verify, 90 act)."""

    clarify: int = Field(60, ge=0)
    verify: int = Field(90, ge=0)
    act: int = Field(90, ge=0)

    def quotas(self) -> dict[str, int]:
        return {"clarify": self.clarify, "verify": self.verify, "act": self.act}


class CalibrationConfig(Section):
    """Where the labelled decision states live and how the threshold grid is laid out."""

    # JSONL of the dev candidate states: every decision state of the reserve-task trajectories
    # (collect-dev), in a seeded order; annotation keeps them in that order up to dev_mix
    dev_states: str | None = None
    test_states: str | None = None  # disjoint held-out JSONL, used only after the search
    out_dir: str | None = None  # labels and AU/EU caches; default <run_dir>/calibration
    # `prour calibrate states --split test`: held-out decision states sampled (A.2.2: 240)
    n_states: int = Field(240, ge=1)
    # Labelled dev states kept per route (A.2.2: 60 clarify, 90 verify, 90 act): candidates are
    # annotated in order and a state is kept while its label's quota is open; null keeps every
    # labelled dev state
    dev_mix: DevMix | None = DevMix()
    # When a review's corrections leave the dev mix short of dev_mix with candidates still
    # unlabelled: `annotate` labels further candidates (the review gate then closes again for
    # them), `continue` fits the thresholds on the short mix as it is (the search says so)
    short_mix: Literal["annotate", "continue"] = "annotate"
    # retail episodes of the calibration reserve the chain collects for the dev candidates
    dev_episodes: int = Field(80, ge=1)
    # airline episodes the chain collects for the held-out states (A.2.2: 240 states from 60)
    test_episodes: int = Field(60, ge=1)
    lo: float = Field(0.0, ge=0)  # grid start (both thresholds), nats
    hi: float = Field(0.8, gt=0)  # grid end, inclusive, nats
    step: float = Field(0.01, gt=0)  # grid spacing, nats
    annotator_temperature: float = Field(0.0, ge=0)
    annotator_max_tokens: int = Field(16, ge=1)  # a label is one word
    excerpt_chars: int = Field(1500, ge=100)  # tail of the history shown to reviewers
    # Unattended runs: approve the annotator's labels at the review gate without a person
    # (`prour run` / `prour slurm submit` stop there otherwise; `--approve-labels` does it once).
    approve_labels: bool = False

    def model_post_init(self, context: Any, /) -> None:
        if self.hi <= self.lo:
            raise ValueError(f"hi ({self.hi}) must be greater than lo ({self.lo})")
        if self.step > self.hi - self.lo:
            raise ValueError(f"step ({self.step}) is wider than the grid [{self.lo}, {self.hi}]")


class RouterConfig(Section):
    """Decomposer (paper A.2.2), routing thresholds, budget (A.2.3) and the LLM-router ablation."""

    n_interpretations: int = Field(5, ge=1)  # K goal interpretations per decision
    n_actions: int = Field(4, ge=1)  # L candidate actions per interpretation
    goal_temperature: float = Field(1.0, ge=0)
    action_temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    goal_max_tokens: int = Field(96, ge=1)  # one first-person sentence
    action_max_tokens: int = Field(256, ge=1)  # one JSON action
    enable_thinking: bool = False  # Qwen3 <think> for the decomposer's generations
    # How tools appear in the decomposer prompts: "full" argument JSON schemas (paper A.4.1) or
    # "brief" typed signatures (~5x fewer tokens, for small context windows such as the tiny model).
    tool_detail: Literal["full", "brief"] = "full"
    # Appended to each canonical action when scoring, so the completion token is scored too
    # (Qwen3's end of turn). Set it to the decomposer model's end-of-turn marker.
    end_marker: str = "<|im_end|>"
    tau_au: float | None = Field(None, ge=0)  # explicit thresholds win over thresholds_file
    tau_eu: float | None = Field(None, ge=0)
    thresholds_file: str | None = None  # JSON keyed by decomposer model id (prour calibrate)
    # Route with the thresholds calibrated for this decomposer model id (as the thresholds file
    # keys it, e.g. "openai:Qwen/Qwen3-8B") instead of the decomposer's own: the Prour paper's
    # Table 7 runs GLM-4-32B with Qwen3-8B's thresholds beside its own. None: its own.
    thresholds_model: str | None = None
    empty_route: RouteName = "act"  # route when no valid candidate (or no goal) survives
    budget: int | None = Field(None, ge=0)  # max decomposer runs per episode; None: unlimited
    every_n: int = Field(1, ge=1)  # run the decomposer every n-th agent decision step
    llm_router_fallback: RouteName = "act"  # LLM router mode when its output is invalid
    llm_router_temperature: float = Field(0.0, ge=0)
    llm_router_max_tokens: int = Field(128, ge=1)
    calibration: CalibrationConfig = CalibrationConfig()

    def model_post_init(self, context: Any, /) -> None:
        if (self.tau_au is None) != (self.tau_eu is None):
            raise ValueError(
                "set both tau_au and tau_eu, or neither (then thresholds_file is read)"
            )
