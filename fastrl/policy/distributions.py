"""The action distribution used by inference and the learner, over the layout of
``fastrl.policy.actions.ActionSpec``: independent categoricals over the split logits of the
categorical dimensions (``Discrete``, ``MultiDiscrete``), a diagonal Gaussian over the
continuous ones (``Box``), and both at once for ``Dict`` / ``Tuple`` action spaces. Illegal
categorical actions are masked with :func:`mask_logits`: an illegal action's logit is
``-inf``, so it is never sampled and its probability is exactly 0 in the loss."""

from __future__ import annotations

import math

import torch
from gymnasium import spaces
from torch import Tensor
from torch.nn import functional as F

from fastrl.policy.actions import ActionSpec

__all__ = ["LOG_STD_MAX", "LOG_STD_MIN", "ActionDistribution", "mask_logits"]


def mask_logits(logits: Tensor, mask: Tensor, nvec: tuple[int, ...]) -> Tensor:
    """``logits`` ``[N, A]`` with ``-inf`` where ``mask`` (``[N, A]``, nonzero = legal) is 0.

    A dimension (head) where the mask allows no action at all is left unmasked: an env that
    forbids everything has no answer, and an all ``-inf`` head would make NaNs.
    """
    legal = mask.reshape(logits.shape) != 0
    heads = legal.split(list(nvec), dim=-1)
    legal = torch.cat([h | ~h.any(dim=-1, keepdim=True) for h in heads], dim=-1)
    return logits.masked_fill(~legal, -math.inf)


class _Categoricals:
    """Independent categoricals over split logits (the categorical part of an action).

    ``logits`` has shape ``[*batch, A]`` (A = n, or sum(nvec)); every method keeps the leading
    ``batch`` shape, so ``[B, A]`` logits give ``sample() -> int64 [B, D]`` and ``[B, T, A]``
    logits give ``[B, T, D]``. D = 1 for Discrete, len(nvec) for MultiDiscrete.

    Internally the logits are laid out as ``[N, D, max(nvec)]``, padded with ``-inf`` where
    nvec differs between dimensions, so that every method is a handful of batched tensor ops
    (no ``torch.distributions`` objects, no Python loop over dimensions). Logits are evaluated
    in float32.
    """

    def __init__(self, logits: Tensor, nvec: tuple[int, ...]) -> None:
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
        # The Gumbel-max trick: argmax(log p + G), G standard Gumbel, is a draw from p. A
        # few elementwise kernels: less host work per call than torch.multinomial (0.35 ms on
        # an H100 machine, perf/log/RESULTS.md "where an inference call's time goes"), no
        # host-device checks, and safe to capture in a CUDA graph. Masked and padding slots
        # (-inf) are never drawn; u is kept above 0 so that G stays finite.
        u = torch.rand_like(self._log_probs).clamp_(min=1e-30)
        return self._out((self._log_probs - (-u.log()).log()).argmax(dim=-1))

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


# Bounds of the log-std the actor outputs with --action_log_std state_dependent (std from
# about 0.007 to 7.4): a collapsed or exploding std would make the ratios meaningless.
LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class _DiagGaussian:
    """A diagonal Gaussian over ``[N, C]`` means and log-stds (the continuous part)."""

    def __init__(self, mean: Tensor, log_std: Tensor) -> None:
        self.mean = mean
        self.log_std = log_std

    def sample(self, noise: Tensor | None = None) -> Tensor:
        """``mean + std * noise``, ``noise`` a standard normal ``[N, C]`` (drawn here if
        not given)."""
        noise = torch.randn_like(self.mean) if noise is None else noise.to(self.mean.dtype)
        return self.mean + noise * self.log_std.exp()

    def log_prob(self, x: Tensor) -> Tensor:
        z = (x - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> Tensor:
        return (self.log_std + (0.5 + _HALF_LOG_2PI)).sum(-1)


class ActionDistribution:
    """The policy's distribution over one action per row of ``params``.

    ``params`` has shape ``[*batch, P]`` with ``P = spec.num_params`` (for Discrete and
    MultiDiscrete spaces these are just the logits, ``P = sum(nvec)``); every method keeps the
    leading ``batch`` shape: ``sample() -> [*batch, D]`` with ``D = spec.action_dims`` in
    ``spec.dtype`` (int64 indices without continuous dimensions, else float32 with the
    categorical indices first), ``log_prob -> [*batch]``. Log-probabilities and entropies sum
    over all dimensions (they are independent). Evaluated in float32.

    ``action_space`` may be a gymnasium space or an :class:`ActionSpec` (callers on the hot
    path build the spec once).
    """

    def __init__(self, params: Tensor, action_space: spaces.Space | ActionSpec) -> None:
        spec = action_space if isinstance(action_space, ActionSpec) else ActionSpec(action_space)
        if params.shape[-1] != spec.num_params:
            raise ValueError(
                f"the policy output has {params.shape[-1]} entries in the last dim, but "
                f"{spec.space} needs {spec.num_params}"
            )
        self.spec = spec
        self.batch_shape = params.shape[:-1]
        flat = params.reshape(-1, params.shape[-1]).float()
        n_logits, n_cont = spec.num_logits, spec.num_continuous
        self._cat = _Categoricals(flat[:, :n_logits], spec.nvec) if spec.nvec else None
        self._gauss = (
            _DiagGaussian(flat[:, n_logits:n_logits + n_cont], flat[:, n_logits + n_cont:])
            if n_cont else None
        )

    def _out(self, x: Tensor) -> Tensor:
        """``[N, ...]`` -> ``[*batch, ...]``."""
        return x.view(*self.batch_shape, *x.shape[1:])

    def _join(self, cat: Tensor | None, cont: Tensor | None) -> Tensor:
        if cont is None:
            return self._out(cat)
        if cat is None:
            return self._out(cont)
        return self._out(torch.cat([cat.to(cont.dtype), cont], dim=-1))

    def _sum(self, cat: Tensor | None, cont: Tensor | None) -> Tensor:
        total = cat if cont is None else (cont if cat is None else cat + cont)
        return self._out(total)

    @property
    def probs(self) -> Tensor:
        """``[N, D, n_max]`` probabilities of the categorical dimensions (0 in padding)."""
        if self._cat is None:
            raise ValueError(f"{self.spec.space} has no categorical dimensions")
        return self._cat.probs

    def sample(self, gauss_noise: Tensor | None = None) -> Tensor:
        """Random actions ``[*batch, D]``; ``gauss_noise``: the continuous part's standard
        normal draws ``[N, C]`` (``--action_log_std sde``'s, fastrl.sampling.sde), else fresh
        ones."""
        return self._join(None if self._cat is None else self._cat.sample(),
                          None if self._gauss is None else self._gauss.sample(gauss_noise))

    def mode(self) -> Tensor:
        """The most likely action ``[*batch, D]``: each categorical's argmax, the Gaussian
        means."""
        return self._join(None if self._cat is None else self._cat.mode(),
                          None if self._gauss is None else self._gauss.mean)

    def log_prob(self, actions: Tensor) -> Tensor:
        """actions ``[*batch, D]`` -> log-probability summed over dims, ``[*batch]``."""
        actions = actions.reshape(-1, self.spec.action_dims)
        d = len(self.spec.nvec)
        return self._sum(None if self._cat is None else self._cat.log_prob(actions[:, :d]),
                         None if self._gauss is None else self._gauss.log_prob(actions[:, d:]))

    def entropy(self) -> Tensor:
        """Entropy summed over dims, ``[*batch]`` (for the Gaussian: the differential
        entropy, of the pre-squash samples under ``--action_bounds tanh``)."""
        return self._sum(None if self._cat is None else self._cat.entropy(),
                         None if self._gauss is None else self._gauss.entropy())

    def symmetric_kl_to_uniform(self) -> Tensor:
        """``KL(u || p) + KL(p || u)`` of the categorical dimensions, ``[*batch]``
        (see :meth:`_Categoricals.symmetric_kl_to_uniform`). A Gaussian has no uniform
        counterpart, so continuous actions take the entropy term instead (checked when the
        learner starts)."""
        if self._gauss is not None:
            raise ValueError("the symmetric-KL exploration term needs categorical actions only; "
                             f"{self.spec.space} has continuous ones (use entropy)")
        return self._out(self._cat.symmetric_kl_to_uniform())


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
