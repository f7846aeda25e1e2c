"""Environment registry: a name plus a factory.

```python
from fastrl.env_registry import make_env, register_env

env = make_env("doom_basic", frameskip=4)      # a built-in VizDoom scenario
env = make_env("CartPole-v1")                  # any gymnasium id works too
env = make_env("MiniGrid-Empty-5x5-v0")        # imports minigrid first (a known family)
env = make_env("minigrid:MiniGrid-Empty-5x5-v0")  # any package: imported, then the id made
register_env("my_env", lambda **options: MyEnv(**options), recommended={"reward_scale": 0.1})
env = make_env("my_env")
```

An entry may carry recommended training settings (``Config`` field names and values: reward
scale, time limit, model...). ``train.py`` applies them unless the same flag is given.

Built-in names come from a static table of env families (``BUILTIN_FAMILIES``): each is a
plain-data module of `envs` whose ``builtin_envs()`` gives name -> (factory, recommended
settings), and/or whose ``match_env(name)`` recognises a whole family of names by their form
(the Atari ids ``ALE/<Game>-v5``, the ids of other packages' families in
``envs.package_envs``...). It is read the first time a name is looked up; reading it imports
no simulator (vizdoom loads when a doom env is made, ale_py when an Atari env is) and nothing
of fastrl, so there is no import circle.

Without a display, making an env first chooses the headless OpenGL paths
(:func:`use_headless_gl`), so that envs rendering through pyglet or MuJoCo run on a server
(MuJoCo's only when the env renders frames: its ``render_mode``).

Options are passed to the factory as keyword arguments. When the factory's signature
does not accept an option, an option left at None is dropped and any other value is a
`ValueError` naming it and listing the options the factory supports.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import registry as gym_registry

from fastrl.errors import MissingExtraError, UnknownEnvError  # noqa: F401 - raised by envs too

EnvFactory = Callable[..., gym.Env]

# Modules of env families built into fastrl, each with ``builtin_envs()``: name -> (factory as
# "module:attribute", leading arguments, recommended settings), and/or ``match_env(name)``:
# that row for a name of the family's form, else None (for families named by a pattern, whose
# names are not listed by ``registered_envs``; matched before gymnasium's registry).
BUILTIN_FAMILIES = ("envs.doom_scenarios", "envs.atari_games", "envs.pettingzoo_env",
                    "envs.memory_tasks", "envs.package_envs")
# Any gymnasium id, through the adapter; the frame-stacking wrapper for --env_framestack, the
# one that joins vectors for --env_concat_vectors, and the one that makes an env anew for
# --env_recycle_episodes and --env_recycle_mb.
GYM_FACTORY = "envs.gym_env:make_gym_env"
FRAMESTACK = "envs.wrappers:FrameStack"
CONCAT = "envs.wrappers:ConcatVectors"
RECYCLE = "envs.wrappers:Recycle"


class _LazyFactory:
    """A factory named by ``"module:attribute"``, imported when it is first needed."""

    def __init__(self, target: str, args: tuple):
        self.target = target
        self.args = args

    def resolve(self) -> EnvFactory:
        module, attribute = self.target.split(":")
        return functools.partial(getattr(importlib.import_module(module), attribute), *self.args)

    def __call__(self, **options: Any) -> gym.Env:
        return self.resolve()(**options)


# Names registered with register_env: name -> (factory, recommended settings).
_REGISTRY: dict[str, tuple[EnvFactory, dict[str, Any]]] = {}


@functools.cache
def _families() -> tuple[Any, ...]:
    return tuple(importlib.import_module(module) for module in BUILTIN_FAMILIES)


@functools.cache
def _builtins() -> dict[str, tuple[EnvFactory, dict[str, Any]]]:
    table: dict[str, tuple[EnvFactory, dict[str, Any]]] = {}
    for family in _families():
        rows = family.builtin_envs() if hasattr(family, "builtin_envs") else {}
        for name, (target, args, recommended) in rows.items():
            table[name] = (_LazyFactory(target, args), recommended)
    return table


def _matched(name: str) -> tuple[EnvFactory, dict[str, Any]] | None:
    for family in _families():
        row = family.match_env(name) if hasattr(family, "match_env") else None
        if row is not None:
            target, args, recommended = row
            return _LazyFactory(target, args), recommended
    return None


def _entry(name: str) -> tuple[EnvFactory, dict[str, Any]] | None:
    return _REGISTRY.get(name) or _builtins().get(name) or _matched(name)


def register_env(name: str, factory: EnvFactory, *, recommended: dict[str, Any] | None = None,
                 overwrite: bool = False) -> None:
    """Register `factory(**options) -> gymnasium.Env` under `name`, with the training
    settings recommended for it (`recommended`, Config field names; flags override them).

    A name can be registered once (built-in names included); pass `overwrite=True` to
    replace an existing entry. With multiprocessing "spawn", register at import time of a
    module the worker processes also import (not under `if __name__ == "__main__":`).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"env name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for {name!r} must be callable, got {factory!r}")
    existing = _entry(name)
    if existing is not None and not overwrite and existing[0] is not factory:
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = (factory, dict(recommended or {}))


# Gymnasium ids with measured recommendations (perf/log/RESULTS.md, "Learning"), over the recipe
# for their kind (fastrl.config.recipes). CartPole learned the classic recipe first; its
# rewards of 1 per step are scaled to 0.1.
_GYM_RECOMMENDED: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"recipe": "classic", "reward_scale": 0.1},
    # Ten passes over each batch (the classic recipe's 4) in minibatches of 128 (the recipe's
    # 256): 80 SGD steps a batch of 1,024. The suite's -80 within 300K steps, seeds 1-15: serial
    # mode 15 of 15 (ten passes of 256: 10 of 15, the same seeds; serial runs repeat), parallel
    # 13 of 15 (13 of 15); the mark a median 193K steps in (270K), but more ends over 5% under
    # their best (8 of 15 serial, against 5) (perf/log/RESULTS.md, "Acrobot's minibatches",
    # 2026-11-28; four passes of 256: 2 of 6 in parallel mode).
    "Acrobot-v1": {"num_epochs": 10, "batch_size": 128, "num_batches_per_epoch": 8},
}
# MuJoCo control tasks (the optional extra fastrl[mujoco]): the continuous recipe, measured
# on Hopper-v5 (perf/log/RESULTS.md, "Continuous control").
_MUJOCO_TASKS = ("Ant", "HalfCheetah", "Hopper", "Humanoid", "HumanoidStandup",
                 "InvertedDoublePendulum", "InvertedPendulum", "Pusher", "Reacher", "Swimmer",
                 "Walker2d")
_GYM_RECOMMENDED.update({f"{task}-v{v}": {"recipe": "continuous"}
                         for task in _MUJOCO_TASKS for v in (4, 5)})
# HalfCheetah's Gaussian starts at std exp(-2) = 0.14 (rl-baselines3-zoo's initial log-std
# for it): 3 seeds passed 4,000 within 1M steps, where std 1 ended at 1,675-2,952. It stays
# HalfCheetah's alone: Hopper learned far slower with it and Walker2d no better
# (perf/log/RESULTS.md, "HalfCheetah's initial log-std").
for _v in (4, 5):
    _GYM_RECOMMENDED[f"HalfCheetah-v{_v}"]["action_init_log_std"] = -2.0
# MountainCarContinuous explores with state-dependent noise (fastrl/sampling/sde.py): with
# independent noise every step, a run that has not found the flag within about 50K steps
# learns to stand still (2 seeds of 3 did); held noise swings the car (perf/log/RESULTS.md,
# "MountainCarContinuous with state-dependent exploration"). Each env keeps its matrix for
# 1,000 steps (an episode, at most 999): in parallel mode 7 of 9 seeds passed 85 within 100K
# steps with it, 2 of 6 with the default 64 (serial: 3 of 3 with either; perf/log/RESULTS.md,
# "MountainCarContinuous's noise held for an episode", 2026-11-28).
_GYM_RECOMMENDED["MountainCarContinuous-v0"] = {"action_log_std": "sde",
                                                "action_noise_every": 1000}


def recommended_settings(name: str) -> dict[str, Any]:
    """The training settings recommended for env `name` (empty for an unknown name)."""
    entry = _entry(name)
    if entry is not None:
        return dict(entry[1])
    return dict(_GYM_RECOMMENDED.get(name, {}))


def declared_spaces(name: str, settings: Any = None
                    ) -> tuple[gym.Space, gym.Space, int] | None:
    """(observation space, action space, agents) of a built-in family's env ``name`` whose
    module declares them (``spaces_for_budget(name, settings)``: VizDoom, Atari; ``settings``:
    the run's ``fastrl.sampling.env_setup.EnvSettings``, None for the env's default options),
    known without making it; None for any other name (a name given to :func:`register_env`
    included)."""
    if name in _REGISTRY:
        return None
    for family in _families():
        declared = getattr(family, "spaces_for_budget", None)
        row = declared(name, settings) if declared is not None else None
        if row is not None:
            return row
    return None


def registered_envs() -> list[str]:
    """Sorted names registered with fastrl (built-ins included; gymnasium ids not listed)."""
    return sorted({*_builtins(), *_REGISTRY})


def _gym_ids() -> list[str]:
    return list(gym_registry.keys())


def _is_gym_id(name: str) -> bool:
    # A "package:EnvId" never gets here: envs.package_envs.match_env claims every name with
    # a package and an id around its colon (it imports the package, then makes the id).
    return name in gym_registry


def use_headless_gl(environ: MutableMapping[str, str] = os.environ, render: bool = False
                    ) -> list[str]:
    """On a machine without a display (``DISPLAY`` and ``WAYLAND_DISPLAY`` unset), choose the
    headless OpenGL paths before an env imports its renderer, unless the variable is set
    already: ``PYGLET_HEADLESS=True`` (pyglet renders through EGL: MiniWorld's observations)
    and, when frames are to be rendered (``render``: a ``render_mode`` such as ``rgb_array``,
    enjoy.py's video) and libEGL is installed, ``MUJOCO_GL=egl`` (MuJoCo and dm_control;
    unset, they try GLFW first, which needs a display). State-only MuJoCo envs keep
    MUJOCO_GL unset: dm_control imports the backend it names when it is imported, and an EGL
    that cannot start (libglvnd's libEGL without a driver, in a container) would fail it,
    where unset it falls back. Returns the names set. A pyglet imported already, with no
    window module yet, is switched too; one with a window module can no longer switch (the
    env then fails in one line that says how: ``envs.package_envs.GL_HINT``)."""
    if environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return []
    chosen = {"PYGLET_HEADLESS": "True"}
    if render and _has_egl():
        chosen["MUJOCO_GL"] = "egl"
    set_now = [name for name in chosen if name not in environ]
    for name in set_now:
        environ[name] = chosen[name]
    pyglet = sys.modules.get("pyglet")
    if "PYGLET_HEADLESS" in set_now and environ is os.environ and pyglet is not None and \
            "pyglet.window" not in sys.modules:
        pyglet.options["headless"] = True
    return set_now


def renders_frames(options: dict[str, Any]) -> bool:
    """Whether an env made with ``options`` renders frames off screen (its ``render_mode``
    is one of gymnasium's arrays: ``rgb_array``, ``depth_array``...)."""
    mode = options.get("render_mode")
    return isinstance(mode, str) and mode.endswith(("_array", "_array_list"))


EGL_LIBRARY = "libEGL.so.1"


@functools.cache
def _has_egl() -> bool:
    """Whether the dynamic loader finds libEGL: in its cache (what ``ldconfig -p`` lists; read
    as a file, since ``ctypes.util.find_library`` starts a process) or in LD_LIBRARY_PATH."""
    folders = [f for f in os.environ.get("LD_LIBRARY_PATH", "").split(":") if f]
    if any(os.path.exists(os.path.join(f, EGL_LIBRARY)) for f in folders):
        return True
    try:
        with open("/etc/ld.so.cache", "rb") as fh:
            return EGL_LIBRARY.encode() in fh.read()
    except OSError:
        return False


def import_env_packages(names: str | list[str], render: bool = False) -> None:
    """Import each package of ``names`` (``--env_packages``: comma-separated module names),
    so that the gymnasium ids they register on import can be made (``render``: for an env
    that renders frames, :func:`use_headless_gl`). A package that cannot be imported, or
    fails while it is, is an ``UnknownEnvError`` naming it (one line)."""
    if isinstance(names, str):
        names = names.split(",")
    names = [n.strip() for n in names if n.strip()]
    if names:
        use_headless_gl(render=render)
    for module in names:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - ImportError, or a package broken on import
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise UnknownEnvError(f"--env_packages {module}: cannot import it ({reason})"
                                  ) from None


def _old_gym_hint(name: str) -> str | None:
    """What to say about an id that only the old ``gym`` registers (a family of
    ``OLD_GYM_ONLY`` in an env module, or an id in an installed gym's registry)."""
    for family in _families():
        for prefix, package in getattr(family, "OLD_GYM_ONLY", ()):
            if name.startswith(prefix):
                return f"{package} registers its ids with the old gym package only"
    try:
        import gym as old_gym  # only where it is installed

        registered = name in old_gym.envs.registry
    except Exception:  # noqa: BLE001 - no gym, or one that does not import under this numpy
        return None
    return f"{name!r} is registered with the old gym package only" if registered else None


def _family_suggestions() -> list[str]:
    """Names of pattern families worth suggesting (e.g. 'ALE/Pong-v5' for 'pong-v5')."""
    return [n for f in _families() if hasattr(f, "suggestions") for n in f.suggestions()]


def _unknown_env_error(name: str) -> UnknownEnvError:
    fastrl_names = registered_envs()
    candidates = fastrl_names + [i for i in [*_gym_ids(), *_family_suggestions()]
                                 if i not in fastrl_names]
    by_lower: dict[str, str] = {}
    for c in candidates:
        by_lower.setdefault(c.lower(), c)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = (
        "did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?"
        if close
        else f"registered: {', '.join(fastrl_names)}."
    )
    old_gym = _old_gym_hint(name)
    if old_gym is not None:
        hint = (f"{old_gym}, not with gymnasium, whose envs fastrl makes: wrap it in an "
                "adapter to gymnasium's API and register that with fastrl.register_env "
                "(envs/crafter_env.py is one).")
    return UnknownEnvError(
        f"unknown env {name!r}: {hint} Any gymnasium id (e.g. 'CartPole-v1') works too, "
        "Atari games as 'ALE/<Game>-v5' (with ale-py installed), and the envs another package "
        "registers as 'package:EnvId' (e.g. 'minigrid:MiniGrid-Empty-5x5-v0') or with "
        "--env_packages package."
    )


def _accepted_options(factory: EnvFactory) -> tuple[list[str], bool]:
    """Keyword names the factory accepts, and whether it takes **kwargs."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # some builtins/C callables have no signature
        return [], True
    names = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _filter_options(name: str, factory: EnvFactory, options: dict[str, Any]) -> dict[str, Any]:
    if isinstance(factory, _LazyFactory):
        factory = factory.resolve()
    accepted, takes_any = _accepted_options(factory)
    if takes_any:
        return options
    unsupported = sorted(k for k, v in options.items() if k not in accepted and v is not None)
    if unsupported:
        raise ValueError(
            f"env {name!r} does not support option(s) {', '.join(unsupported)}; "
            f"supported: {', '.join(accepted) or '(none)'}"
        )
    return {k: v for k, v in options.items() if k in accepted}


def _gym_factory(env_id: str) -> EnvFactory:
    return _LazyFactory(GYM_FACTORY, (env_id,)).resolve()


def stack_frames(env: gym.Env, num_frames: int) -> gym.Env:
    """``env`` with its image observations stacked over the last ``num_frames`` steps."""
    return _LazyFactory(FRAMESTACK, (env, num_frames)).resolve()()


def concat_vectors(env: gym.Env, keys: list[str] | tuple[str, ...] = ()) -> gym.Env:
    """``env`` with its observation made of vectors (only ``keys``, when given) as one vector
    (a ``ValueError`` naming what is not a vector, or a key it does not have)."""
    return _LazyFactory(CONCAT, (env,)).resolve()(keys=tuple(keys))


def recycles(env: gym.Env) -> int:
    """How many times ``env`` was made anew at an episode boundary: the count of the
    ``envs.wrappers.Recycle`` among its wrappers; 0 for an env that is not recycled (an env's
    own attribute of that name is not read)."""
    module, name = RECYCLE.split(":")
    wrappers = sys.modules.get(module)
    if wrappers is None:  # not imported: no env of this process is recycled
        return 0
    recycle = getattr(wrappers, name)
    for _ in range(1000):  # (a wrapper chain that loops back on itself ends too)
        if isinstance(env, recycle):
            return int(env.recycled)
        if not isinstance(env, gym.Wrapper):
            return 0
        env = env.env
    return 0


def recycle_env(env: gym.Env, factory: Callable[[], gym.Env], **limits: Any) -> gym.Env:
    """``env``, made anew by ``factory`` at an episode boundary within ``limits`` (``episodes``,
    ``max_rss``: see ``envs.wrappers.Recycle``; a ``ValueError`` for a bound it starts above)."""
    return _LazyFactory(RECYCLE, (env, factory)).resolve()(**limits)


def make_env(name: str, **options: Any) -> gym.Env:
    """Build the env registered as `name` (or the gymnasium env with that id).

    Raises `UnknownEnvError` (a `ValueError`) listing close matches when `name` is
    unknown, and `ValueError` for an option the factory does not support.
    """
    use_headless_gl(render=renders_frames(options))
    entry = _entry(name) if isinstance(name, str) else None
    factory = entry[0] if entry is not None else None
    if factory is None:
        if not isinstance(name, str) or not _is_gym_id(name):
            raise _unknown_env_error(str(name))
        factory = _gym_factory(name)
    env = factory(**_filter_options(name, factory, options))
    if not isinstance(env, gym.Env):
        raise TypeError(f"factory for {name!r} returned {type(env).__name__}, not a gymnasium.Env")
    if "frameskip" not in env.metadata:
        # Copy rather than mutate: metadata is often a dict shared by the class.
        env.metadata = {**env.metadata, "frameskip": 1}
    return env


# The multi-agent contract (fastrl/sampling/agents.py) as far as telling such an env apart:
# here, without torch, for env adapters and the launcher's probe of an env, which read it
# before train.py imports torch.
INACTIVE = "inactive"  # infos[a][INACTIVE] = True: agent a has no step this time
FINAL_OBS = "final_obs"  # infos[a][FINAL_OBS]: agent a's last observation at a time limit


def is_multi_agent(env: Any) -> bool:
    """Whether ``env`` follows the multi-agent contract (an int ``num_agents``)."""
    n = getattr(env, "num_agents", None)
    return isinstance(n, int) and not isinstance(n, bool)


def num_agents(env: Any) -> int:
    """How many agents ``env`` controls: its ``num_agents``, 1 for a single-agent env;
    ``ValueError`` naming the value when it is not a positive int."""
    if not hasattr(env, "num_agents"):
        return 1
    n = env.num_agents
    if not is_multi_agent(env) or n < 1:
        raise ValueError(f"the env's num_agents={n!r}: must be an int of 1 or more")
    return n
