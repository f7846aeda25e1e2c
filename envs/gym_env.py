"""Adapter that makes any gymnasium id a fastrl env (`fastrl.make_env("CartPole-v1")`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import DtypeObservation, RecordEpisodeStatistics


def _has_wrapper(env: gym.Env, wrapper_type: type) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_type):
            return True
        env = env.env
    return False


def make_gym_env(
    env_id: str,
    *,
    frameskip: int | None = None,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """`gymnasium.make(env_id)` made to follow the fastrl env contract.

    - `frameskip`: gymnasium envs step one frame per agent step, so only None or 1 is
      accepted (`env.metadata["frameskip"]` is 1);
    - `max_episode_steps` / `render_mode`: passed to `gymnasium.make` (None keeps the
      id's own time limit / no rendering);
    - wraps in `RecordEpisodeStatistics` (unless already there) for `info["episode"]`;
    - casts a floating-point `Box` observation that is not float32 to float32.
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
    env = gym.make(env_id, **kwargs)
    space = env.observation_space
    if (
        isinstance(space, spaces.Box)
        and np.issubdtype(space.dtype, np.floating)
        and space.dtype != np.float32
    ):
        env = DtypeObservation(env, np.float32)
    if not _has_wrapper(env, RecordEpisodeStatistics):
        env = RecordEpisodeStatistics(env)
    metadata: dict[str, Any] = dict(env.metadata)
    metadata["frameskip"] = 1
    env.metadata = metadata
    return env
