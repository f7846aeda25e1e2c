"""VizDoom scenario tests (need the vizdoom engine; marked `doom`)."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

pytest.importorskip("vizdoom")

import vizdoom as vzd  # noqa: E402

from envs import doom_game  # noqa: E402
from envs.doom import DoomEnv  # noqa: E402
from envs.doom_game import start_game  # noqa: E402
from envs.doom_image import ImageResizer  # noqa: E402
from envs.doom_scenarios import SCENARIOS  # noqa: E402
from fastrl.env_registry import make_env  # noqa: E402

pytestmark = pytest.mark.doom

NO_GAME_VARIABLES = {"doom_my_way_home", "doom_predict_position"}
REPO_ROOT = Path(__file__).resolve().parents[1]


def _vizdoom_children() -> list[int]:
    """Pids of live vizdoom engine processes started by this process."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == os.getpid() and comm == "vizdoom" and state != "Z":
            pids.append(int(entry))
    return pids


@pytest.fixture(autouse=True, scope="module")
def _no_engine_left_behind() -> Iterator[None]:
    yield
    gc.collect()
    assert _vizdoom_children() == [], "vizdoom engine processes left running"


def _episode_rollout(env, steps: int, seed: int) -> list[dict]:
    """Random actions for `steps` steps; checks every step, returns the episode infos."""
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    assert env.observation_space.contains(obs)
    episodes, ep_reward, ep_len = [], 0.0, 0
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert isinstance(reward, float)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
        ep_reward += reward
        ep_len += 1
        if terminated or truncated:
            assert not (terminated and truncated)
            assert info["episode"]["l"] == ep_len
            assert info["episode"]["r"] == pytest.approx(ep_reward, abs=1e-6)
            if truncated:
                assert ep_len == env.max_episode_steps
            episodes.append({**info["episode"], "terminated": terminated})
            env.reset()
            ep_reward, ep_len = 0.0, 0
        else:
            assert "episode" not in info
    return episodes


# Every single-agent scenario (the self-play ones are tests/test_doom_selfplay.py's).
@pytest.mark.parametrize("name", sorted(n for n, s in SCENARIOS.items() if s.agents is None))
def test_scenario_random_rollout(name: str) -> None:
    measurements = name not in NO_GAME_VARIABLES
    env = make_env(name, max_episode_steps=50, measurements=measurements)
    try:
        assert env.metadata["frameskip"] == 4
        assert isinstance(env.action_space, (spaces.Discrete, spaces.MultiDiscrete))
        image_space = env.observation_space["obs"] if measurements else env.observation_space
        assert image_space.shape == (3, 72, 128) and image_space.dtype == np.uint8
        if measurements:
            k = env.observation_space["measurements"].shape[0]
            assert k == len(env.unwrapped.measurement_names) > 0
        episodes = _episode_rollout(env, steps=200, seed=1)
        assert len(episodes) >= 4  # 50-step limit: at least 4 ends in 200 steps
        obs, _ = env.reset(seed=2)
        image = obs["obs"] if measurements else obs
        assert image.shape == (3, 72, 128) and image.dtype == np.uint8
        assert image.max() > image.min()  # a rendered frame, not a blank
    finally:
        env.close()
        env.close()


def test_check_env_doom_basic() -> None:
    env = make_env("doom_basic")
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_check_env_with_measurements() -> None:
    env = make_env("doom_defend_the_center", measurements=True, max_episode_steps=20)
    try:
        assert isinstance(env.observation_space, spaces.Dict)
        assert env.observation_space["measurements"].shape == (2,)
        assert env.unwrapped.measurement_names == ["AMMO2", "HEALTH"]
        check_env(env, skip_render_check=True)
        obs, _ = env.reset(seed=0)
        assert obs["measurements"].dtype == np.float32
        assert obs["measurements"][1] == 100.0  # full health at the start
    finally:
        env.close()


@pytest.mark.parametrize("name", ["doom_basic", "doom_deathmatch", "doom_health_gathering"])
def test_same_seed_same_trajectory(name: str) -> None:
    a, b = make_env(name), make_env(name)
    try:
        obs_a, _ = a.reset(seed=123)
        obs_b, _ = b.reset(seed=123)
        np.testing.assert_array_equal(obs_a, obs_b)
        a.action_space.seed(5)
        for _ in range(40):
            action = a.action_space.sample()
            out_a, out_b = a.step(action), b.step(action)
            np.testing.assert_array_equal(out_a[0], out_b[0])
            assert out_a[1:] == out_b[1:]
            if out_a[2] or out_a[3]:
                break
        # Re-seeding replays the start; another seed gives another episode.
        np.testing.assert_array_equal(a.reset(seed=123)[0], obs_a)
        if name != "doom_health_gathering":  # its start is fixed: seed-independent
            assert not np.array_equal(a.reset(seed=124)[0], obs_a)
    finally:
        a.close()
        b.close()


def test_default_time_limit_comes_from_the_cfg() -> None:
    env = make_env("doom_basic")
    try:
        assert env.unwrapped.max_episode_steps == 75  # 300 tics / frameskip 4
        env.reset(seed=0)
        for step in range(1, 76):
            _, reward, terminated, truncated, info = env.step(0)  # no-op: the monster lives
            assert reward == -4.0  # living reward -1 per tic
            assert not terminated
            assert truncated == (step == 75)
        assert info["episode"] == {"r": -300.0, "l": 75}
    finally:
        env.close()
    env = make_env("doom_basic", frameskip=2)
    try:
        assert env.metadata["frameskip"] == 2
        assert env.unwrapped.max_episode_steps == 150
    finally:
        env.close()


def test_time_limits_of_scenarios_without_cfg_timeout_and_benchmark() -> None:
    env = make_env("doom_take_cover")
    try:
        assert env.unwrapped.max_episode_steps is None  # the cfg has no episode_timeout
    finally:
        env.close()
    env = make_env("doom_benchmark", max_episode_steps=300)
    try:
        assert env.unwrapped.max_episode_steps == 300
        env.reset(seed=0)
        env.action_space.seed(0)
        for _ in range(300):  # invulnerable: only the time limit ends the episode
            _, _, terminated, truncated, info = env.step(env.action_space.sample())
            assert not terminated
        assert truncated and info["episode"]["l"] == 300
    finally:
        env.close()


def test_reward_shaping_leaves_native_return_alone() -> None:
    plain = make_env("doom_deadly_corridor", max_episode_steps=100)
    shaped = None
    try:
        shaped = make_env("doom_deadly_corridor", max_episode_steps=100, reward_shaping=True)
        plain.reset(seed=3)
        shaped.reset(seed=3)
        plain.action_space.seed(3)
        sum_plain = sum_shaped = 0.0
        # The terms (fastrl/algo/pbt/reward_weights.py): named, and each step's parts make up
        # the shaping.
        assert shaped.metadata["reward_terms"] == ("HEALTH", "KILLCOUNT")
        assert "reward_terms" not in plain.metadata
        for _ in range(100):
            action = plain.action_space.sample()
            _, r_plain, term, trunc, info_plain = plain.step(action)
            _, r_shaped, _, _, info_shaped = shaped.step(action)
            assert "reward_terms" not in info_plain
            assert r_shaped == pytest.approx(r_plain + sum(info_shaped["reward_terms"]))
            sum_plain += r_plain
            sum_shaped += r_shaped
            if term or trunc:
                break
        assert info_plain["episode"] == info_shaped["episode"]
        assert info_plain["episode"]["r"] == pytest.approx(sum_plain)
        assert sum_shaped != pytest.approx(sum_plain)  # random play in the corridor gets hurt
    finally:
        plain.close()
        if shaped is not None:
            shaped.close()


def test_observations_are_fresh_arrays() -> None:
    env = make_env("doom_basic", max_episode_steps=5, measurements=True)
    try:
        first, _ = env.reset(seed=0)
        kept = {k: v.copy() for k, v in first.items()}
        seen = [first]
        for _ in range(5):
            obs, _, terminated, truncated, _ = env.step(1)
            seen.append(obs)
        assert truncated or terminated
        env.reset(seed=1)
        for k in kept:
            np.testing.assert_array_equal(first[k], kept[k])
        images = [o["obs"] for o in seen]
        for i, x in enumerate(images):
            for y in images[i + 1 :]:
                assert not np.shares_memory(x, y)
    finally:
        env.close()


def test_render_rgb_array_is_full_resolution() -> None:
    env = make_env("doom_basic", render_mode="rgb_array")
    try:
        env.reset(seed=0)
        frame = env.render()
        assert frame.shape == (120, 160, 3) and frame.dtype == np.uint8
        obs, *_ = env.step(0)
        assert env.render().shape == (120, 160, 3)
    finally:
        env.close()
    env = make_env("doom_basic")
    try:
        env.reset(seed=0)
        assert env.render() is None
    finally:
        env.close()


def test_misuse_gives_clear_errors() -> None:
    env = make_env("doom_defend_the_center")
    try:
        with pytest.raises(RuntimeError, match="reset"):
            env.step([0, 0])
        env.reset(seed=0)
        with pytest.raises(ValueError, match="outside"):
            env.step([3, 0])
        with pytest.raises(ValueError, match="does not match"):
            env.step([0])
    finally:
        env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()
    with pytest.raises(RuntimeError, match="closed"):
        env.step([0, 0])


@pytest.mark.parametrize(
    "options, match",
    [
        ({"frameskip": 0}, "frameskip"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"render_mode": "ascii"}, "render_mode"),
        ({"interpolation": "cubic"}, "interpolation"),
    ],
)
def test_invalid_option_values(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_env("doom_basic", **options)


def test_measurements_on_scenario_without_variables_is_an_error() -> None:
    with pytest.raises(ValueError, match="no game variables"):
        make_env("doom_my_way_home", measurements=True)
    gc.collect()
    assert _vizdoom_children() == []


def test_close_stops_the_engine_process() -> None:
    env = make_env("doom_basic")
    assert len(_vizdoom_children()) == 1
    env.close()
    assert _vizdoom_children() == []
    env = make_env("doom_basic")
    del env  # __del__ closes too
    gc.collect()
    assert _vizdoom_children() == []


def test_init_is_retried_then_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = {"left": 2}
    real_game = vzd.DoomGame

    class FlakyGame(real_game):  # type: ignore[misc, valid-type]
        def init(self) -> bool:
            if failures["left"] > 0:
                failures["left"] -= 1
                raise vzd.ViZDoomUnexpectedExitException("simulated start failure")
            return super().init()

    monkeypatch.setattr(doom_game.vzd, "DoomGame", FlakyGame)
    monkeypatch.setattr(doom_game.time, "sleep", lambda s: None)
    game, timeout = start_game(SCENARIOS["doom_basic"])
    assert timeout == 300 and failures["left"] == 0
    game.close()
    failures["left"] = 10
    with pytest.raises(RuntimeError, match=r"doom_basic.*after 3 attempts.*simulated"):
        start_game(SCENARIOS["doom_basic"], attempts=3)


def _start_and_step(name: str) -> int:
    env = DoomEnv(name, max_episode_steps=10)
    env.reset(seed=os.getpid())
    for _ in range(20):
        *_, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    env.close()
    return 1


def test_many_engines_start_side_by_side() -> None:
    ctx = mp.get_context("spawn")
    names = ["doom_basic", "doom_defend_the_center", "doom_deathmatch", "doom_basic"] * 2
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old) if p)
    try:
        with ctx.Pool(4) as pool:
            assert sum(pool.map(_start_and_step, names)) == len(names)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old


# ----------------------------------------------------------------------- resizer


def _exact_area(img: np.ndarray, oh: int, ow: int) -> np.ndarray:
    def matrix(n_in: int, n_out: int) -> np.ndarray:
        m = np.zeros((n_out, n_in))
        s = n_in / n_out
        for o in range(n_out):
            lo, hi = o * s, (o + 1) * s
            for i in range(int(np.floor(lo)), int(np.ceil(hi))):
                m[o, i] = max(0.0, min(hi, i + 1) - max(lo, i)) / s
        return m

    return np.einsum(
        "oh,chw,pw->cop", matrix(img.shape[1], oh), img.astype(float), matrix(img.shape[2], ow)
    )


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "area"])
def test_resizer_shape_constant_and_fresh(interpolation: str) -> None:
    resize = ImageResizer((3, 120, 160), (72, 128), interpolation)
    img = np.full((3, 120, 160), 200, np.uint8)
    img[1] = 7
    out = resize(img)
    assert out.shape == (3, 72, 128) and out.dtype == np.uint8
    assert (out[0] == 200).all() and (out[1] == 7).all()
    assert not np.shares_memory(out, resize(img))


def test_resizer_area_matches_exact_average() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (3, 120, 160), dtype=np.uint8)
    out = ImageResizer((3, 120, 160), (72, 128), "area")(img)
    error = np.abs(out - _exact_area(img, 72, 128))
    # Two fixed-point passes, each rounded: at most ~1.5 levels off, ~0.3 on average.
    assert error.max() <= 1.5 and error.mean() < 0.4


def test_resizer_nearest_picks_centre_pixels() -> None:
    img = np.arange(3 * 120 * 160, dtype=np.int64).reshape(3, 120, 160)
    img8 = (img % 251).astype(np.uint8)
    out = ImageResizer((3, 120, 160), (72, 128), "nearest")(img8)
    rows = ((np.arange(72) + 0.5) * 120 / 72).astype(int)
    cols = ((np.arange(128) + 0.5) * 160 / 128).astype(int)
    np.testing.assert_array_equal(out, img8[:, rows][:, :, cols])


# ------------------------------------------------------------------ perf/env_fps.py


@pytest.mark.parametrize("extra", [["--num_workers", "2", "--pin"], ["--bare"]])
def test_env_fps_script_prints_one_json_line(extra: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "perf/env_fps.py", "--env", "doom_basic", "--seconds", "1"]
        + ["--warmup", "0.5", *extra],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["fps"] > 0 and result["sps"] > 0
    assert result["env_frames"] == 4 * result["agent_steps"]
    assert result["bare"] == ("--bare" in extra)
    assert result["pinned"] == ("--pin" in extra)
    assert result["num_workers"] == (2 if "--pin" in extra else 1)
    # The workers' and their engines' CPU time per frame: at most every core's whole time.
    cores = len(os.sched_getaffinity(0))
    assert 0 < result["core_seconds_per_frame"] <= cores / result["fps"] * 1.2
