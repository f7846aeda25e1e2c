"""Adapter that makes any gymnasium id a fastrl env (`fastrl.make_env("CartPole-v1")`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import DtypeObservation, RecordEpisodeStatistics

from fastrl.env_registry import is_multi_agent
from fastrl.policy.obs import ACTION_MASK_KEY, flat_action_mask, obs_to_dict
from fastrl.sampling.env_faults import check_reward


def _has_wrapper(env: gym.Env, wrapper_type: type) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_type):
            return True
        env = env.env
    return False


class RewardCheck(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Raises fastrl's ``EnvOutputError`` (a fault of kind ``reward``, naming the value) when
    the env's reward is not a finite real number, before ``RecordEpisodeStatistics`` adds it
    up: that would fail on ``None`` with a ``TypeError`` that names no reward, and sum a NaN
    into the episode's return. The rollout worker checks the reward again; this is for
    the wrappers above."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, check_reward(reward), terminated, truncated, info


class InfoActionMask(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Moves the legal-action mask an env returns in ``info["action_mask"]`` (at reset and at
    every step) into the observation, under the key fastrl masks logits with.

    The mask is a flat array of ``n`` (Discrete) or ``sum(nvec)`` (MultiDiscrete) entries,
    nonzero where legal, or for MultiDiscrete a tuple of one array per dimension (gymnasium's
    ``MultiDiscrete.sample(mask=...)`` form). A ``Box`` observation becomes
    ``{"obs": box, "action_mask": mask}``; a ``Dict`` gains the key.
    """

    KEY = ACTION_MASK_KEY

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        from fastrl.policy.actions import ActionSpec  # torch: not on the launcher's probe path

        spec = ActionSpec(env.action_space)
        if not spec.maskable:
            raise ValueError(f"an action mask needs a Discrete or MultiDiscrete action space, "
                             f"not {env.action_space}")
        self._size = spec.num_logits
        base = env.observation_space
        inner = dict(base.spaces) if isinstance(base, spaces.Dict) else {"obs": base}
        if self.KEY in inner:
            raise ValueError(f"the env already has an {self.KEY!r} observation key: it needs "
                             "no mask from info")
        inner[self.KEY] = spaces.Box(0, 1, (self._size,), np.uint8)
        self.observation_space = spaces.Dict(inner)

    def _with_mask(self, obs, info: dict) -> dict:
        if self.KEY not in info:
            raise KeyError(f"the env returned no info[{self.KEY!r}] (needed because of "
                           "action_mask_from_info)")
        mask = (flat_action_mask(info[self.KEY]) != 0).astype(np.uint8)
        if mask.shape != (self._size,):
            raise ValueError(f"info[{self.KEY!r}] has {mask.size} entries; the action space "
                             f"{self.env.action_space} needs {self._size}")
        out = obs_to_dict(obs)
        out[self.KEY] = mask
        return out

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._with_mask(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with_mask(obs, info), reward, terminated, truncated, info


def make_gym_env(
    env_id: str,
    *,
    frameskip: int | None = None,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    action_mask_from_info: bool = False,
) -> gym.Env:
    """`gymnasium.make(env_id)` made to follow the fastrl env contract.

    - `frameskip`: gymnasium envs step one frame per agent step, so only None or 1 is
      accepted (`env.metadata["frameskip"]` is 1);
    - `max_episode_steps` / `render_mode`: passed to `gymnasium.make` (None keeps the
      id's own time limit / no rendering);
    - wraps in `RecordEpisodeStatistics` (unless already there) for `info["episode"]`,
      over a :class:`RewardCheck`;
    - casts a floating-point `Box` observation that is not float32 to float32;
    - `action_mask_from_info`: wraps in :class:`InfoActionMask`.

    A multi-agent env (`fastrl.sampling.agents`: an int `num_agents`) is returned unwrapped:
    gymnasium's wrappers step one agent. It keeps its own time limit and episode statistics.
    """
    if frameskip is not None and frameskip != 1:
        raise ValueError(
            f"frameskip={frameskip!r} is not supported for gymnasium env {env_id!r}: "
            "it steps one frame per agent step (use None or 1, or wrap the env yourself)"
        )
    kwargs: dict[str, Any] = {}
    # Only pass what was asked for: some envs' constructors take no render_mode at all.
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        from fastrl.errors import MissingExtraError

        extra = "mujoco" if "mujoco" in str(exc).lower() else None
        hint = f" (pip install 'fastrl[{extra}]')" if extra else ""
        raise MissingExtraError(f"env {env_id!r}: {exc}{hint}") from exc
    if is_multi_agent(env.unwrapped):
        return _multi_agent(env_id, env, max_episode_steps, action_mask_from_info)
    env = RewardCheck(env)
    space = env.observation_space
    if (
        isinstance(space, spaces.Box)
        and np.issubdtype(space.dtype, np.floating)
        and space.dtype != np.float32
    ):
        env = DtypeObservation(env, np.float32)
    if action_mask_from_info:
        env = InfoActionMask(env)
    if not _has_wrapper(env, RecordEpisodeStatistics):
        env = RecordEpisodeStatistics(env)
    metadata: dict[str, Any] = dict(env.metadata)
    metadata["frameskip"] = 1
    env.metadata = metadata
    return env


def _multi_agent(env_id: str, env: gym.Env, max_episode_steps: int | None,
                 action_mask_from_info: bool) -> gym.Env:
    """A multi-agent env made by `gymnasium.make`, without gymnasium's wrappers."""
    for option, value in (("max_episode_steps", max_episode_steps),
                          ("action_mask_from_info", action_mask_from_info or None)):
        if value is not None:
            env.close()
            raise ValueError(f"{option}={value!r} is not supported for the multi-agent env "
                             f"{env_id!r}: gymnasium's wrappers step a single agent (give the "
                             "option to the env itself)")
    env = env.unwrapped
    env.metadata = {**env.metadata, "frameskip": int(env.metadata.get("frameskip", 1))}
    return env
