"""Crafter (crafter 1.8, Hafner 2021) as a gymnasium env, by its own ids ``CrafterReward-v1``
and ``CrafterNoReward-v1``.

crafter registers those ids with the old ``gym`` only (and only when gym is installed), and
its ``crafter.Env`` speaks gym's old API: ``reset() -> obs``, ``step(a) -> (obs, reward, done,
info)``, spaces of gym's or, without gym, plain named tuples. :class:`CrafterEnv` adapts it:

- ``reset(seed=s)`` makes a new world generator seeded with ``s`` (crafter takes its seed at
  construction and derives each episode's world from it and the episode count); without a
  seed, the first comes from OS entropy (crafter's own draw, from numpy's global generator,
  is the same in every process forked from one parent);
- ``done`` is split: ``terminated`` when the player died (crafter's ``discount`` is 0),
  ``truncated`` at the episode length (10,000 steps, crafter's own);
- spaces: ``Box(0, 255, (64, 64, 3), uint8)`` (channels last) and ``Discrete(17)``;
- at the step that ends an episode, ``info["episode_metrics"]["achievements"]`` is the
  number of the 22 achievements unlocked in it (the basis of Crafter's score).

The ids are registered with gymnasium when this module is imported (``gymnasium.make
("CrafterReward-v1")`` works after ``import envs.crafter_env``); ``fastrl.make_env`` makes them
through ``envs.gym_env.make_gym_env`` like any gymnasium id. No ``gym`` is needed.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# id -> whether the reward is given (CrafterNoReward-v1 returns 0; info["reward"] has it).
IDS = {"CrafterReward-v1": True, "CrafterNoReward-v1": False}
LENGTH = 10_000  # crafter's episode length, in steps


class CrafterEnv(gym.Env):
    """``crafter.Env`` under gymnasium's API (module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "frameskip": 1}

    def __init__(self, reward: bool = True, length: int = LENGTH, size: int = 64,
                 render_mode: str | None = None, seed: int | None = None):
        import crafter

        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}: Crafter renders 'rgb_array' only")
        self.render_mode = render_mode
        self._options = {"reward": reward, "length": length, "size": (size, size)}
        self._make = crafter.Env
        if seed is None:
            # crafter would draw it from numpy's global generator, whose state every rollout
            # worker forked from the fork server shares: the same worlds in every worker.
            seed = int(np.random.SeedSequence().generate_state(1)[0] % (2**31 - 1))
        self._env = self._make(**self._options, seed=seed)
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(self._env.action_space.n)
        self._unlocked: set[str] = set()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._env = self._make(**self._options, seed=int(seed))
        self._unlocked = set()
        return self._env.reset(), {}

    def step(self, action):
        obs, reward, done, info = self._env.step(int(action))
        info["player_pos"] = np.array(info["player_pos"])  # crafter returns its own array
        self._unlocked |= {name for name, count in info["achievements"].items() if count > 0}
        terminated = bool(done) and info["discount"] == 0
        truncated = bool(done) and not terminated
        if done:
            info["episode_metrics"] = {"achievements": len(self._unlocked)}
        return obs, float(reward), terminated, truncated, info

    def render(self):
        return self._env.render()


def register_ids() -> None:
    """Register ``IDS`` with gymnasium (again is harmless)."""
    for env_id, reward in IDS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="envs.crafter_env:CrafterEnv",
                         kwargs={"reward": reward})


def make_crafter_env(env_id: str, **options: Any) -> gym.Env:
    """``CrafterReward-v1`` or ``CrafterNoReward-v1`` through ``envs.gym_env.make_gym_env``
    (options as that takes them); another id is an ``UnknownEnvError`` naming the two."""
    if env_id not in IDS:
        from fastrl.errors import UnknownEnvError

        raise UnknownEnvError(f"unknown env {env_id!r}: Crafter's ids are "
                              f"{' and '.join(map(repr, IDS))}")
    from envs.gym_env import make_gym_env

    register_ids()
    return make_gym_env(env_id, **options)


register_ids()
