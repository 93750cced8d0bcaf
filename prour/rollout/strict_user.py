"""The strict user simulator: the training responder for clarify queries.

It knows the normalized user goal G* (ground truth is allowed here: the simulator plays the user)
and gives task information away only when a question is precise and relevant to it. Vague,
generic or placeholder questions are deflected, so that the reward cannot be farmed by asking
"anything else?".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prour.llm.base import LLM, ChatRequest, Message, SamplingParams
from prour.llm.meter import record

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.rewards import RewardConfig

logger = logging.getLogger(__name__)

STRICT_USER_VERSION = "strict-user-v1"

STRICT_USER_SYSTEM = """\
You play a customer talking to a customer-service agent. You act on a hidden goal that the agent
cannot see:

{goal}

How to reply:
- Write one short message in the first person, as this customer would say it.
- Use only facts stated in your goal. If you are asked for something your goal does not give,
  say that you do not remember it or do not have it. Never make details up.
- Say things in your own words; do not recite the goal.

Be strict about what you reveal:
- Give information only when the agent's question is specific and bears directly on what you
  are trying to get done. Then answer exactly what was asked and nothing more.
- If the question is vague, broad or generic (for example "Anything else?", "Can you tell me
  more?", "Is there any additional information?"), reply only "No, that's all." or "Just do what
  I asked."
- If the question is too unclear to answer, reply "Could you be more specific?" or "I'm not sure
  what information you need."
- If the message is a template or placeholder, or is not addressed to you as the customer (for
  example "Your clarifying question to the user here"), reply only "Who are you talking to?"."""


def responder_sampling(reward: RewardConfig) -> SamplingParams:
    """How the frozen responders (strict user, verifier) decode, as the ``reward`` section says:
    one sample at ``responder_temperature``, up to ``responder_max_tokens`` tokens."""
    return SamplingParams(n=1, temperature=reward.responder_temperature,
                          max_tokens=reward.responder_max_tokens)


class StrictUserSimulator:
    """Answers clarify questions as the user with hidden goal G*; batched over questions.

    It decodes as the recipe's ``reward`` section says (:func:`responder_sampling`).
    """

    def __init__(self, llm: LLM, reward: RewardConfig, enable_thinking: bool = False):
        self.llm = llm
        self.sampling = responder_sampling(reward)
        self.enable_thinking = enable_thinking

    def messages(self, goal: str, question: str) -> list[Message]:
        """The chat prompt for one question: the hidden goal and rules, then the agent's question."""
        return [
            {"role": "system", "content": STRICT_USER_SYSTEM.format(goal=goal.strip())},
            {"role": "user", "content": question.strip()},
        ]

    def answer_many(self, goal: str, questions: Sequence[str]) -> list[str | None]:
        """One reply per question, in one batched call; None where the model gave no usable text.

        Backend errors (``BackendError``, timeouts) propagate; the caller decides on retries.
        """
        if not questions:
            return []
        requests = [
            ChatRequest(
                messages=self.messages(goal, q),
                sampling=self.sampling,
                enable_thinking=self.enable_thinking,
            )
            for q in questions
        ]
        try:
            outputs = self.llm.chat(requests)
        except Exception:
            record(len(requests))  # sent, and waited for: counted without tokens
            raise
        if len(outputs) != len(requests):
            raise RuntimeError(
                f"strict user backend {self.llm.name!r} returned {len(outputs)} results "
                f"for {len(requests)} requests"
            )
        record(len(requests), outputs)
        return [_reply_text(out) for out in outputs]

    def answer(self, goal: str, question: str) -> str | None:
        """Reply to a single question (see :meth:`answer_many`)."""
        return self.answer_many(goal, [question])[0]


def _reply_text(completions: list) -> str | None:
    """The visible reply (think block removed) of the first completion, or None if it is empty."""
    if not completions:
        return None
    first = completions[0]
    text = (first.content or "").strip()
    if not text:
        logger.warning(
            "strict user simulator returned an empty reply (finish=%s)", first.finish_reason
        )
        return None
    return text
