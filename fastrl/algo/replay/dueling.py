"""A Q-network read from ``ActorCritic``'s outputs as a dueling network (``--algo apex``,
``r2d2``): the critic is the state value ``V(s)``, the actor's logits the advantages, one Q
head per categorical action dimension. The learners and the policy workers (which act
epsilon-greedily and report their Q-values for Ape-X's actor priorities) both read it here."""

from __future__ import annotations

import torch


def dueling_heads(advantages: torch.Tensor, values: torch.Tensor,
                  nvec: tuple[int, ...]) -> list[torch.Tensor]:
    """Q-values per action dimension: ``advantages`` ``[B, sum(nvec)]``, ``values`` ``[B]``
    -> ``[B, n_j]`` for each ``n_j`` in ``nvec``."""
    return [values.unsqueeze(1) + a - a.mean(1, keepdim=True)
            for a in torch.split(advantages, list(nvec), dim=1)]


def chosen_q(q: list[torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
    """``[B, D]``: each head's Q-value of the action taken (``actions`` ``[B, D]``)."""
    return torch.stack([h.gather(1, actions[:, j:j + 1].long()).squeeze(1)
                        for j, h in enumerate(q)], 1)


def greedy_q(q: list[torch.Tensor]) -> torch.Tensor:
    """``[B, D]``: each head's highest Q-value."""
    return torch.stack([h.amax(1) for h in q], 1)
