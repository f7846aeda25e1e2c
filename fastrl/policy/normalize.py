"""Running statistics: merging a batch's moments into running ones, and the return
normaliser the critic's targets go through with ``--normalize_returns``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RETURN_VAR_EPS", "ReturnNormalizer", "merge_moments", "merge_summed_moments",
           "summed_moments"]

RETURN_VAR_EPS = 1e-4  # variance floor of the return normaliser: std >= 0.01 (return units)


@torch.no_grad()
def merge_moments(mean: Tensor, var: Tensor, count: Tensor, batch_mean: Tensor,
                  batch_var: Tensor, n: int | Tensor) -> None:
    """Merge a batch's mean and (population) variance over ``n`` samples into running
    statistics held in the buffers ``mean``, ``var`` and ``count``, in place (Chan et al.'s
    parallel update, exact for any split of the data).

    ``n`` is a number or a 0-d tensor on the statistics' device; nothing is read back to the
    host (on a GPU that would wait for the device), and a batch of no samples leaves the
    statistics as they are."""
    if not isinstance(n, Tensor) and n == 0:
        return
    old = count.reshape(())
    total = old + n
    delta = batch_mean - mean
    merged_m2 = var * old + batch_var * n + delta.square() * (old * n / total)
    new_mean, new_var = mean + delta * (n / total), merged_m2 / total
    if isinstance(n, Tensor):  # a count on the device may be 0: select rather than branch
        some = n > 0
        new_mean = torch.where(some, new_mean, mean)
        new_var = torch.where(some, new_var, var)
        total = torch.where(some, total, old)
    mean.copy_(new_mean)
    var.copy_(new_var)
    count.copy_(total)


@torch.no_grad()
def summed_moments(x: Tensor, reduce, valid: Tensor | None = None
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Mean and population variance over dim 0 of ``x`` ``[N, ...]`` and the count (a 0-d
    float64 tensor), over the rows every learner holds: ``reduce`` sums a float64 tensor over
    the learners in place. Only the rows where ``valid`` ``[N]`` is true count, when given.
    Every learner must call it, with or without rows of its own."""
    x64 = x.detach().double()
    if valid is None:
        count = x64.new_tensor([x.shape[0]])
    else:
        keep = valid.reshape(-1, *([1] * (x.dim() - 1)))
        x64 = torch.where(keep, x64, 0.0)
        count = valid.sum(dtype=torch.float64).reshape(1)
    packed = torch.cat([count, x64.sum(0).reshape(-1), x64.square().sum(0).reshape(-1)])
    reduce(packed)
    k = (packed.numel() - 1) // 2
    n = packed[0]
    mean = packed[1:1 + k] / n.clamp(min=1)
    var = (packed[1 + k:] / n.clamp(min=1) - mean.square()).clamp(min=0.0)
    return mean.reshape(x.shape[1:]), var.reshape(x.shape[1:]), n


@torch.no_grad()
def merge_summed_moments(mean: Tensor, var: Tensor, count: Tensor, x: Tensor, reduce,
                         valid: Tensor | None = None) -> None:
    """Merge the moments of every learner's rows of ``x`` ``[N, ...]`` (see
    :func:`summed_moments`) into the running statistics ``mean``, ``var`` and ``count``, in
    place, in the buffers' shape and dtype."""
    batch_mean, batch_var, n = summed_moments(x, reduce, valid)
    merge_moments(mean, var, count, batch_mean.reshape(mean.shape).to(mean.dtype),
                  batch_var.reshape(var.shape).to(var.dtype), n)


class ReturnNormalizer(nn.Module):
    """Running mean and variance of the value targets (return units), kept as buffers so that
    checkpoints carry them. With it the critic predicts ``(return - mean) / std``.

    Starts at mean 0, std 1 (the identity); the first :meth:`update` replaces that. ``std`` is
    floored at ``sqrt(RETURN_VAR_EPS)`` so that near-constant returns (a sparse-reward env
    before its first success) do not blow the normalised targets up.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def mean_std(self) -> tuple[Tensor, Tensor]:
        """0-d float32 ``(mean, std)``."""
        std = torch.sqrt(torch.clamp(self.var, min=RETURN_VAR_EPS))
        return self.mean.float(), std.float()

    @torch.no_grad()
    def update(self, x: Tensor, reduce=None, valid: Tensor | None = None) -> None:
        """Merge the mean and variance of the values ``x`` (any shape) into the running ones
        (Chan et al.'s parallel update); only the entries where ``valid`` (``x``'s shape) is
        true count, when given; with ``reduce``, those of every learner's values (see
        :func:`summed_moments`). Reads nothing back from the device."""
        x = x.detach().double().reshape(-1)
        if valid is not None:
            valid = valid.reshape(-1)
        if reduce is not None:
            merge_summed_moments(self.mean, self.var, self.count, x.reshape(-1, 1), reduce,
                                 valid)
            return
        if x.numel() == 0:
            return
        if valid is None:
            n: int | Tensor = x.numel()
            batch_mean = x.mean()
            batch_var = (x - batch_mean).square().mean()
        else:
            n = valid.sum(dtype=torch.float64)
            batch_mean = torch.where(valid, x, 0.0).sum() / n.clamp(min=1)
            batch_var = torch.where(valid, x - batch_mean, 0.0).square().sum() / n.clamp(min=1)
        merge_moments(self.mean, self.var, self.count, batch_mean, batch_var, n)
