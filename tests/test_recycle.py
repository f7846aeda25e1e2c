"""Engine recycling (envs.wrappers.Recycle, --env_recycle_episodes, --env_recycle_mb): an env
made anew at an episode boundary, nothing lost; fake envs in-process, then real VizDoom
engines (marked doom)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from envs.wrappers import Recycle
from fastrl.config.settings import Config, ConfigError
from fastrl.env_registry import register_env
from fastrl.errors import EnvSettingsError
from fastrl.run_config import parse_config
from fastrl.sampling.env_setup import EnvSettings, create_env
from tests.agents_env import AgentsEnv
from tests.counting_env import CountingEnv
from tests.test_rollout import T, drive, make_worker

EPISODE_LEN = 3


class EngineEnv(CountingEnv):
    """A CountingEnv that records its resets' seeds and whether it was closed, and names a
    process of its own (``engine_pids``) as a simulator with an engine does."""

    metadata = {**CountingEnv.metadata, "recycle_episodes": 4}

    def __init__(self, env_tag: int, episode_len: int = EPISODE_LEN):
        super().__init__(env_tag=env_tag, episode_len=episode_len)
        self.seeds: list[int | None] = []
        self.closed = False

    def reset(self, *, seed=None, options=None):
        self.seeds.append(seed)
        return super().reset(seed=seed, options=options)

    def close(self):
        self.closed = True

    def engine_pids(self) -> list[int]:
        return [os.getpid()]


def recycling(episodes=0, max_rss=0, rss=None, first_tag=0, episode_len=EPISODE_LEN):
    """A Recycle around EngineEnvs tagged first_tag, first_tag + 1, ...; and every env made."""
    made: list[EngineEnv] = []
    tags = itertools.count(first_tag)

    def factory():
        made.append(EngineEnv(next(tags), episode_len))
        return made[-1]

    return Recycle(factory(), factory, episodes=episodes, max_rss=max_rss, rss=rss), made


def play(env, episodes: int, seed=None) -> list[list[tuple[int, int]]]:
    """``episodes`` episodes; each as its observations' (env tag, episode step)."""
    out = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed if k == 0 else None)
        seen = [(int(obs[0]), int(obs[2]))]
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(0)
            seen.append((int(obs[0]), int(obs[2])))
            done = terminated or truncated
        out.append(seen)
    return out


def test_an_env_is_made_anew_after_n_episodes_at_a_boundary():
    env, made = recycling(episodes=3)
    episodes = play(env, 10)
    tags = [{tag for tag, _ in ep} for ep in episodes]
    assert tags == [{0}] * 3 + [{1}] * 3 + [{2}] * 3 + [{3}]  # one env per episode
    # every episode whole, from its reset's observation on
    assert all([s for _, s in ep] == list(range(EPISODE_LEN + 1)) for ep in episodes)
    assert [e.closed for e in made] == [True, True, True, False]
    assert env.recycled == 3 and env.unwrapped is made[-1]
    env.close()
    assert made[-1].closed


def test_a_new_env_is_seeded_from_the_last_seed_given():
    env, made = recycling(episodes=2)
    play(env, 5, seed=7)
    seeds = [e.seeds for e in made]
    assert seeds[0] == [7, None]
    assert all(s[0] is not None and s[1:] == [None] * (len(s) - 1) for s in seeds[1:])
    assert len({s[0] for s in seeds}) == 3  # each new env its own seed
    again, made_again = recycling(episodes=2)
    play(again, 5, seed=7)
    assert [e.seeds for e in made_again] == seeds  # a seeded run repeats
    other, made_other = recycling(episodes=2)
    play(other, 5, seed=8)
    assert made_other[1].seeds[0] != seeds[1][0]
    unseeded, made_unseeded = recycling(episodes=2)
    play(unseeded, 5)
    assert all(s is None for e in made_unseeded for s in e.seeds)  # the env seeds itself


def test_the_memory_bound_makes_the_env_anew_at_the_next_reset_only():
    sizes = {0: 50, 1: 50}
    env, made = recycling(max_rss=100, rss=lambda e: sizes[e.unwrapped.env_tag])
    assert [{t for t, _ in ep} for ep in play(env, 3)] == [{0}] * 3
    env.reset()
    env.step(0)
    sizes[0] = 150  # the engine grows past the bound mid-episode: the episode goes on
    obs, *_ = env.step(0)
    assert int(obs[0]) == 0 and env.recycled == 0
    obs, _ = env.reset()
    assert int(obs[0]) == 1 and made[0].closed and env.recycled == 1 and env.started == 1


def test_a_bound_a_new_env_starts_above_is_refused():
    with pytest.raises(ValueError, match="already hold 2 MB, above the bound of 1 MB"):
        recycling(max_rss=2**20, rss=lambda e: 2 * 2**20)


def test_nothing_is_lost_through_the_rollout_worker():
    """Envs made anew every 2 episodes under the rollout worker: every step of every env lands
    in exactly one trajectory, each episode whole and reported, a new env only at a boundary."""
    envs = [recycling(episodes=2, first_tag=1000 * i, episode_len=7)[0] for i in range(4)]
    worker, _, buffers, _ = make_worker(envs=envs)
    completed, episodes = drive(worker, buffers, steps=600)
    seen: dict[int, list[int]] = {}
    for group in completed:
        for _, traj in group:
            obs = traj["obs"]["obs"][0]  # [T + 1, 3]: tag, the env's step, the episode's step
            for t in range(T + 1):
                tag, step, ep_step = (int(v) for v in obs[t])
                if t < T:
                    seen.setdefault(tag, []).append(step)
                if t and tag != int(obs[t - 1, 0]):
                    assert ep_step == 0 and bool(traj["dones"][0, t - 1]), "cut mid-episode"
            assert torch_all_valid(traj)
    assert all(sorted(s) == list(range(len(s))) for s in seen.values()), "a step lost or twice"
    assert len(seen) > 3 * len(envs)  # envs were made anew, several times each
    assert sum(e.recycled for e in envs) >= 2 * len(envs)
    assert worker.env_recycles == sum(e.recycled for e in envs)  # what its station reports
    assert episodes and all(ep.episode_return == 7 and ep.length == 7 for ep in episodes)


def torch_all_valid(traj) -> bool:
    return bool((traj["policy_versions"] >= 0).all()) and bool((traj["rewards"] == 1.0).all())


def _settings(env: str, **flags) -> EnvSettings:
    return EnvSettings.from_config(dataclasses.replace(Config(), env=env, **flags))


@pytest.fixture(scope="module")
def registered():
    register_env("recycle_opt_in", lambda: EngineEnv(1), overwrite=True)
    register_env("recycle_plain", lambda: CountingEnv(env_tag=1), overwrite=True)
    register_env("recycle_agents", lambda: _agents_opting_in(), overwrite=True)


def _agents_opting_in() -> AgentsEnv:
    env = AgentsEnv(env_tag=1)
    env.metadata = {**env.metadata, "recycle_episodes": 5}  # (as DoomMatchEnv's players do)
    return env


@pytest.mark.parametrize("env,flags,episodes", [
    ("recycle_opt_in", {}, 4),  # the env's own period
    ("recycle_opt_in", {"env_recycle_episodes": 9}, 9),
    ("recycle_opt_in", {"env_recycle_episodes": 0}, None),
    ("recycle_plain", {}, None),  # an env that does not opt in
    ("recycle_plain", {"env_recycle_episodes": 9}, 9),  # any single-agent env when asked
    ("recycle_agents", {}, None),  # never a multi-agent env by itself
])
def test_create_env_recycles_as_the_flags_and_the_env_ask(registered, env, flags, episodes):
    made = create_env(_settings(env, **flags))
    assert (made.episodes if isinstance(made, Recycle) else None) == episodes
    made.close()


@pytest.mark.parametrize("env,flags,needle", [
    ("recycle_agents", {"env_recycle_episodes": 5},
     "--env_recycle_episodes=5: env 'recycle_agents' (2 agents) restarts its episodes itself"),
    ("recycle_plain", {"env_recycle_mb": 64},
     "--env_recycle_mb=64: env 'recycle_plain' names no processes of its own"),
    ("recycle_opt_in", {"env_recycle_mb": 1}, "--env_recycle_mb=1: a new env's processes "
                                              "already hold"),
])
def test_what_an_env_cannot_do_is_one_line(registered, env, flags, needle):
    with pytest.raises(EnvSettingsError) as info:
        create_env(_settings(env, **flags))
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)


def test_the_memory_bound_reads_the_engines_resident_memory(registered):
    env = create_env(_settings("recycle_opt_in", env_recycle_mb=1 << 16))  # 64 GB
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert env.max_rss == 2**36 and abs(env._rss(env) - rss) < 64 * 2**20
    env.close()


def test_negative_values_are_refused_in_one_line_each():
    with pytest.raises(ConfigError) as info:
        parse_config(["--env_recycle_episodes", "-1", "--env_recycle_mb", "-5",
                      "--train_dir", "/nonexistent"])
    assert info.value.errors == [
        "--env_recycle_episodes=-1: must be >= 0 (0: never; None: the env's own period)",
        "--env_recycle_mb=-5: must be >= 0 (0: no bound)"]


# --- real VizDoom engines --------------------------------------------------------------------


def _engines() -> set[int]:
    from fastrl.transport.procs import alive, children, process_title

    return {p for p in alive(children(os.getpid())) if process_title(p).endswith("vizdoom")}


@pytest.mark.doom
def test_a_doom_engine_is_made_anew_every_2_episodes_and_the_old_one_is_gone():
    pytest.importorskip("vizdoom")
    from envs.doom import RECYCLE_EPISODES
    from fastrl.transport.procs import SHM_DIR

    default = create_env(_settings("doom_basic"))
    assert isinstance(default, Recycle) and default.episodes == RECYCLE_EPISODES
    default.close()
    env = create_env(_settings("doom_basic", env_recycle_episodes=2))
    rng = np.random.default_rng(0)
    pids, ids, returns = [], [], []
    for k in range(7):
        env.reset(seed=11 if k == 0 else None)
        pids += env.unwrapped.engine_pids()
        ids.append(env.unwrapped._game.get_instance_id())
        assert _engines() == {pids[-1]}  # the old engine is gone before the new one plays
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
            done = terminated or truncated
        returns.append(info["episode"]["r"])
        assert 1 <= info["episode"]["l"] <= env.unwrapped.max_episode_steps
    assert [pids.index(p) for p in pids] == [0, 0, 2, 2, 4, 4, 6]
    assert all(-800 < r <= 101 for r in returns), returns  # doom_basic's own range
    assert len(set(returns)) > 1
    env.close()
    assert _engines() == set()
    left = [n for n in os.listdir(SHM_DIR) if any(n.endswith(i) for i in ids)]
    assert left == []  # no engine's shared memory left behind


@pytest.mark.doom
def test_a_match_against_bots_is_hosted_anew_on_a_new_port():
    pytest.importorskip("vizdoom")
    env = create_env(_settings("doom_duel_bots", env_recycle_episodes=1, env_max_episode_steps=5))
    assert env.episodes == 1
    pids, ports = [], []
    for k in range(3):
        env.reset(seed=3 if k == 0 else None)
        pids += env.unwrapped.engine_pids()
        ports.append(env.unwrapped.port)
        assert _engines() == {pids[-1]}
        for _ in range(5):
            *_, truncated, info = env.step(env.action_space.sample())
        assert truncated and set(info["episode_metrics"]) >= {"frags", "placing"}
    assert len(set(pids)) == 3 and len(set(ports)) == 3
    env.close()
    assert _engines() == set()


@pytest.mark.doom
def test_a_training_run_with_recycled_engines_loses_nothing(tmp_path, monkeypatch):
    pytest.importorskip("vizdoom")
    from fastrl.runner.serial import run_serial
    from fastrl.sampling import env_setup

    wrappers = []

    def recycle_env(*args, **kwargs):
        wrappers.append(env_setup_recycle_env(*args, **kwargs))
        return wrappers[-1]

    env_setup_recycle_env = env_setup.recycle_env
    monkeypatch.setattr(env_setup, "recycle_env", recycle_env)

    cfg = parse_config(["--env", "doom_basic", "--serial_mode", "--num_envs_per_worker", "4",
                        "--env_recycle_episodes", "2", "--train_for_env_steps", "4000",
                        "--train_dir", str(tmp_path), "--experiment", "recycle",
                        "--seed", "1"])
    summary = run_serial(cfg)
    assert summary["env_frames"] >= 4000
    # 1,024 agent steps on 4 envs; doom_basic times out after 75 agent steps: at least 14
    # episodes (18-20 seen), so each env passes its period of 2 at least once or twice.
    assert summary["episodes"] >= 14, summary
    assert sum(w.recycled for w in wrappers) >= 4  # engines were made anew during the run
    assert summary["env_restarts"] == 0 and not any(summary["env_faults"].values()), summary
    assert _engines() == set()


@pytest.mark.doom
@pytest.mark.parametrize("argv", [["cost", "--repeats", "2"], ["growth", "--seconds", "1"]])
def test_the_sizing_script_prints_one_json_line(argv):
    pytest.importorskip("vizdoom")
    proc = subprocess.run([sys.executable, "perf/engine_recycle.py", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["what"] == argv[0] and (out.get("median_s", 0) > 0 or out.get("episodes", 0) > 0)


@pytest.mark.slow
def test_the_run_counts_the_envs_made_anew(tmp_path, capsys):
    """Recycles travel from the rollout worker to summary.json and the exit summary."""
    from fastrl.experiment.reporter import print_final_summary
    from fastrl.runner.serial import run_serial

    register_env("recycle_counted", lambda: CountingEnv(env_tag=1, episode_len=5),
                 overwrite=True)
    cfg = parse_config(["--env", "recycle_counted", "--serial_mode", "--num_envs_per_worker",
                        "4", "--env_recycle_episodes", "3", "--train_for_env_steps", "2048",
                        "--rollout", "16", "--batch_size", "256", "--device", "cpu",
                        "--train_dir", str(tmp_path), "--experiment", "counted", "--seed", "1",
                        "--env_check", "strict"])
    summary = run_serial(cfg)
    # >= 2,048 steps of 5-step episodes on 4 envs: >= 100 episodes per env, one recycle
    # every 3: about 33 per env (the last report may miss the final few)
    assert summary["env_recycles"] >= 4 * 25, summary
    assert summary["env_restarts"] == 0, summary
    print_final_summary(summary)
    assert "  envs recycled   " in capsys.readouterr().out
