"""A tiny env with a legal-action mask, for the action-mask tests.

Each step a random subset of every head's choices is legal (at least one per head). The
observation is ``{"obs": the mask as float32, "action_mask": the mask}``; the reward is the
fraction of heads where the agent picked the highest legal choice, so a policy that learns
it scores 1 per step, and a random legal policy about ``1 / legal choices``. An illegal
action raises: a test that sees no env fault knows no masked action was ever taken.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class IllegalActionError(RuntimeError):
    pass


class MaskedPickEnv(gym.Env):
    metadata = {"frameskip": 1, "render_modes": []}

    def __init__(self, nvec: tuple[int, ...] = (5,), episode_len: int = 16,
                 mask_in_info: bool = False, strict: bool = True):
        self.nvec = tuple(nvec)
        self.strict = strict  # raise on an illegal action (else it scores 0)
        self.mask_in_info = mask_in_info  # the mask in info["action_mask"], not in the obs
        self.episode_len = episode_len
        total = sum(self.nvec)
        self.action_space = (spaces.Discrete(self.nvec[0]) if len(self.nvec) == 1
                             else spaces.MultiDiscrete(self.nvec))
        self.observation_space = spaces.Dict({
            "obs": spaces.Box(0.0, 1.0, (total,), np.float32),
            "action_mask": spaces.Box(0, 1, (total,), np.uint8),
        })
        if mask_in_info:
            self.observation_space = self.observation_space["obs"]
        self._mask = np.zeros(total, np.uint8)
        self._t = 0

    def _observe(self):
        """The observation and the info of a new step, with a new mask."""
        obs = self._new_mask()
        if self.mask_in_info:
            return obs["obs"], {"action_mask": obs["action_mask"]}
        return obs, {}

    def _new_mask(self) -> dict:
        parts = []
        for n in self.nvec:
            part = (self.np_random.random(n) < 0.5).astype(np.uint8)
            part[self.np_random.integers(n)] = 1  # never an empty head
            parts.append(part)
        self._mask = np.concatenate(parts)
        return {"obs": self._mask.astype(np.float32), "action_mask": self._mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._observe()

    def step(self, action):
        picks = np.atleast_1d(np.asarray(action))
        reward, offset = 0.0, 0
        for head, (n, pick) in enumerate(zip(self.nvec, picks)):
            legal = self._mask[offset:offset + n]
            if not legal[int(pick)] and self.strict:
                raise IllegalActionError(f"head {head}: action {int(pick)} is masked ({legal})")
            reward += float(int(pick) == int(np.flatnonzero(legal)[-1])) / len(self.nvec)
            offset += n
        self._t += 1
        obs, info = self._observe()
        return obs, reward, self._t >= self.episode_len, False, info


gym.register("MaskedPick-v0", entry_point=MaskedPickEnv)
gym.register("MaskedPickMulti-v0", entry_point=MaskedPickEnv, kwargs={"nvec": (3, 4)})
gym.register("MaskedPickInfo-v0", entry_point=MaskedPickEnv,
             kwargs={"nvec": (3, 4), "mask_in_info": True})
