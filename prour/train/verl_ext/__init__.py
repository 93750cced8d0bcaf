"""Extensions that verl's ``main_ppo`` loads by path on the GPU nodes (prour itself imports
only the CPU ``rehearsal``).

- ``agent_loop``: :class:`QueryAgentLoop` samples one query per session from the rollout server,
  asks the frozen responder, and scores the information-gain reward with the rollout server's
  prompt log-probs (the policy being trained scores its own beliefs).
- ``sampler``: :class:`KeepValidFirstReplayBuffer` keeps ``keep`` of the ``n`` sessions of each
  group (valid questions first) before the update, returns the step's reward diagnostics to
  verl's step metrics, replaces a batch whose groups were all dropped, and stops training when
  too many questions failed (``train.max_failed_ask_fraction``).
- ``dataset``: :class:`ProurRLDataset` asks for ``n`` sessions per prompt while verl's batch
  arithmetic counts the ``keep`` that reach the update, and refuses prompts over
  ``data.max_prompt_tokens``.
- ``trainer``: :class:`StateOrderedTrainer`, verl's sync trainer whose data-parallel split gives
  every optimizer mini-batch whole states (each rank an equal share of the same states) instead
  of verl's length balancing; registered in the Ray workers by Ray's setup hook. With
  ``train.overlap: one_step``, :class:`OneStepStateOrderedTrainer` (the same split on verl's
  colocated asynchronous trainer, one batch ahead, no session across a weight sync) and the
  sampler's asynchronous twin, ``OneStepKeepValidFirstReplayBuffer``.
- ``logic``: the pure parts of the three, tested on CPU.
- ``rehearsal``: the CPU rehearsal of the trainer (verl's trainer code, stand-ins for the GPU
  engine and the vLLM rollout), which the tests and the overlap benchmark build on.
"""
