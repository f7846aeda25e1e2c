"""The action distribution used by inference and the learner: independent categoricals
over the split logits of a ``Discrete`` or ``MultiDiscrete`` action space, and the masking
of illegal actions (:func:`mask_logits`): an illegal action's logit is ``-inf``, so it is
never sampled and its probability is exactly 0 in the loss."""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor
from torch.nn import functional as F

__all__ = ["ActionDistribution", "action_nvec", "mask_logits"]


def action_nvec(action_space: spaces.Space) -> tuple[int, ...]:
    """Number of choices per action dimension: ``(n,)`` for Discrete, ``nvec`` for
    MultiDiscrete."""
    if isinstance(action_space, spaces.Discrete):
        return (int(action_space.n),)
    if isinstance(action_space, spaces.MultiDiscrete):
        nvec = np.asarray(action_space.nvec)
        if nvec.ndim != 1:
            raise ValueError(f"MultiDiscrete action space must be 1-D, got nvec shape {nvec.shape}")
        return tuple(int(n) for n in nvec)
    raise ValueError(f"action space {action_space} is not supported: use Discrete or MultiDiscrete")


def mask_logits(logits: Tensor, mask: Tensor, nvec: tuple[int, ...]) -> Tensor:
    """``logits`` ``[N, A]`` with ``-inf`` where ``mask`` (``[N, A]``, nonzero = legal) is 0.

    A dimension (head) where the mask allows no action at all is left unmasked: an env that
    forbids everything has no answer, and an all ``-inf`` head would make NaNs.
    """
    legal = mask.reshape(logits.shape) != 0
    heads = legal.split(list(nvec), dim=-1)
    legal = torch.cat([h | ~h.any(dim=-1, keepdim=True) for h in heads], dim=-1)
    return logits.masked_fill(~legal, -math.inf)


class ActionDistribution:
    """Independent categoricals over the split logits of a Discrete / MultiDiscrete space.

    ``logits`` has shape ``[*batch, A]`` (A = n, or sum(nvec)); every method keeps the leading
    ``batch`` shape, so ``[B, A]`` logits give ``sample() -> int64 [B, D]`` and ``[B, T, A]``
    logits give ``[B, T, D]``. D = 1 for Discrete, len(nvec) for MultiDiscrete.

    Internally the logits are laid out as ``[N, D, max(nvec)]``, padded with ``-inf`` where
    nvec differs between dimensions, so that every method is a handful of batched tensor ops
    (no ``torch.distributions`` objects, no Python loop over dimensions). Logits are evaluated
    in float32.
    """

    def __init__(self, logits: Tensor, action_space: spaces.Space) -> None:
        nvec = action_nvec(action_space)
        if logits.shape[-1] != sum(nvec):
            raise ValueError(
                f"logits have {logits.shape[-1]} entries in the last dim, but {action_space} "
                f"needs {sum(nvec)}"
            )
        self.batch_shape = logits.shape[:-1]
        self.nvec = nvec
        self.num_dims = len(nvec)
        n_max = max(nvec)
        flat = logits.reshape(-1, logits.shape[-1]).float()
        if all(n == n_max for n in nvec):
            padded = flat.view(flat.shape[0], self.num_dims, n_max)
        else:
            index = _padding_index(nvec, flat.device)
            # Column A of the extended logits is -inf; the index points every pad slot at it.
            ext = torch.cat([flat, flat.new_full((flat.shape[0], 1), -math.inf)], dim=1)
            padded = ext[:, index]
        self._logits = padded  # [N, D, n_max]
        self._log_probs = F.log_softmax(padded, dim=-1)
        self._probs: Tensor | None = None

    @property
    def probs(self) -> Tensor:
        """``[N, D, n_max]`` probabilities (0 in padding slots)."""
        if self._probs is None:
            self._probs = self._log_probs.exp()
        return self._probs

    def _out(self, x: Tensor) -> Tensor:
        """``[N, ...]`` -> ``[*batch, ...]``."""
        return x.view(*self.batch_shape, *x.shape[1:])

    def sample(self) -> Tensor:
        """Random actions, int64 ``[*batch, D]``."""
        probs = self.probs
        actions = torch.multinomial(probs.view(-1, probs.shape[-1]), 1)
        return self._out(actions.view(-1, self.num_dims))

    def mode(self) -> Tensor:
        """Most likely action in each dimension, int64 ``[*batch, D]``."""
        return self._out(self._logits.argmax(dim=-1))

    def log_prob(self, actions: Tensor) -> Tensor:
        """actions: int ``[*batch, D]`` -> log-probability summed over dims, ``[*batch]``."""
        index = actions.reshape(-1, self.num_dims, 1).long()
        return self._out(self._log_probs.gather(-1, index).view(-1, self.num_dims).sum(-1))

    def entropy(self) -> Tensor:
        """Entropy summed over dims, ``[*batch]``."""
        # The -inf of padding slots and masked actions is zeroed first: 0 * -inf would be NaN
        # in the value and in the gradient.
        return self._out(-(self.probs * self._log_probs_finite()).sum(dim=(-2, -1)))

    def _log_probs_finite(self) -> Tensor:
        """``[N, D, n_max]`` log-probabilities with 0 in the padding slots and at masked
        actions (the ``-inf`` ones)."""
        return torch.where(torch.isfinite(self._log_probs), self._log_probs, 0.0)

    def symmetric_kl_to_uniform(self) -> Tensor:
        """``KL(u || p) + KL(p || u)`` summed over dims, ``[*batch]``, where ``u`` is uniform
        over each dim's ``n`` legal choices: ``sum_i p_i log p_i - (1/n) sum_i log p_i``.

        As an exploration penalty it is 0 for the uniform policy, like ``-entropy`` is at its
        minimum there; unlike entropy it grows without bound as any probability goes to 0,
        so it keeps every action possible.
        """
        log_probs = self._log_probs_finite()
        n = torch.isfinite(self._log_probs).sum(-1).to(log_probs.dtype)  # legal choices
        per_dim = (self.probs * log_probs).sum(-1) - log_probs.sum(-1) / n
        return self._out(per_dim.sum(-1))


_PADDING_CACHE: dict[tuple[tuple[int, ...], torch.device], Tensor] = {}


def _padding_index(nvec: tuple[int, ...], device: torch.device) -> Tensor:
    """For unequal ``nvec``: a gather index ``[D, n_max]`` into logits extended with one -inf
    column (index ``sum(nvec)``), which every padding slot points at. Cached per
    (nvec, device), since inference builds a distribution every step."""
    key = (nvec, torch.device(device))
    cached = _PADDING_CACHE.get(key)
    if cached is None:
        # Built outside inference mode even when the first caller is a policy worker under
        # ``torch.inference_mode``: an inference tensor cannot take part in autograd, and the
        # learner (in the same process in serial mode) indexes with these in its backward pass.
        with torch.inference_mode(False):
            total, n_max = sum(nvec), max(nvec)
            index = torch.full((len(nvec), n_max), total, dtype=torch.long)
            offset = 0
            for d, n in enumerate(nvec):
                index[d, :n] = torch.arange(offset, offset + n)
                offset += n
            cached = index.to(device)
        _PADDING_CACHE[key] = cached
    return cached
