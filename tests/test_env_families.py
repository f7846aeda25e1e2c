"""Envs of other packages by the ids their packages document (``envs/package_envs.py``), the
Crafter adapter (``envs/crafter_env.py``), the headless OpenGL switch, and the one line that
an import failure of a family's package is. Tests of the real packages skip where they are
not installed (CI installs ``.[dev]`` only); the fakes here play them everywhere else."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections import namedtuple

import numpy as np
import pytest

from envs import crafter_env, package_envs
from fastrl import env_registry
from fastrl.env_registry import (
    MissingExtraError,
    UnknownEnvError,
    make_env,
    recommended_settings,
    use_headless_gl,
)
from fastrl.run_config import parse_config


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ----- ids ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "popgym-RepeatPreviousEasy-v0", "dm_control/cartpole-swingup-v0", "highway-v0",
    "intersection-v1", "CrafterReward-v1", "CrafterNoReward-v1", "MiniWorld-OneRoom-v0",
    "MiniGrid-Empty-5x5-v0", "miniworld:MiniWorld-OneRoom-v0", "some_pkg:Some-v0",
])
def test_family_ids_and_package_ids_go_to_the_package_factory(name):
    row = package_envs.match_env(name)
    assert row is not None and row[0] == package_envs.FACTORY and row[1] == (name,)


@pytest.mark.parametrize("name", ["CartPole-v1", "doom_basic", ":Foo-v0", "Foo:", "popgym"])
def test_other_names_are_not_the_familys(name):
    assert package_envs.match_env(name) is None


def test_popgym_recommends_memory_and_the_classic_recipe_keeps_none(tmp_path):
    """A bare command on a POPGym task gets a recurrent core (it stays at random without);
    a flag still wins, and the classic recipe of other vector envs is unchanged."""
    assert recommended_settings("popgym-RepeatPreviousEasy-v0") == {"use_rnn": True}
    assert recommended_settings("popgym:popgym-RepeatPreviousEasy-v0") == {"use_rnn": True}
    base = ["--train_dir", str(tmp_path), "--experiment", "x"]
    assert parse_config([*base, "--env", "popgym-RepeatPreviousEasy-v0"]).use_rnn is True
    flag = parse_config([*base, "--env", "popgym-RepeatPreviousEasy-v0", "--use_rnn", "False"])
    assert flag.use_rnn is False
    cartpole = parse_config([*base, "--env", "Acrobot-v1"])
    assert cartpole.recipe == "classic" and cartpole.use_rnn is False


def test_the_recipe_line_says_what_the_family_recommends():
    from gymnasium.spaces import Discrete

    from fastrl.sampling.env_probe import recipe_line

    line = recipe_line("popgym-RepeatPreviousEasy-v0", "classic", Discrete(4), Discrete(4))
    assert "popgym-RepeatPreviousEasy-v0's registry entry recommends use_rnn=True" in line


# ----- one line when a package cannot be imported ------------------------------------------

def _family(monkeypatch, prefix, module, install, **fields):
    monkeypatch.setattr(package_envs, "FAMILIES", (
        package_envs.Family(module, (prefix,), module, install, **fields),))


def _module_file(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_missing_package_of_package_id_form_names_pip(monkeypatch):
    with pytest.raises(MissingExtraError) as err:
        make_env("fastrl_no_such_package:Foo-v0")
    assert one_line(err).endswith("needs fastrl_no_such_package, which is not installed: "
                                  "pip install fastrl_no_such_package (the package that "
                                  "provides it)")


def test_package_id_form_of_a_known_family_names_its_extra(monkeypatch):
    _family(monkeypatch, "NoSuch-", "fastrl_no_such_package", "pip install 'fastrl[nosuch]'")
    with pytest.raises(MissingExtraError) as err:
        make_env("fastrl_no_such_package:NoSuch-v0")
    assert one_line(err).endswith("pip install 'fastrl[nosuch]'")


def test_a_package_broken_on_import_is_one_line(tmp_path, monkeypatch):
    """dm_control 1.0.50 on mujoco 4.0 fails on import with an AttributeError: one line that
    says to reinstall with the pinned versions, not a traceback."""
    _module_file(tmp_path, monkeypatch, "fastrl_broken_pkg",
                 "raise AttributeError(\"'MjModel' object has no attribute 'flex_vertedge'\")")
    _family(monkeypatch, "Broken-", "fastrl_broken_pkg", "pip install -e '.[broken]'")
    with pytest.raises(MissingExtraError) as err:
        make_env("Broken-v0")
    message = one_line(err)
    assert "failed to import (AttributeError: 'MjModel' object has no attribute" in message
    assert message.endswith("reinstall it with the pinned versions: pip install -e '.[broken]'")


def test_a_missing_dependency_of_the_package_is_named(tmp_path, monkeypatch):
    _module_file(tmp_path, monkeypatch, "fastrl_dep_pkg", "import fastrl_missing_dependency\n")
    _family(monkeypatch, "Dep-", "fastrl_dep_pkg", "pip install dep")
    with pytest.raises(MissingExtraError) as err:
        make_env("Dep-v0")
    assert "cannot import 'fastrl_missing_dependency' (not installed): pip install dep" in \
        one_line(err)


def test_an_opengl_family_without_a_display_says_how(tmp_path, monkeypatch):
    """MiniWorld opens a pyglet window on import: with no display and no headless path, one
    line names the headless path and xvfb-run."""
    _module_file(tmp_path, monkeypatch, "fastrl_gl_pkg", (
        "class NoSuchDisplayException(Exception):\n    pass\n"
        "NoSuchDisplayException.__module__ = 'pyglet.canvas.xlib'\n"
        "raise NoSuchDisplayException('Cannot connect to \"None\"')\n"))
    _family(monkeypatch, "GL-", "fastrl_gl_pkg", "pip install gl", opengl=True)
    with pytest.raises(MissingExtraError) as err:
        make_env("GL-v0")
    message = one_line(err)
    assert "NoSuchDisplayException: Cannot connect" in message
    assert "PYGLET_HEADLESS=True" in message and "xvfb-run" in message


@pytest.mark.parametrize("error", [
    "ImportError('Cannot initialize a headless EGL display.')",
    "OSError('libGL.so.1: cannot open shared object file')",
])
def test_a_package_without_opengl_on_import_names_the_headless_path(tmp_path, monkeypatch,
                                                                     error):
    """dm_control imports the OpenGL backend MUJOCO_GL names when it is imported: an EGL that
    cannot start is not a broken install (no "reinstall"), whatever the family."""
    _module_file(tmp_path, monkeypatch, "fastrl_egl_pkg", f"raise {error}\n")
    _family(monkeypatch, "Egl-", "fastrl_egl_pkg", "pip install egl")
    with pytest.raises(MissingExtraError) as err:
        make_env("Egl-v0")
    message = one_line(err)
    assert "failed to import" in message and "reinstall" not in message
    assert "MUJOCO_GL" in message and "xvfb-run" in message


def test_a_glibc_clash_on_import_is_no_opengl_failure(tmp_path, monkeypatch):
    _module_file(tmp_path, monkeypatch, "fastrl_glibc_pkg",
                 "raise OSError(\"libc.so.6: version `GLIBC_2.38' not found\")\n")
    _family(monkeypatch, "Glibc-", "fastrl_glibc_pkg", "pip install glibc", opengl=True)
    with pytest.raises(MissingExtraError) as err:
        make_env("Glibc-v0")
    assert one_line(err).endswith("reinstall it with the pinned versions: pip install glibc")


def test_env_packages_broken_on_import_is_one_line(tmp_path, monkeypatch):
    _module_file(tmp_path, monkeypatch, "fastrl_broken_pkg", "raise RuntimeError('no GPU')\n")
    with pytest.raises(UnknownEnvError) as err:
        env_registry.import_env_packages("fastrl_broken_pkg")
    assert "--env_packages fastrl_broken_pkg: cannot import it (RuntimeError: no GPU)" in \
        one_line(err)


def test_an_id_only_the_old_gym_registers_says_so(monkeypatch):
    old_gym = types.ModuleType("gym")
    old_gym.envs = types.SimpleNamespace(registry={"OldOnly-v3": object()})
    monkeypatch.setitem(sys.modules, "gym", old_gym)
    with pytest.raises(UnknownEnvError) as err:
        make_env("OldOnly-v3")
    assert "'OldOnly-v3' is registered with the old gym package only, not with gymnasium" in \
        one_line(err)
    with pytest.raises(UnknownEnvError, match="procgen registers its ids with the old gym"):
        make_env("procgen-coinrun-v0")


# ----- third-party output ------------------------------------------------------------------

def test_noise_lines_are_dropped_and_others_pass(capsys):
    with package_envs.dropping(("Falling back to num_samples=",)):
        print("Falling back to num_samples=4")
        print("a real warning")
        print("Falling back to num_samples=4", end="")
    assert capsys.readouterr().out == "a real warning\n"


# ----- headless OpenGL ---------------------------------------------------------------------

def test_no_display_chooses_pyglets_headless_path_and_leaves_mujoco_alone(monkeypatch):
    """State-only MuJoCo envs (dm_control's, Hopper's) render nothing: MUJOCO_GL stays unset,
    so that dm_control, which imports the backend MUJOCO_GL names when it is imported, still
    falls back where libEGL is listed but no EGL driver starts (a container)."""
    monkeypatch.setattr(env_registry, "_has_egl", lambda: True)
    environ: dict[str, str] = {}
    assert use_headless_gl(environ) == ["PYGLET_HEADLESS"]
    assert environ == {"PYGLET_HEADLESS": "True"}


def test_rendering_frames_without_a_display_chooses_mujocos_egl(monkeypatch):
    monkeypatch.setattr(env_registry, "_has_egl", lambda: True)
    environ: dict[str, str] = {}
    assert sorted(use_headless_gl(environ, render=True)) == ["MUJOCO_GL", "PYGLET_HEADLESS"]
    assert environ == {"PYGLET_HEADLESS": "True", "MUJOCO_GL": "egl"}


def test_without_egl_mujoco_keeps_its_own_choice(monkeypatch):
    monkeypatch.setattr(env_registry, "_has_egl", lambda: False)
    environ: dict[str, str] = {}
    assert use_headless_gl(environ, render=True) == ["PYGLET_HEADLESS"]
    assert "MUJOCO_GL" not in environ


@pytest.mark.parametrize("options, mujoco_gl", [({}, None), ({"render_mode": None}, None),
                                                ({"render_mode": "rgb_array"}, "egl")])
def test_make_env_chooses_mujocos_egl_only_to_render_frames(monkeypatch, options, mujoco_gl):
    monkeypatch.setattr(env_registry, "_has_egl", lambda: True)
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "PYGLET_HEADLESS", "MUJOCO_GL"):
        monkeypatch.setenv(name, "x")  # recorded, so that the test leaves os.environ as it was
        monkeypatch.delenv(name)
    make_env("CartPole-v1", **options).close()
    import os

    assert os.environ.get("MUJOCO_GL") == mujoco_gl


@pytest.mark.parametrize("environ", [{"DISPLAY": ":0"}, {"WAYLAND_DISPLAY": "wayland-0"}])
def test_a_display_changes_nothing(environ):
    before = dict(environ)
    assert use_headless_gl(environ) == [] and environ == before


def test_the_users_choice_stays(monkeypatch):
    monkeypatch.setattr(env_registry, "_has_egl", lambda: True)
    environ = {"PYGLET_HEADLESS": "False", "MUJOCO_GL": "osmesa"}
    assert use_headless_gl(environ, render=True) == []
    assert environ == {"PYGLET_HEADLESS": "False", "MUJOCO_GL": "osmesa"}


def test_making_any_env_without_a_display_sets_the_switch(monkeypatch):
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "PYGLET_HEADLESS"):
        monkeypatch.setenv(name, "x")  # recorded, so that the test leaves os.environ as it was
        monkeypatch.delenv(name)
    make_env("CartPole-v1").close()
    import os

    assert os.environ["PYGLET_HEADLESS"] == "True"


# ----- Crafter -----------------------------------------------------------------------------

class FakeCrafter:
    """crafter.Env's old API: the player dies at step ``DIES_AT`` of a seed-1 world."""

    DIES_AT = 3
    made: list[int | None] = []

    def __init__(self, area=(64, 64), view=(9, 9), size=(64, 64), reward=True, length=10000,
                 seed=None):
        self.size, self.length, self.seed, self.t = size, length, seed, 0
        self.pos = np.zeros(2, np.int64)
        self.action_space = namedtuple("DiscreteSpace", "n")(17)
        FakeCrafter.made.append(seed)

    def reset(self):
        self.t = 0
        return np.zeros((*self.size, 3), np.uint8)

    def step(self, action):
        self.t += 1
        dead = self.seed == 1 and self.t == self.DIES_AT
        done = dead or self.t >= self.length
        info = {"achievements": {"collect_wood": int(self.t >= 2), "eat_cow": 0},
                "discount": 0.0 if dead else 1.0, "player_pos": self.pos}
        return np.full((*self.size, 3), self.t, np.uint8), 0.5, done, info


@pytest.fixture
def fake_crafter(monkeypatch):
    FakeCrafter.made = []
    monkeypatch.setitem(sys.modules, "crafter", types.SimpleNamespace(Env=FakeCrafter))


def test_crafter_dying_terminates_and_the_length_truncates(fake_crafter):
    env = crafter_env.CrafterEnv(length=5)
    obs, info = env.reset(seed=1)
    assert obs.shape == (64, 64, 3) and info == {} and FakeCrafter.made[-1] == 1
    steps = [env.step(0) for _ in range(FakeCrafter.DIES_AT)]
    assert [s[2:4] for s in steps] == [(False, False)] * 2 + [(True, False)]
    assert steps[-1][4]["episode_metrics"] == {"achievements": 1}
    assert steps[0][4]["player_pos"] is not steps[1][4]["player_pos"]  # gymnasium's checker
    env.reset(seed=2)
    steps = [env.step(0) for _ in range(5)]
    assert [s[2:4] for s in steps][-1] == (False, True) and steps[-1][1] == 0.5


def test_crafter_worlds_without_a_seed_differ_across_forked_workers(fake_crafter):
    """crafter.Env(seed=None) draws its world seed from numpy's global generator, the same in
    every child of the fork server: without a seed the adapter draws one from OS entropy."""
    state = np.random.get_state()
    try:
        for _ in range(2):
            np.random.seed(0)  # as every rollout worker forked from the fork server starts
            crafter_env.CrafterEnv()
    finally:
        np.random.set_state(state)
    first, second = FakeCrafter.made
    assert isinstance(first, int) and isinstance(second, int) and first != second
    crafter_env.CrafterEnv(seed=7).reset(seed=9)
    assert FakeCrafter.made[2:] == [7, 9]  # a seed given is used as it is


def test_crafter_ids_through_make_env(fake_crafter):
    env = make_env("CrafterReward-v1")
    assert env.observation_space.shape == (64, 64, 3) and env.action_space.n == 17
    assert env.metadata["frameskip"] == 1
    with pytest.raises(UnknownEnvError, match="Crafter's ids are 'CrafterReward-v1' and"):
        make_env("CrafterReward-v2")


@pytest.mark.skipif(importlib.util.find_spec("crafter") is None, reason="crafter not installed")
def test_real_crafter_runs_without_gym():
    env = make_env("CrafterNoReward-v1")
    first = env.reset(seed=3)[0]
    assert first.shape == (64, 64, 3) and first.dtype == np.uint8
    assert np.array_equal(env.reset(seed=3)[0], first)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert reward == 0.0 and not terminated and not truncated and "achievements" in info
    if importlib.util.find_spec("gym") is None:
        assert "gym" not in sys.modules


@pytest.mark.slow  # pyglet finds its libraries with ctypes.util, which starts processes
@pytest.mark.skipif(importlib.util.find_spec("miniworld") is None or
                    not env_registry._has_egl(), reason="miniworld or libEGL not installed")
def test_real_miniworld_renders_headless_without_its_noise(monkeypatch, capfd):
    if "pyglet.window" in sys.modules and "PYGLET_HEADLESS" not in __import__("os").environ:
        pytest.skip("pyglet's window module was imported with a display")
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    env = make_env("MiniWorld-OneRoom-v0")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (60, 80, 3) and obs.any()
    env.close()
    assert "Falling back" not in capfd.readouterr().out
