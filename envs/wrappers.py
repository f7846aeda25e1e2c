"""Wrappers fastrl applies to any env from the command line."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fastrl.policy.obs import ACTION_MASK_KEY as MASK_KEY  # never stacked
from fastrl.policy.obs import obs_to_dict


class FrameStack(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """The last ``k`` observations, concatenated along the first axis: a ``uint8 [C, H, W]``
    image becomes ``[k * C, H, W]`` and a vector ``[N]`` becomes ``[k * N]``, oldest first,
    so the feed-forward encoders see motion. After a reset the stack holds ``k`` copies of
    the first observation. For a ``Dict`` observation every key is stacked except an
    ``action_mask``, which stays the current one.
    """

    def __init__(self, env: gym.Env, k: int):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"frame stack must be a positive int, got {k!r}")
        gym.utils.RecordConstructorArgs.__init__(self, k=k)
        gym.Wrapper.__init__(self, env)
        self.k = k
        base = env.observation_space
        self._dict = isinstance(base, spaces.Dict)
        inner = dict(base.spaces) if self._dict else {"obs": base}
        stacked = {}
        for key, space in inner.items():
            if key == MASK_KEY:
                stacked[key] = space
                continue
            if not isinstance(space, spaces.Box) or len(space.shape) not in (1, 3):
                raise ValueError(f"frame stacking needs Box observations of shape [N] or "
                                 f"[C, H, W]; key {key!r} is {space}")
            reps = (k,) + (1,) * (len(space.shape) - 1)
            stacked[key] = spaces.Box(np.tile(space.low, reps), np.tile(space.high, reps),
                                      dtype=space.dtype)
        self.observation_space = spaces.Dict(stacked) if self._dict else stacked["obs"]
        self._frames = {key: deque(maxlen=k) for key in stacked if key != MASK_KEY}

    def _stacked(self, obs):
        parts = obs_to_dict(obs)
        out = {}
        for key, value in parts.items():
            if key == MASK_KEY:
                out[key] = value
                continue
            frames = self._frames[key]
            frames.append(np.asarray(value))
            out[key] = np.concatenate(list(frames), axis=0)
        return out if self._dict else out["obs"]

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        parts = obs_to_dict(obs)
        for key, frames in self._frames.items():
            frames.clear()
            frames.extend([np.asarray(parts[key])] * (self.k - 1))
        return self._stacked(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._stacked(obs), reward, terminated, truncated, info
