"""A tiny PettingZoo parallel env for tests/test_pettingzoo.py (needs pettingzoo).

Three agents see ``[agent, step, cue]`` (float32) and get 1 when their action (0 or 1)
equals the cue, else 0. ``agent_1`` terminates after ``short`` steps and leaves while the
others go on; ``agent_0`` and ``agent_2`` end after ``long`` steps (truncated, a time limit).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class FakeParallelEnv(ParallelEnv):
    metadata = {"name": "fake_parallel_v0", "render_modes": []}

    def __init__(self, short: int = 2, long: int = 4, odd_space: bool = False):
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.short, self.long = short, long
        self._obs_space = spaces.Box(-10.0, 10.0, (3,), np.float64)
        self._odd = spaces.Box(-10.0, 10.0, (4,), np.float64) if odd_space else self._obs_space
        self.rng = np.random.default_rng(0)
        self.t = 0
        self.agents: list[str] = []
        self.cues: dict[str, int] = {}

    def observation_space(self, agent):
        return self._odd if agent == "agent_2" else self._obs_space

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self):
        self.cues = {a: int(self.rng.integers(2)) for a in self.agents}
        return {a: np.array([int(a[-1]), self.t, self.cues[a]], dtype=np.float64)
                for a in self.agents}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        rewards = {a: float(int(actions[a]) == self.cues[a]) for a in self.agents}
        terminations = {a: a == "agent_1" and self.t >= self.short for a in self.agents}
        truncations = {a: a != "agent_1" and self.t >= self.long for a in self.agents}
        obs = self._obs()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return obs, rewards, terminations, truncations, infos


def parallel_env(**kwargs):
    return FakeParallelEnv(**kwargs)
