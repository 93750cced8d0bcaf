"""``ig-clarifier``: clarification only, the clarifier deciding by itself whether to ask.

Source: Deng et al. (2026), the IG-Clarifier of the prour paper's Table 1 (cited there as the
reward estimator prour generalises), and its public code, github.com/Trailblazerss/
Information-Gain-Clarifier (read for reference only). There a clarifier model is trained with
a belief-update reward: the mean per-token log-probability of the user's intent summary with the
question-and-answer turn minus without it. Its decision rule is the clarifier's own output for a
dialogue state: ``NO`` (no question needed) or ``YES [QUESTION]…[/QUESTION]``; no separate
router, no uncertainty estimate and no world-side verification.

What it does here: at every agent decision the clarifier (``models.ig_clarifier``: the checkpoint
of its own DAPO run, :mod:`prour.config.ig_clarifier` and ``recipes/ig-clarifier.yaml``, on the
clarify template, which asks the same YES/NO question) decides; ``YES`` sends its question to the user
(turn tag ``clarify``), ``NO`` or an invalid answer lets the task agent act. The decision
records ``{"router": "ig-clarifier", "route": "clarify"}`` and the clarifier's answer under
``query``.

The clarifier is trained as the public code trains it (the information-gain reward of its
clarify states, per-token mean, 0 without a question), from the same initial generator and with
the same DAPO settings as prour's; ``prour run`` trains and exports it (``train-ig-clarifier``,
``export-ig-clarifier``) and its eval step sets ``models.ig_clarifier.path`` to the export.
``prour eval --checkpoint`` never touches it. Simplified: its calls follow ``router.budget`` /
``router.every_n`` like prour's router calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prour.eval.agent import ProactiveAgent, RouteChoice
from prour.llm.base import Message

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.agents import Agent
    from prour.eval.baselines import BaselineContext

NAME = "ig-clarifier"
ROLE = "ig_clarifier"  # models.ig_clarifier: its own trained clarifier


class ClarifierGate:
    """Sends every decision to the clarifier: its own YES / NO is the decision rule."""

    def choose(self, messages: Sequence[Message], seed: int) -> RouteChoice:
        return RouteChoice("clarify", {"router": NAME, "route": "clarify"})


def build(context: BaselineContext) -> Agent:
    return ProactiveAgent(context.task_agent, ClarifierGate(), context.new_generator(ROLE),
                          routes=("act", "clarify"), new_budget=context.budget)
