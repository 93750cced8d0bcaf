"""The pure algorithm: the information-gain reward's arithmetic and DAPO's update maths.

Nothing here reads a recipe file, loads a model or imports a stage package (``train``, ``eval``,
``cluster``, ``rewards``); what a function needs beyond numbers and tensors (settings, a clock)
is passed in. ``reward``: information gain, its aggregation over the target's tokens, the
attention-priced utility; ``cost``: a request's attention cost under each accounting; ``asks``: how many things a message
asks, by rule;
``policy_gradient``: keep-k selection, dynamic sampling, group advantages, the clipped loss;
``fused_logprob``: per-token log-probs and entropies from hidden states and the LM head, a chunk of
tokens at a time (no full-vocabulary logits);
``clock``: the phases a training step's time goes to (the reward records on the clock it is given).
"""
