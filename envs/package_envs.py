"""Env families of other packages, made by the ids their packages document: the table
``FAMILIES`` says which ids belong to which package, what to install for it (an extra of
fastrl's, ``pip install 'fastrl[popgym]'``), and what the family needs beyond
``gymnasium.make``:

- ``popgym-RepeatPreviousEasy-v0``, ``dm_control/cartpole-swingup-v0`` (through shimmy),
  ``highway-v0``, ``MiniGrid-Empty-5x5-v0``, ``MiniWorld-OneRoom-v0``... : the package is
  imported (it registers its ids with gymnasium), then the id goes through
  ``envs.gym_env.make_gym_env`` like any gymnasium id;
- ``CrafterReward-v1`` and ``CrafterNoReward-v1``: crafter registers them with the old
  ``gym`` only, so they are made by fastrl's adapter (``envs.crafter_env``);
- ``package:EnvId`` (``miniworld:MiniWorld-OneRoom-v0``, ``my_pkg:MyEnv-v0``): ``package``
  is imported, then ``EnvId`` made; the family of ``EnvId``, when it has one, applies too.

A package that is not installed, or that fails while it is imported (a version clash such as
dm_control 1.0.50 on mujoco 4), is one ``MissingExtraError`` line naming the install command;
an id the imported package does not register is an ``UnknownEnvError`` naming close ones.

A family of ``fastrl.env_registry.BUILTIN_FAMILIES``: :func:`match_env` is plain data and
imports nothing; the package is imported when an env is made.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import io
import re
import sys
from typing import Any, NamedTuple

FACTORY = "envs.package_envs:make_package_env"
CRAFTER_FACTORY = "envs.crafter_env:make_crafter_env"


class Family(NamedTuple):
    name: str
    prefixes: tuple[str, ...]  # the ids of the family begin with one of these
    module: str  # imported before an env is made (it registers the family's ids)
    install: str  # the command that installs it
    # Training settings for every id of the family (Config field names; flags override them).
    recommended: dict[str, Any] = {}
    # "module:attribute" of a factory of fastrl's for the family (else make_gym_env).
    factory: str | None = None
    # Lines the package prints to stdout while an env is made that say nothing to the user:
    # dropped (other lines pass), so that they do not fill the run's progress output.
    noise: tuple[str, ...] = ()
    # Renders with OpenGL: a failure to import or make it names the headless path.
    opengl: bool = False
    notes: str = ""  # for the docs' table


def _extra(name: str) -> str:
    return f"pip install -c constraints.txt -e '.[{name}]'"


# What to do when OpenGL cannot start (no display, no EGL driver, no context).
GL_HINT = ("without a display fastrl takes pyglet's headless EGL path (PYGLET_HEADLESS=True) "
           "and, for envs that render frames, MuJoCo's (MUJOCO_GL=egl), which need libEGL and a "
           "driver for it (apt-get install libegl1 libegl-mesa0, or the GPU's); else unset "
           "MUJOCO_GL (state-only MuJoCo envs need no OpenGL), set MUJOCO_GL=osmesa, or run "
           "under xvfb-run")
# Words of an error that is about OpenGL (not "GLIBC_2.38 not found").
_GL_WORDS = re.compile(r"EGL|OpenGL|GLFW|GLX|libGL\b|\bGL\b")


FAMILIES: tuple[Family, ...] = (
    Family("MiniGrid / BabyAI", ("MiniGrid-", "BabyAI-"), "minigrid", _extra("minigrid")),
    # MiniWorld renders its 3D frames with OpenGL through pyglet: without a display, the
    # registry chose pyglet's headless (EGL) path before anything imported pyglet
    # (fastrl.env_registry.use_headless_gl). Each env makes two frame buffers and prints a
    # line for each when the driver has fewer samples than it asks for (16 envs: 32 lines).
    Family("MiniWorld", ("MiniWorld-",), "miniworld", _extra("miniworld"),
           noise=("Falling back to num_samples=", "Falling back to non-multisampled"),
           opengl=True, notes="OpenGL; headless through EGL when DISPLAY is unset"),
    Family("highway-env", ("highway-", "merge-", "roundabout-", "parking-", "intersection-",
                           "racetrack-", "exit-", "two-way-", "lane-keeping-", "u-turn-"),
           "highway_env", _extra("highway"),
           # highway-v0 steps at 2-14 a second per core here (15 simulation frames, 50 cars,
           # in Python): the classic recipe's sync round of 2 x 8 envs x 64 steps took minutes
           # before the first update; 2 x 4 envs x 16 steps is one 128-step batch a round.
           recommended={"num_envs_per_worker": 4, "rollout": 16, "batch_size": 32,
                        "num_batches_per_epoch": 4},
           notes="slow steps (70-500 ms for highway-v0): 4 envs a worker, rollout 16"),
    Family("Crafter", ("CrafterReward-", "CrafterNoReward-"), "crafter", _extra("crafter"),
           factory=CRAFTER_FACTORY, notes="crafter registers with the old gym only: "
                                          "fastrl's adapter makes its two ids"),
    # POPGym's tasks are partially observed by design: a policy without memory stays at
    # random on them (RepeatPreviousEasy: -0.49 without a recurrent core, 0.13 after 28K
    # steps with one, issue 41). So the family asks for the GRU; the recipe follows the spaces.
    Family("POPGym", ("popgym-",), "popgym", _extra("popgym"), recommended={"use_rnn": True},
           notes="needs memory: --use_rnn True by default"),
    # shimmy gives dm_control's state as a Dict of vectors (cartpole: position, velocity),
    # which the continuous recipe's MLPs encoded apart: cartpole-swingup stayed at 200-225
    # (the pole never swung up) to 514K steps. As one vector (perf/log/RESULTS.md, "DeepMind
    # Control").
    Family("DeepMind Control (shimmy)", ("dm_control/",), "shimmy", _extra("dm_control"),
           recommended={"env_concat_vectors": True},
           notes="state observations as one vector (--env_concat_vectors); mujoco 3.17 "
                 "(constraints.txt)"),
    Family("Gymnasium-Robotics", ("Fetch", "AntMaze", "PointMaze", "Adroit", "FrankaKitchen"),
           "gymnasium_robotics", _extra("robotics")),
    # flappy-bird-gymnasium requires pygame, which shares its import name with the pygame-ce
    # that vizdoom requires: no extra, so that `pip install fastrl[...]` never installs both.
    Family("Flappy Bird", ("FlappyBird-",), "flappy_bird_gymnasium",
           "pip install flappy-bird-gymnasium", notes="no extra: it requires pygame, "
                                                      "which clashes with vizdoom's pygame-ce"),
)

# Packages that register their ids with the old ``gym`` only, with no gymnasium adapter in
# fastrl: the unknown-env error says so instead of offering close gymnasium ids.
OLD_GYM_ONLY: tuple[tuple[str, str], ...] = (("procgen-", "procgen"),)


def family_of(env_id: str) -> Family | None:
    """The family of ``env_id`` (a plain id, not ``package:EnvId``), None for none."""
    for family in FAMILIES:
        if env_id.startswith(family.prefixes):
            return family
    return None


def split_package(name: str) -> tuple[str | None, str]:
    """``package:EnvId`` as (package, EnvId); a plain id as (None, id)."""
    package, sep, env_id = name.partition(":")
    if sep and package and env_id:
        return package, env_id
    return None, name


def match_env(name: str) -> tuple[str, tuple, dict[str, Any]] | None:
    """The registry's row for an id of a known family or a ``package:EnvId``, else None."""
    package, env_id = split_package(name)
    family = family_of(env_id)
    if family is None and package is None:
        return None
    return FACTORY, (name,), dict(family.recommended) if family else {}


def suggestions() -> list[str]:
    return ["CrafterReward-v1", "CrafterNoReward-v1", "popgym-RepeatPreviousEasy-v0",
            "dm_control/cartpole-swingup-v0", "MiniWorld-OneRoom-v0", "highway-v0"]


def import_package(module: str, env_name: str, install: str, opengl: bool = False) -> None:
    """Import ``module`` for env ``env_name``; any failure is one ``MissingExtraError`` line
    naming ``install`` (not installed, or broken: a clash of versions shows as an
    AttributeError or an OSError while it is imported), or saying how to get OpenGL where
    that is what failed: the EGL that MUJOCO_GL names (dm_control loads it on import), a
    library of OpenGL's, or (``opengl``) any failure of pyglet's, whose context MiniWorld
    opens on import."""
    from fastrl.errors import MissingExtraError

    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name != module and \
                not module.startswith(exc.name + "."):
            raise MissingExtraError(f"env {env_name!r} needs {module}, which cannot import "
                                    f"{exc.name!r} (not installed): {install}") from None
        raise MissingExtraError(f"env {env_name!r} needs {module}, which is not installed: "
                                f"{install}") from None
    except Exception as exc:  # noqa: BLE001 - a package broken on import: say which and how
        how = f"OpenGL could not start: {GL_HINT}" if _is_gl_failure(exc, opengl) else \
            f"reinstall it with the pinned versions: {install}"
        raise MissingExtraError(f"env {env_name!r} needs {module}, which failed to import "
                                f"({_reason(exc)}); {how}") from None


def _reason(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _install_hint(module: str) -> str:
    for family in FAMILIES:
        if family.module == module:
            return family.install
    return f"pip install {module} (the package that provides it)"


class _DropNoise(io.TextIOBase):
    """A stdout that passes whole lines to ``target`` except those beginning with one of
    ``noise``."""

    def __init__(self, target, noise: tuple[str, ...]):
        self.target, self.noise, self.pending = target, noise, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not line.startswith(self.noise):
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.pending.startswith(self.noise):
            self.target.write(self.pending)
        self.pending = ""
        self.target.flush()


@contextlib.contextmanager
def dropping(noise: tuple[str, ...]):
    """Lines of ``noise`` printed inside the block are dropped (nothing changes without)."""
    if not noise:
        yield
        return
    quiet = _DropNoise(sys.stdout, noise)
    try:
        with contextlib.redirect_stdout(quiet):
            yield
    finally:
        quiet.flush()


def _unregistered(env_name: str, env_id: str, module: str):
    """The ``UnknownEnvError`` for an id that ``module`` (imported) does not register."""
    from gymnasium.envs.registration import registry

    from fastrl.errors import UnknownEnvError

    def home(entry_point) -> str:  # the module an id's entry point lives in
        return entry_point if isinstance(entry_point, str) else \
            getattr(entry_point, "__module__", "")

    top = module.split(".")[0]
    ids = [i for i in registry if home(registry[i].entry_point).startswith(top)] or \
        list(registry)
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
    hint = ("did you mean " + " or ".join(repr(c) for c in close) + "?") if close else \
        f"{module} registers {len(ids)} ids, e.g. {', '.join(sorted(ids)[:4])}."
    return UnknownEnvError(f"unknown env {env_name!r}: {module} is installed but registers "
                           f"no {env_id!r}; {hint}")


def make_package_env(name: str, **options: Any):
    """The env ``name`` of a known family or ``package:EnvId``: its package imported (one
    line naming the install command when that fails), then made by the family's factory or
    by ``envs.gym_env.make_gym_env`` (options as that takes them)."""
    import gymnasium as gym

    package, env_id = split_package(name)
    family = family_of(env_id)
    if package is None and family is not None:
        package = family.module
    install = family.install if family is not None and family.module == package else \
        _install_hint(package)
    opengl = family is not None and family.opengl
    import_package(package, name, install, opengl)
    if family is not None and family.factory is not None:
        module, attribute = family.factory.split(":")
        return getattr(importlib.import_module(module), attribute)(env_id, **options)
    from envs.gym_env import make_gym_env

    try:
        with dropping(family.noise if family is not None else ()):
            return make_gym_env(env_id, **options)
    except gym.error.UnregisteredEnv:
        raise _unregistered(name, env_id, package) from None
    except Exception as exc:
        if opengl and _is_gl_failure(exc, opengl):
            from fastrl.errors import MissingExtraError

            raise MissingExtraError(f"env {name!r} could not open an OpenGL context "
                                    f"({_reason(exc)}): {GL_HINT}") from None
        raise


def _is_gl_failure(exc: BaseException, opengl: bool = False) -> bool:
    """Whether ``exc`` says OpenGL is not to be had (no display, no EGL, no context): an
    ImportError or OSError about OpenGL, or (``opengl``: a family that renders through
    pyglet) an error of pyglet's or PyOpenGL's."""
    return opengl and type(exc).__module__.startswith(("pyglet", "OpenGL")) or \
        isinstance(exc, ImportError | OSError) and _GL_WORDS.search(str(exc)) is not None
