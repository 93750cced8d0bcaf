"""prour: train and evaluate the query generator of proactive tool-using agents on tau2-bench."""

__version__ = "0.1.0"
