"""Two-agent envs (the contract: fastrl/sampling/agents.py) with one kind of observation space
per agent each, registered with gymnasium when this module is imported:
``--env tests.agents_spaces_env:AgentsBoxGrid-v0`` and the other ids of :data:`SPACES`.

An agent's observation is a function of the agent and the env's step only (:func:`raw_obs`),
and its reward names both (``agent * 1000 + step``), so a test can tell from the buffers which
agent's observation of which step landed where. Agent ``a``'s episodes end by a time limit
after ``3 + a`` steps, with ``info["final_obs"]`` (:func:`final_obs_of`).
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import register

SPACES = {  # id stem -> one agent's observation space
    "BoxGrid": spaces.Box(-1.0, 1.0, (27, 5), np.float64),  # knights_archers_zombies
    "Gray": spaces.Box(0, 255, (6, 7), np.uint8),
    "PixelsHWC": spaces.Box(0, 255, (9, 8, 3), np.uint8),
    "FloatImageHWC": spaces.Box(0.0, 1.0, (10, 10, 4), np.float32),
    "Discrete": spaces.Discrete(5, start=-2),
    "MultiDiscrete": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "MultiBinary": spaces.MultiBinary((2, 3)),
    "Dict": spaces.Dict({
        "image": spaces.Box(0, 255, (5, 5, 3), np.uint8),
        "direction": spaces.Discrete(4),
        "mission": spaces.Text(8),
        "nested": spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (2, 2), np.float32)}),
    }),
    "Tuple": spaces.Tuple((spaces.Discrete(3), spaces.Box(-1.0, 1.0, (2, 3), np.float32))),
}
FINAL_OFFSET = 500_000  # final_obs_of(a, s) is raw_obs(a, s + FINAL_OFFSET)


def raw_obs(space: spaces.Space, agent: int, step: int):
    """Agent ``agent``'s observation after the env's ``step``-th step: a sample of ``space``
    seeded by both."""
    space.seed(agent * 1_000_003 + step)
    return space.sample()


def final_obs_of(space: spaces.Space, agent: int, step: int):
    """The ``info["final_obs"]`` of agent ``agent``'s episode that a time limit ended at the
    env's ``step``-th step (unlike any observation of the run)."""
    return raw_obs(space, agent, step + FINAL_OFFSET)


class AgentsSpacesEnv(gym.Env):
    """Two agents observing ``SPACES[kind]`` each; ``Discrete(3)`` actions."""

    metadata = {"frameskip": 1, "render_modes": []}

    def __init__(self, kind: str):
        self.num_agents = 2
        self.observation_space = copy.deepcopy(SPACES[kind])  # (reseeded by each sample)
        self.action_space = spaces.Discrete(3)
        self.step_count = 0
        self.episode_step = [0, 0]

    def _obs(self) -> list:
        return [raw_obs(self.observation_space, a, self.step_count) for a in range(2)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode_step = [0, 0]
        return self._obs(), [{}, {}]

    def step(self, actions):
        assert len(actions) == 2, actions
        self.step_count += 1
        s = self.step_count
        rewards, ended, infos = [0.0, 0.0], [False, False], [{}, {}]
        for a in range(2):
            rewards[a] = float(a * 1000 + s)
            self.episode_step[a] += 1
            if self.episode_step[a] >= 3 + a:
                ended[a] = True
                self.episode_step[a] = 0
                infos[a]["final_obs"] = final_obs_of(self.observation_space, a, s)
        return self._obs(), rewards, [False, False], ended, infos


for _kind in SPACES:
    register(id=f"Agents{_kind}-v0", entry_point=AgentsSpacesEnv, kwargs={"kind": _kind})
