"""Several learners as one torch.distributed group (``--num_learners``).

Every learner holds the same weights. Each trains on its own share of every minibatch; the
loss of a share is its sum over the whole minibatch's count of valid samples (see
``fastrl.algo.appo.clipped_loss``), so summing the learners' gradients gives the gradient of
one learner on the whole minibatch, and every learner takes the same optimizer step. The
statistics that are not gradients (input and return normalisers, advantage moments) are
summed over the group the same way. Rank 0 talks to the rest of the pipeline: it takes the
batches, hands the other ranks their shares (slot numbers, through a queue; the data stays in
shared memory), publishes weights and writes checkpoints.

Gloo on CPU, NCCL on GPUs (with ``--device cuda:N``, rank r on ``cuda:N+r``;
``fastrl.device.learner_device``).
"""

from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist
from torch import nn

# How long a collective waits for a rank that does not come: a dead rank stops the others
# with an error instead of a hang (the runner reports the first death).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
# How long a leaving rank waits for the others at the closing barrier.
CLOSE_TIMEOUT = datetime.timedelta(seconds=20)


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now (for the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LearnerGroup:
    """This process's membership in the group of learners."""

    def __init__(self, rank: int, world_size: int, port: int, device: torch.device):
        self.rank = rank
        self.world_size = world_size
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
        self.device = device

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the group, in place; returns it."""
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def sum_grads(self, params: list[nn.Parameter]) -> None:
        """Sum the gradients of the trainable ``params`` over the group, in one flat buffer (a
        parameter without a gradient counts as zero, so that every rank sends the same
        layout)."""
        params = [p for p in params if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            chunk = flat[offset:offset + n].view_as(g)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n

    def broadcast_module(self, module: nn.Module) -> None:
        """Rank 0's parameters and buffers, everywhere."""
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)

    def broadcast_buffers(self, module: nn.Module) -> None:
        """Rank 0's buffers (input normalisers' moments), everywhere."""
        for t in module.buffers():
            dist.broadcast(t.data, src=0)

    def interleave(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's ``t`` ``[K]`` in one ``[N * K]`` tensor, rank r's values at positions
        r, r + N, r + 2N, ... (the order in which shares ``x[r::N]`` were cut)."""
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.stack(parts, 1).reshape(-1)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        """Leave the group. On Gloo the ranks first meet at a barrier (at most
        ``CLOSE_TIMEOUT``, so that a dead rank cannot hold the others), then tear down together:
        a rank that destroyed its group and exited while another still held its connections
        once aborted that one ('terminate called without an active exception', CI)."""
        if not dist.is_initialized():
            return
        if dist.get_backend() == "gloo":
            try:
                dist.monitored_barrier(timeout=CLOSE_TIMEOUT)
            except RuntimeError:
                pass  # a rank is gone: the runner reports it; leave anyway
        dist.destroy_process_group()
