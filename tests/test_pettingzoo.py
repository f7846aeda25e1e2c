"""PettingZoo's parallel API through envs/pettingzoo_env.py (the optional extra
``fastrl[pettingzoo]``): the adapter on a tiny fake parallel env, the rollout worker's slots
behind it, the names, and MPE's simple_spread when mpe2 is installed. Tests that need
pettingzoo skip without it (CI installs ``.[dev]`` only)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from fastrl.env_registry import make_env
from fastrl.errors import MissingExtraError, UnknownEnvError

FAKE = "pettingzoo:tests.pettingzoo_fake"


def test_without_pettingzoo_a_pettingzoo_env_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pettingzoo", None)  # import pettingzoo fails
    with pytest.raises(MissingExtraError, match=r"needs pettingzoo, .*fastrl\[pettingzoo\]"):
        make_env("pettingzoo:mpe2.simple_spread_v3")


def test_a_module_that_is_not_there_is_a_one_line_error():
    pytest.importorskip("pettingzoo")
    with pytest.raises(UnknownEnvError, match=r"pettingzoo:no_such_env_v0: no such module"):
        make_env("pettingzoo:no_such_env_v0")
    with pytest.raises(ValueError, match="names no module"):
        make_env("pettingzoo:")


def test_agents_with_different_spaces_are_refused():
    pytest.importorskip("pettingzoo")
    from envs.pettingzoo_env import PettingZooEnv
    from tests.pettingzoo_fake import FakeParallelEnv

    with pytest.raises(ValueError, match=r"agent 'agent_2' has the observation space"):
        PettingZooEnv(FakeParallelEnv(odd_space=True), "fake")


def test_an_agent_that_leaves_early_sits_out_until_the_episode_restarts():
    pytest.importorskip("pettingzoo")
    env = make_env(FAKE)
    assert env.num_agents == 3 and env.observation_space.dtype == np.float32
    obs, _ = env.reset(seed=0)
    assert [o.dtype for o in obs] == [np.float32] * 3
    history = []
    for _ in range(5):
        obs, rewards, terminated, truncated, infos = env.step([0, 1, 0])
        history.append((terminated, truncated, infos))
    # step 2: agent_1 terminates; steps 3-4: it sits out; step 4: the others hit the time
    # limit, the env restarts, and step 5 is every agent's first step again
    assert history[1][0] == [False, True, False] and history[1][2][1]["episode"]["l"] == 2
    assert [h[2][1].get("inactive", False) for h in history] == [False, False, True, True, False]
    assert history[3][1] == [True, False, True]
    assert history[3][2][0]["episode"]["l"] == 4 and "final_obs" in history[3][2][0]
    assert [int(o[1]) for o in obs] == [1, 1, 1]  # (step counter of the new episode)


def test_the_rollout_worker_leaves_sitting_out_steps_out_of_training():
    pytest.importorskip("pettingzoo")
    from tests.test_agents import drive, make_worker

    envs = [make_env(FAKE) for _ in range(2)]
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, agents=3, envs=envs)
    completed, episodes = drive(worker, buffers, steps=40)
    for data in completed:
        obs = data["obs"]["obs"]  # [B, T+1, 3]: agent, step, cue
        for b in range(obs.shape[0]):
            agent, steps = int(obs[b, 0, 0]), obs[b, :-1, 1].long()
            valid = data["policy_versions"][b] >= 0
            # agent_1 has steps 1-2 of every 4; it sits out the other two
            expected = (steps < 2) if agent == 1 else steps >= 0
            assert valid.tolist() == expected.tolist(), (agent, steps, valid)
    lengths = sorted({(ep.env_id % 3, ep.length) for ep in episodes})
    assert lengths == [(0, 4), (1, 2), (2, 4)]
    assert all(ep.truncated == (ep.env_id % 3 != 1) for ep in episodes)


def test_simple_spread_from_mpe2():
    pytest.importorskip("pettingzoo")
    pytest.importorskip("mpe2")
    env = make_env("pettingzoo:mpe2.simple_spread_v3", max_episode_steps=5)
    obs, _ = env.reset(seed=1)
    assert env.num_agents == 3 and env.observation_space.shape == (18,) and len(obs) == 3
    for _ in range(5):
        obs, rewards, terminated, truncated, infos = env.step([0, 1, 2])
    assert truncated == [True] * 3 and all(info["episode"]["l"] == 5 for info in infos)
    env.close()
