"""One data-parallel rank of the CPU rehearsal (:func:`prour.train.verl_ext.rehearsal.rehearse`):
a Ray actor holding the policy on CPU, trained by verl's ``train_mini_batch`` with prour's loss."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


def _interface_of(address: str) -> str | None:
    """The network interface holding ``address`` (gloo binds there, not to the hostname's)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


class PolicyRank:
    """One data-parallel rank of the rehearsal (a Ray actor, placed one per node): the policy
    (an HF causal LM on CPU) with AdamW, verl's ``TrainingWorker.train_mini_batch`` around a
    ``train_batch`` that runs prour's clipped-surrogate loss (:func:`prour.train.algorithm.
    policy_loss`) forward and backward, sums the gradients over the ranks with gloo, clips and
    steps. Rank 0 saves ``step_N`` (HF folder + optimizer, scheduler, step) through
    :mod:`prour.train.checkpoint`. ``policy_dir`` is the initial policy or the checkpoint to
    resume from; ``train`` is the recipe's train section as a mapping."""

    def __init__(self, rank: int, dp: int, policy_dir: str, train: dict[str, Any],
                 output_dir: str):
        import os
        import socket

        import ray
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.torch_functional import get_constant_schedule_with_warmup

        from prour.config.train import TrainConfig
        from prour.train import checkpoint as ckpt

        torch.set_num_threads(1)
        self.rank, self.dp, self.output_dir = rank, dp, output_dir
        self.cfg = TrainConfig.model_validate(train)
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.address = ray.util.get_node_ip_address()
        self.tokenizer = AutoTokenizer.from_pretrained(policy_dir)
        self.pad_id = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
        self.model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        o = self.cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        self.scheduler = get_constant_schedule_with_warmup(
            self.optimizer, num_warmup_steps=o.warmup_steps
        )
        if (Path(policy_dir) / ckpt.STATE_FILE).is_file():  # a checkpoint: its optimizer too
            state = ckpt.load_trainer_state(policy_dir)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        self.seen: list[list[str]] = []
        self.profiler = SimpleNamespace(step=lambda: None)
        self.engine = SimpleNamespace(
            get_data_parallel_size=lambda: dp,
            get_data_parallel_rank=lambda: rank,
            get_data_parallel_group=lambda: None,
            is_mp_src_rank_with_outputs=lambda: True,
            train_mode=lambda **_: contextlib.nullcontext(),
        )
        print(f"rank {rank} on node {self.node} {self.address} (pid {os.getpid()})", flush=True)

    def where(self) -> dict[str, Any]:
        import os

        return {"rank": self.rank, "node": self.node, "address": self.address,
                "pid": os.getpid()}

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port there, for the gloo group's store (rank 0)."""
        import socket

        with socket.socket() as probe:
            probe.bind((self.address, 0))
            return self.address, probe.getsockname()[1]

    def join(self, address: str, port: int) -> None:
        """Join the ranks' gloo group, bound to the interface that holds this node's address."""
        import datetime
        import os

        import torch.distributed as dist

        interface = _interface_of(self.address)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=self.rank,
                                world_size=self.dp, timeout=datetime.timedelta(seconds=300))

    def train(self, chunk: Any) -> tuple[Any, list[list[str]]]:
        """verl's ``train_mini_batch`` on this rank's chunk (its TransferQueue bridge fetches the
        samples); the output and the uids of each mini-batch trained on."""
        from verl.workers.engine_workers import TrainingWorker

        self.seen = []
        output = TrainingWorker.train_mini_batch(self, chunk)
        return output, self.seen

    def train_batch(self, mini_batch: Any) -> Any:
        """One optimizer step on one mini-batch, the gradient summed over the ranks."""
        import math

        import torch.distributed as dist
        from torch.nn.functional import pad
        from verl.utils import tensordict_utils as tu

        from prour.train.algorithm import policy_loss
        from prour.train.layout import padded_response_logits
        from prour.train.policy import response_scores

        self.seen.append([str(uid) for uid in mini_batch["uid"]])
        seqs = [t.tolist() for t in mini_batch["input_ids"].unbind()]
        prompts = [len(t) for t in mini_batch["prompts"].unbind()]
        responses = [t.tolist() for t in mini_batch["responses"].unbind()]
        temperature = float(tu.get(mini_batch, "temperature"))
        self.model.train()
        rows = padded_response_logits(self.model, seqs, prompts, self.pad_id, torch.device("cpu"))
        scores = response_scores(rows, responses, temperature, with_entropy=True)
        width = scores.log_probs.shape[1]

        def padded(key: str) -> torch.Tensor:
            rows = [t.float()[:width] for t in mini_batch[key].unbind()]
            return torch.stack([pad(t, (0, width - len(t))) for t in rows])

        mask = padded("response_mask") * scores.mask
        tokens = mask.sum().reshape(1)
        dist.all_reduce(tokens)  # the mini-batch's response tokens over every rank
        loss, metrics = policy_loss(
            padded("old_log_probs"), scores.log_probs, padded("advantages"), mask,
            self.cfg.ppo, entropy=scores.entropy, batch_num_tokens=max(int(tokens), 1),
        )
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat)  # token sums over all ranks: the mini-batch's token mean
        offset = 0
        for p in self.params:
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        if tu.get(mini_batch, "update_lr_scheduler"):
            self.scheduler.step()
        metrics.update(grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"], mfu=0.0,
                       response_tokens=float(tokens))
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    def save(self, step: int, record: dict[str, Any]) -> str:
        """``step_<step>``: the policy in HF format, optimizer, scheduler, step and the step's
        metrics line (rank 0)."""
        from prour.train import checkpoint as ckpt

        state = {"optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "step": step, "engine": "cpu_rehearsal",
                 "metrics": record}
        return str(ckpt.save_checkpoint(self.output_dir, step, self.model, self.tokenizer, state))

    def digest(self) -> str:
        """SHA-256 of the weights, to show the ranks hold the same policy."""
        import hashlib

        h = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    def state(self) -> dict[str, Any]:
        """The weights, for the rollout server's sync."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
