"""--env_framestack: the last k observations stacked along the first axis, oldest first."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from envs.wrappers import FrameStack
from fastrl.env_registry import make_env
from tests.counting_env import CountingEnv
from tests.masked_env import MaskedPickEnv
from tests.test_parallel import run_train, run_train_here


def test_vectors_are_stacked_oldest_first_and_reset_fills_with_the_first():
    env = FrameStack(CountingEnv(env_tag=7, episode_len=3), 3)
    assert env.observation_space.shape == (9,)
    obs, _ = env.reset(seed=0)
    first = obs[6:]
    assert np.array_equal(obs, np.concatenate([first] * 3))
    seen = [first]
    for _ in range(2):
        obs, *_ = env.step(0)
        seen.append(obs[6:])
        assert np.array_equal(obs[3:6], seen[-2])  # the previous observation is before it
    assert np.array_equal(obs, np.concatenate(seen))
    assert env.observation_space.contains(obs)
    obs, _ = env.reset()  # a new episode starts from copies of its own first observation
    assert np.array_equal(obs[:3], obs[6:]) and obs[2] == 0


class _ImageEnv(CountingEnv):
    def __init__(self):
        super().__init__(env_tag=1)
        self.observation_space = spaces.Box(0, 255, (2, 4, 5), np.uint8)

    def _image(self, obs):
        return np.full((2, 4, 5), int(obs[2]), np.uint8)

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        return self._image(obs), info

    def step(self, action):
        obs, *rest = super().step(action)
        return self._image(obs), *rest


def test_images_are_stacked_along_channels():
    env = FrameStack(_ImageEnv(), 4)
    assert env.observation_space.shape == (8, 4, 5) and env.observation_space.dtype == np.uint8
    env.reset(seed=0)
    obs, *_ = env.step(0)
    assert [int(obs[c, 0, 0]) for c in range(0, 8, 2)] == [0, 0, 0, 1]


def test_dict_keys_are_stacked_but_the_action_mask_stays_current():
    env = FrameStack(MaskedPickEnv(), 2)
    assert env.observation_space["obs"].shape == (10,)
    assert env.observation_space["action_mask"].shape == (5,)
    obs, _ = env.reset(seed=0)
    legal = int(np.flatnonzero(obs["action_mask"])[-1])
    obs2, *_ = env.step(legal)
    assert np.array_equal(obs2["obs"][:5], obs["obs"][5:])
    assert np.array_equal(obs2["obs"][5:], obs2["action_mask"].astype(np.float32))


def test_the_gymnasium_checker_passes_and_bad_k_is_refused():
    check_env(FrameStack(make_env("CartPole-v1").unwrapped, 3), skip_render_check=True)
    with pytest.raises(ValueError, match="frame stack must be a positive int, got 0"):
        FrameStack(CountingEnv(), 0)


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", [["--serial_mode", "True"], []], ids=["serial", "parallel"])
def test_training_with_a_frame_stack(tmp_path, mode):
    args = ["--env", "tests.counting_env:CountingEnv-v0", "--recipe", "pixels",
            "--env_framestack", "4",
            "--train_dir", str(tmp_path), "--experiment", "x", "--device", "cpu",
            "--use_rnn", "False", "--encoder_mlp_layers", "16", "--num_workers", "2",
            "--num_envs_per_worker", "4", "--rollout", "8", "--batch_size", "64",
            "--train_for_env_steps", "2000", *mode]
    proc = run_train_here(args) if mode else run_train(args, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 2000


@pytest.mark.doom
def test_doom_trains_with_a_frame_stack(tmp_path):
    args = ["--env", "doom_basic", "--env_framestack", "2", "--train_dir", str(tmp_path),
            "--experiment", "x", "--device", "cpu", "--serial_mode", "True", "--use_rnn",
            "False", "--num_envs_per_worker", "2", "--rollout", "16", "--batch_size", "64",
            "--encoder_fc_size", "32", "--train_for_env_steps", "1000"]
    proc = run_train(args, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ckpt_cfg = json.loads((tmp_path / "x" / "config.json").read_text())
    assert ckpt_cfg["env_framestack"] == 2


@pytest.mark.slow
def test_a_bad_frame_stack_flag_is_one_line(tmp_path):
    proc = run_train(["--env", "CartPole-v1", "--env_framestack", "0", "--train_dir",
                      str(tmp_path)], timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--env_framestack=0: must be > 0" in lines[0], proc.stderr


def test_stacking_what_cannot_be_stacked_is_one_settings_error():
    # FrozenLake's observation is a state index (Discrete(16)): the wrapper's ValueError used
    # to reach the user as a traceback from deep inside the probe (review-50).
    import dataclasses

    from fastrl.config.settings import Config
    from fastrl.errors import EnvSettingsError
    from fastrl.sampling.env_setup import EnvSettings, create_env

    cfg = dataclasses.replace(Config(), env="FrozenLake-v1", env_framestack=4)
    with pytest.raises(EnvSettingsError, match=r"--env_framestack=4: frame stacking needs Box "
                                               r".*Discrete\(16\); use --env_framestack 1"):
        create_env(EnvSettings.from_config(cfg))
