"""A multi-agent env's observations adapted agent by agent (``AgentsObsAdapter`` in
fastrl/sampling/env_setup.py): every kind of space per agent through ``create_env``, the
rollout worker's buffers (each agent's own slots, ``final_obs`` too), the model and enjoy's
match, against plain numpy references; PettingZoo's knights_archers_zombies and pistonball
when pettingzoo is installed (they skip without it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.env_registry import make_env
from fastrl.errors import EnvSettingsError
from fastrl.experiment.match import play_match
from fastrl.policy.model import ActorCritic
from fastrl.run_config import parse_config
from fastrl.sampling.agents import MultiAgentRolloutWorker
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.env_setup import AgentsObsAdapter, EnvSettings, create_env, env_info
from tests.agents_spaces_env import SPACES, final_obs_of, raw_obs
from tests.test_agents import drive
from tests.test_model import small_settings
from tests.test_rollout import worker_flags

T = 5
KAZ = "pettingzoo:butterfly.knights_archers_zombies_v11"


def _hwc(o):
    return o.transpose(2, 0, 1)


REFERENCE = {  # kind -> one agent's raw observation -> {key: what the buffers must hold}
    "BoxGrid": lambda o: {"obs": o.reshape(-1)},
    "Gray": lambda o: {"obs": o[None]},
    "PixelsHWC": lambda o: {"obs": _hwc(o)},
    "FloatImageHWC": lambda o: {"obs": _hwc(o)},
    "Discrete": lambda o: {"obs": np.asarray(o)},
    "MultiDiscrete": lambda o: {"obs": o.reshape(-1)},
    "MultiBinary": lambda o: {"obs": o.reshape(-1)},
    "Dict": lambda o: {"image": _hwc(o["image"]), "direction": np.asarray(o["direction"]),
                       "nested.pos": o["nested"]["pos"].reshape(-1)},  # (the Text left out)
    "Tuple": lambda o: {"obs.0": np.asarray(o[0]), "obs.1": o[1].reshape(-1)},
}


def _settings(env: str, *extra: str) -> EnvSettings:
    return EnvSettings.from_config(
        parse_config(["--env", env, "--train_dir", "/nonexistent", *extra]))


def _envs(kind: str, n: int = 2):
    settings = _settings(f"tests.agents_spaces_env:Agents{kind}-v0")
    return [create_env(settings) for _ in range(n)]


def _assert_holds(stored: dict, expected: dict, what: str) -> None:
    assert sorted(stored) == sorted(expected), what
    for key, value in expected.items():
        got = stored[key]
        got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
        np.testing.assert_array_equal(got, np.asarray(value).astype(got.dtype),
                                      err_msg=f"{what}, key {key}")


def test_every_kind_of_space_is_covered():
    assert sorted(REFERENCE) == sorted(SPACES)


@pytest.mark.parametrize("kind", sorted(SPACES))
def test_each_agents_observation_lands_adapted_in_its_own_slots(kind):
    envs = _envs(kind)
    info = env_info(envs[0])
    assert info.multi_agent and info.num_agents == 2
    reference = REFERENCE[kind]
    assert sorted(info.obs_space.spaces) == sorted(reference(raw_obs(SPACES[kind], 0, 0)))
    slots = len(envs) * 2
    layout = BufferLayout.from_spaces(info.obs_space, info.action_space, slots * 3, T, 0)
    buffers = TrajectoryBuffers(layout)
    worker = MultiAgentRolloutWorker(0, envs, buffers, torch.zeros(slots, 0),
                                     list(range(layout.num_buffers)), 1,
                                     **worker_flags(reward_clip=1e9))
    completed, episodes = drive(worker, buffers, steps=30)
    rows = finals = 0
    agents_seen = set()
    for data in completed:
        for b, codes in enumerate(data["rewards"].long().tolist()):  # agent * 1000 + step
            agent = codes[0] // 1000
            steps = [c - 1000 * agent for c in codes]
            assert [c // 1000 for c in codes] == [agent] * T, "a trajectory mixes agents"
            assert steps == list(range(steps[0], steps[0] + T))
            for t in range(T + 1):  # obs[t]: what the agent saw after the env's step steps[0]-1+t
                stored = {k: v[b, t] for k, v in data["obs"].items()}
                expected = reference(raw_obs(SPACES[kind], agent, steps[0] - 1 + t))
                _assert_holds(stored, expected, f"agent {agent}, step {steps[0] - 1 + t}")
            f = int(data["final_step"][b])
            if f >= 0:  # a time limit ended the agent's episode at step f
                stored = {k: v[b] for k, v in data["final_obs"].items()}
                expected = reference(final_obs_of(SPACES[kind], agent, steps[f]))
                _assert_holds(stored, expected, f"agent {agent}'s final_obs at step {steps[f]}")
                finals += 1
            rows += 1
            agents_seen.add(agent)
    assert rows >= 8 and finals >= 4 and agents_seen == {0, 1}
    assert {ep.length for ep in episodes} == {3, 4} and all(ep.truncated for ep in episodes)


def test_the_adapter_keeps_the_multi_agent_contract():
    env = _envs("BoxGrid", 1)[0]
    assert isinstance(env, AgentsObsAdapter) and env.num_agents == 2
    assert env_info(env).obs_space["obs"].shape == (135,)
    obs, _ = env.reset(seed=0)
    assert len(obs) == 2 and [o["obs"].shape for o in obs] == [(135,), (135,)]
    obs, rewards, terminated, truncated, infos = env.step([0, 0])
    assert rewards == [1.0, 1001.0] and len(infos) == 2
    assert env.step_count == 1  # the env's own attributes show through the adapter
    with pytest.raises(AttributeError):
        env.no_such_attribute  # noqa: B018
    # a multi-agent env takes no frame stacking, adapted or not
    with pytest.raises(EnvSettingsError, match=r"2 agents.*--env_framestack=2"):
        create_env(_settings("tests.agents_spaces_env:AgentsBoxGrid-v0", "--env_framestack", "2"))


SETTINGS = small_settings(rnn_size=8, encoder_fc_size=16, encoder_mlp_layers=[8],
                          normalize_input=True)


@pytest.mark.parametrize("kind", ["BoxGrid", "PixelsHWC", "Dict", "Tuple"])
def test_enjoys_match_gives_the_model_each_agents_adapted_observation(kind):
    env = _envs(kind, 1)[0]
    info = env_info(env)
    model = ActorCritic(info.obs_space, info.action_space, SETTINGS)
    seen = []
    step = model.forward_step

    def recorder(obs, state):
        seen.append({k: v[0].clone() for k, v in obs.items()})
        return step(obs, state)

    model.forward_step = recorder
    frames = []
    results = play_match([model], [0, 0], env, 2, False, "cpu",
                         frame_sink=lambda obs, _env: frames.append(obs), seed=0)
    assert [r.lengths for r in results] == [[3, 3], [4, 4]]
    for n, obs in enumerate(seen[:6]):  # agent 0, agent 1, in turn, from step 0
        _assert_holds(obs, REFERENCE[kind](raw_obs(SPACES[kind], n % 2, n // 2)),
                      f"the model's input {n}")
    # the video gets agent 0's adapted observation
    _assert_holds(frames[1], REFERENCE[kind](raw_obs(SPACES[kind], 0, 1)), "frame 1")


def test_knights_archers_zombies_is_adapted_agent_by_agent():
    """KAZ's agents observe Box(-1, 1, (27, 5)) each: four (135,) vectors, not one (540,)."""
    pytest.importorskip("pettingzoo")
    pytest.importorskip("pymunk")
    env, raw = create_env(_settings(KAZ)), make_env(KAZ)
    try:
        info = env_info(env)
        assert info.multi_agent and info.num_agents == 4 and env.agent_ids == raw.agent_ids
        assert info.obs_space["obs"].shape == (135,)
        obs, _ = env.reset(seed=3)
        raw_first, _ = raw.reset(seed=3)
        assert len(obs) == 4
        for a in range(4):
            np.testing.assert_array_equal(obs[a]["obs"], raw_first[a].reshape(-1))
        assert not np.array_equal(obs[0]["obs"], obs[2]["obs"])  # an archer, a knight
        obs, *_ = env.step([0, 1, 2, 3])
        assert [o["obs"].shape for o in obs] == [(135,)] * 4
    finally:
        env.close()
        raw.close()


def test_pistonball_keeps_the_image_path_per_agent():
    """Pistonball's agents observe uint8 (457, 120, 3) each: one [3, 457, 120] image per agent
    (made channels first by envs/pettingzoo_env.py: no adapter)."""
    pytest.importorskip("pettingzoo")
    pytest.importorskip("pymunk")
    env = create_env(_settings("pettingzoo:butterfly.pistonball_v6"))
    try:
        info = env_info(env)
        assert info.multi_agent and info.num_agents == 20
        assert not isinstance(env, AgentsObsAdapter)
        space = info.obs_space["obs"]
        assert space.shape == (3, 457, 120) and space.dtype == np.uint8
        assert "(image, channels first)" in dict(info.obs_sources)["obs"]
        obs, _ = env.reset(seed=0)
        assert len(obs) == 20 and obs[0].shape == (3, 457, 120)
    finally:
        env.close()


@pytest.mark.slow
def test_knights_archers_zombies_trains_in_serial_mode(tmp_path):
    pytest.importorskip("pettingzoo")
    pytest.importorskip("pymunk")
    from fastrl.runner.serial import run_serial

    summary = run_serial(parse_config([
        "--env", KAZ, "--serial_mode", "True", "--device", "cpu", "--seed", "1",
        "--train_dir", str(tmp_path), "--experiment", "kaz", "--num_envs_per_worker", "2",
        "--worker_num_splits", "1", "--rollout", "16", "--batch_size", "128",
        "--train_for_env_steps", "1024", "--log_every_sec", "100",
        "--summaries_every_sec", "100"]))
    assert summary["env_frames"] >= 1024 and summary["learner_steps"] >= 1
