"""Model backends behind one protocol (:mod:`prour.llm.base`), chosen by name."""

from prour._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "prour.llm.base": (
            "LLM",
            "BackendError",
            "ChatRequest",
            "Completion",
            "Message",
            "SamplingParams",
            "ScoreRequest",
            "ScoreResult",
            "ToolCall",
        ),
        "prour.llm.registry": (
            "build_llm",
        ),
    },
)
