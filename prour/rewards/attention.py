"""The attention cost of a training question, for the attention-aware reward R = IG − λ·cost(q).

Beyond both papers: the prour paper rewards a question by its information gain alone; the
ask-less paper prices every discretionary request the user must read (utility U = R − λ·A). The
attention-aware reward charges each clarify question its own share of A, so that a policy trained
on it learns to ask only what pays for the user's attention. A training question is a
discretionary request by construction (it asks the user something the policy chose to ask), and
``reward.attention.cost`` picks how it is priced, with the accountings of
:mod:`prour.core.cost` and default weights:

* ``proxy``: the ``atomic`` accounting, i.e. the number of separate asks in the question as
  :func:`prour.core.asks.count_atomic_questions` counts them by rule (at least 1:
  a question asks something). Free, deterministic, and it penalizes bundled questions;
* ``judge``: the ``full`` accounting, 1 + r/20 + (1 − v/10), with reading effort r and value v
  from the ask-less LLM judge (:class:`prour.rewards.judge.RequestJudge`) reading the
  question after the state's history. A judge that never gives a valid verdict fails the sample
  (no invented cost), as a failed responder does.

Verify questions go to the verifier, which reads tools, not the user: they cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prour.llm.base import Message

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.rewards import AttentionRewardConfig
    from prour.rewards.judge import Judgment, RequestJudge


def _discretionary_cost(accounting: str, **scores: float) -> float:
    """The cost of one discretionary request under ``accounting`` with the default weights."""
    from prour.config.attention import CostWeights
    from prour.core.cost import request_cost

    return request_cost({"discretionary": True, **scores}, accounting, CostWeights())


def proxy_cost(question: str) -> float:
    """The ``atomic`` cost of one discretionary request: its rule-counted asks (at least 1)."""
    from prour.core.asks import count_atomic_questions

    return _discretionary_cost("atomic", atomic_questions=max(1, count_atomic_questions(question)))


def judged_cost(judgment: Judgment) -> float:
    """The ``full`` cost of one discretionary request from the judge's r and v."""
    return _discretionary_cost(
        "full", reading_effort=judgment.reading_effort, value=judgment.value
    )


class QuestionCost:
    """Prices the clarify questions of one state: ``(cost, error)`` per question."""

    def __init__(self, config: AttentionRewardConfig, judge: RequestJudge | None = None):
        if config.cost == "judge" and judge is None:
            raise ValueError("reward.attention.cost 'judge' needs a RequestJudge (models.judge)")
        self.config = config
        self.judge = judge

    @property
    def lam(self) -> float:
        return self.config.lam

    def costs(
        self, history: Sequence[Message], questions: Sequence[str]
    ) -> list[tuple[float | None, str | None]]:
        """The cost of each question asked after ``history``, or (None, why it failed)."""
        if self.config.cost == "proxy":
            return [(proxy_cost(q), None) for q in questions]
        from prour.llm.history import render_history

        context = render_history(list(history))
        distinct = list(dict.fromkeys(questions))  # a group's repeated question is judged once
        verdicts = dict(zip(distinct, self.judge.judge([(q, context) for q in distinct])))
        return [(None, v.error) if v.failed else (judged_cost(v), None)
                for v in (verdicts[q] for q in questions)]
