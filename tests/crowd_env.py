"""A multi-agent env of large images, shaped like pistonball_v6: 20 agents, each seeing a
457x120 RGB image (channels last, uint8)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CrowdImageEnv(gym.Env):
    metadata = {"frameskip": 1, "render_modes": []}

    def __init__(self, num_agents: int = 20, shape: tuple[int, ...] = (457, 120, 3),
                 episode_len: int = 50):
        self.num_agents = num_agents
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = spaces.Discrete(3)
        self.episode_len, self.t = episode_len, 0
        self._frame = np.zeros(shape, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return [self._frame] * self.num_agents, [{} for _ in range(self.num_agents)]

    def step(self, actions):
        self.t += 1
        n, done = self.num_agents, self.t >= self.episode_len
        if done:
            self.t = 0
        return ([self._frame] * n, [float(a == 1) for a in actions], [done] * n, [False] * n,
                [{} for _ in range(n)])


gym.register("CrowdImageEnv-v0", entry_point=CrowdImageEnv)
