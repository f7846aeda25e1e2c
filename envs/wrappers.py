"""Wrappers fastrl applies to any env from the command line."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fastrl.policy.obs import ACTION_MASK_KEY as MASK_KEY  # never stacked
from fastrl.policy.obs import obs_to_dict
from fastrl.transport.procs import rss_bytes


class FrameStack(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """The last ``k`` observations, concatenated along the first axis: a ``uint8 [C, H, W]``
    image becomes ``[k * C, H, W]`` and a vector ``[N]`` becomes ``[k * N]``, oldest first,
    so the feed-forward encoders see motion. After a reset the stack holds ``k`` copies of
    the first observation. For a ``Dict`` observation every key is stacked except an
    ``action_mask``, which stays the current one.
    """

    def __init__(self, env: gym.Env, k: int):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"frame stack must be a positive int, got {k!r}")
        gym.utils.RecordConstructorArgs.__init__(self, k=k)
        gym.Wrapper.__init__(self, env)
        self.k = k
        base = env.observation_space
        self._dict = isinstance(base, spaces.Dict)
        inner = dict(base.spaces) if self._dict else {"obs": base}
        stacked = {}
        for key, space in inner.items():
            if key == MASK_KEY:
                stacked[key] = space
                continue
            if not isinstance(space, spaces.Box) or len(space.shape) not in (1, 3):
                raise ValueError(f"frame stacking needs Box observations of shape [N] or "
                                 f"[C, H, W]; key {key!r} is {space}")
            reps = (k,) + (1,) * (len(space.shape) - 1)
            stacked[key] = spaces.Box(np.tile(space.low, reps), np.tile(space.high, reps),
                                      dtype=space.dtype)
        self.observation_space = spaces.Dict(stacked) if self._dict else stacked["obs"]
        self._frames = {key: deque(maxlen=k) for key in stacked if key != MASK_KEY}

    def _stacked(self, obs):
        parts = obs_to_dict(obs)
        out = {}
        for key, value in parts.items():
            if key == MASK_KEY:
                out[key] = value
                continue
            frames = self._frames[key]
            frames.append(np.asarray(value))
            out[key] = np.concatenate(list(frames), axis=0)
        return out if self._dict else out["obs"]

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        parts = obs_to_dict(obs)
        for key, frames in self._frames.items():
            frames.clear()
            frames.extend([np.asarray(parts[key])] * (self.k - 1))
        return self._stacked(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._stacked(obs), reward, terminated, truncated, info


class ConcatVectors(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """A ``Dict`` (or ``Tuple``, nested) observation whose leaves are all numeric ``Box``es
    (scalars, vectors, matrices: each flattened), as one float32 vector ``[N]``: the leaves
    concatenated in the space's order. A feed-forward model encodes each key of a ``Dict``
    with an MLP of its own and mixes them only in its linear heads, so its action and value
    are sums of one function of each key; one vector lets the MLP combine them (dm_control's
    ``position`` and ``velocity``: swinging a pole up needs the product of its angle and its
    angular velocity). ``keys`` (``--obs_keys``: leaf names, ``a.b`` for a nested one) joins
    only those. A leaf of any other kind (an image, a ``Discrete``) is a ``ValueError``
    naming it.
    """

    def __init__(self, env: gym.Env, keys: list[str] | tuple[str, ...] = ()):
        gym.utils.RecordConstructorArgs.__init__(self, keys=tuple(keys))
        gym.ObservationWrapper.__init__(self, env)
        leaves = list(_box_leaves(env.observation_space, "obs"))
        names = [name for name, _ in leaves]
        unknown = [k for k in keys if k not in names]
        if unknown:
            raise ValueError(f"obs_keys {','.join(unknown)}: no such observation key; the env "
                             f"has {', '.join(names)}")
        self._chosen = [not keys or name in keys for name in names]
        leaves = [leaf for leaf, chosen in zip(leaves, self._chosen) if chosen]
        from fastrl.policy.spaces import is_image

        bad = [f"{name} ({space})" for name, space in leaves
               if not isinstance(space, spaces.Box) or not np.issubdtype(space.dtype, np.number)
               or is_image(space)]
        if bad or not leaves:
            raise ValueError(f"only observations made of vectors can be concatenated into "
                             f"one; this one has {', '.join(bad) or 'no leaf'}")
        self._leaves = leaves
        low = np.concatenate([np.broadcast_to(s.low, s.shape).reshape(-1) for _, s in leaves])
        high = np.concatenate([np.broadcast_to(s.high, s.shape).reshape(-1) for _, s in leaves])
        self.observation_space = spaces.Box(low.astype(np.float32), high.astype(np.float32),
                                            dtype=np.float32)

    def observation(self, observation):
        from fastrl.errors import EnvOutputError

        try:
            values = [leaf for leaf, chosen in
                      zip(_obs_leaves(observation, self.env.observation_space), self._chosen,
                          strict=True) if chosen]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EnvOutputError(f"the env returned an observation that does not fit its "
                                 f"space {self.env.observation_space} ({exc!r})",
                                 "obs_missing") from None
        parts = []
        for (name, space), value in zip(self._leaves, values, strict=True):
            part = np.asarray(value, np.float32).reshape(-1)
            if part.size != int(np.prod(space.shape)):  # (each key: a total that fits is not)
                raise EnvOutputError(f"the env returned the observation {name!r} with "
                                     f"{part.size} numbers, expected shape {space.shape}",
                                     "obs_shape")
            parts.append(part)
        return np.concatenate(parts)


def _box_leaves(space: spaces.Space, name: str):
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _box_leaves(sub, f"{name}.{key}" if name != "obs" else str(key))
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _box_leaves(sub, f"{name}.{i}")
    else:
        yield name, space


def _obs_leaves(obs, space: spaces.Space):
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _obs_leaves(obs[key], sub)
    elif isinstance(space, spaces.Tuple):
        for item, sub in zip(obs, space.spaces, strict=True):
            yield from _obs_leaves(item, sub)
    else:
        yield obs


def engine_rss(env: gym.Env) -> int:
    """Bytes of resident memory held by the processes ``env`` runs (the ``engine_pids()`` of
    the env underneath its wrappers: a VizDoom engine); 0 for processes already gone."""
    return sum(rss_bytes(pid) or 0 for pid in env.unwrapped.engine_pids())


_SAID_BOUND_OFF = False  # Recycle's one line about a bound turned off, once per process


class Recycle(gym.Wrapper):
    """``env``, made anew by ``factory`` at an episode boundary once it has started
    ``episodes`` episodes (0: never) or once the processes it runs hold more than ``max_rss``
    bytes (``rss(env)``, by default :func:`engine_rss`; 0: no bound), so that a simulator whose
    engine grows with every episode (VizDoom) stays bounded over a run of days.

    It happens inside ``reset``, where a new episode begins anyway: the old env is closed (its
    engine process ends with it), the new one is reset and its first observation is the
    reset's. The caller sees an ordinary reset, so an episode in progress loses nothing, and
    what follows a reset (recurrent state, frame stacks) starts afresh as at any episode.
    A new env's first reset without a seed is seeded from the last seed given to ``reset``
    and the count of envs made since (a seeded run stays reproducible, and envs of different
    seeds stay apart); with no seed ever given, the new env seeds itself (VizDoom: at random).
    The period counts the episodes since the env was made or last given a seed, so a
    sequence of episodes that begins with a seeded reset (an evaluation) recycles at the
    same episodes each time and plays the same episodes.

    A bound that an env's processes pass after their first episode would remake the env at
    every episode: the bound is then turned off for this env, said in one line (once per
    process). A new env that cannot be made leaves the wrapper without one: the next reset
    tries again (never the closed env).
    ``recycled`` counts the envs made anew.
    """

    def __init__(self, env: gym.Env, factory: Callable[[], gym.Env], *, episodes: int = 0,
                 max_rss: int = 0, rss: Callable[[gym.Env], int] | None = None):
        super().__init__(env)
        self._factory = factory
        self.episodes = episodes
        self.max_rss = max_rss
        self._rss = engine_rss if rss is None else rss
        self.started = 0  # episodes begun since the current env was made or last seeded
        self.played = 0  # episodes the current env has begun
        self.recycled = 0
        self._closed = False  # the old env is closed and no new one could be made yet
        self._seed: int | None = None
        self._since_seed = 0  # envs made since the last seed given
        if max_rss:
            fresh = self._rss(env)
            if fresh > max_rss:  # (it would be recreated at every episode)
                raise ValueError(f"a new env's processes already hold {fresh / 2**20:.0f} MB, "
                                 f"above the bound of {max_rss / 2**20:.0f} MB")

    def due(self) -> bool:
        """Whether the next reset makes the env anew."""
        if self.episodes and self.started >= self.episodes:
            return True
        return bool(self.max_rss) and self._rss(self.env) > self.max_rss

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._seed, self._since_seed, self.started = seed, 0, 0
        if self.played == 1 and self.max_rss:
            self._check_bound()
        if self._closed or (self.started and self.due()):
            if not self._closed:
                self.env.close()
                self._closed = True
            self.env = self._factory()  # raises: the next reset tries again
            self._closed = False
            self.started = self.played = 0
            self.recycled += 1
            self._since_seed += 1
            if seed is None and self._seed is not None:
                entropy = (int(self._seed), self._since_seed)
                seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        self.started += 1
        self.played += 1
        return self.env.reset(seed=seed, options=options)

    def _check_bound(self) -> None:
        """After the env's first episode: a bound its processes already pass is turned off."""
        held = self._rss(self.env)
        if held > self.max_rss:
            global _SAID_BOUND_OFF
            if not _SAID_BOUND_OFF:
                _SAID_BOUND_OFF = True
                from fastrl.log import log

                log(f"--env_recycle_mb={self.max_rss / 2**20:g}: a new env's processes hold "
                    f"{held / 2**20:.1f} MB after one episode, above the bound, which would "
                    "remake the env at every episode; the bound is off for such envs (set it "
                    f"well above {held / 2**20:.0f} MB)")
            self.max_rss = 0

