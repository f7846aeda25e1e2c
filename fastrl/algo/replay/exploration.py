"""How the replay algorithms' actors explore (``--algo apex``, ``r2d2``): Ape-X's fixed
epsilon per env slot (:func:`ape_x_epsilons`), the epsilon-greedy choice the policy workers
make with them (:func:`epsilon_greedy`), and its temporally-extended form
(:class:`RepeatedExploration`, ``--apex_epsilon_repeat_mu``).

**Why repeats.** Plain epsilon-greedy replaces single steps: a deviation of k steps in a row
comes with probability about ``(epsilon / 2) ** k``. On CartPole with its velocities hidden,
R2D2's greedy policy on some seeds balances the pole but lets the cart drift off the track,
and no single step can stop the drift: from the drifting states of such a policy (seed 3,
300K steps), pushing the drift's way for 1 or 2 steps and then acting greedily still ends at
the edge (249 and 259 steps on average over 6 episodes, 249 with no push), 3 steps reaches
500 in 2 of 6 and 4 steps in 4 of 6 (perf/log/RESULTS.md, "R2D2's stuck seeds").
Temporally-extended epsilon-greedy (Dabney, Ostrovski and Barreto, "Temporally-Extended
epsilon-Greedy Exploration", ICLR 2021) keeps epsilon as the chance of starting to explore
but holds the random action for ``n`` steps, ``n`` drawn from a zeta distribution
(``P(n)`` proportional to ``n ** -mu``): with ``mu`` 2, 61% of the repeats are single steps
and 6% run 10 steps or more.
"""

from __future__ import annotations

import math

import torch


def ape_x_epsilons(num_envs: int, base: float = 0.4, alpha: float = 7.0) -> torch.Tensor:
    """Ape-X's exploration rates ``[num_envs]``: env ``i`` of ``N`` explores with
    ``base ** (1 + alpha * i / (N - 1))`` (one env: ``base``)."""
    i = torch.arange(num_envs, dtype=torch.float64)
    return (base ** (1.0 + alpha * i / max(1, num_envs - 1))).float()


def uniform_actions(rows: int, nvec: tuple[int, ...], device: torch.device | str,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[rows, D]`` int64 uniform choices, dimension ``j`` among its ``nvec[j]`` (drawn in
    ``dtype`` on ``device``)."""
    n = torch.tensor(nvec, device=device, dtype=dtype)
    return (torch.rand((rows, len(nvec)), device=device, dtype=dtype) * n).long().clamp(
        max=n.long() - 1)


def epsilon_greedy(greedy: torch.Tensor, epsilons: torch.Tensor,
                   nvec: tuple[int, ...]) -> torch.Tensor:
    """``greedy`` actions ``[B, D]`` where each row, with probability ``epsilons[b]``, is
    replaced by uniform choices (every dimension ``j`` among its ``nvec[j]``)."""
    b = greedy.shape[0]
    uniform = uniform_actions(b, nvec, greedy.device)
    explore = torch.rand(b, device=greedy.device) < epsilons
    return torch.where(explore.unsqueeze(1), uniform.to(greedy.dtype), greedy)


# The longest repeat: the zeta distribution is cut off here (the paper's is at 10,000 steps;
# a repeat this long on a short-horizon task only ends the episode).
REPEAT_MAX = 100


class RepeatedExploration:
    """Temporally-extended epsilon-greedy: each env slot's random action and the steps it
    still repeats it.

    Args:
        slots: env slots (the rows of the policy worker's recurrent state).
        dims: action dimensions (``len(nvec)``).
        mu: the zeta exponent of the repeats' lengths (> 0; see the module docstring).
        shared: kept in shared memory, for several policy workers (a slot has one request at
            a time, so no two workers write the same row).

    The state is on the host whatever the policy worker's device. A repeat ends with its
    env's episode: the rollout worker zeroes the slot's ``left`` when it zeroes the slot's
    recurrent state (``RolloutWorker(repeats_left=...)``).
    """

    def __init__(self, slots: int, dims: int, mu: float, shared: bool = False) -> None:
        if not (mu > 0 and math.isfinite(mu)):
            raise ValueError(f"apex_epsilon_repeat_mu must be a positive number, got {mu}")
        n = torch.arange(1, REPEAT_MAX + 1, dtype=torch.float64)
        weights = n ** -float(mu)
        self.cdf = weights.cumsum(0) / weights.sum()
        self.left = torch.zeros(slots, dtype=torch.int64)  # steps still to repeat
        self.action = torch.zeros((slots, dims), dtype=torch.int64)
        if shared:
            self.left.share_memory_()
            self.action.share_memory_()

    def lengths(self, count: int) -> torch.Tensor:
        """``count`` repeat lengths ``[count]`` int64 in ``[1, REPEAT_MAX]``."""
        u = torch.rand(count, dtype=torch.float64)
        return (torch.searchsorted(self.cdf, u, right=True) + 1).clamp(max=REPEAT_MAX)

    def choose(self, greedy: torch.Tensor, epsilons: torch.Tensor, nvec: tuple[int, ...],
               slots: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, D]`` for env slots ``slots`` (int64 ``[B]``): a slot in a repeat
        takes its held action; one that is not starts one with probability ``epsilons[b]``
        (a uniform action, held for a drawn length); the rest take ``greedy``. With every
        length 1 this is :func:`epsilon_greedy`."""
        slots = slots.to(torch.int64).cpu()
        b = len(slots)
        left = self.left[slots]
        held = left > 0
        start = ~held & (torch.rand(b) < epsilons.float().cpu())
        uniform = uniform_actions(b, nvec, "cpu", torch.float64)
        action = torch.where(start.unsqueeze(1), uniform, self.action[slots])
        self.action[slots] = action
        self.left[slots] = torch.where(start, self.lengths(b) - 1, (left - 1).clamp(min=0))
        explore = (held | start).unsqueeze(1).to(greedy.device)
        return torch.where(explore, action.to(greedy.device, greedy.dtype), greedy)
