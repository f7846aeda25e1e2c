"""``--action_log_std sde``: the policy worker's exploration noise, held per env.

Independent Gaussian noise at every step explores badly where a goal needs the same push for
many steps: on MountainCarContinuous-v0 the car has to swing back and forth, and a run that
has not found the flag within about 50K steps learns that pushing only costs (the action's
penalty) and stands still; 2 seeds of 3 did (perf/log/RESULTS.md). State-dependent
exploration (Raffin, Kober and Stulp, "Smooth Exploration for Robotic Reinforcement Learning",
CoRL 2021) makes the noise a function of the state, ``f(s) @ (sigma * eps)``, with ``f`` the
actor's last features, ``sigma`` learned (``ActorCritic.sde_log_std``) and a standard normal
matrix ``eps`` that each env keeps for ``--action_noise_every`` steps: nearby states get
nearby noise, so a push lasts.

Given the state, the noise is Gaussian with variance ``sum_i f_i^2 sigma_ij^2`` (whatever
``eps`` was drawn), which is the std the model outputs: the learner's log-probabilities,
ratios and entropy are those of a diagonal Gaussian as in the other modes, and this module
hands the sampler the noise divided by that std (a standard normal draw, per dimension), which
``ActionDistribution.sample`` scales back by the model's (clamped) std. It is divided by the
exact std, not by the model's floored one (``sde_variance``'s 1e-8), so that it stays standard
where the features nearly vanish; where they are all 0 the noise is 0 whatever ``eps``, and
the matrix's first row (standard normal, held as the matrix is) stands in for it. It is
computed in float32 whatever the worker's autocast, as the heads are.

The matrices are the policy worker's own, on its device; with several policy workers in a
parallel run they are the wiring's, in shared memory on the host (``shared``): a slot's
requests go to whichever worker takes them from the shared queue, so every worker has to read
the slot's one matrix and its count (a slot has one request at a time: no two workers write
the same row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.device import autocast_off
from fastrl.policy.model import sde_variance

# --action_noise_every above this holds a matrix for good: an int64 step count never reaches
# it (and a larger Python int would not fit the count's modulo).
MAX_EVERY = 1 << 62


class HeldNoise:
    """Each env slot's ``eps`` ``[F, C]`` and how many steps it has acted with it.

    Args:
        slots: env slots (the rows of the policy worker's recurrent state).
        features: ``F``, the actor's input size; ``dims``: ``C``, the continuous dimensions.
        every: draw a new ``eps`` for a slot after this many of its steps.
        device: where the matrices are kept (unless ``shared``).
        shared: kept on the host in shared memory, for several policy workers (each call
            takes its rows' matrices to the features' device).
    """

    def __init__(self, slots: int, features: int, dims: int, every: int,
                 device: torch.device | None = None, shared: bool = False) -> None:
        if every < 1:
            raise ValueError(f"action_noise_every must be >= 1, got {every}")
        self.every = min(int(every), MAX_EVERY)
        self.eps = torch.zeros(slots, features, dims,
                               device="cpu" if shared or device is None else device)
        self.age = torch.zeros(slots, dtype=torch.int64)  # steps since the slot's last draw
        if shared:
            self.eps.share_memory_()
            self.age.share_memory_()

    def standard_noise(self, features: Tensor, sde_log_std: Tensor, slots: Tensor) -> Tensor:
        """The rows' noise divided by its std, ``[N, C]`` float32: ``features`` ``[N, F]`` of
        env slots ``slots`` (int64 ``[N]``, host), with the model's ``sde_log_std`` ``[F, C]``.
        Draws a new ``eps`` for the slots whose turn it is, then counts the step."""
        slots = slots.to(torch.int64).cpu()
        fresh = slots[self.age[slots] % self.every == 0]
        if len(fresh):
            rows = fresh.to(self.eps.device)
            self.eps[rows] = torch.randn((len(fresh), *self.eps.shape[1:]),
                                         device=self.eps.device)
        self.age[slots] += 1
        with autocast_off(features.device):
            f = features.float()
            log_std = sde_log_std.detach().float()
            eps = self.eps[slots.to(self.eps.device)].to(f.device)
            noise = torch.einsum("nf,nfc->nc", f, eps * torch.exp(log_std))
            var = sde_variance(f, log_std, floor=0.0)
            return torch.where(var > 0, noise * torch.rsqrt(var), eps[:, 0])
