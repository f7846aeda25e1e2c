"""Registry and gymnasium adapter tests (no vizdoom needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env
from gymnasium.wrappers import RecordEpisodeStatistics

from fastrl.env_registry import make_env, register_env, registered_envs
from fastrl.errors import UnknownEnvError

REPO_ROOT = Path(__file__).resolve().parents[1]
DOOM_NAMES = {
    "doom_basic",
    "doom_defend_the_center",
    "doom_defend_the_line",
    "doom_health_gathering",
    "doom_health_gathering_supreme",
    "doom_my_way_home",
    "doom_deadly_corridor",
    "doom_predict_position",
    "doom_take_cover",
    "doom_deathmatch",
    "doom_benchmark",
}


class _ToyEnv(gym.Env):
    """Vector obs, episodes of `length` steps, reward 1 per step."""

    def __init__(self, length: int = 3, scale: float = 1.0) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.scale, self.t = length, scale, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        info = {"episode": {"r": float(self.t), "l": self.t}} if done else {}
        return np.full(2, 0.5 * self.scale, np.float32), 1.0, done, False, info


def _toy_factory(*, length: int = 3, max_episode_steps: int | None = None) -> gym.Env:
    return _ToyEnv(length=max_episode_steps or length)


@pytest.mark.slow
def test_builtin_names_registered_without_importing_vizdoom() -> None:
    code = (
        "import sys; from fastrl.env_registry import registered_envs; "
        "names = registered_envs(); import envs; "
        "assert 'vizdoom' not in sys.modules, 'vizdoom imported'; print(','.join(names))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert DOOM_NAMES <= set(out.stdout.strip().split(","))


def test_registered_envs_sorted_and_complete() -> None:
    names = registered_envs()
    assert names == sorted(names)
    assert DOOM_NAMES <= set(names)


def test_unknown_name_suggests_close_match() -> None:
    with pytest.raises(UnknownEnvError) as err:
        make_env("doom_basci")
    message = str(err.value)
    assert "'doom_basic'" in message and "gymnasium" in message
    assert "\n" not in message
    assert isinstance(err.value, ValueError)


def test_unknown_name_suggests_gymnasium_id() -> None:
    with pytest.raises(UnknownEnvError, match="CartPole-v1"):
        make_env("cartpole-v1x")


def test_unknown_name_without_close_match_lists_names() -> None:
    with pytest.raises(UnknownEnvError, match="doom_basic"):
        make_env("qqqqqqqq")


def test_register_user_env_and_make_it() -> None:
    register_env("test_toy_env", _toy_factory, overwrite=True)
    assert "test_toy_env" in registered_envs()
    env = make_env("test_toy_env", length=2)
    assert env.metadata["frameskip"] == 1
    assert _ToyEnv.metadata.get("frameskip") is None  # class-level dict left alone
    env.reset(seed=0)
    _, _, terminated, _, info = env.step(0)
    assert not terminated
    _, _, terminated, _, info = env.step(1)
    assert terminated and info["episode"] == {"r": 2.0, "l": 2}
    # Options the factory does not know are dropped when None, an error otherwise.
    make_env("test_toy_env", frameskip=None, render_mode=None)
    with pytest.raises(ValueError, match="frameskip") as err:
        make_env("test_toy_env", frameskip=4)
    assert "length" in str(err.value) and "max_episode_steps" in str(err.value)


def test_register_env_refuses_silent_replacement() -> None:
    register_env("test_toy_env2", _toy_factory, overwrite=True)
    register_env("test_toy_env2", _toy_factory)  # same factory again: fine
    with pytest.raises(ValueError, match="already registered"):
        register_env("test_toy_env2", lambda **kw: _ToyEnv())
    with pytest.raises(ValueError):
        register_env("", _toy_factory)
    with pytest.raises(TypeError):
        register_env("test_toy_env3", "not callable")  # type: ignore[arg-type]


def test_factory_with_var_kwargs_gets_everything() -> None:
    seen: dict = {}

    def factory(**options):
        seen.update(options)
        return _ToyEnv()

    register_env("test_toy_kwargs", factory, overwrite=True)
    make_env("test_toy_kwargs", frameskip=None, anything=3)
    assert seen == {"frameskip": None, "anything": 3}


def test_factory_must_return_a_gym_env() -> None:
    register_env("test_not_an_env", lambda: object(), overwrite=True)
    with pytest.raises(TypeError, match="gymnasium.Env"):
        make_env("test_not_an_env")


def test_unsupported_option_for_builtin_is_value_error() -> None:
    # Raised by the option check before any engine starts (no vizdoom needed).
    with pytest.raises(ValueError, match="colour") as err:
        make_env("doom_basic", colour="red")
    assert "frameskip" in str(err.value)


# ----------------------------------------------------------------- gymnasium adapter


def test_gym_adapter_cartpole_contract() -> None:
    env = make_env("CartPole-v1")
    assert env.metadata["frameskip"] == 1
    assert isinstance(env, RecordEpisodeStatistics)
    assert isinstance(env.action_space, spaces.Discrete)
    assert env.observation_space.dtype == np.float32
    check_env(env.unwrapped, skip_render_check=True)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    env.action_space.seed(0)
    total, steps = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += float(reward)
        steps += 1
        if terminated or truncated:
            break
        assert "episode" not in info
    assert info["episode"]["l"] == steps
    assert float(info["episode"]["r"]) == pytest.approx(total)
    env.close()


def test_gym_adapter_time_limit_truncates() -> None:
    env = make_env("CartPole-v1", max_episode_steps=3)
    env.reset(seed=1)
    for _ in range(3):
        _, _, terminated, truncated, info = env.step(0)
    assert truncated or terminated
    assert info["episode"]["l"] == 3
    env.close()


def test_gym_adapter_does_not_double_wrap_statistics() -> None:
    from envs.gym_env import make_gym_env

    env = make_gym_env("CartPole-v1")
    depth = 0
    inner = env
    while isinstance(inner, gym.Wrapper):
        depth += isinstance(inner, RecordEpisodeStatistics)
        inner = inner.env
    assert depth == 1


def test_gym_adapter_casts_float64_observations() -> None:
    gym.register("TestFloat64-v0", entry_point=lambda: _Float64Env())
    try:
        env = make_env("TestFloat64-v0")
        assert env.observation_space.dtype == np.float32
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.float32
    finally:
        gym.registry.pop("TestFloat64-v0", None)


class _Float64Env(_ToyEnv):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float64)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return obs.astype(np.float64), info

    def step(self, action):
        obs, *rest = super().step(action)
        return (obs.astype(np.float64), *rest)


@pytest.mark.parametrize("frameskip", [4, 2, 0])
def test_gym_adapter_rejects_frameskip(frameskip: int) -> None:
    with pytest.raises(ValueError, match=f"frameskip={frameskip}"):
        make_env("CartPole-v1", frameskip=frameskip)


def test_gym_adapter_accepts_frameskip_one_and_none() -> None:
    make_env("CartPole-v1", frameskip=1).close()
    make_env("CartPole-v1", frameskip=None).close()


def test_gym_adapter_rejects_unknown_option() -> None:
    with pytest.raises(ValueError, match="measurements") as err:
        make_env("CartPole-v1", measurements=True)
    assert "max_episode_steps" in str(err.value)


def test_gym_adapter_render_mode() -> None:
    env = make_env("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
    env.close()
