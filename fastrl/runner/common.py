"""Set-up shared by the serial and parallel runners."""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from fastrl.actions import ActionSpec
from fastrl.cfg import Config
from fastrl.device import resolve_device  # noqa: F401 - re-exported for the runners
from fastrl.env_registry import make_env, recommended_settings
from fastrl.learner import exploration_problem
from fastrl.model import ActorCritic
from fastrl.obs import as_dict_space


class EnvSettingsError(ValueError):
    """The settings do not fit the env's spaces (a user error, reported in one line)."""


class StartMethodError(ValueError):
    """``FASTRL_START_METHOD`` names no start method fastrl supports (reported in one line)."""


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
    env = make_env(cfg.env, **env_options(cfg), **extra)
    if cfg.env_framestack > 1:
        from envs.wrappers import FrameStack

        env = FrameStack(env, cfg.env_framestack)
    return env


@dataclass(frozen=True)
class EnvInfo:
    obs_space: spaces.Dict
    action_space: spaces.Space
    frameskip: int

    def describe(self) -> dict:
        return {"obs_space": repr(self.obs_space), "action_space": repr(self.action_space),
                "frameskip": self.frameskip}


def env_info(env: gym.Env) -> EnvInfo:
    try:
        obs_space = as_dict_space(env.observation_space)
    except ValueError as exc:
        raise EnvSettingsError(str(exc)) from None
    return EnvInfo(obs_space, env.action_space, int(env.metadata.get("frameskip", 1)))


def check_env_settings(cfg: Config, info: EnvInfo) -> None:
    """Refuse, before anything starts, settings the env's action space cannot take."""
    try:
        spec = ActionSpec(info.action_space, cfg.action_bounds)
    except ValueError as exc:
        raise EnvSettingsError(f"env {cfg.env!r}: {exc}") from None
    problem = exploration_problem(cfg.exploration_loss, spec)
    if problem:
        raise EnvSettingsError(f"env {cfg.env!r} ({info.action_space}): {problem}")


def probe_env(cfg: Config) -> EnvInfo:
    """Create one env to read its spaces, then close it."""
    env = create_env(cfg)
    try:
        return env_info(env)
    finally:
        env.close()


def build_model(cfg: Config, info: EnvInfo, device: torch.device) -> ActorCritic:
    try:
        model = ActorCritic(info.obs_space, info.action_space, cfg)
    except ValueError as exc:  # spaces the model cannot take, or settings that do not fit
        raise EnvSettingsError(f"env {cfg.env!r}: {exc}") from None
    return model.to(device)


def buffers_per_env(cfg: Config, num_envs: int) -> int:
    """Trajectory slots per env: one being filled plus room for two learner batches."""
    return 2 * math.ceil(cfg.trajectories_per_batch / num_envs) + 1


# What the fork server imports once, so that no child it forks imports torch again (under
# spawn every child spends 1.5-2 s of CPU on that, which on a 2-core machine delays the start
# of a run and every restart of a worker).
FORKSERVER_PRELOAD = ["torch", "fastrl.runner.parallel", "fastrl.runner.node", "envs"]


def process_context():
    """The multiprocessing context for the parallel runner's children: ``forkserver``, whose
    server has imported torch and fastrl and has started no threads and touched no GPU, so a
    child is as clean as under spawn and starts in a fraction of the time.

    A child's parent is then the fork server, not the runner, and the fork server can outlive
    a killed runner; children therefore watch the runner itself (``Wiring.parent``, a
    :class:`fastrl.procs.Lifeline`), not their parent pid.

    ``FASTRL_START_METHOD=spawn`` starts every child afresh instead (slower), for a library
    that misbehaves in a forked child."""
    import torch.multiprocessing as tmp

    method = os.environ.get("FASTRL_START_METHOD", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise StartMethodError(f"FASTRL_START_METHOD={method!r} is not a start method fastrl "
                               "supports: use 'forkserver' (the default) or 'spawn'")
    ctx = tmp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def seed_everything(seed: int | None) -> None:
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
