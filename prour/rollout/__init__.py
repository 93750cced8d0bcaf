"""Query generator (prompts, parser) and the frozen responders: strict user simulator, verifier."""

from prour._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "prour.rollout.query": (
            "PROMPTS_VERSION",
            "ParsedQuery",
            "clarify_prompt",
            "parse_query",
            "query_prompt",
            "verify_prompt",
        ),
        "prour.rollout.strict_user": (
            "StrictUserSimulator",
        ),
        "prour.rollout.verifier": (
            "ReadOnlyViolation",
            "Verifier",
            "VerifierCall",
            "VerifierResult",
        ),
    },
)
