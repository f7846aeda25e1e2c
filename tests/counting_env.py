"""A tiny deterministic env for pipeline tests: its observation counts its own steps."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CountingEnv(gym.Env):
    """Observation ``[env_tag, global_step, episode_step]`` (float32).

    ``global_step`` counts every step the env ever took, so a test can check that each
    step lands in exactly one trajectory. Episodes last ``episode_len`` steps; the reward
    is 1 per step, so the return equals the length. ``env_tag`` is random unless given,
    so that envs in different processes can be told apart.
    """

    metadata = {"frameskip": 1, "render_modes": []}

    instances = 0  # made in this process, for ``fail_after_instances``

    def __init__(self, env_tag: int | None = None, episode_len: int = 7,
                 crash_at: int | None = None, hang_at: int | None = None,
                 fail_after_instances: int | None = None,
                 nvec: tuple[int, ...] | None = None, truncate: bool = False,
                 step_seconds: float = 0.0):
        CountingEnv.instances += 1
        if fail_after_instances is not None and CountingEnv.instances > fail_after_instances:
            raise RuntimeError(
                f"CountingEnv refuses to be made more than {fail_after_instances} times"
            )
        if env_tag is None:
            env_tag = int(np.random.default_rng().integers(1, 2**24))
        self.observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
        # ``nvec``: a MultiDiscrete action space (unequal sizes exercise the padded
        # distribution); the default is Discrete(3).
        self.action_space = spaces.Discrete(3) if nvec is None else spaces.MultiDiscrete(nvec)
        self.truncate = truncate  # end episodes by time limit (truncated) instead of terminating
        self.env_tag = env_tag
        self.episode_len = episode_len
        self.crash_at = crash_at
        self.hang_at = hang_at
        self.step_seconds = step_seconds  # a slow env: each step sleeps this long
        self.global_step = 0
        self.episode_step = 0
        self.actions: list[int] = []

    def _obs(self) -> np.ndarray:
        return np.array([self.env_tag, self.global_step, self.episode_step], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode_step = 0
        return self._obs(), {}

    def step(self, action):
        if self.crash_at is not None and self.global_step >= self.crash_at:
            raise RuntimeError(
                f"CountingEnv {self.env_tag} crashed on purpose at step {self.global_step}"
            )
        if self.hang_at is not None and self.global_step >= self.hang_at:
            time.sleep(3600)
        if self.step_seconds:
            time.sleep(self.step_seconds)
        self.actions.append(int(action) if np.ndim(action) == 0 else tuple(int(a) for a in action))
        self.global_step += 1
        self.episode_step += 1
        ended = self.episode_step >= self.episode_len
        return self._obs(), 1.0, ended and not self.truncate, ended and self.truncate, {}


# Registered with gymnasium so that spawned worker processes can build it from its id
# ("tests.counting_env:CountingEnv-v0" imports this module first).
gym.register("CountingEnv-v0", entry_point=CountingEnv)
gym.register("MultiCountingEnv-v0", entry_point=CountingEnv, kwargs={"nvec": (3, 2)})
gym.register("SlowCountingEnv-v0", entry_point=CountingEnv, kwargs={"step_seconds": 0.004})
gym.register("CrashingCountingEnv-v0", entry_point=CountingEnv, kwargs={"crash_at": 40})
gym.register("HangingCountingEnv-v0", entry_point=CountingEnv, kwargs={"hang_at": 40})
# Crashes, and every replacement fails: the rollout worker itself goes down.
gym.register("BrokenCountingEnv-v0", entry_point=CountingEnv,
             kwargs={"crash_at": 40, "fail_after_instances": 4})
