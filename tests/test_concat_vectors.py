"""--env_concat_vectors: a Dict observation made of vectors as one vector
(``envs.wrappers.ConcatVectors``), which the DeepMind Control family turns on."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from envs.wrappers import ConcatVectors
from fastrl.env_registry import recommended_settings
from fastrl.errors import EnvOutputError, EnvSettingsError
from fastrl.policy.model import ActorCritic
from fastrl.run_config import parse_config
from fastrl.sampling.env_setup import EnvSettings, create_env, env_info
from tests.test_model import small_settings


class StateEnv(gym.Env):
    """dm_control's state through shimmy, in small: ``position`` [3], ``velocity`` [2] and a
    nested scalar, float64; each observation a function of the step."""

    def __init__(self, extra: spaces.Space | None = None):
        box = spaces.Box(-np.inf, np.inf, dtype=np.float64, shape=(3,))
        inner = {"height": spaces.Box(0.0, 2.0, (), np.float64)}
        if extra is not None:
            inner["frame"] = extra
        self.observation_space = spaces.Dict({
            "position": box, "velocity": spaces.Box(-1.0, 1.0, (2,), np.float64),
            "body": spaces.Dict(inner)})
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def _obs(self):
        t = float(self.t)
        return {"position": np.array([t, t + 1, t + 2]), "velocity": np.array([-t, 0.5]),
                "body": {"height": np.float64(1.5)}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= 3, {}


def test_the_leaves_are_one_float32_vector_in_the_spaces_order():
    env = ConcatVectors(StateEnv())
    space = env.observation_space
    assert space.shape == (6,) and space.dtype == np.float32
    assert list(env.env.observation_space) == ["body", "position", "velocity"]  # (sorted)
    assert space.low.tolist() == [0.0, *[-np.inf] * 3, -1.0, -1.0] and space.high[0] == 2.0
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.tolist() == [1.5, 0, 1, 2, -0.0, 0.5]
    obs, *_ = env.step(env.action_space.sample())
    assert obs.tolist() == [1.5, 1, 2, 3, -1, 0.5] and space.contains(obs)


def test_an_observation_that_does_not_fit_is_an_env_fault():
    env = ConcatVectors(StateEnv())
    env.reset(seed=0)
    with pytest.raises(EnvOutputError,
                       match=r"'position' with 4 numbers, expected shape \(3,\)") as bad:
        env.observation({"position": np.zeros(4), "velocity": np.zeros(2),
                         "body": {"height": 1.0}})
    assert bad.value.kind == "obs_shape"
    with pytest.raises(EnvOutputError) as missing:
        env.observation({"position": np.zeros(3)})
    assert missing.value.kind == "obs_missing"


def test_create_env_concatenates_and_names_what_it_cannot(monkeypatch):
    envs = iter([StateEnv(), StateEnv(spaces.Box(0, 255, (3, 8, 8), np.uint8))])
    monkeypatch.setattr("fastrl.sampling.env_setup.make_env", lambda name, **kw: next(envs))
    cfg = parse_config(["--env", "x", "--train_dir", "/nonexistent",
                        "--env_concat_vectors", "True"])
    info = env_info(create_env(EnvSettings.from_config(cfg)))
    assert list(info.obs_space.spaces) == ["obs"] and info.obs_space["obs"].shape == (6,)
    with pytest.raises(EnvSettingsError, match=r"--env_concat_vectors: .*body\.frame") as bad:
        create_env(EnvSettings.from_config(cfg))
    assert "\n" not in str(bad.value)


def test_dm_control_ids_get_one_vector_by_default_and_a_flag_wins(tmp_path):
    """The bare command on a DeepMind Control id concatenates its state (the continuous
    recipe's MLPs took position and velocity apart, and cartpole-swingup stayed at 200-225);
    other envs keep their keys."""
    base = ["--train_dir", str(tmp_path), "--experiment", "x"]
    assert recommended_settings("dm_control/cartpole-swingup-v0") == {
        "env_concat_vectors": True}
    assert parse_config([*base, "--env", "dm_control/walker-walk-v0"]).env_concat_vectors
    off = parse_config([*base, "--env", "dm_control/cartpole-swingup-v0",
                        "--env_concat_vectors", "False"])
    assert off.env_concat_vectors is False
    pendulum = parse_config([*base, "--env", "Pendulum-v1"])
    assert pendulum.recipe == "continuous" and pendulum.env_concat_vectors is False


def test_a_feed_forward_model_sums_its_keys_and_one_vector_mixes_them():
    """Why: without a recurrent core, a Dict's keys meet only in the linear heads, so the
    action mean is f(position) + g(velocity); over one vector it is not a sum."""
    cfg = small_settings(use_rnn=False, rnn_size=8, encoder_fc_size=16,
                         encoder_mlp_layers=[16, 16], nonlinearity="tanh",
                         normalize_input=False, actor_critic_share_weights=False)
    action = spaces.Box(-1.0, 1.0, (1,), np.float32)
    split = spaces.Dict({"a": spaces.Box(-5, 5, (2,)), "b": spaces.Box(-5, 5, (2,))})
    torch.manual_seed(0)
    a, a2, b, b2 = (torch.randn(1, 2) * 2 for _ in range(4))

    def interaction(mean) -> float:  # 0 for a sum f(a) + g(b)
        return float(mean(a, b) - mean(a2, b) - mean(a, b2) + mean(a2, b2))

    model = ActorCritic(split, action, cfg)
    with torch.no_grad():
        model.actor.weight.mul_(100)  # (its gain of 0.01 keeps the first means near 0)
        assert abs(interaction(lambda x, y: model.forward_step(
            {"a": x, "b": y}, torch.zeros(1, 0))[0][0, 0])) < 1e-5
        joined = ActorCritic(spaces.Dict({"obs": spaces.Box(-5, 5, (4,))}), action, cfg)
        joined.actor.weight.mul_(100)
        assert abs(interaction(lambda x, y: joined.forward_step(
            {"obs": torch.cat([x, y], 1)}, torch.zeros(1, 0))[0][0, 0])) > 1e-2
