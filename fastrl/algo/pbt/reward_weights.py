"""Reward-shaping weights a learner sets for itself (``--with_pbt``, ``--pbt_reward_shaping``).

An env that shapes its reward may name its shaping terms in ``metadata["reward_terms"]`` and
report, at every step, each term's part of that step's reward in ``info["reward_terms"]``
(the VizDoom scenarios do with ``--env_reward_shaping``). The rewards it returns keep every
term at weight 1, so nothing changes for a run that does not weigh them. Under PBT the
rollout workers keep each step's terms apart in the trajectory buffers
(``TrajectoryBuffers.reward_terms``) and leave the reward unclipped; each policy's learner
then trains on ``clip(reward + scale * sum_k (w_k - 1) * term_k)`` with its own weights
``w_k``, which PBT perturbs like its other hyperparameters (as ``reward/<term>``). A
population thereby searches the shaping without a message to any rollout worker: the
weights live where the loss is computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PREFIX = "reward/"


class RewardWeights:
    """A learner's weights of the env's shaping terms (each 1.0 at the start)."""

    def __init__(self, names: Sequence[str], scale: float, clip: float, device: torch.device):
        self.names = tuple(names)
        self.scale, self.clip, self.device = float(scale), float(clip), device
        self.weights = [1.0] * len(self.names)
        self.set({})

    def hyperparams(self) -> dict[str, float]:
        return {PREFIX + n: w for n, w in zip(self.names, self.weights, strict=True)}

    def set(self, values: dict) -> None:
        """Take the ``reward/<term>`` entries of ``values``; a term it lacks keeps its weight
        (a checkpoint from before the term was weighed)."""
        self.weights = [float(values.get(PREFIX + n, w))
                        for n, w in zip(self.names, self.weights, strict=True)]
        self._extra = torch.tensor([w - 1.0 for w in self.weights], dtype=torch.float32,
                                   device=self.device) * self.scale

    def apply(self, rewards: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
        """``rewards`` ``[B, T]`` (scaled, unclipped) reweighted by ``terms`` ``[B, T, K]``
        and clipped."""
        shaped = rewards + (terms * self._extra.to(terms.dtype)).sum(-1)
        return shaped.clamp(-self.clip, self.clip)
