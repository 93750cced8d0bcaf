"""DAPO training of the query generator (paper A.2.1): the local trainer and the verl backend, on
the maths of :mod:`prour.core` (verl's core algorithms written out). Heavy modules load on use:

- ``config``: the ``train`` recipe section and its batch-arithmetic checks (a leaf);
- ``recipe``: the recipe as training reads it (``train_section``, its plain dump);
- ``algorithm``: ``select_kept``, ``drop_zero_variance``, ``group_advantages``, ``policy_loss``
  (from :mod:`prour.core.policy_gradient`);
- ``local``: :class:`~prour.train.local.LocalTrainer` (one process, CPU or one GPU); ``step``: its
  DAPO update, from a step's scored groups to ``optimizer.step()``;
- ``verl_backend``: Hydra overrides and launch of ``verl.trainer.main_ppo``; ``verl_ext``: the
  agent loop, sampler and dataset verl loads on the GPU nodes;
- ``metrics``: the per-step metrics file (and wandb), and the sample diagnostics both backends
  log under the same names;
- ``report``: :func:`~prour.train.report.write_training_report`, the training curves (PNG, series
  JSON, markdown) of a run's metrics, local or verl; ``progress``: the training progress bar;
- ``layout``: padded, packed or packed-exact (explicit document mask) forwards of the update and
  token-budget micro-batches (torch only, timed by benchmarks/gpu_step.py);
- ``checkpoint``, ``data``, ``policy``, ``reward``: the trainer's parts.
"""
