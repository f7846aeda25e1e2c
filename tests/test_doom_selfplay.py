"""VizDoom self-play (`envs.doom_selfplay`): several learning players in one match. Tests that
start engines are marked `doom` (and so slow); the others check the table, the registry and
bad input in-process."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("vizdoom")

from envs.doom_scenarios import DEATHMATCH_HEADS, SCENARIOS  # noqa: E402
from envs.doom_selfplay import (  # noqa: E402
    DoomMatchEnv,
    MatchError,
    match_engines,
    port_holders,
)
from fastrl.env_registry import _entry, make_env  # noqa: E402
from fastrl.run_config import parse_config  # noqa: E402
from fastrl.transport.procs import SHM_DIR  # noqa: E402
from tests.test_doom_envs import _vizdoom_children  # noqa: E402
from tests.test_doom_multiplayer import METRICS, REPO_ROOT, train_serially  # noqa: E402

SELFPLAY = {"doom_duel": (2, 0), "doom_deathmatch_full": (4, 4)}  # name: (agents, bots)


def _shm_files(instance_ids) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if any(n.endswith(i) for i in instance_ids)]


def _random_actions(env) -> list:
    return [env.action_space.sample() for _ in range(env.num_agents)]


@pytest.fixture(autouse=True)
def _no_engine_left_behind():
    yield
    gc.collect()
    assert _vizdoom_children() == [], "vizdoom engine processes left running"


# ------------------------------------------------------------------- no engine


def test_selfplay_scenarios_in_the_table_and_the_registry(tmp_path):
    for name, (agents, bots) in SELFPLAY.items():
        s = SCENARIOS[name]
        assert (s.agents, s.bots) == (agents, bots) and s.heads == DEATHMATCH_HEADS
        assert _entry(name)[0].target == "envs.doom_selfplay:DoomMatchEnv"
        cfg = parse_config(["--env", name, "--experiment", "x", "--train_dir", str(tmp_path)])
        assert cfg.env_reward_shaping is True and cfg.reward_scale == 1.0  # recommended
        assert cfg.num_envs_per_worker == {"doom_duel": 8, "doom_deathmatch_full": 2}[name]
    assert SCENARIOS["doom_duel"].cfg == "multi_duel.cfg"
    assert SCENARIOS["doom_deathmatch_full"].cfg == "multi.cfg"


@pytest.mark.parametrize("make, match", [
    (lambda: DoomMatchEnv("doom_duel_bots"), "not a self-play scenario"),
    (lambda: DoomMatchEnv("doom_basic"), "not a self-play scenario"),
    (lambda: make_env("doom_duel", agents=1), "agents must be an int from 2 to 16, got 1"),
    (lambda: make_env("doom_duel", agents=True), "agents must be"),
    (lambda: make_env("doom_deathmatch_full", bots=13), "bots must be an int from 0 to 12"),
    (lambda: make_env("doom_duel", bots=-1), "bots must be"),
    (lambda: make_env("doom_duel", timeout=0), "timeout must be a positive number"),
    (lambda: make_env("doom_duel", render_mode="human"), "render_mode must be None or"),
    (lambda: make_env("doom_duel", rgb=True), "does not take option.s. rgb; it takes agents"),
    (lambda: make_env("doom_duel", frameskip=0), "frameskip must be a positive int"),
    (lambda: make_env("doom_duel", interpolation="cubic"), "interpolation must be one of"),
])
def test_bad_input_is_one_clear_error_before_any_engine_starts(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------------------------- with the engines


@contextmanager
def _match(name: str = "doom_duel", seed: int = 0, **options):
    """A match, reset with `seed` (its action space too); closed at the end, and then none of
    its engines or /dev/shm files may be left."""
    env = make_env(name, **options)
    instances = [p.instance_id for p in env._players]
    try:
        env.action_space.seed(seed)
        env.reset(seed=seed)
        yield env
    finally:
        env.close()
    assert match_engines(env.port) == [] and _shm_files(instances) == []


@pytest.mark.doom
@pytest.mark.parametrize("name", list(SELFPLAY))
def test_each_agent_follows_the_multi_agent_contract(name):
    with _match(name, max_episode_steps=20) as env:
        n = env.num_agents
        assert n == SELFPLAY[name][0] and env.metadata["frameskip"] == 4
        assert env.spec.nondeterministic
        obs, infos = env.reset(seed=0)
        assert len(obs) == len(infos) == n
        assert all(env.observation_space.contains(o) for o in obs)
        for _ in range(5):
            obs, rewards, terminated, truncated, infos = env.step(_random_actions(env))
            for item in (obs, rewards, terminated, truncated, infos):
                assert len(item) == n
            assert all(env.observation_space.contains(o) for o in obs)
            assert all(isinstance(r, float) for r in rewards)
            assert not any(terminated) and not any(truncated)
            assert all(isinstance(i, dict) and "inactive" not in i for i in infos)
        with pytest.raises(ValueError, match="expected one per agent"):
            env.step(_random_actions(env)[:-1])


@pytest.mark.doom
def test_a_match_ends_for_every_player_with_its_metrics_and_the_next_one_starts():
    with _match(seed=1, max_episode_steps=60, measurements=True) as env:
        totals = np.zeros(env.num_agents)
        for step in range(1, 61):
            obs, rewards, terminated, truncated, infos = env.step(_random_actions(env))
            totals += rewards
            assert all(truncated) == (step == 60) and not any(terminated)
        for a, info in enumerate(infos):
            metrics = info["episode_metrics"]
            assert set(metrics) == METRICS
            assert info["episode"] == {"r": metrics["frags"], "l": 60}
            assert metrics["frags"] == totals[a]  # the native return: the frag count
            assert metrics["deaths"] >= metrics["suicides"] >= 0
            assert env.observation_space.contains(info["final_obs"])
        frags = [i["episode_metrics"]["frags"] for i in infos]
        assert [i["episode_metrics"]["placing"] for i in infos] == [
            1 + sum(f > mine for f in frags) for mine in frags]
        # obs are already the next match's first observations: the engines started again.
        assert all(env.observation_space.contains(o) for o in obs)
        assert all(p._game.get_episode_time() <= 2 for p in env._players)
        _, _, _, truncated, infos = env.step(_random_actions(env))
        assert not any(truncated)


def _match_in_a_process(seed: int) -> int:
    """Start a duel in this (spawned) process, check its host holds the port, step, close."""
    with _match(seed=seed, max_episode_steps=10) as env:
        assert len(port_holders(env.port)) == 1
        env.step(_random_actions(env))
        return env.port


@pytest.mark.doom
@pytest.mark.multiprocess
def test_concurrent_matches_get_distinct_ports_each_held_by_its_own_host(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    with mp.get_context("spawn").Pool(2) as processes, ThreadPoolExecutor(3) as threads:
        elsewhere = processes.map_async(_match_in_a_process, range(2))  # other processes
        envs = list(threads.map(lambda _: make_env("doom_duel", max_episode_steps=10),
                                range(3)))  # and 3 matches of this one, all at once
        try:
            ports = [env.unwrapped.port for env in envs]
            for env in envs:
                assert len(match_engines(env.port)) == 2
                assert len(port_holders(env.port)) == 1  # the host binds it, the joiner not
                env.reset(seed=0)
                env.step(_random_actions(env))
        finally:
            for env in envs:
                env.close()
        ports += elsewhere.get(timeout=60)
    assert len(set(ports)) == 5 and all(1024 <= p < 65536 for p in ports)
    assert all(match_engines(p) == [] for p in ports)


@pytest.mark.doom
@pytest.mark.parametrize("victim, sig, message, within", [
    # killed: vizdoom notices at once; stopped (hung): the 2-second timeout
    ("host", signal.SIGKILL, "player 0 failed in step", (0.0, 2.0)),
    ("joiner", signal.SIGSTOP, "did not finish step within 2 s", (1.5, 6.0)),
])
def test_a_dead_or_hung_engine_makes_the_match_raise_in_bounded_time(victim, sig, message,
                                                                     within):
    with _match(max_episode_steps=200, timeout=2.0) as env:
        for _ in range(10):
            env.step(_random_actions(env))
        (host,) = port_holders(env.port)
        instances = [p.instance_id for p in env._players]
        assert len(_shm_files(instances)) == 6  # each engine's shared memory and two queues
        engine = host if victim == "host" else next(
            pid for pid in match_engines(env.port) if pid != host)
        os.kill(engine, sig)
        start = time.monotonic()
        with pytest.raises(MatchError, match=message):
            for _ in range(20):
                env.step(_random_actions(env))
        assert within[0] < time.monotonic() - start < within[1]
        with pytest.raises(MatchError, match="the match is dead"):
            env.reset()


@pytest.mark.doom
@pytest.mark.slow
def test_a_short_serial_training_run_reports_frags(tmp_path):
    out, summary = train_serially(tmp_path, "doom_duel", "--batch_size", "64",
                                  "--train_for_env_steps", "2048")
    assert summary["episodes"] >= 8  # 2 envs x 2 agents, each match 32 steps
    assert "frags" in out
