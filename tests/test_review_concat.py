"""Review 47 of --env_concat_vectors (envs.wrappers.ConcatVectors, commits e482ecd and
684b7f9): reproductions of its defects, each an expected failure until it is fixed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envs.wrappers import ConcatVectors
from fastrl.errors import EnvOutputError, EnvSettingsError
from fastrl.run_config import parse_config
from fastrl.sampling.env_setup import EnvSettings, create_env, env_info

REPO = Path(__file__).resolve().parent.parent


class DictEnv(gym.Env):
    """A Dict observation of float64 Boxes of the given shapes, zeros, as shimmy gives
    dm_control's state."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.observation_space = spaces.Dict(
            {k: spaces.Box(-np.inf, np.inf, s, np.float64) for k, s in shapes.items()})
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self):
        return {k: np.zeros(s.shape) for k, s in self.observation_space.spaces.items()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


def _needs_dm_control() -> None:
    pytest.importorskip("shimmy")
    pytest.importorskip("dm_control")


def _keys_joined_or_flag_named(cfg, size: int) -> None:
    """``--obs_keys`` with ``--env_concat_vectors``: the chosen keys joined (``size``
    numbers), or a refusal that names the flag to drop."""
    try:
        env = create_env(EnvSettings.from_config(cfg))
    except EnvSettingsError as exc:
        assert "--env_concat_vectors" in str(exc)
    else:
        assert env_info(env).obs_space["obs"].shape == (size,)
        env.close()


def _cfg(*argv: str):
    return parse_config(["--env", "x", "--train_dir", "/nonexistent", *argv])


# --- the family's default refuses dm_control tasks whose state holds matrices --------------

# dm_control/manipulator-*: arm_pos (8, 2) (sin and cos of each joint); stacker-*: arm_pos
# (8, 2) and box_pos (n, 4); the manipulation *_features tasks: every key (1, k) or (1, 6, 2).
MANIPULATOR = {"arm_pos": (8, 2), "arm_vel": (8,), "hand_pos": (4,), "touch": (5,)}


def test_a_matrix_key_is_flattened_into_the_vector(monkeypatch):
    monkeypatch.setattr("fastrl.sampling.env_setup.make_env",
                        lambda name, **kw: DictEnv(MANIPULATOR))
    env = create_env(EnvSettings.from_config(_cfg("--env_concat_vectors", "True")))
    assert env_info(env).obs_space["obs"].shape == (16 + 8 + 4 + 5,)


@pytest.mark.slow  # (importing dm_control starts a process: its OpenGL library probe)
@pytest.mark.parametrize("env_id", ["dm_control/manipulator-bring_ball-v0",
                                    "dm_control/stacker-stack_2-v0",
                                    "dm_control/lift_brick_features-v0"])
def test_dm_control_tasks_with_matrices_start_with_the_bare_command(env_id, tmp_path):
    _needs_dm_control()
    cfg = parse_config(["--env", env_id, "--train_dir", str(tmp_path), "--experiment", "x"])
    assert cfg.env_concat_vectors  # (the family's default)
    env = create_env(EnvSettings.from_config(cfg))
    try:
        want = sum(int(np.prod(s.shape)) for s in env.unwrapped.observation_space.values())
        assert env_info(env).obs_space["obs"].shape == (want,)
    finally:
        env.close()


@pytest.mark.slow
def test_the_bare_train_command_on_manipulator_trains(tmp_path):
    _needs_dm_control()
    proc = subprocess.run(
        [sys.executable, "train.py", "--env", "dm_control/manipulator-bring_ball-v0",
         "--train_for_env_steps", "500", "--device", "cpu", "--num_workers", "1",
         "--num_envs_per_worker", "2", "--experiment", "x", "--train_dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


# --- --obs_keys names the keys the env has, and the family's default hides them -----------

def test_obs_keys_with_concat_choose_keys_or_name_the_flag(monkeypatch):
    monkeypatch.setattr("fastrl.sampling.env_setup.make_env",
                        lambda name, **kw: DictEnv({"position": (3,), "velocity": (2,)}))
    _keys_joined_or_flag_named(_cfg("--env_concat_vectors", "True", "--obs_keys", "position"), 3)


@pytest.mark.slow  # (importing dm_control starts a process: its OpenGL library probe)
def test_obs_keys_on_a_dm_control_id_with_the_bare_command(tmp_path):
    _needs_dm_control()
    cfg = parse_config(["--env", "dm_control/cartpole-swingup-v0", "--obs_keys", "position",
                        "--train_dir", str(tmp_path), "--experiment", "x"])
    _keys_joined_or_flag_named(cfg, 3)  # cart x, pole cos and sin


# --- each key's shape --------------------------------------------------------------------

def test_a_key_of_the_wrong_shape_is_an_env_fault_even_when_the_total_fits():
    env = ConcatVectors(DictEnv({"position": (3,), "velocity": (2,)}))
    with pytest.raises(EnvOutputError) as bad:
        env.observation({"position": np.arange(2.0), "velocity": np.arange(3.0)})
    assert bad.value.kind == "obs_shape" and "position" in str(bad.value)
