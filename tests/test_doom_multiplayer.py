"""VizDoom multiplayer against the engine's bots (`envs.doom_multiplayer`). Tests that start
an engine are marked `doom`; the others check the table and the helpers in-process."""

from __future__ import annotations

import gc
import inspect
import json
import multiprocessing as mp
import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("vizdoom")

import vizdoom as vzd  # noqa: E402

from envs.doom import DoomEnv  # noqa: E402
from envs.doom_multiplayer import DoomBotsEnv, free_udp_port, placing  # noqa: E402
from envs.doom_scenarios import DEATHMATCH_HEADS, SCENARIOS  # noqa: E402
from fastrl.env_registry import _entry, make_env  # noqa: E402
from fastrl.run_config import parse_config  # noqa: E402
from fastrl.transport.procs import SHM_DIR  # noqa: E402
from tests.test_doom_envs import _vizdoom_children  # noqa: E402
from tests.test_parallel import run_train_here  # noqa: E402

BOTS_SCENARIOS = ["doom_duel_bots", "doom_deathmatch_bots"]
METRICS = {"frags", "deaths", "suicides", "hits", "damage", "placing"}
REPO_ROOT = Path(__file__).resolve().parents[1]


def _engine_files(env) -> list[str]:
    instance = env.unwrapped._game.get_instance_id()
    return [n for n in os.listdir(SHM_DIR) if n.endswith(instance)]


@pytest.fixture(autouse=True)
def _no_engine_left_behind():
    yield
    gc.collect()
    assert _vizdoom_children() == [], "vizdoom engine processes left running"


# ------------------------------------------------------------------- no engine


def test_placing_is_one_plus_the_players_with_more_frags():
    assert placing(5, [1, 2, 3]) == 1
    assert placing(2, [1, 2, 3]) == 2  # a tie shares the better place
    assert placing(-1, [0, 0, 7]) == 4
    assert placing(0, []) == 1


def test_free_udp_port_can_be_bound():
    port = free_udp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", port))


def test_bots_scenarios_in_the_table_and_the_registry(tmp_path):
    for name in BOTS_SCENARIOS:
        s = SCENARIOS[name]
        assert s.bots >= 1 and s.heads == DEATHMATCH_HEADS
        pressed = {b for head in s.heads for c in head.choices for b, _ in c.buttons}
        assert set(s.buttons) == pressed
        assert _entry(name)[0].target == "envs.doom_multiplayer:DoomBotsEnv"
        where = ["--env", name, "--experiment", "x", "--train_dir", str(tmp_path)]
        cfg = parse_config(where)
        assert cfg.env_reward_shaping is True and cfg.reward_scale == 1.0  # recommended
        off = parse_config([*where, "--env_reward_shaping", "False"])
        assert off.env_reward_shaping is False
    assert SCENARIOS["doom_duel_bots"].bots == 1
    assert SCENARIOS["doom_deathmatch_bots"].bots == 7


@pytest.mark.parametrize("make, match", [
    (lambda: DoomEnv("doom_duel_bots"), "multiplayer scenario"),
    (lambda: DoomBotsEnv("doom_basic"), "single-player scenario"),
    (lambda: DoomBotsEnv("doom_duel_bots", bots=0), "bots must be an int from 1 to 15"),
    (lambda: DoomBotsEnv("doom_duel_bots", bots=16), "bots must be"),
    (lambda: DoomBotsEnv("doom_duel_bots", bots=True), "bots must be"),
    (lambda: make_env("doom_duel_bots", bots="7"), "bots must be"),
    (lambda: DoomBotsEnv("doom_duel"), "self-play scenario"),
    (lambda: DoomBotsEnv("doom_duel_bot"), "unknown doom scenario"),
])
def test_bad_input_is_one_clear_error_before_any_engine_starts(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_bots_env_takes_bots_and_every_one_of_doom_env_s_keywords():
    """It forwards DoomEnv's keywords (one list of them): its signature, which make_env
    checks a run's options against, still names each one; any other is refused by name."""
    own = inspect.signature(DoomEnv).parameters
    bots_env = inspect.signature(DoomBotsEnv).parameters
    assert list(bots_env) == ["scenario", "bots", *list(own)[1:]]
    assert all(bots_env[k].default == p.default for k, p in own.items())
    with pytest.raises(TypeError, match="DoomBotsEnv.*'rgb'"):
        DoomBotsEnv("doom_duel_bots", rgb=True)
    with pytest.raises(ValueError, match="does not support option.*rgb; supported: bots"):
        make_env("doom_duel_bots", rgb=True)


# ------------------------------------------------------------------- with the engine


@pytest.mark.doom
@pytest.mark.parametrize("name", BOTS_SCENARIOS)
def test_gymnasium_env_checker(name):
    env = make_env(name, max_episode_steps=30, measurements=True)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.doom
@pytest.mark.parametrize("name", BOTS_SCENARIOS)
def test_matches_report_frags_and_their_metrics_at_the_end(name):
    env = make_env(name, max_episode_steps=120)
    game = env.unwrapped._game
    try:
        assert env.unwrapped.bots == SCENARIOS[name].bots
        env.action_space.seed(0)
        env.reset(seed=0)
        deaths = 0.0
        for _ in range(2):
            total, steps = 0.0, 0
            truncated = False
            while not truncated:
                _, reward, terminated, truncated, info = env.step(env.action_space.sample())
                total += reward
                steps += 1
                assert not terminated  # dying respawns: only the time limit ends a match
                assert ("episode_metrics" in info) == truncated
            assert steps == 120
            metrics = info["episode_metrics"]
            assert set(metrics) == METRICS
            assert info["episode"]["r"] == total == metrics["frags"]  # the native return: frags
            assert 1 <= metrics["placing"] <= env.unwrapped.bots + 1
            assert metrics["deaths"] >= metrics["suicides"] >= 0
            assert metrics["hits"] >= 0 and metrics["damage"] >= 0
            deaths += metrics["deaths"]
            assert game.get_game_variable(vzd.GameVariable.PLAYER_COUNT) == env.unwrapped.bots + 1
            env.reset()
        # The engine counts deaths since it started; each match reports its own.
        assert deaths == game.get_game_variable(vzd.GameVariable.DEATHCOUNT)
    finally:
        env.close()


@pytest.mark.doom
def test_the_agent_respawns_and_shaping_changes_only_the_training_reward():
    env = make_env("doom_duel_bots", max_episode_steps=200, reward_shaping=True)
    try:
        env.action_space.seed(1)
        env.reset(seed=1)
        shaped = 0.0
        terms = np.zeros(len(env.metadata["reward_terms"]))
        for _ in range(200):  # random play with rockets in the duel: several deaths
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            shaped += reward
            terms += info["reward_terms"]
            assert not terminated
        assert truncated
        metrics = info["episode_metrics"]
        assert metrics["deaths"] > 0
        assert info["episode"]["r"] == metrics["frags"]
        assert shaped != pytest.approx(metrics["frags"])  # -0.5 a death, damage, pickups
        assert shaped == pytest.approx(metrics["frags"] + terms.sum())  # the terms in the reward
        names = env.metadata["reward_terms"]
        assert terms[names.index("DEATHCOUNT")] == -0.5 * metrics["deaths"]
    finally:
        env.close()


def _start_and_step(_: int) -> int:
    env = DoomBotsEnv("doom_duel_bots", max_episode_steps=10)
    try:
        env.reset(seed=os.getpid())
        for _ in range(15):
            *_, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        return env.port
    finally:
        env.close()


@pytest.mark.doom
def test_several_envs_start_at_once_on_distinct_ports():
    envs = [make_env("doom_duel_bots", max_episode_steps=10) for _ in range(3)]
    try:
        ports = {env.unwrapped.port for env in envs}
        for env in envs:
            env.reset(seed=0)
            env.step(env.action_space.sample())
    finally:
        for env in envs:
            env.close()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old) if p)
    try:
        with mp.get_context("spawn").Pool(4) as pool:
            ports |= set(pool.map(_start_and_step, range(4)))
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    assert len(ports) == 7 and all(1024 <= p < 65536 for p in ports)


@pytest.mark.doom
def test_a_killed_engine_makes_the_env_raise_and_close_leaves_nothing():
    env = make_env("doom_deathmatch_bots", max_episode_steps=50)
    try:
        env.reset(seed=0)
        env.step(env.action_space.sample())
        assert len(_engine_files(env)) == 3  # the engine's shared memory and two queues
        instance = env.unwrapped._game.get_instance_id()
        (engine,) = _vizdoom_children()
        os.kill(engine, signal.SIGKILL)
        with pytest.raises(Exception, match="ViZDoom|crash") as raised:
            env.step(env.action_space.sample())
        assert "ViZDoom" in type(raised.value).__name__
    finally:
        env.close()
    assert _vizdoom_children() == []
    assert [n for n in os.listdir(SHM_DIR) if n.endswith(instance)] == []
    # A new env works, and closing it leaves nothing either.
    env = make_env("doom_deathmatch_bots", max_episode_steps=50)
    env.reset(seed=1)
    for _ in range(5):
        env.step(env.action_space.sample())
    instance = env.unwrapped._game.get_instance_id()
    env.close()
    assert _vizdoom_children() == []
    assert [n for n in os.listdir(SHM_DIR) if n.endswith(instance)] == []


def train_serially(tmp_path, env: str, *extra: str) -> tuple[str, dict]:
    """A short serial train.py run on `env` (`extra`: how long, and other flags) that must
    succeed and report frags; its stdout and summary.json."""
    args = ["--env", env, "--experiment", "x", "--train_dir", str(tmp_path),
            "--serial_mode", "--device", "cpu", "--seed", "1", "--num_workers", "1",
            "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--rollout", "16",
            "--env_max_episode_steps", "32", "--log_every_sec", "5", *extra]
    proc = run_train_here(args)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert set(summary["episode_metrics"]) == METRICS
    assert summary["episode_metrics"]["frags"] == pytest.approx(summary["mean_episode_return"])
    assert "episode metrics" in proc.stdout
    return proc.stdout, summary


@pytest.mark.doom
def test_a_short_serial_training_run_reports_frags(tmp_path):
    _, summary = train_serially(tmp_path, "doom_duel_bots", "--batch_size", "32",
                                "--train_for_env_steps", "1024")
    assert summary["env_frames"] >= 1024 and summary["episodes"] >= 4
