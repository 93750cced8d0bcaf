"""The ``data`` recipe section: collection, goal normalization, extraction and dataset paths."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from prour.config.domains import DomainName, SplitName
from prour.config.eval import MAX_ERROR_FRACTION
from prour.section import Section


class DataConfig(Section):
    """Settings of ``prour collect | normalize | extract`` (paper section 4 and A.2.1).

    Episode limits and the agent's and user's decoding are the ``env`` section's (shared with
    evaluation). Relative paths resolve against the recipe's run directory.
    """

    # --- collect ---
    domain: DomainName = "retail"  # the paper trains on retail only
    split: SplitName = "train"  # tau2 split the trajectories come from
    max_tasks: int | None = Field(None, ge=1)  # first N tasks of the split (smoke runs)
    # Tasks of data.split held out of training for the calibration dev states (paper A.2.2: a
    # development set disjoint from training): a seeded sample of this many task ids
    # (prour.data.reserve). Training (collect, normalize, extract) never uses them.
    calibration_reserve: int = Field(0, ge=0)
    reserve_seed: int = 0  # seed of the reserve's sample
    # Which side of data.split collect and normalize run on: the training tasks, or the reserve
    # (the chain's collect-dev step sets `data.tasks=reserve`).
    tasks: Literal["training", "reserve"] = "training"
    num_trajectories: int = Field(500, ge=1)  # stop once this many episodes are recorded
    # one trial per seed per task, seed-major order
    trial_seeds: list[int] = Field(default_factory=lambda: list(range(10)))
    concurrency: int = Field(8, ge=1)  # episodes run at the same time
    teacher: bool = True  # invoke the teacher query generator after each agent tool call
    teacher_max_questions: int | None = Field(None, ge=0)  # per episode; None: no cap
    teacher_temperature: float = Field(0.0, ge=0)
    teacher_max_tokens: int = Field(512, ge=1)
    teacher_thinking: bool = False  # Qwen3 <think> for the teacher's decision
    # `prour collect` exits non-zero, naming the most common error, when more than this share of
    # its planned episodes ended in an error (as eval.max_error_fraction); a rerun runs the
    # errored episodes again.
    max_error_fraction: float = Field(MAX_ERROR_FRACTION, ge=0, le=1)
    # --- normalize ---
    normalizer_max_tokens: int = Field(768, ge=16)
    # --- extract ---
    val_ratio: float = Field(0.2, ge=0, lt=1)  # share of trajectories held out for validation
    split_seed: int = 0  # seed of the trajectory shuffle that assigns the split
    # "task" (default): all trials of a task on one side, so train and validation share no task
    split_by: Literal["trajectory", "task"] = "task"
    max_decisions: int = Field(16, ge=1)  # first N agent decisions of each trajectory
    # The query generator's prompt budget in policy tokens (paper: 1400): histories are
    # left-truncated to it here, always keeping the newest user message and the calls after it
    # (a state that cannot fit even with those calls' results cut is dropped, "over_budget";
    # prour.data.truncate), and training (both backends) refuses longer prompts.
    max_prompt_tokens: int = Field(1400, ge=64)
    only_successful: bool = False  # verify targets only from trajectories with reward 1
    # The verify target Y. "agent" (default): the collected agent's own next tool call, also from
    # failed episodes (unless only_successful). "reference" (paper A.2.1: "the reference next
    # action a_t*"): the earliest of the task's reference actions (tau2's evaluation_criteria
    # .actions, requestor assistant) that no agent tool call before the decision matches, matched
    # order-free as tau2's action check does (extra calls allowed); a WRITE call matching no
    # reference action takes the trajectory off the path and its later states are dropped
    # ("verify_off_reference"); the calls of one turn all count for the next decision. "gold"
    # (stricter): only states whose agent tool calls so far are the first reference actions in
    # order; the others are dropped ("verify_off_reference").
    verify_target: Literal["agent", "reference", "gold"] = "agent"
    success_threshold: float = 1.0  # reward at or above which a trajectory counts as successful
    # Verify states whose next agent decision is a text reply rather than a tool call: "drop"
    # them (the target is defined as the next *tool call*), or use the decomposer's
    # `{"tool":"respond","arguments":{}}` action as the target.
    verify_on_reply: Literal["drop", "respond"] = "drop"
    tokenizer: str | None = None  # policy tokenizer; default: models.generator.path
    # Which states become rows. "routed" (prour's data): the decomposer routes every decision
    # state with the calibrated thresholds; clarify and verify states become rows, act states
    # are left out. "every" (the IG-Clarifier baseline's data, prour.config.ig_clarifier): every
    # decision state becomes a clarify row whose target is the normalized goal G*, with no
    # decomposer call, so that no router setting can change one row.
    states: Literal["routed", "every"] = "routed"
    # --- inputs and outputs ---
    on_bad_line: Literal["error", "skip"] = "error"  # corrupt JSONL input lines (always reported)
    trajectories: str = "data/trajectories.jsonl"
    goals: str = "data/goals.jsonl"
    decisions: str = "data/decisions.jsonl"
    dataset_dir: str = "data/dataset"

    def model_post_init(self, context: Any, /) -> None:
        if not self.trial_seeds:
            raise ValueError("trial_seeds must list at least one seed")
        if len(set(self.trial_seeds)) != len(self.trial_seeds):
            raise ValueError(f"trial_seeds must be distinct, got {self.trial_seeds}")
