"""Env ids that other packages register: the known families, --env_packages, and what the
unknown-env error says. ``tests.spaces_env`` plays the other package (it registers its ids
when imported)."""

from __future__ import annotations

import sys

import pytest
from gymnasium.envs.registration import registry as gym_registry

from fastrl.env_registry import MissingExtraError, UnknownEnvError, make_env
from fastrl.run_config import parse_config
from fastrl.sampling.env_setup import EnvSettings, create_env, env_info

PACKAGE = "tests.spaces_env"


@pytest.fixture
def unimported(monkeypatch):
    """``tests.spaces_env`` not imported yet and its ids not registered."""
    monkeypatch.delitem(sys.modules, PACKAGE, raising=False)
    for env_id in ("PixelsHWC-v0", "SpacesGrid-v0", "EverySpace-v0"):
        monkeypatch.delitem(gym_registry, env_id, raising=False)


def _families(monkeypatch, *rows):
    """``envs.package_envs.FAMILIES`` replaced by ``rows`` of (prefix, module, install)."""
    from envs import package_envs

    monkeypatch.setattr(package_envs, "FAMILIES", tuple(
        package_envs.Family(module, (prefix,), module, install)
        for prefix, module, install in rows))


def test_a_known_family_imports_its_package(unimported, monkeypatch):
    _families(monkeypatch, ("SpacesGrid-", PACKAGE, "pip install fastrl-test-spaces"))
    env = make_env("SpacesGrid-v0")
    assert PACKAGE in sys.modules
    assert set(env.observation_space.spaces) == {"image", "direction", "mission"}


def test_an_id_of_a_family_whose_package_is_missing_names_the_install(monkeypatch):
    _families(monkeypatch, ("NoSuch-", "fastrl_no_such_package", "pip install no-such-package"))
    with pytest.raises(MissingExtraError) as err:
        make_env("NoSuch-Grid-v0")
    message = str(err.value)
    assert "needs fastrl_no_such_package, which is not installed" in message
    assert message.endswith("pip install no-such-package") and "\n" not in message


def test_misspelled_id_of_an_installed_package_suggests_the_id(unimported, monkeypatch):
    _families(monkeypatch, ("SpacesGrid", PACKAGE, "pip install fastrl-test-spaces"))
    with pytest.raises(UnknownEnvError, match="did you mean 'SpacesGrid-v0'"):
        make_env("SpacesGrid-v1")


@pytest.mark.parametrize("name", ["pkg:", "gymnasium:", "tests.spaces_env:"])
def test_a_package_with_no_id_after_its_colon_is_one_unknown_env_line(name):
    """``package:EnvId`` with the id left out: a ``package:EnvId`` is the package families'
    (envs.package_envs.match_env) and only this form reached gymnasium, which failed in a deep
    traceback (ModuleNotFoundError for 'pkg', "Malformed environment ID" otherwise)."""
    with pytest.raises(UnknownEnvError) as err:
        make_env(name)
    message = str(err.value)
    assert message.startswith(f"unknown env {name!r}: ") and "'package:EnvId'" in message
    assert "\n" not in message


def test_minigrid_names_its_extra_when_missing_or_works_when_installed():
    try:
        import minigrid  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtraError, match=r"needs minigrid, which is not installed: "
                                                    r"pip install .*\[minigrid\]"):
            make_env("MiniGrid-Empty-5x5-v0")
        return
    cfg = parse_config(["--env", "MiniGrid-Empty-5x5-v0", "--train_dir", "/nonexistent"])
    info = env_info(create_env(EnvSettings.from_config(cfg)))
    assert info.obs_space["image"].shape == (3, 7, 7)
    assert "mission" not in info.obs_space.spaces and info.obs_left_out


def test_env_packages_imports_first(unimported):
    cfg = parse_config(["--env", "PixelsHWC-v0", "--env_packages", PACKAGE,
                        "--train_dir", "/nonexistent"])
    info = env_info(create_env(EnvSettings.from_config(cfg)))
    assert info.obs_space["obs"].shape == (3, 40, 44)


def test_env_packages_that_cannot_be_imported_is_one_line():
    cfg = parse_config(["--env", "CartPole-v1", "--env_packages", "fastrl_no_such_package",
                        "--train_dir", "/nonexistent"])
    with pytest.raises(UnknownEnvError, match="--env_packages fastrl_no_such_package: cannot "
                                              "import it"):
        create_env(EnvSettings.from_config(cfg))


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--env_obs_layout", "whc", "invalid choice: 'whc'"),
    ("--obs_keys", "a,,b", "--obs_keys='a,,b': must be names separated by commas"),
    ("--env_packages", "a,a", "--env_packages='a,a': must be names separated by commas"),
])
def test_bad_flags_are_one_line(capsys, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        from fastrl.run_config import parse_or_exit

        parse_or_exit(["--env", "CartPole-v1", flag, value], prog="train.py")
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err
