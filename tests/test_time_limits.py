"""Time limits are not deaths: the rollout worker keeps the episode's last observation, the
model values it as the next step would, and the learner bootstraps from that value. Also the
start-up decorrelation of envs and the vector-observation normaliser."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.policy.model import ActorCritic
from tests.counting_env import CountingEnv
from tests.test_model import OBS_SPACES, random_obs, small_settings
from tests.test_rollout import T, drive, make_worker


def test_truncated_episode_keeps_its_last_observation():
    envs = [CountingEnv(env_tag=i, episode_len=3, truncate=True) for i in range(2)]
    worker, envs, buffers, _ = make_worker(num_envs=2, splits=1, per_env=3, envs=envs)
    slots, episodes = drive(worker, buffers, steps=4 * T)
    assert episodes and all(ep.truncated for ep in episodes)
    for _, data in (s for traj in slots for s in traj):
        dones = data["dones"][0]
        step = int(data["final_step"][0])
        ends = torch.nonzero(dones).flatten().tolist()
        assert step == ends[0]  # one kept per slot: the first time limit in the trajectory
        final = data["final_obs"]["obs"][0]
        after = data["obs"]["obs"][0, step + 1]
        # The kept observation ends the episode (episode_step 3); the one at step + 1 is the
        # reset (episode_step 0) of the same env.
        assert float(final[2]) == 3 and float(after[2]) == 0 and float(final[0]) == float(after[0])
        assert float(final[1]) == float(after[1])  # same global step: reset takes no step
    # With episodes of 3 steps and T = 5, some trajectories hold two time limits.
    assert worker.truncations_not_bootstrapped > 0


def test_terminated_episode_keeps_nothing():
    worker, envs, buffers, _ = make_worker(num_envs=2, splits=1, per_env=3)
    slots, episodes = drive(worker, buffers, steps=4 * T)
    assert episodes and not any(ep.truncated for ep in episodes)
    assert all(int(data["final_step"][0]) == -1 for traj in slots for _, data in traj)


def test_decorrelated_start_offsets_each_env():
    envs = [CountingEnv(env_tag=i, episode_len=1000) for i in range(4)]
    worker, envs, buffers, _ = make_worker(num_envs=4, splits=2, envs=envs, decorrelate=True)
    worker.start()
    assert [env.global_step for env in envs] == [e * T for e in range(4)]
    # The first observation written is the one the env was left at.
    assert buffers.obs["obs"][0, 0, 1].item() == 0
    steps_in_buffers = sorted(int(buffers.obs["obs"][b, 0, 1]) for b in worker.splits[1].buffers)
    assert steps_in_buffers == [2 * T, 3 * T]


@pytest.mark.parametrize("use_rnn", [True, False])
def test_final_value_is_the_next_step_value_before_the_reset(use_rnn):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    space = OBS_SPACES["dict"]
    from gymnasium import spaces

    model = ActorCritic(space, spaces.Discrete(3), small_settings(use_rnn=use_rnn))
    b, t = 3, 5
    obs = random_obs(space, (b, t), gen)
    final_obs = random_obs(space, (b,), gen)
    final_step = torch.tensor([1, -1, 4])
    h0 = torch.randn(b, model.rnn_state_size, generator=gen)
    resets = torch.zeros(b, t)
    resets[0, 2] = 1.0  # the episode cut after step 1 restarts at step 2
    with torch.no_grad():
        logits, values, final_values = model.forward_sequence(
            obs, h0, resets, final_obs, final_step
        )
        plain_logits, plain_values = model.forward_sequence(obs, h0, resets)
        torch.testing.assert_close(values, plain_values)
        for row in (0, 2):
            h = h0[row:row + 1]
            for step in range(int(final_step[row]) + 1):
                h = h * (1.0 - resets[row, step])
                _, _, h = model.forward_step({k: v[row:row + 1, step] for k, v in obs.items()}, h)
            _, expected, _ = model.forward_step(
                {k: v[row:row + 1] for k, v in final_obs.items()}, h
            )
            assert float(final_values[row]) == pytest.approx(float(expected), abs=1e-5)
    assert float(final_values[1]) == 0.0


def test_vector_observations_are_whitened_after_an_update():
    from gymnasium import spaces

    settings = small_settings(normalize_input=True)
    model = ActorCritic(OBS_SPACES["vector"], spaces.Discrete(3), settings)
    enc = model.encoders[0]
    x = torch.from_numpy(np.random.default_rng(0).normal(5.0, 3.0, (64, 7)).astype(np.float32))
    # Before any update: the identity (up to the clip to [-5, 5]).
    torch.testing.assert_close(enc(x), enc.mlp(x.clamp(-5, 5)))
    model.update_normalizers({"obs": x})
    torch.testing.assert_close(enc.obs_mean, x.mean(0))
    torch.testing.assert_close(enc.obs_var, x.var(0, unbiased=False))
    whitened = ((x - x.mean(0)) / x.std(0, unbiased=False)).clamp(-5, 5)
    torch.testing.assert_close(enc(x), enc.mlp(whitened), atol=1e-5, rtol=1e-5)


def test_env_fault_during_decorrelation_recreates_the_env():
    envs = [CountingEnv(env_tag=i, crash_at=3) for i in range(2)]
    worker, envs, buffers, _ = make_worker(num_envs=2, splits=1, envs=envs, decorrelate=True,
                                           env_factory=lambda: CountingEnv(env_tag=9))
    out = worker.start()
    # env 1 takes T = 5 random steps and crashes at its 4th: a fresh env takes its place.
    assert out.env_restarts == 1 and "crashed on purpose" in str(out.faults[0])
    assert worker.envs[1].env_tag == 9 and out.requests
