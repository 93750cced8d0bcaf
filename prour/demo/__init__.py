"""The tiny local model and its warm start, for ``prour demo`` and the tests (CPU, no download).

- ``tiny``: a random-init Qwen3 with a locally trained BPE tokenizer and a Qwen3-style chat
  template (``chat_template.jinja``);
- ``warmstart``: a short supervised pass so that the pipeline's parsers see valid outputs, built
  from ``transcripts`` (oracle replays of train tasks), ``targets`` and ``actions`` (the synthetic
  replies), ``corpus`` (the examples, rendered by the pipeline's own prompt functions) and
  ``training`` (token rows and the reply-only loss);
- ``folders``: reuse of a built folder recorded by its marker file.

Nothing in the pipeline's stages imports this package; it imports them.
"""
