"""Model backends behind one protocol (:mod:`prour.llm.base`), chosen by name."""

from prour.llm.base import (
    LLM,
    BackendError,
    ChatRequest,
    Completion,
    Message,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
    ToolCall,
)
from prour.llm.registry import build_llm

__all__ = [
    "LLM",
    "BackendError",
    "ChatRequest",
    "Completion",
    "Message",
    "SamplingParams",
    "ScoreRequest",
    "ScoreResult",
    "ToolCall",
    "build_llm",
]
