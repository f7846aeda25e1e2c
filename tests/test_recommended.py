"""Per-env recommended settings: applied unless a flag (or the resumed config) says otherwise."""

from __future__ import annotations

import json

import pytest

from fastrl.env_registry import recommended_settings, register_env
from fastrl.run_config import parse_config
from fastrl.sampling.env_setup import EnvSettings, env_options, reward_scale
from tests.counting_env import CountingEnv


def parse(tmp_path, *argv):
    return parse_config(["--train_dir", str(tmp_path), "--experiment", "x", *argv])


@pytest.mark.parametrize(
    ("env", "scale", "shaping"),
    [
        ("doom_basic", 0.01, False),  # rewards in the hundreds
        ("doom_deadly_corridor", 0.01, False),
        ("doom_defend_the_center", 1.0, False),  # a kill is worth 1, not 0.01
        ("doom_my_way_home", 1.0, False),  # the goal is worth 1, not 0.0001
        ("doom_health_gathering", 0.01, True),
        ("doom_health_gathering_supreme", 0.01, True),
        ("CartPole-v1", 0.1, False),  # a gymnasium id with a recommendation
        ("Acrobot-v1", 1.0, False),  # one without
    ],
)
def test_scenarios_get_their_recommended_settings(tmp_path, env, scale, shaping):
    cfg = parse(tmp_path, "--env", env)
    assert cfg.reward_scale == scale and reward_scale(EnvSettings.from_config(cfg)) == scale
    assert cfg.env_reward_shaping is shaping
    assert env_options(EnvSettings.from_config(cfg)).get("reward_shaping", False) is shaping


def test_a_flag_overrides_the_recommendation(tmp_path):
    cfg = parse(tmp_path, "--env", "doom_health_gathering", "--reward_scale", "0.5",
                "--env_reward_shaping", "False")
    assert cfg.reward_scale == 0.5 and cfg.env_reward_shaping is False


def test_user_envs_can_recommend_settings(tmp_path):
    register_env("counting_with_advice", lambda: CountingEnv(), overwrite=True,
                 recommended={"reward_scale": 0.25, "rollout": 16})
    assert recommended_settings("counting_with_advice") == {"reward_scale": 0.25, "rollout": 16}
    cfg = parse(tmp_path, "--env", "counting_with_advice")
    assert (cfg.reward_scale, cfg.rollout) == (0.25, 16)
    register_env("counting_bad_advice", lambda: CountingEnv(), overwrite=True,
                 recommended={"no_such_setting": 1})
    with pytest.raises(ValueError, match="recommends unknown setting 'no_such_setting'"):
        parse(tmp_path, "--env", "counting_bad_advice", "--experiment", "y")


def test_an_old_config_keeps_what_it_was_trained_with(tmp_path):
    """A config.json from before recommendations stored reward_scale None (then 0.01 for every
    doom_* env) and lacks the settings added since: resuming must not change its training."""
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / "config.json").write_text(
        json.dumps({"env": "doom_defend_the_center", "reward_scale": None})
    )
    cfg = parse(tmp_path)
    assert cfg.reward_scale == 0.01
    assert (cfg.normalize_returns, cfg.value_bootstrap, cfg.decorrelate_envs_on_one_worker,
            cfg.env_reward_shaping, cfg.exploration_loss) == (False, False, False, False, "entropy")


def test_an_env_packages_module_registering_its_env_has_its_settings_applied(tmp_path,
                                                                             monkeypatch):
    """--env_packages pkg, where pkg registers the env with recommended settings at import:
    the settings apply at parse time as for an env registered before the parse."""
    (tmp_path / "my_recommending_pkg.py").write_text(
        "from fastrl import register_env\n"
        "from tests.counting_env import CountingEnv\n"
        "register_env('pkg_recommending_env', CountingEnv, overwrite=True,\n"
        "             recommended={'reward_scale': 0.5, 'rollout': 32})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = parse_config(["--env", "pkg_recommending_env", "--env_packages",
                        "my_recommending_pkg"])
    assert (cfg.reward_scale, cfg.rollout) == (0.5, 32)
