"""Query generator (prompts, parser) and the frozen responders: strict user simulator, verifier."""

from prour.rollout.query import (
    PROMPTS_VERSION,
    ParsedQuery,
    clarify_prompt,
    parse_query,
    query_prompt,
    verify_prompt,
)
from prour.rollout.strict_user import StrictUserSimulator
from prour.rollout.verifier import ReadOnlyViolation, Verifier, VerifierCall, VerifierResult

__all__ = [
    "PROMPTS_VERSION",
    "ParsedQuery",
    "ReadOnlyViolation",
    "StrictUserSimulator",
    "Verifier",
    "VerifierCall",
    "VerifierResult",
    "clarify_prompt",
    "parse_query",
    "query_prompt",
    "verify_prompt",
]
