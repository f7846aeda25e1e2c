"""How an env's action space is laid out inside fastrl (:class:`ActionSpec`).

Every action space is flattened into two groups of columns:

* categorical dimensions, one per ``Discrete`` and one per entry of each ``MultiDiscrete``,
  holding the index of the choice (``0 .. n - 1``; a space's ``start`` is added only when the
  action goes to the env);
* continuous dimensions, one per entry of each float ``Box`` (any shape, flattened), holding
  the unbounded sample of a diagonal Gaussian.

``Dict`` and ``Tuple`` spaces of these (nested too) are flattened leaf by leaf, in the
space's own order, categorical columns first. The buffers store one row of ``action_dims``
columns per step: int64 when the space has no continuous part (the common case, unchanged),
float32 otherwise (an index is exact in float32 up to 2**24).

The policy's output (``num_params`` values per step) is laid out the same way: the logits of
every categorical dimension, then the Gaussian means, then the Gaussian log-stds
(``fastrl.policy.distributions``).

A continuous sample ``u`` reaches the env bounded (``to_env``), in one of two ways:

* ``"clip"``: ``clip(u, low, high)``, the usual choice for PPO on MuJoCo; the stored sample
  and its log-probability stay unclipped, so the loss sees the Gaussian the policy sampled;
* ``"tanh"``: ``low + (tanh(u) + 1) / 2 * (high - low)``, for bounds that must never be hit
  exactly. The stored sample is ``u``: the tanh's Jacobian depends on ``u`` alone, so it
  cancels in the importance ratio and the log-probability of ``u`` is all the loss needs.
  The entropy bonus is then the pre-squash Gaussian's (the squashed one has no closed form).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from fastrl.policy.obs import mask_logits

__all__ = ["ACTION_BOUNDS", "ActionSpec"]

ACTION_BOUNDS = ("clip", "tanh")


@dataclass(frozen=True)
class _Leaf:
    """One Discrete, MultiDiscrete or Box inside the action space."""

    space: spaces.Space
    nvec: tuple[int, ...] = ()  # categorical: choices per dimension
    start: np.ndarray | None = None  # categorical: value of choice 0 per dimension
    size: int = 0  # continuous: number of entries


def _leaf(space: spaces.Space, where: str) -> _Leaf:
    if isinstance(space, spaces.Discrete):
        return _Leaf(space, (int(space.n),), np.array([int(space.start)], dtype=np.int64))
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        if nvec.ndim != 1:
            raise ValueError(f"{where}MultiDiscrete action space must be 1-D, got nvec shape "
                             f"{nvec.shape}")
        return _Leaf(space, tuple(int(n) for n in nvec),
                     np.asarray(space.start, dtype=np.int64).reshape(-1))
    if isinstance(space, spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise ValueError(f"{where}Box action space {space} has dtype {space.dtype}: "
                             "continuous actions must be floating point")
        return _Leaf(space, size=int(np.prod(space.shape, dtype=np.int64)))
    raise ValueError(
        f"{where}action space {space} is not supported: use Discrete, MultiDiscrete, a float "
        "Box, or a Dict / Tuple of these"
    )


def _leaves(space: spaces.Space, where: str = "") -> Iterator[_Leaf]:
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _leaves(sub, f"{where}[{key!r}] ")
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _leaves(sub, f"{where}[{i}] ")
    else:
        yield _leaf(space, where)


class ActionSpec:
    """The flat layout of ``action_space`` (see the module docstring).

    Attributes:
        nvec: choices of every categorical dimension, in order (empty for a pure Box).
        num_continuous: number of continuous dimensions.
        num_logits: ``sum(nvec)``, the categorical part of the policy output.
        num_params: policy outputs per step: ``num_logits + 2 * num_continuous``.
        action_dims: columns of a stored action: ``len(nvec) + num_continuous``.
        dtype: torch dtype of stored actions (int64 without continuous dimensions).
        bounds: ``"clip"`` or ``"tanh"``, how continuous samples are bounded for the env.
    """

    def __init__(self, action_space: spaces.Space, bounds: str = "clip") -> None:
        if bounds not in ACTION_BOUNDS:
            raise ValueError(f"action bounds {bounds!r} unknown; choose one of {ACTION_BOUNDS}")
        self.space = action_space
        self.bounds = bounds
        leaves = list(_leaves(action_space))
        self._leaves = leaves
        self.nvec: tuple[int, ...] = tuple(n for leaf in leaves for n in leaf.nvec)
        self.num_continuous = sum(leaf.size for leaf in leaves)
        self.num_logits = sum(self.nvec)
        self.num_params = self.num_logits + 2 * self.num_continuous
        self.action_dims = len(self.nvec) + self.num_continuous
        self.dtype = torch.float32 if self.num_continuous else torch.int64
        box_leaves = [leaf for leaf in leaves if leaf.size]
        if box_leaves:
            low = np.concatenate([np.asarray(leaf.space.low, np.float64).reshape(-1)
                                  for leaf in box_leaves])
            high = np.concatenate([np.asarray(leaf.space.high, np.float64).reshape(-1)
                                   for leaf in box_leaves])
            if bounds == "tanh" and not (np.isfinite(low).all() and np.isfinite(high).all()):
                raise ValueError(f"--action_bounds tanh needs finite bounds; {action_space} has "
                                 "infinite ones (use clip)")
            self._low, self._high = low, high
        # The one-leaf spaces take a short path in to_env (rollout workers call it per step).
        self._simple = leaves[0] if len(leaves) == 1 and leaves[0].space is action_space else None

    @property
    def is_discrete(self) -> bool:
        """No continuous dimensions."""
        return self.num_continuous == 0

    @property
    def maskable(self) -> bool:
        """A single Discrete or MultiDiscrete space (what an action mask may cover)."""
        return mask_logits(self.space) is not None

    def bound(self, u: np.ndarray) -> np.ndarray:
        """Continuous samples ``[..., num_continuous]`` -> the values within the bounds."""
        u = np.asarray(u, dtype=np.float64)
        if self.bounds == "clip":
            return np.clip(u, self._low, self._high)
        return self._low + (np.tanh(u) + 1.0) * 0.5 * (self._high - self._low)

    def to_env(self, row: np.ndarray) -> Any:
        """One stored action (``[action_dims]``) in the form ``env.step`` takes."""
        leaf = self._simple
        if leaf is not None:
            if isinstance(leaf.space, spaces.Discrete):
                return int(row[0]) + int(leaf.start[0])
            if isinstance(leaf.space, spaces.MultiDiscrete):
                return np.asarray(row, dtype=np.int64) + leaf.start
            return self.bound(row).astype(leaf.space.dtype).reshape(leaf.space.shape)
        row = np.asarray(row)
        cat = row[:len(self.nvec)].astype(np.int64)
        cont = self.bound(row[len(self.nvec):]) if self.num_continuous else row[:0]
        values = []  # each leaf's value, in the order of self._leaves
        i = j = 0
        for leaf in self._leaves:
            if leaf.nvec:
                picks = cat[i:i + len(leaf.nvec)] + leaf.start
                i += len(leaf.nvec)
                values.append(int(picks[0]) if isinstance(leaf.space, spaces.Discrete) else picks)
            else:
                values.append(cont[j:j + leaf.size].astype(leaf.space.dtype)
                              .reshape(leaf.space.shape))
                j += leaf.size
        leaf_values = iter(values)

        def build(space: spaces.Space) -> Any:  # the same walk as _leaves
            if isinstance(space, spaces.Dict):
                return {key: build(sub) for key, sub in space.spaces.items()}
            if isinstance(space, spaces.Tuple):
                return tuple(build(sub) for sub in space.spaces)
            return next(leaf_values)

        return build(self.space)

    def __repr__(self) -> str:
        return (f"ActionSpec(nvec={self.nvec}, num_continuous={self.num_continuous}, "
                f"bounds={self.bounds!r})")


def exploration_problem(exploration_loss: str, spec: ActionSpec) -> str | None:
    """Why ``--exploration_loss`` cannot work with these actions (None when it can)."""
    if exploration_loss == "symmetric_kl" and spec.num_continuous:
        return ("--exploration_loss symmetric_kl needs categorical actions, and these have "
                "continuous ones: use --exploration_loss entropy")
    return None
