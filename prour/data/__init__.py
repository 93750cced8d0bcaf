"""The data stage: collect trajectories, normalize goals (G*), extract routed state–mode instances,
and write/check/describe the parquet dataset the trainers read.

Modules: ``collect`` (teacher-augmented episodes), ``normalize`` (G* and the value check),
``extract`` (split, decision states, routing, targets), ``calibration_states`` (the decision
states ``prour calibrate`` labels, sampled with extract's rule), ``truncate`` (prompt budget),
``decisions`` (decomposer cache), ``schema`` (the training row: instance → row → reward state,
the verifier's environment), ``dataset`` (parquet files, dataset check), ``card``
(dataset card), ``pipeline`` (recipe sections, ``prour extract``), ``config`` (``DataConfig``).
Nothing heavy is imported here.
"""
