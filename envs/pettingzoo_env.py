"""PettingZoo's parallel API as fastrl multi-agent envs (the optional extra
``fastrl[pettingzoo]``; the contract: ``fastrl/sampling/agents.py``).

``--env pettingzoo:<module>`` names a module with a ``parallel_env(**kwargs)`` function:
``pettingzoo:mpe2.simple_spread_v3``, ``pettingzoo:pettingzoo.butterfly.pistonball_v6``;
a name that is not importable as it is is tried under ``pettingzoo.`` too
(``pettingzoo:butterfly.pistonball_v6``). A module with ``env()`` and no ``parallel_env()``
is a turn-based game: ``envs/pettingzoo_aec.py`` plays it (``pettingzoo:classic.connect_four_v3``).
:func:`match_env` is what the registry reads: it imports nothing; pettingzoo is imported when
such an env is made.

How PettingZoo's episodes map onto the contract:

- the agents are ``possible_agents``, in their order: agent ``a`` is ``possible_agents[a]``;
  every agent must have the same observation and action space (one policy acts for all);
- an agent whose ``terminations`` or ``truncations`` entry is true has ended its episode
  (``info["episode"]`` gives its return and length); while others go on it sits out
  (``info["inactive"]``: no sample, no action sent to PettingZoo);
- when no agent is left (``env.agents`` is empty) the env is reset at once, and every agent's
  next observation is the first of its next episode;
- an agent cut by a time limit (truncated, not terminated) keeps its last observation in
  ``info["final_obs"]`` for the learner's bootstrap;
- image observations ``uint8 [H, W, C]`` are given channel-first (``[C, H, W]``), as fastrl's
  image encoder expects; float observations as float32.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

PREFIX = "pettingzoo:"
FACTORY = "envs.pettingzoo_env:make_pettingzoo_env"
INSTALL_HINT = "pip install 'fastrl[pettingzoo]' (or the package that provides the module)"


# PettingZoo's classic board games (turn-based: envs/pettingzoo_aec.py, which gives their
# boards as images), measured on connect_four_v3 against a random player (600K steps each,
# 2 x 200 games per checkpoint): the classic recipe (sync PPO, no recurrent core) rather than
# the pixels one the image calls for; relu, as tanh convs took immediate wins half as often;
# an entropy bonus, as without one self-play settled into a few fixed lines (the critic told
# the winner from the first move) and met a random player's moves unprepared: 80-92% wins.
# A sync round (the recipe's 2 x 8 envs x 64 steps x 2 players) is cut into batches of 256
# by fastrl.config.recipes.fit_round, from the players the launcher's probe counts: 8.
CLASSIC_GAMES: dict[str, Any] = {"recipe": "classic", "nonlinearity": "relu",
                                 "exploration_loss_coeff": 0.03}
# Games of a few dozen turns at most: a discount of 0.9 a turn (0.81 a move of one's own)
# makes a win now worth more than the same win later, so the policy takes it and blocks the
# other's; with 0.99 it let wins wait, and blocked no more often than by chance (90-95% wins
# from 340K to 600K steps, against 85-97% with 0.99). Long games (chess, go) keep 0.99.
SHORT_GAMES: dict[str, Any] = {"gamma": 0.9}
_SHORT = ("connect_four", "tictactoe")


def match_env(name: str) -> tuple[str, tuple, dict[str, Any]] | None:
    """The registry's row for a ``pettingzoo:<module>`` name, None for any other name."""
    if not name.startswith(PREFIX):
        return None
    module = name[len(PREFIX):]
    if module.split(".")[-2:-1] != ["classic"]:
        return FACTORY, (module,), {}
    short = module.split(".")[-1].startswith(_SHORT)
    return FACTORY, (module,), {**CLASSIC_GAMES, **(SHORT_GAMES if short else {})}


def suggestions() -> list[str]:
    return ["pettingzoo:mpe2.simple_spread_v3"]


def _import_env_module(module: str):
    if not module:
        raise ValueError(f"env {PREFIX!r} names no module: use {PREFIX}<module>, e.g. "
                         f"{PREFIX}mpe2.simple_spread_v3")
    try:
        import pettingzoo  # noqa: F401 - the extra's package
    except ImportError as exc:
        from fastrl.errors import MissingExtraError

        raise MissingExtraError(f"env {PREFIX}{module} needs pettingzoo, which is not "
                                f"installed: {INSTALL_HINT}") from exc
    errors = []
    for candidate in (module, f"pettingzoo.{module}"):
        try:
            found = importlib.import_module(candidate)
        except ImportError as exc:
            if _exists(candidate):  # there, but a package it needs is not
                from fastrl.errors import MissingExtraError

                raise MissingExtraError(f"env {PREFIX}{module}: {_missing(candidate, exc)}"
                                        ) from None
            errors.append(f"{candidate}: {exc}")
            continue
        if not any(callable(getattr(found, f, None)) for f in ("parallel_env", "env")):
            raise ValueError(f"env {PREFIX}{module}: module {candidate} has no parallel_env() "
                             "and no env(); PettingZoo envs have one or both")
        return found
    from fastrl.errors import UnknownEnvError

    raise UnknownEnvError(f"env {PREFIX}{module}: no such module ({'; '.join(errors)}); "
                          f"{INSTALL_HINT}")


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # (a parent package that is not there)
        return False


def _missing(module: str, exc: ImportError) -> str:
    """One line for a module that is there but cannot be imported: the package it needs."""
    if not exc.name or module.startswith(exc.name):
        return f"module {module} needs what is not installed: {' '.join(str(exc).split())}"
    family = module.split(".")[1] if module.startswith("pettingzoo.") else None
    extra = f" (or pip install 'pettingzoo[{family}]')" if family else ""
    return (f"module {module} needs the package {exc.name!r}, which is not installed: "
            f"pip install {exc.name.split('.')[0]}{extra}")


def make_pettingzoo_env(module: str, *, frameskip: int | None = None,
                        max_episode_steps: int | None = None, render_mode: str | None = None,
                        env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """``parallel_env(**env_kwargs)`` of ``module`` as a multi-agent env, or its ``env()``
    when it has no ``parallel_env`` (a turn-based game). ``max_episode_steps`` is given as
    PettingZoo's ``max_cycles`` (a turn-based game: a limit on turns); ``frameskip`` must be
    None or 1."""
    kwargs = dict(env_kwargs or {})
    if frameskip not in (None, 1):
        raise ValueError(f"frameskip={frameskip!r} is not supported for PettingZoo envs: they "
                         "step one frame per agent step (use None or 1)")
    found = _import_env_module(module)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    turn_based = not callable(getattr(found, "parallel_env", None))
    if max_episode_steps is not None and not turn_based:
        kwargs["max_cycles"] = max_episode_steps
    try:  # (a game may import what it needs only here: Hanabi's open_spiel)
        env = found.env(**kwargs) if turn_based else found.parallel_env(**kwargs)
    except ImportError as exc:
        from fastrl.errors import MissingExtraError

        raise MissingExtraError(f"env {PREFIX}{module}: {_missing(found.__name__, exc)}") from None
    if turn_based:
        from envs.pettingzoo_aec import PettingZooAECEnv

        return PettingZooAECEnv(env, f"{PREFIX}{module}", max_episode_steps)
    return PettingZooEnv(env, f"{PREFIX}{module}")


def _agent_space(space: spaces.Space) -> tuple[spaces.Space, bool]:
    """The space fastrl sees for a PettingZoo observation space, and whether to transpose
    (an ``[H, W, C]`` uint8 image becomes ``[C, H, W]``)."""
    if isinstance(space, spaces.Box):
        if space.dtype == np.uint8 and len(space.shape) == 3:
            return spaces.Box(0, 255, (space.shape[2], *space.shape[:2]), np.uint8), True
        if np.issubdtype(space.dtype, np.floating):
            return spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                              space.shape, np.float32), False
    return space, False


class PettingZooEnv(gym.Env):
    """A PettingZoo ``ParallelEnv`` under fastrl's multi-agent contract (module docstring)."""

    def __init__(self, env, name: str):
        self.env = env
        self.name = name
        self.agent_ids = list(env.possible_agents)
        self.num_agents = len(self.agent_ids)
        from envs.pettingzoo_aec import check_one_space

        first = self.agent_ids[0]
        check_one_space(env, self.agent_ids, name)
        self.observation_space, self._transpose = _agent_space(env.observation_space(first))
        self.action_space = env.action_space(first)
        self.metadata = {**getattr(env, "metadata", {}), "frameskip": 1}
        self.render_mode = getattr(env, "render_mode", None)
        self._live: set[str] = set()
        self._last_obs: list = [None] * self.num_agents
        self._returns = np.zeros(self.num_agents)
        self._lengths = np.zeros(self.num_agents, dtype=np.int64)

    def _obs(self, obs: Any) -> Any:
        if self._transpose:
            return np.ascontiguousarray(np.moveaxis(obs, -1, 0))
        if isinstance(obs, np.ndarray) and obs.dtype == np.float64:
            return obs.astype(np.float32)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, infos = self.env.reset(seed=seed, options=options)
        self._live = set(self.env.agents)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._last_obs = [self._obs(obs[a]) for a in self.agent_ids]
        return list(self._last_obs), [dict(infos.get(a, {})) for a in self.agent_ids]

    def step(self, actions):
        live = self._live
        sent = {a: actions[k] for k, a in enumerate(self.agent_ids) if a in live}
        obs, rewards, terminations, truncations, infos = self.env.step(sent)
        n = self.num_agents
        out_rewards, terminated, truncated = [0.0] * n, [False] * n, [False] * n
        out_infos: list[dict] = []
        for k, a in enumerate(self.agent_ids):
            if a not in sent:
                out_infos.append({"inactive": True})
                continue
            info = dict(infos.get(a, {}))
            if a in obs:
                self._last_obs[k] = self._obs(obs[a])
            reward = rewards.get(a, 0.0)
            out_rewards[k] = reward
            self._returns[k] += reward
            self._lengths[k] += 1
            terminated[k] = bool(terminations.get(a, False))
            truncated[k] = bool(truncations.get(a, False))
            if terminated[k] or truncated[k]:
                live.discard(a)
                info["episode"] = {"r": float(self._returns[k]), "l": int(self._lengths[k])}
                if truncated[k] and not terminated[k]:
                    info["final_obs"] = self._last_obs[k]
            out_infos.append(info)
        if not live or not self.env.agents:  # the episode is over for every agent
            next_obs, _ = self.reset()
        else:
            next_obs = list(self._last_obs)
        return next_obs, out_rewards, terminated, truncated, out_infos

    def render(self):
        return self.env.render()

    def close(self):
        self.env.close()
