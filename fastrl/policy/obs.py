"""Observations inside fastrl are dicts: an observation space that is not a ``Dict`` (a ``Box``,
a ``Discrete``...) is handled as ``Dict({"obs": space})``, and its observations as
``{"obs": value}``. (How nested and channels-last spaces are flattened into such a ``Dict``:
``fastrl.policy.spaces``.)"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from fastrl.errors import EnvOutputError

__all__ = [
    "ACTION_MASK_KEY", "as_dict_space", "brief", "flat_action_mask", "has_action_mask",
    "integer_range", "lowest_obs", "mask_logits", "obs_array", "obs_to_dict",
    "random_legal_action",
]

# An observation key under this name is not encoded: it is the env's legal-action mask, a Box
# of shape [A] (A = n for Discrete, sum(nvec) for MultiDiscrete), nonzero where an action is
# legal. The model sets the logits of illegal actions to -inf (fastrl.policy.distributions).
ACTION_MASK_KEY = "action_mask"


def as_dict_space(space: spaces.Space) -> spaces.Dict:
    """Return ``space`` as a ``Dict``: a ``Dict`` is returned as is, any other space becomes
    ``Dict({"obs": space})`` (whether its keys can be encoded is the encoders' concern)."""
    if isinstance(space, spaces.Dict):
        return space
    return spaces.Dict({"obs": space})


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60
brief = _short.repr  # a value in a message: its repr, cut short


def obs_array(value: Any, key: str, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The observation ``key`` as an array; an ``obs_shape``
    :class:`~fastrl.errors.EnvOutputError` when it is none (a ragged list has no one shape)
    (``shape``: the one expected; ``what``: the call that returned it)."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError):
        raise EnvOutputError(f"{what} returned the observation {key!r} as {brief(value)}, "
                             f"which is no array, expected shape {shape}", "obs_shape") from None


def obs_to_dict(obs: Any) -> dict[str, Any]:
    """Return an observation as a dict: a mapping is copied into a ``dict``, anything else
    (a tensor or array for a ``Box`` space) becomes ``{"obs": obs}``."""
    if isinstance(obs, Mapping):
        return dict(obs)
    return {"obs": obs}


def mask_logits(action_space: spaces.Space) -> int | None:
    """The logits an action mask covers: ``n`` for a Discrete space, ``sum(nvec)`` for a 1-D
    MultiDiscrete one; None for any other space (a mask cannot cover it)."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete) and np.asarray(action_space.nvec).ndim == 1:
        return int(np.asarray(action_space.nvec).sum())
    return None


def flat_action_mask(mask: Any) -> np.ndarray:
    """An env's mask as one flat array: a tuple or list of one array per MultiDiscrete
    dimension (gymnasium's ``MultiDiscrete.sample(mask=...)`` form) is concatenated."""
    if isinstance(mask, (tuple, list)):
        return np.concatenate([np.asarray(m).reshape(-1) for m in mask])
    return np.asarray(mask).reshape(-1)


def has_action_mask(space: spaces.Dict, num_logits: int) -> bool:
    """Whether the observation space carries an action mask; a mask of the wrong kind is a
    ``ValueError`` naming what it must be."""
    mask_space = space.spaces.get(ACTION_MASK_KEY)
    if mask_space is None:
        return False
    if not isinstance(mask_space, spaces.Box) or tuple(mask_space.shape) != (num_logits,):
        raise ValueError(f"observation key {ACTION_MASK_KEY!r} must be a Box of shape "
                         f"({num_logits},) for this action space, got {mask_space}")
    return True


def random_legal_action(action_space: spaces.Space, obs: Any) -> Any:
    """A random action, legal under ``obs``'s action mask when it has one."""
    mask = obs.get(ACTION_MASK_KEY) if isinstance(obs, Mapping) else None
    if mask is None:
        return action_space.sample()
    legal = (np.asarray(mask).reshape(-1) != 0).astype(np.int8)
    if isinstance(action_space, spaces.Discrete):
        return action_space.sample(mask=legal) if legal.any() else action_space.sample()
    heads = np.split(legal, np.cumsum(action_space.nvec)[:-1])
    return action_space.sample(mask=tuple(h if h.any() else np.ones_like(h) for h in heads))


def integer_range(space: spaces.Space) -> tuple[np.ndarray, np.ndarray] | None:
    """The lowest and highest value a ``Discrete`` (0-d arrays) or ``MultiDiscrete`` (arrays
    of its shape) space holds; None for a space of any other kind."""
    if isinstance(space, spaces.Discrete):
        return np.asarray(space.start), np.asarray(space.start + space.n - 1)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(space.start), np.asarray(space.start + space.nvec - 1)
    return None


def lowest_obs(space: spaces.Dict) -> dict[str, np.ndarray]:
    """An observation every key's space holds, at its low end: a ``Discrete`` or
    ``MultiDiscrete`` key at its first value (``start``), a ``Box`` key at the value nearest
    0 within its bounds, a ``MultiBinary`` key at 0 (what a CUDA graph warms up on: an
    all-zero input is out of range for a ``Discrete`` space with ``start > 0``)."""
    out = {}
    for key, sub in space.spaces.items():
        bounds = integer_range(sub)
        if bounds is not None:
            out[key] = bounds[0]
        elif isinstance(sub, spaces.Box):
            out[key] = np.clip(np.zeros(sub.shape), sub.low, sub.high).astype(sub.dtype)
        else:
            out[key] = np.zeros(sub.shape, np.uint8)
    return out
