"""Envs as the flags ask for them (``EnvSettings``, copied from ``Config`` once by whoever
holds it): options, observations in the form the model takes (``ObsAdapter``; a multi-agent
env's agent by agent: ``AgentsObsAdapter``), frame stacking, reward scale, and the spaces
(``EnvInfo``) that size the model and the shared buffers."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gymnasium as gym
from gymnasium import spaces

from fastrl.config.settings import CopiedFromConfig
from fastrl.env_registry import (
    FINAL_OBS,
    concat_vectors,
    import_env_packages,
    is_multi_agent,
    make_env,
    num_agents,
    recommended_settings,
    recycle_env,
    renders_frames,
    stack_frames,
)
from fastrl.errors import EnvSettingsError
from fastrl.policy.obs import as_dict_space
from fastrl.policy.spaces import ObsPlan
from fastrl.transport.signals import held


@dataclass(frozen=True)
class EnvSettings(CopiedFromConfig):
    """What making the run's env reads: each field as the ``Config`` field of the same name
    (``--help``), copied by :meth:`from_config`; no defaults of its own."""

    env: str
    env_packages: str  # imported before the env is made
    # make_env's options (env_options: only those the user changed)
    env_frameskip: int | None
    env_max_episode_steps: int | None
    env_measurements: bool
    env_reward_shaping: bool
    env_action_mask_from_info: bool
    env_atari_rgb: bool
    # made anew at an episode boundary (recycled)
    env_recycle_episodes: int | None
    env_recycle_mb: int
    # the observation the model takes (obs_plan), frame stacking
    env_obs_layout: str
    obs_keys: str
    env_concat_vectors: bool
    env_framestack: int
    # the training reward's scale (reward_scale: None is the env's recommended one)
    reward_scale: float | None


def reward_scale(settings: EnvSettings) -> float:
    """``--reward_scale``; when it is None (a Config not made by ``parse_config``), the env's
    recommended scale, else 1.0."""
    if settings.reward_scale is not None:
        return settings.reward_scale
    return float(recommended_settings(settings.env).get("reward_scale", 1.0))


def env_options(settings: EnvSettings) -> dict:
    """Options for ``make_env`` from the flags (only those the user changed)."""
    options: dict = {}
    if settings.env_frameskip is not None:
        options["frameskip"] = settings.env_frameskip
    if settings.env_max_episode_steps is not None:
        options["max_episode_steps"] = settings.env_max_episode_steps
    if settings.env_measurements:
        options["measurements"] = True
    if settings.env_reward_shaping:
        options["reward_shaping"] = True
    if settings.env_action_mask_from_info:
        options["action_mask_from_info"] = True
    if settings.env_atari_rgb:
        options["rgb"] = True
    return options


class ObsAdapter(gym.ObservationWrapper):
    """The env's observations as the flat ``Dict`` of ``plan`` (nested keys flattened,
    channels-last images transposed as views: the rollout worker's write into the
    channels-first buffer is the one copy). An observation that does not fit the env's space
    is an ``EnvOutputError`` naming the call, the key and what was expected
    (``ObsPlan.convert``): an env fault of its kind for the rollout worker."""

    def __init__(self, env: gym.Env, plan: ObsPlan):
        super().__init__(env)
        self.plan = plan
        self.observation_space = plan.model_space()

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self.convert(obs, "reset"), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.convert(obs, "step"), reward, terminated, truncated, info

    def observation(self, observation):
        return self.convert(observation, "step")

    def convert(self, observation, what: str):
        return self.plan.convert(observation, what)


class AgentsObsAdapter(ObsAdapter):
    """:class:`ObsAdapter` for a multi-agent env (fastrl/sampling/agents.py): ``plan`` is one
    agent's, and each agent's observation, and its ``info["final_obs"]``, is converted on its
    own. The env's own attributes stay visible: ``num_agents`` and whatever else an env family
    tells of its agents (gymnasium's wrappers no longer pass attributes on)."""

    def __getattr__(self, name: str):
        env = self.__dict__.get("env")  # (None while unpickling: no recursion)
        if env is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(env, name)

    def convert(self, observation, what: str):
        convert = self.plan.convert
        return [convert(o, what, agent) for agent, o in enumerate(observation)]

    def step(self, action):
        obs, rewards, terminated, truncated, infos = super().step(action)
        if isinstance(infos, (list, tuple)):  # (anything else is the worker's to report)
            infos = [self._final_obs(info, agent) for agent, info in enumerate(infos)]
        return obs, rewards, terminated, truncated, infos

    def _final_obs(self, info, agent: int):
        if not isinstance(info, dict) or info.get(FINAL_OBS) is None:
            return info
        return {**info, FINAL_OBS: self.plan.convert(info[FINAL_OBS], "step (final_obs)", agent)}


def obs_keys(settings: EnvSettings) -> list[str]:
    """``--obs_keys`` as a list (empty: every key)."""
    return [k.strip() for k in settings.obs_keys.split(",") if k.strip()]


def obs_plan(settings: EnvSettings, space: spaces.Space, keys: list[str] | None = None) -> ObsPlan:
    """How ``space`` becomes the model's observation (``--env_obs_layout``, ``keys``: by
    default ``--obs_keys``); a space that cannot be encoded is an ``EnvSettingsError``
    naming it."""
    keys = obs_keys(settings) if keys is None else keys
    try:
        return ObsPlan(space, settings.env_obs_layout, keys)
    except ValueError as exc:
        raise EnvSettingsError(f"env {settings.env!r}: {exc}") from None


def _make(settings: EnvSettings, extra: dict) -> gym.Env:
    # The processes an env starts (VizDoom's engine) never see the launcher's signals: a
    # scheduler's SIGTERM to the whole job must not kill them mid-step; they are closed in
    # order (fastrl.transport.signals).
    with held():
        return make_env(settings.env, **env_options(settings), **extra)


def recycled(settings: EnvSettings, env: gym.Env, factory) -> gym.Env:
    """``env``, made anew by ``factory`` at an episode boundary as ``--env_recycle_episodes``
    (None: the env's own ``metadata["recycle_episodes"]``, none for a multi-agent env) and
    ``--env_recycle_mb`` ask (``envs.wrappers.Recycle``); ``env`` itself when neither does.
    What the env cannot do is an ``EnvSettingsError`` naming the flag (``env`` closed)."""
    episodes, mb = settings.env_recycle_episodes, settings.env_recycle_mb
    if episodes is None:
        episodes = 0 if is_multi_agent(env) else int(env.metadata.get("recycle_episodes") or 0)
    if not episodes and not mb:
        return env
    flag = f"--env_recycle_mb={mb}" if mb else f"--env_recycle_episodes={episodes}"
    try:
        if is_multi_agent(env):
            raise ValueError(f"env {settings.env!r} ({env.num_agents} agents) restarts its "
                             "episodes itself, where nothing can make it anew; use 0")
        if mb and not callable(getattr(env.unwrapped, "engine_pids", None)):
            raise ValueError(f"env {settings.env!r} names no processes of its own (an "
                             "engine_pids() method) whose memory could be bounded; use 0")
        return recycle_env(env, factory, episodes=episodes, max_rss=mb * 2**20)
    except ValueError as exc:
        env.close()
        raise EnvSettingsError(f"{flag}: {exc}") from None


def create_env(settings: EnvSettings, **extra) -> gym.Env:
    import_env_packages(settings.env_packages, render=renders_frames(extra))
    make = functools.partial(_make, settings, extra)
    env = recycled(settings, make(), make)
    keys = obs_keys(settings)
    if settings.env_concat_vectors:  # (it takes --obs_keys: the model then sees the one vector)
        env, keys = joined_vectors(settings, env, keys), []
    plan = obs_plan(settings, env.observation_space, keys)
    if not plan.identity:  # an env the model takes as it is keeps exactly its own path
        env = (AgentsObsAdapter if is_multi_agent(env) else ObsAdapter)(env, plan)
    if settings.env_framestack > 1:
        if is_multi_agent(env):
            env.close()
            raise EnvSettingsError(f"env {settings.env!r} ({env.num_agents} agents): "
                                   f"--env_framestack={settings.env_framestack} stacks a single "
                                   "agent's frames only; use --env_framestack 1")
        try:
            env = stack_frames(env, settings.env_framestack)
        except ValueError as exc:  # what the frames cannot be stacked from, in one line
            env.close()
            raise EnvSettingsError(f"env {settings.env!r}: --env_framestack="
                                   f"{settings.env_framestack}: {exc}; use --env_framestack 1"
                                   ) from None
    return env


def joined_vectors(settings: EnvSettings, env: gym.Env, keys: list[str] | None = None) -> gym.Env:
    """``env`` with its observation of vectors as one vector (``--env_concat_vectors``,
    ``envs.wrappers.ConcatVectors``); one it cannot take is an ``EnvSettingsError`` naming
    the flag (``env`` closed)."""
    try:
        if is_multi_agent(env):
            raise ValueError(f"it takes a single agent's observation; env {settings.env!r} has "
                             f"{env.num_agents} agents")
        return concat_vectors(env, keys or ())
    except ValueError as exc:
        env.close()
        raise EnvSettingsError(f"--env_concat_vectors: {exc}; use --env_concat_vectors "
                               "False") from None


@dataclass(frozen=True)
class EnvInfo:
    obs_space: spaces.Dict
    action_space: spaces.Space
    frameskip: int
    # A multi-agent env (fastrl.sampling.agents): its agents, each an env slot of its own.
    num_agents: int = 1
    multi_agent: bool = False
    # What the env's observation keys are and how they were adapted (ObsPlan.sources), and
    # one line per kind of key left out: for the first lines of a run, not for checkpoints.
    obs_sources: tuple[tuple[str, str], ...] = ()
    obs_left_out: tuple[str, ...] = ()
    # The reward-shaping terms the env names (metadata["reward_terms"]:
    # fastrl/algo/pbt/reward_weights.py).
    reward_terms: tuple[str, ...] = ()
    # Whether the env declares a time limit (has_time_limit): without one, the run warns when
    # episodes grow far longer than its first ones (fastrl.experiment.stats.long_episodes).
    time_limit: bool = False

    def describe(self) -> dict:
        out = {"obs_space": repr(self.obs_space), "action_space": repr(self.action_space),
               "frameskip": self.frameskip}
        if self.multi_agent:
            out["num_agents"] = self.num_agents
        return out


def _plan_of(env: gym.Env, layout: str) -> ObsPlan:
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, ObsAdapter):
            return inner.plan
        inner = inner.env
    return ObsPlan(env.observation_space, layout)


def env_info(env: gym.Env, layout: str = "auto") -> EnvInfo:
    """The spaces of ``env`` (made by :func:`create_env`; ``layout``: its
    ``--env_obs_layout``, for the description of its keys)."""
    try:
        plan = _plan_of(env, layout)
    except ValueError as exc:
        raise EnvSettingsError(str(exc)) from None
    try:
        agents, terms = num_agents(env), reward_term_names(env.metadata)
    except ValueError as exc:
        raise EnvSettingsError(str(exc)) from None
    return EnvInfo(as_dict_space(env.observation_space), env.action_space,
                   int(env.metadata.get("frameskip", 1)), agents, is_multi_agent(env),
                   tuple(plan.sources().items()), tuple(plan.left_out()), terms,
                   has_time_limit(env))


# What a layer of an env (the env or one of its wrappers) calls its time limit: fastrl's Doom
# envs say max_episode_steps, gymnasium's TimeLimit _max_episode_steps.
TIME_LIMIT_ATTRIBUTES = ("max_episode_steps", "_max_episode_steps")


def has_time_limit(env) -> bool:
    """Whether ``env`` declares a limit on its episodes' length: gymnasium's
    ``spec.max_episode_steps``, ALE's ``max_num_frames_per_episode`` (in its spec's kwargs:
    108,000 frames for every Atari id), or a positive ``max_episode_steps`` or
    ``_max_episode_steps`` of the env or of one of its wrappers (gymnasium's wrappers no longer
    pass attributes on, so each layer is looked at)."""
    layer, seen = env, set()
    while layer is not None and id(layer) not in seen:
        seen.add(id(layer))
        own = getattr(layer, "__dict__", {})
        if any(isinstance(own.get(name), int) and own[name] > 0
               for name in TIME_LIMIT_ATTRIBUTES):
            return True
        spec = own.get("spec") if not isinstance(layer, gym.Wrapper) else None
        if spec is not None and (spec.max_episode_steps
                                 or (spec.kwargs or {}).get("max_num_frames_per_episode")):
            return True
        layer = own.get("env")
    return False


def reward_term_names(metadata: dict) -> tuple[str, ...]:
    """The shaping terms an env names in its ``metadata`` (none: ``()``); each a non-empty
    string, no name twice."""
    names = metadata.get("reward_terms") or ()
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"metadata['reward_terms'] = {names!r}: must be a sequence of "
                         "non-empty names")
    names = tuple(names)
    if len(set(names)) != len(names):
        raise ValueError(f"metadata['reward_terms'] = {names!r}: a name appears twice")
    return names


def probe_env(settings: EnvSettings) -> EnvInfo:
    """Create one env to read its spaces, then close it."""
    env = create_env(settings)
    try:
        return env_info(env, settings.env_obs_layout)
    finally:
        env.close()
