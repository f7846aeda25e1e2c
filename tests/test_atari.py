"""Atari envs (ale-py): the preprocessing against slow references, the registry route, training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

pytest.importorskip("ale_py")

from envs.atari import AtariPreprocess, make_atari_env  # noqa: E402
from envs.atari_games import LEGACY_GAMES, is_atari_id  # noqa: E402
from envs.doom_image import ImageResizer  # noqa: E402
from fastrl.env_registry import make_env, recommended_settings  # noqa: E402
from fastrl.errors import UnknownEnvError  # noqa: E402
from fastrl.run_config import parse_config  # noqa: E402
from fastrl.sampling.env_setup import EnvSettings, env_options  # noqa: E402
from tests.test_parallel import run_train_here  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
H, W = 210, 160


# --- slow, obvious references ------------------------------------------------------------


def _area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: output o is the mean of input interval [o, o + 1) * n_in / n_out."""
    m = np.zeros((n_out, n_in))
    s = n_in / n_out
    for o in range(n_out):
        lo, hi = o * s, (o + 1) * s
        for i in range(int(np.floor(lo)), int(np.ceil(hi))):
            m[o, i] = (min(hi, i + 1) - max(lo, i)) / s
    return m


ROWS, COLS = _area_matrix(H, 84), _area_matrix(W, 84)


def _reference_obs(frames: list[np.ndarray], frameskip: int) -> np.ndarray:
    """max of the last two raw frames (the last alone for frameskip 1), area-resized to
    84x84 in float64, channels first."""
    pooled = frames[-1] if frameskip == 1 else np.maximum(frames[-2], frames[-1])
    planes = pooled[..., None] if pooled.ndim == 2 else pooled
    return np.stack([ROWS @ planes[..., c].astype(np.float64) @ COLS.T
                     for c in range(planes.shape[-1])])


def _assert_close(obs: np.ndarray, ref: np.ndarray) -> None:
    assert obs.dtype == np.uint8 and obs.shape == ref.shape
    # The resizer works in 8.8 fixed point: within 1.5 grey levels of the exact mean.
    assert np.abs(obs.astype(np.float64) - ref).max() <= 1.5


class FakeAtari(gym.Env):
    """An ALE-like env stepping one emulator frame per step: frame t is a random image drawn
    from seed t (so any two frames differ), the reward of frame t is t (so a sum tells which
    frames were stepped), the game ends at frame `end` (terminated) or `cut` (truncated)."""

    def __init__(self, end: int = 10**9, cut: int = 10**9, rgb: bool = False):
        shape = (H, W, 3) if rgb else (H, W)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = spaces.Discrete(3)
        self.end, self.cut, self.t = end, cut, 0
        self.actions: list[int] = []
        self.resets = 0

    def frame(self, t: int) -> np.ndarray:
        return np.random.default_rng(t).integers(0, 256, self.observation_space.shape, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.resets = 0, self.resets + 1
        return self.frame(0), {"lives": 3}

    def step(self, action):
        self.t += 1
        self.actions.append(int(action))
        return (self.frame(self.t), float(self.t), self.t >= self.end, self.t >= self.cut,
                {"lives": 3, "t": self.t})


# --- the preprocessing, on a fake env we control -------------------------------------------


@pytest.mark.parametrize("frameskip", [1, 2, 4, 5])
def test_frame_skip_sums_rewards_and_max_pools_the_last_two_frames(frameskip):
    inner = FakeAtari()
    env = AtariPreprocess(inner, frameskip=frameskip)
    assert env.metadata["frameskip"] == frameskip
    assert env.observation_space == spaces.Box(0, 255, (1, 84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    _assert_close(obs, _reference_obs([inner.frame(0)], 1))
    for k in range(1, 4):
        obs, reward, terminated, truncated, info = env.step(2)
        frames = [inner.frame(t) for t in range((k - 1) * frameskip, k * frameskip + 1)]
        assert reward == sum(range((k - 1) * frameskip + 1, k * frameskip + 1))
        assert info["t"] == k * frameskip and not terminated and not truncated
        _assert_close(obs, _reference_obs(frames, frameskip))
        assert env.observation_space.contains(obs)
    assert inner.actions == [2] * 3 * frameskip


@pytest.mark.parametrize(("end", "steps", "reward", "pooled"), [
    (6, 2, 5 + 6, (5, 6)),  # ends on the 2nd frame of step 2: frames 5-6 stepped and pooled
    (5, 2, 5, (4, 5)),  # ends on the 1st frame of step 2: pooled with step 1's last frame
])
@pytest.mark.parametrize("how", ["terminated", "truncated"])
def test_an_episode_end_inside_a_skip_stops_it(end, steps, reward, pooled, how):
    inner = FakeAtari(**{"end" if how == "terminated" else "cut": end})
    env = AtariPreprocess(inner, frameskip=4)
    env.reset(seed=0)
    env.step(0)
    obs, r, terminated, truncated, _ = env.step(1)
    assert r == reward and inner.t == end
    assert (terminated, truncated) == (how == "terminated", how == "truncated")
    _assert_close(obs, _reference_obs([inner.frame(t) for t in pooled], 4))


def test_rgb_screens_become_channels_first():
    inner = FakeAtari(rgb=True)
    env = AtariPreprocess(inner, frameskip=4)
    assert env.observation_space.shape == (3, 84, 84)
    env.reset(seed=0)
    obs, *_ = env.step(0)
    _assert_close(obs, _reference_obs([inner.frame(3), inner.frame(4)], 4))


def test_noop_starts_are_seeded_and_bounded():
    counts = set()
    for seed in range(20):
        inner = FakeAtari()
        env = AtariPreprocess(inner, frameskip=4, noop_max=5)
        obs, _ = env.reset(seed=seed)
        assert inner.actions == [0] * inner.t and 1 <= inner.t <= 5
        _assert_close(obs, _reference_obs([inner.frame(inner.t)], 1))
        counts.add(inner.t)
        again = FakeAtari()
        AtariPreprocess(again, frameskip=4, noop_max=5).reset(seed=seed)
        assert again.t == inner.t
    assert len(counts) > 1


def test_a_game_ending_during_the_noops_is_reset():
    inner = FakeAtari(end=1)  # every no-op ends the game
    env = AtariPreprocess(inner, frameskip=4, noop_max=3)
    obs, _ = env.reset(seed=0)
    assert inner.actions and inner.resets == 1 + len(inner.actions) and inner.t == 0
    _assert_close(obs, _reference_obs([inner.frame(0)], 1))


def test_bad_wrapper_arguments_are_refused():
    with pytest.raises(ValueError, match="frameskip must be an int >= 1"):
        AtariPreprocess(FakeAtari(), frameskip=0)
    with pytest.raises(ValueError, match="interpolation must be one of"):
        AtariPreprocess(FakeAtari(), interpolation="cubic")
    with pytest.raises(ValueError, match="one frame at a time"):
        AtariPreprocess(gym.make("ALE/Pong-v5", obs_type="grayscale"))  # ALE skips 4 itself


def test_the_area_resize_matches_the_exact_mean():
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, (H, W), np.uint8)
    resized = ImageResizer((1, H, W), (84, 84), "area")(frame[None])
    _assert_close(resized, _reference_obs([frame], 1))


# --- the real games ------------------------------------------------------------------------


def test_pong_matches_a_raw_env_stepped_frame_by_frame():
    """Against ale-py's own env at frameskip 1, seeded alike: ALE draws the sticky actions
    (on by default, 0.25) from its seeded RNG once per emulator frame, so both take the same
    actions on the same frames."""
    env = make_atari_env("ALE/Pong-v5")
    raw = gym.make("ALE/Pong-v5", frameskip=1, obs_type="grayscale")
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 108_000
    obs, _ = env.reset(seed=5)
    frame, _ = raw.reset(seed=5)
    _assert_close(obs, _reference_obs([frame], 1))
    actions = np.random.default_rng(0).integers(env.action_space.n, size=300)
    nonzero = 0
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(a)
        frames, total = [frame], 0.0
        for _ in range(4):
            frame, r, raw_terminated, raw_truncated, _ = raw.step(a)
            frames.append(frame)
            total += r
            if raw_terminated or raw_truncated:
                break
        assert reward == total and (terminated, truncated) == (raw_terminated, raw_truncated)
        _assert_close(obs, _reference_obs(frames, 4))
        nonzero += reward != 0
        if terminated or truncated:
            break
    assert nonzero >= 2  # points were scored, so the reward sums were checked


def test_the_same_seed_and_actions_give_the_same_episode():
    envs = [make_atari_env("ALE/Pong-v5", noop_max=30) for _ in range(2)]
    runs = []
    for env in envs:
        obs, _ = env.reset(seed=11)
        trace = [obs]
        for a in np.random.default_rng(3).integers(env.action_space.n, size=150):
            obs, reward, *_ = env.step(a)
            trace += [obs, np.float64(reward)]
        runs.append(trace)
    assert all(np.array_equal(x, y) for x, y in zip(*runs))


def test_episode_statistics_report_the_raw_game_score():
    env = make_atari_env("ALE/Pong-v5", noop_max=30)
    env.reset(seed=0)
    total, steps = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            break
    assert terminated and total <= -15  # a random player loses most of the 21 points
    assert info["episode"]["r"] == total and info["episode"]["l"] == steps


def test_options_time_limit_frameskip_rgb_render_and_sticky_actions():
    env = make_atari_env("ALE/Breakout-v5", frameskip=2, max_episode_steps=20, rgb=True,
                         render_mode="rgb_array", repeat_action_probability=0.0)
    assert env.metadata["frameskip"] == 2 and env.metadata["render_fps"] == 30
    assert env.observation_space == spaces.Box(0, 255, (3, 84, 84), np.uint8)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    env.reset(seed=0)
    assert env.render().shape == (H, W, 3)
    for _ in range(20):
        _, _, terminated, truncated, info = env.step(0)
    assert truncated and not terminated and info["episode"]["l"] == 20
    assert env.unwrapped.ale.getEpisodeFrameNumber() == 40


@pytest.mark.parametrize("rgb", [False, True])
def test_the_gymnasium_checker_passes(rgb):
    env = make_atari_env("ALE/Pong-v5", rgb=rgb)
    # Its render check would open ALE's "human" window; render is tested above.
    check_env(env, skip_render_check=True)


@pytest.mark.slow
def test_make_env_by_name_needs_no_prior_ale_import():
    code = (
        "import sys; import fastrl, envs; from fastrl.env_registry import make_env, "
        "recommended_settings; assert recommended_settings('ALE/Pong-v5')['env_framestack'] "
        "== 4; assert 'ale_py' not in sys.modules, 'ale_py imported early'; "
        "env = make_env('ALE/Pong-v5'); obs, _ = env.reset(seed=0); "
        "legacy = make_env('PongNoFrameskip-v4'); "
        "print(obs.shape, obs.dtype, env.metadata['frameskip'], legacy.metadata['frameskip'])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "(1, 84, 84) uint8 4 4"


def test_every_id_ale_py_registers_is_routed_to_the_atari_adapter():
    ale_ids = [k for k, s in gym.registry.items() if s.entry_point == "ale_py.env:AtariEnv"]
    assert len(ale_ids) > 300
    assert all(is_atari_id(k) for k in ale_ids)
    legacy = {k.split("-")[0].removesuffix("NoFrameskip") for k in ale_ids if "/" not in k}
    assert legacy == LEGACY_GAMES
    assert not any(is_atari_id(k) for k in ("CartPole-v1", "doom_basic", "Pendulum-v1"))
    assert recommended_settings("ALE/Qbert-v5") == recommended_settings("BreakoutNoFrameskip-v4")


def test_bad_names_and_options_are_clear_errors(monkeypatch):
    with pytest.raises(UnknownEnvError, match="did you mean 'ALE/Pong-v5'"):
        make_env("ALE/Pongg-v5")
    with pytest.raises(UnknownEnvError, match="'ALE/Pong-v5'"):
        make_env("pong-v5")
    with pytest.raises(ValueError, match="does not support option.*measurements; supported: "
                                         "frameskip, max_episode_steps, render_mode, rgb"):
        make_env("ALE/Pong-v5", measurements=True)
    with pytest.raises(ValueError, match="frameskip must be an int >= 1, got 0"):
        make_env("ALE/Pong-v5", frameskip=0)
    with pytest.raises(ValueError, match="rgb must be True or False"):
        make_env("ALE/Pong-v5", rgb="yes")
    with pytest.raises(ValueError, match=r"repeat_action_probability must be in \[0, 1\]"):
        make_env("ALE/Pong-v5", repeat_action_probability=2)
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"needs ale-py.*pip install 'fastrl\[atari\]'"):
        make_env("ALE/Pong-v5")


def test_recommended_settings_and_the_rgb_flag(tmp_path):
    cfg = parse_config(["--env", "ALE/Pong-v5", "--train_dir", str(tmp_path)])
    assert (cfg.env_framestack, cfg.use_rnn, cfg.reward_clip, cfg.rollout) == (4, False, 1.0, 128)
    assert "rgb" not in env_options(EnvSettings.from_config(cfg))
    cfg = parse_config(["--env", "ALE/Pong-v5", "--train_dir", str(tmp_path), "--rollout", "32",
                        "--env_atari_rgb", "True"])
    assert cfg.rollout == 32 and env_options(EnvSettings.from_config(cfg))["rgb"] is True


@pytest.mark.slow
def test_serial_training_on_pong_writes_a_checkpoint(tmp_path):
    args = ["--env", "ALE/Pong-v5", "--train_dir", str(tmp_path), "--experiment", "pong",
            "--device", "cpu", "--serial_mode", "True", "--num_envs_per_worker", "2",
            "--worker_num_splits", "1", "--rollout", "32", "--batch_size", "64",
            "--num_batches_per_epoch", "1", "--num_epochs", "1", "--encoder_fc_size", "32",
            "--train_for_env_steps", "1000", "--seed", "1"]
    proc = run_train_here(args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exp = tmp_path / "pong"
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["env_frames"] >= 1000 and summary["learner_steps"] > 0
    assert list((exp / "checkpoints").glob("checkpoint_*.pt"))
    saved = json.loads((exp / "config.json").read_text())
    assert saved["env_framestack"] == 4 and saved["use_rnn"] is False
