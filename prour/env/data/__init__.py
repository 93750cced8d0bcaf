"""Data shipped with prour: τ-bench v1 retail training tasks converted to tau2
(docs/evaluation.md)."""
