"""The ``taxonomy`` recipe section: the uncertainty taxonomy of the paper's Appendix A.1 (Table 5,
Figure 2) over the collected retail and airline trajectories (:mod:`prour.data.taxonomy`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from prour.section import Section


class TaxonomyConfig(Section):
    """Whether the chain annotates every decision step of the collected trajectories, and how the
    annotator (``models.annotator``) is asked. ``taxonomy: false`` stands for ``run: false``."""

    # The chain's `taxonomy` and `taxonomy-review` steps run (recipes/paper.yaml turns them on);
    # false leaves them out, and the report's Table 5 and Figure 2 say so.
    run: bool = False
    annotator_attempts: int = Field(3, ge=1)  # strict-JSON attempts per step, the error fed back
    temperature: float = Field(0.0, ge=0)
    max_tokens: int = Field(384, ge=1)  # one JSON object of seven short fields
    context_messages: int = Field(8, ge=1)  # the dialogue's last messages before the decision
    # Unattended runs: approve the annotator's taxonomy labels at the taxonomy-review gate
    # without a person (`prour run --approve-labels` does it for one run).
    approve_labels: bool = False

    @model_validator(mode="before")
    @classmethod
    def _plain_switch(cls, data: Any) -> Any:
        """``taxonomy: true`` / ``taxonomy: false`` is the switch alone."""
        return {"run": data} if isinstance(data, bool) else data
