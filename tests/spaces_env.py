"""Fake envs with the observation spaces of envs outside fastrl (channels-last pixels,
MiniGrid's Dict with a text mission, every gymnasium space nested), registered with gymnasium
when this module is imported: ``--env tests.spaces_env:PixelsHWC-v0``.

Each observation is a function of the env's step counter (``PixelsHWC``, ``Grid``) so that a
test can tell where every value landed.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import register


def hwc_frame(step: int, shape: tuple[int, int, int]) -> np.ndarray:
    """The channels-last frame ``PixelsHWC`` shows at ``step``: every pixel differs."""
    h, w, c = shape
    grid = np.arange(h * w * c, dtype=np.int64).reshape(h, w, c)
    return ((grid * 7 + step) % 251).astype(np.uint8)


class PixelsHWC(gym.Env):
    """uint8 ``[H, W, C]`` frames (``hwc_frame``), ``Discrete(2)`` actions; reward 1 when the
    action equals the parity of the step; episodes of ``episode_len`` steps."""

    metadata = {"render_modes": []}

    def __init__(self, shape: tuple[int, int, int] = (40, 44, 3), episode_len: int = 10):
        self.shape = tuple(shape)
        self.episode_len = episode_len
        self.observation_space = spaces.Box(0, 255, self.shape, np.uint8)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return hwc_frame(self.t, self.shape), {}

    def step(self, action):
        reward = float(int(action) == self.t % 2)
        self.t += 1
        return hwc_frame(self.t, self.shape), reward, self.t >= self.episode_len, False, {}


class Grid(gym.Env):
    """MiniGrid's observation form: ``Dict(image: uint8 [5, 5, 3] cell ids, channels last;
    direction: Discrete(4); mission: Text)``. The agent walks right along a corridor of
    ``size`` cells (action 1 moves, 0 stays); reward 1 at the end, then the episode ends."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 4, max_steps: int = 12):
        self.size, self.max_steps = size, max_steps
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (5, 5, 3), np.uint8),
            "direction": spaces.Discrete(4),
            "mission": spaces.Text(40, charset="abcdefghijklmnopqrstuvwxyz "),
        })
        self.action_space = spaces.Discrete(2)
        self.pos = self.t = 0

    def _obs(self) -> dict:
        image = np.zeros((5, 5, 3), np.uint8)
        image[:, :, 0] = 1
        image[2, min(self.pos, 4), 0] = 10  # object id of the agent
        image[2, min(self.size - 1, 4), 1] = 8  # goal colour id
        return {"image": image, "direction": self.pos % 4, "mission": "get to the green goal"}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.pos += int(action == 1)
        done = self.pos >= self.size - 1
        return self._obs(), float(done), done, self.t >= self.max_steps, {}


def every_space() -> spaces.Dict:
    """One of every gymnasium space, nested."""
    return spaces.Dict({
        "pixels_hwc": spaces.Box(0, 255, (9, 8, 3), np.uint8),
        "pixels_chw": spaces.Box(0, 255, (1, 8, 9), np.uint8),
        "gray": spaces.Box(0, 255, (6, 7), np.uint8),
        "float_image": spaces.Box(0.0, 1.0, (10, 10, 4), np.float32),
        "vector": spaces.Box(-2.0, 2.0, (5,), np.float64),
        "matrix": spaces.Box(-1.0, 1.0, (2, 3, 4), np.float32),
        "scalar": spaces.Box(-1.0, 1.0, (), np.float32),
        "discrete": spaces.Discrete(5, start=-2),
        "multi_discrete": spaces.MultiDiscrete([[2, 3], [4, 5]]),
        "multi_binary": spaces.MultiBinary(6),
        "nested": spaces.Dict({
            "pair": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary((2, 2)))),
            "inner": spaces.Dict({"int_vector": spaces.Box(0, 300, (3,), np.int64)}),
        }),
        "text": spaces.Text(8),
        "sequence": spaces.Sequence(spaces.Discrete(3)),
        "graph": spaces.Graph(spaces.Box(-1, 1, (2,)), spaces.Discrete(2)),
        "one_of": spaces.OneOf((spaces.Discrete(2), spaces.Box(-1, 1, (2,)))),
    })


class EverySpace(gym.Env):
    """Observations sampled from :func:`every_space` (seeded by ``reset``), ``Discrete(3)``
    actions, reward 0, episodes of 6 steps."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = every_space()
        self.action_space = spaces.Discrete(3)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 0.0, self.t >= 6, False, {}


register(id="PixelsHWC-v0", entry_point=PixelsHWC)
register(id="SpacesGrid-v0", entry_point=Grid)
register(id="EverySpace-v0", entry_point=EverySpace)
