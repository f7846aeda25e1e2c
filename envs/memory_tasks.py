"""Tasks that need memory: a feed-forward policy cannot solve them, a recurrent one can.

``cartpole_masked``: gymnasium's CartPole-v1 whose observations keep the cart's position and
the pole's angle and hide both velocities (the classic partially observed CartPole). From
one observation the velocities are unknown; from two, a recurrent core can estimate them.
It is what ``--algo r2d2`` is measured on against ``--algo apex`` (perf/log/RESULTS.md, "R2D2
(issue 26)").

A family of ``fastrl.env_registry.BUILTIN_FAMILIES``: plain data, nothing imported until an
env is made.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# What CartPole-v1's observation holds, and what the masked task keeps.
CARTPOLE_KEPT = (0, 2)  # cart position, pole angle (1 and 3 are the velocities)
# CartPole's own recommendation (fastrl.env_registry: the classic recipe, rewards x 0.1).
RECOMMENDED: dict[str, Any] = {"recipe": "classic", "reward_scale": 0.1}


class KeepObservationEntries(gym.ObservationWrapper):
    """A vector observation reduced to the entries ``keep``."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...]):
        super().__init__(env)
        box = env.observation_space
        self.keep = np.asarray(keep, dtype=np.int64)
        self.observation_space = spaces.Box(box.low[self.keep], box.high[self.keep],
                                            dtype=box.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]


def make_cartpole_masked(**options: Any) -> gym.Env:
    """CartPole-v1 through fastrl's gymnasium adapter, velocities hidden (options as
    ``envs.gym_env.make_gym_env`` takes them)."""
    from envs.gym_env import make_gym_env

    return KeepObservationEntries(make_gym_env("CartPole-v1", **options), CARTPOLE_KEPT)


def builtin_envs() -> dict[str, tuple[str, tuple, dict]]:
    """name -> (factory as "module:attribute", leading arguments, recommended settings)."""
    return {"cartpole_masked": ("envs.memory_tasks:make_cartpole_masked", (), dict(RECOMMENDED))}
