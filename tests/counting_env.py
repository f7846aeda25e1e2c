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


class MisbehavingCountingEnv(CountingEnv):
    """A CountingEnv whose output goes wrong at its ``every``-th step (counted per instance),
    or with ``on="reset"`` at its ``every``-th reset (the first reset counts as the first).

    ``bad`` names what goes wrong (one of ``BAD``), or is a tuple of names that the instances
    of this process take in turn. ``"f64_obs"`` is the odd one out: float64 values for the
    float32 space, which must pass. ``int_obs``: the observation space is int32.
    """

    BAD = ("nan_reward", "inf_reward", "none_reward", "text_reward", "nan_obs", "wide_obs",
           "float_obs", "text_obs", "dict_obs", "f64_obs")
    spoiled = 0  # bad outputs made in this process, for taking turns

    def __init__(self, bad: str | tuple[str, ...] = "nan_reward", every: int = 10,
                 on: str = "step", int_obs: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.bad = (bad,) if isinstance(bad, str) else tuple(bad)
        assert set(self.bad) <= set(self.BAD) and on in ("step", "reset"), (bad, on)
        self.every = every
        self.on = on
        self.int_obs = int_obs
        if int_obs:
            self.observation_space = spaces.Box(-2**31, 2**31 - 1, (3,), np.int32)
        self.calls = 0  # steps or resets (``on``) so far

    def _obs(self) -> np.ndarray:
        obs = super()._obs()
        return obs.astype(np.int32) if self.int_obs else obs

    def _due(self, call: str) -> bool:
        if self.on != call:
            return False
        self.calls += 1
        return self.calls % self.every == 0

    def _spoil(self, obs, reward):
        what = self.bad[MisbehavingCountingEnv.spoiled % len(self.bad)]
        MisbehavingCountingEnv.spoiled += 1
        if what.endswith("_reward"):
            reward = {"nan_reward": float("nan"), "inf_reward": np.float32("inf"),
                      "none_reward": None, "text_reward": "1.0"}[what]
        elif what == "nan_obs":
            obs = obs.copy()
            obs[1] = np.nan
        elif what == "wide_obs":
            obs = np.append(obs, obs[:1])
        elif what == "float_obs":
            obs = obs.astype(np.float64) + 0.5
        elif what == "text_obs":
            obs = obs.astype(str)
        elif what == "dict_obs":
            obs = {"observation": obs}
        else:
            obs = obs.astype(np.float64)
        return obs, reward

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self._due("reset"):
            obs, _ = self._spoil(obs, 0.0)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self._due("step"):
            obs, reward = self._spoil(obs, reward)
        return obs, reward, terminated, truncated, info


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
# Every 40th step of an env is bad output of a kind that changes each time; a replacement
# env finishes five episodes before its first.
gym.register("MisbehavingCountingEnv-v0", entry_point=MisbehavingCountingEnv,
             kwargs={"bad": ("nan_reward", "none_reward", "nan_obs", "wide_obs", "text_obs",
                             "inf_reward"), "every": 40})
