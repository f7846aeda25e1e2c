"""Envs as the config asks for them: options, frame stacking, reward scale, and the spaces
(``EnvInfo``) that size the model and the shared buffers."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.env_registry import make_env, recommended_settings, stack_frames
from fastrl.errors import EnvSettingsError
from fastrl.policy.obs import as_dict_space
from fastrl.sampling.agents import is_multi_agent, num_agents
from fastrl.transport.signals import held


def reward_scale(cfg: Config) -> float:
    """``--reward_scale``; when it is None (a Config not made by ``parse_config``), the env's
    recommended scale, else 1.0."""
    if cfg.reward_scale is not None:
        return cfg.reward_scale
    return float(recommended_settings(cfg.env).get("reward_scale", 1.0))


def env_options(cfg: Config) -> dict:
    """Options for ``make_env`` from the config (only those the user changed)."""
    options: dict = {}
    if cfg.env_frameskip is not None:
        options["frameskip"] = cfg.env_frameskip
    if cfg.env_max_episode_steps is not None:
        options["max_episode_steps"] = cfg.env_max_episode_steps
    if cfg.env_measurements:
        options["measurements"] = True
    if cfg.env_reward_shaping:
        options["reward_shaping"] = True
    if cfg.env_action_mask_from_info:
        options["action_mask_from_info"] = True
    if cfg.env_atari_rgb:
        options["rgb"] = True
    return options


def create_env(cfg: Config, **extra) -> gym.Env:
    # The processes an env starts (VizDoom's engine) never see the launcher's signals: a
    # scheduler's SIGTERM to the whole job must not kill them mid-step; they are closed in
    # order (fastrl.transport.signals).
    with held():
        env = make_env(cfg.env, **env_options(cfg), **extra)
    if cfg.env_framestack > 1:
        if is_multi_agent(env):
            env.close()
            raise EnvSettingsError(f"env {cfg.env!r} ({env.num_agents} agents): "
                                   f"--env_framestack={cfg.env_framestack} stacks a single "
                                   "agent's frames only; use --env_framestack 1")
        env = stack_frames(env, cfg.env_framestack)
    return env


@dataclass(frozen=True)
class EnvInfo:
    obs_space: spaces.Dict
    action_space: spaces.Space
    frameskip: int
    # A multi-agent env (fastrl.sampling.agents): its agents, each an env slot of its own.
    num_agents: int = 1
    multi_agent: bool = False

    def describe(self) -> dict:
        out = {"obs_space": repr(self.obs_space), "action_space": repr(self.action_space),
               "frameskip": self.frameskip}
        if self.multi_agent:
            out["num_agents"] = self.num_agents
        return out


def env_info(env: gym.Env) -> EnvInfo:
    try:
        obs_space = as_dict_space(env.observation_space)
    except ValueError as exc:
        raise EnvSettingsError(str(exc)) from None
    try:
        agents = num_agents(env)
    except ValueError as exc:
        raise EnvSettingsError(str(exc)) from None
    return EnvInfo(obs_space, env.action_space, int(env.metadata.get("frameskip", 1)),
                   agents, is_multi_agent(env))


def probe_env(cfg: Config) -> EnvInfo:
    """Create one env to read its spaces, then close it."""
    env = create_env(cfg)
    try:
        return env_info(env)
    finally:
        env.close()
