"""Serving frozen models and running the pipeline on Slurm.

- ``config``: the ``serve`` and ``slurm`` recipe sections;
- ``recipe``: the servers a recipe's ``openai`` roles need, and the check of ``serve.models``;
- ``endpoints``: the endpoints file ``prour serve`` writes and train/eval read;
- ``serve``: starting, watching and stopping one vLLM server per frozen model;
- ``vllm_server``: one vLLM server as a child process (start, health wait, stop by PID);
- ``slurm``: rendering the sbatch templates; ``jobs``: submitting them and reading their state;
- ``local``: a single-node Slurm for tests and local trials.
"""
