"""Data shipped with prour: τ-bench v1 and τ³-bench tasks converted to tau2
(docs/evaluation.md)."""
