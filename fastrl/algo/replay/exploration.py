"""How the replay algorithms' actors explore (``--algo apex``, ``r2d2``): Ape-X's fixed
epsilon per env slot (:func:`ape_x_epsilons`), and the epsilon-greedy choice the policy
workers make with them (:func:`epsilon_greedy`)."""

from __future__ import annotations

import torch


def ape_x_epsilons(num_envs: int, base: float = 0.4, alpha: float = 7.0) -> torch.Tensor:
    """Ape-X's exploration rates ``[num_envs]``: env ``i`` of ``N`` explores with
    ``base ** (1 + alpha * i / (N - 1))`` (one env: ``base``)."""
    i = torch.arange(num_envs, dtype=torch.float64)
    return (base ** (1.0 + alpha * i / max(1, num_envs - 1))).float()


def epsilon_greedy(greedy: torch.Tensor, epsilons: torch.Tensor,
                   nvec: tuple[int, ...]) -> torch.Tensor:
    """``greedy`` actions ``[B, D]`` where each row, with probability ``epsilons[b]``, is
    replaced by uniform choices (every dimension ``j`` among its ``nvec[j]``)."""
    b = greedy.shape[0]
    n = torch.tensor(nvec, device=greedy.device, dtype=torch.float32)
    uniform = (torch.rand((b, len(nvec)), device=greedy.device) * n).long().clamp(
        max=n.long() - 1)
    explore = torch.rand(b, device=greedy.device) < epsilons
    return torch.where(explore.unsqueeze(1), uniform.to(greedy.dtype), greedy)
