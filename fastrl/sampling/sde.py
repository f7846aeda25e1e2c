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
``ActionDistribution.sample`` scales back by the model's (clamped) std.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.policy.model import sde_variance


class HeldNoise:
    """Each env slot's ``eps`` ``[F, C]`` and how many steps it has acted with it.

    Args:
        slots: env slots (the rows of the policy worker's recurrent state).
        features: ``F``, the actor's input size; ``dims``: ``C``, the continuous dimensions.
        every: draw a new ``eps`` for a slot after this many of its steps.
    """

    def __init__(self, slots: int, features: int, dims: int, every: int,
                 device: torch.device) -> None:
        if every < 1:
            raise ValueError(f"action_noise_every must be >= 1, got {every}")
        self.every = every
        self.eps = torch.zeros(slots, features, dims, device=device)
        self.age = torch.zeros(slots, dtype=torch.int64)  # steps since the slot's last draw

    def standard_noise(self, features: Tensor, sde_log_std: Tensor, slots: Tensor) -> Tensor:
        """The rows' noise divided by its std, ``[N, C]``: ``features`` ``[N, F]`` of env
        slots ``slots`` (int64 ``[N]``, host), with the model's ``sde_log_std`` ``[F, C]``.
        Draws a new ``eps`` for the slots whose turn it is, then counts the step."""
        slots = slots.to(torch.int64).cpu()
        fresh = slots[self.age[slots] % self.every == 0]
        if len(fresh):
            rows = fresh.to(self.eps.device)
            self.eps[rows] = torch.randn((len(fresh), *self.eps.shape[1:]),
                                         device=self.eps.device)
        self.age[slots] += 1
        f = features.float()
        sigma = torch.exp(sde_log_std.detach().float())
        eps = self.eps[slots.to(self.eps.device)]
        noise = torch.einsum("nf,nfc->nc", f, eps * sigma)
        return noise * torch.rsqrt(sde_variance(f, sde_log_std.detach()))
