"""A tiny env with continuous (and mixed) actions, for the continuous-action tests.

Each step shows a target point ``x`` in ``[-1.5, 1.5]^2`` (and, for the mixed kinds, a
target choice of 3 as a one-hot); the action is a point in the Box ``[-2, 2]^2`` (and a
choice). The reward is ``1 - |a - x|_1 / 4`` floored at 0 for the point (the mixed kinds
average it with 1 for the right choice), so a policy that learns it scores close to 1 per
step, and the initial policy (a unit Gaussian at 0, clipped) about 0.55. An action outside
the action space (a wrong dtype, shape, bound or choice) raises: a test that sees no env
fault knows every action reached the env in the space's own form.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class OutOfSpaceError(RuntimeError):
    pass


class ReachEnv(gym.Env):
    metadata = {"frameskip": 1, "render_modes": []}

    def __init__(self, kind: str = "box", episode_len: int = 16):
        self.kind = kind
        self.episode_len = episode_len
        point = spaces.Box(-2.0, 2.0, (2,), np.float32)
        if kind == "box":
            self.action_space = point
        elif kind == "dict":
            self.action_space = spaces.Dict({"point": point, "choice": spaces.Discrete(3)})
        elif kind == "tuple":  # a start offset, and the Box before the choice
            self.action_space = spaces.Tuple((point, spaces.Discrete(3, start=1)))
        else:
            raise ValueError(kind)
        self.observation_space = spaces.Box(-1.5, 1.5, (5,), np.float32)
        self._t = 0
        self._obs = np.zeros(5, np.float32)

    def _observe(self) -> np.ndarray:
        point = self.np_random.uniform(-1.5, 1.5, 2)
        choice = np.zeros(3)
        choice[self.np_random.integers(3)] = 1.0
        self._obs = np.concatenate([point, choice]).astype(np.float32)
        return self._obs.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise OutOfSpaceError(f"action {action!r} is not in {self.action_space}")
        if self.kind == "box":
            point, choice = action, None
        elif self.kind == "dict":
            point, choice = action["point"], action["choice"]
        else:
            point, choice = action[0], action[1] - 1
        reward = max(0.0, 1.0 - float(np.abs(point - self._obs[:2]).sum()) / 4.0)
        if choice is not None:
            reward = 0.5 * reward + 0.5 * float(self._obs[2 + int(choice)] == 1.0)
        self._t += 1
        return self._observe(), reward, self._t >= self.episode_len, False, {}


gym.register("Reach-v0", entry_point=ReachEnv)
gym.register("ReachDict-v0", entry_point=ReachEnv, kwargs={"kind": "dict"})
gym.register("ReachTuple-v0", entry_point=ReachEnv, kwargs={"kind": "tuple"})
