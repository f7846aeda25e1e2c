"""Reward-shaping weights under PBT (fastrl/algo/pbt/reward_weights.py): the reweighting
against a loop, the terms' path from an env through the rollout workers into the buffers,
the learner's use of its own weights, their perturbation and their checkpoint. The
end-to-end runs are in tests/test_pbt.py (serial) and tests/test_policies_modes.py (parallel)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner import Learner, LearnerSettings
from fastrl.algo.pbt.population import perturb
from fastrl.algo.pbt.reward_weights import RewardWeights
from fastrl.config.settings import Config
from fastrl.errors import EnvOutputError, EnvSettingsError
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.runner.wiring import weighed_reward_terms
from fastrl.sampling.agents import MultiAgentRolloutWorker
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.env_faults import write_reward_terms
from fastrl.sampling.env_setup import env_info, reward_term_names
from fastrl.sampling.rollout import RolloutWorker
from tests.agents_env import AgentsEnv
from tests.counting_env import CountingEnv
from tests.test_ppo_batch import _batch
from tests.test_rollout import drive, fake_policy, worker_flags

T = 5
TERMS = ("bonus", "cost")
HP = {"learning_rate": 5e-4, "exploration_loss_coeff": 0.003, "gamma": 0.99}


class ShapedCountingEnv(CountingEnv):
    """CountingEnv (reward 1 a step) plus two shaping terms, 0.5 and -0.25 a step; from step
    ``bad_at`` on it reports ``bad`` as its terms instead."""

    def __init__(self, *args, bad_at: int | None = None, bad=(1.0,), **kwargs):
        super().__init__(*args, **kwargs)
        self.metadata = {**CountingEnv.metadata, "reward_terms": TERMS}
        self.bad_at, self.bad = bad_at, bad

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        bad = self.bad_at is not None and self.global_step >= self.bad_at
        info["reward_terms"] = self.bad if bad else (0.5, -0.25)
        return obs, reward + 0.25, terminated, truncated, info


def _buffers(env, slots: int, terms: int) -> TrajectoryBuffers:
    layout = BufferLayout.from_spaces(spaces.Dict({"obs": env.observation_space}),
                                      env.action_space, slots, T, 0, terms)
    return TrajectoryBuffers(layout)


# --- the reweighting ------------------------------------------------------------------------


def test_weights_reweigh_the_terms_as_a_loop_does_then_clip():
    gen = torch.Generator().manual_seed(0)
    rewards, terms = torch.randn(3, 4, generator=gen) * 3, torch.randn(3, 4, 2, generator=gen)
    scale, clip = 0.5, 2.0
    weights = RewardWeights(TERMS, scale, clip, torch.device("cpu"))
    weights.set({"reward/bonus": 3.0, "reward/cost": 0.25, "gamma": 0.9})  # others ignored
    got = weights.apply(rewards, terms)
    for b in range(3):
        for t in range(4):
            r = rewards[b, t].item()
            r += scale * ((3.0 - 1) * terms[b, t, 0].item() + (0.25 - 1) * terms[b, t, 1].item())
            assert got[b, t].item() == pytest.approx(max(-clip, min(clip, r)), abs=1e-5)
    assert weights.hyperparams() == {"reward/bonus": 3.0, "reward/cost": 0.25}


def test_weights_of_one_change_nothing_and_a_missing_term_keeps_its_weight():
    weights = RewardWeights(TERMS, 1.0, 1000.0, torch.device("cpu"))
    rewards, terms = torch.randn(2, 3), torch.randn(2, 3, 2)
    assert torch.equal(weights.apply(rewards, terms), rewards)
    weights.set({"reward/cost": 2.0})
    weights.set(dict(HP))  # a checkpoint from before the terms were weighed
    assert weights.hyperparams() == {"reward/bonus": 1.0, "reward/cost": 2.0}


def test_a_steps_terms_are_written_and_bad_ones_are_a_reward_fault():
    out = np.full((3, 2), 7.0, dtype=np.float32)
    write_reward_terms(out[0], (0.5, -1))
    write_reward_terms(out[1], None)  # none reported at this step
    assert out[:2].tolist() == [[0.5, -1.0], [0.0, 0.0]]
    for bad in ((1.0,), (1, 2, 3), 5.0, "ab", (1.0, float("nan")), ((1.0, 2.0),)):
        with pytest.raises(EnvOutputError) as info:
            write_reward_terms(out[2], bad)
        assert info.value.kind == "reward" and "info['reward_terms']" in str(info.value)


# --- from the env into the buffers -----------------------------------------------------------


def test_a_worker_keeps_each_steps_terms_apart_and_leaves_the_reward_to_the_learner():
    envs = [ShapedCountingEnv(env_tag=i, episode_len=7) for i in range(4)]
    buffers = _buffers(envs[0], 12, 2)
    worker = RolloutWorker(0, envs, buffers, torch.zeros((4, 0)), list(range(12)), 2,
                           **worker_flags(reward_scale=2.0, reward_clip=1.0))
    completed, _ = drive(worker, buffers, steps=60)
    assert completed
    for group in completed:
        for _, traj in group:
            assert torch.all(traj["rewards"] == 2.5)  # scaled, not clipped to 1
            assert torch.all(traj["reward_terms"] == torch.tensor([0.5, -0.25]))
    # Without the terms in the buffers the same env's reward is clipped, as before.
    plain = _buffers(envs[0], 12, 0)
    worker = RolloutWorker(0, [ShapedCountingEnv(env_tag=i) for i in range(4)], plain,
                           torch.zeros((4, 0)), list(range(12)), 2,
                           **worker_flags(reward_scale=2.0, reward_clip=1.0))
    completed, _ = drive(worker, plain, steps=60)
    assert all("reward_terms" not in traj and torch.all(traj["rewards"] == 1.0)
               for group in completed for _, traj in group)


def test_bad_terms_are_an_env_fault_like_any_other():
    envs = [ShapedCountingEnv(env_tag=i, bad_at=3 if i == 0 else None) for i in range(2)]
    buffers = _buffers(envs[0], 6, 2)
    worker = RolloutWorker(0, envs, buffers, torch.zeros((2, 0)), list(range(6)), 1,
                           env_factory=lambda: ShapedCountingEnv(env_tag=9), **worker_flags())
    out = worker.start()
    faults = []
    for _ in range(6):
        for split in fake_policy(buffers, out.requests):
            out = worker.on_actions(split)
            faults += out.faults
    assert [f.kind for f in faults] == ["reward"]
    assert "expected 2 numbers" in faults[0].message


def test_each_agent_of_a_multi_agent_env_gets_its_own_terms():
    envs = [AgentsEnv(env_tag=i + 1, shaping=True) for i in range(2)]
    buffers = _buffers(envs[0], 4 * 3, 2)
    worker = MultiAgentRolloutWorker(0, envs, buffers, torch.zeros((4, 0)), list(range(12)), 1,
                                     **worker_flags())
    completed, _ = drive(worker, buffers, steps=40)
    assert completed
    for group in completed:
        for _, traj in group:
            actions, terms = traj["actions"][0, :, 0], traj["reward_terms"][0]
            assert torch.allclose(terms[:, 0], torch.full((T,), 0.1))
            assert torch.allclose(terms[:, 1], torch.where(actions == 0, -0.05, 0.0))


# --- the learner ------------------------------------------------------------------------------


def _cfg(**overrides) -> Config:
    settings = dict(rollout=8, batch_size=48, num_batches_per_epoch=1, num_epochs=1,
                    use_rnn=False, encoder_mlp_layers=[16], device="cpu", precision="fp32",
                    normalize_input=False, normalize_returns=False, num_policies=2,
                    with_pbt=True, reward_scale=0.5, reward_clip=3.0)
    settings.update(overrides)
    return Config(**settings)


def test_a_learner_trains_on_its_own_weighting_of_the_terms():
    cfg, space = _cfg(), spaces.Box(-1.0, 1.0, (5,))
    actions = spaces.Discrete(4)
    torch.manual_seed(1)
    model = ActorCritic(space, actions, ModelSettings.from_config(cfg))
    settings, cpu = LearnerSettings.from_config(cfg), torch.device("cpu")
    shaped = Learner(settings, model, actions, cpu, reward_terms=TERMS)
    plain = Learner(settings, copy.deepcopy(shaped.model), actions, cpu)
    assert shaped.hyperparams == {**HP, "reward/bonus": 1.0, "reward/cost": 1.0} | {
        "learning_rate": cfg.learning_rate, "exploration_loss_coeff":
        cfg.exploration_loss_coeff, "gamma": cfg.gamma}
    shaped.set_hyperparams({**shaped.hyperparams, "reward/bonus": 4.0, "reward/cost": 0.5})
    batch = _batch(6, 8, actions)
    batch["rewards"] = batch["rewards"] * 3  # some beyond the clip once reweighed
    batch["reward_terms"] = torch.randn(6, 8, 2, generator=torch.Generator().manual_seed(2))
    reweighed = dict(batch)
    reweighed["rewards"] = (batch["rewards"] + 0.5 * (3.0 * batch["reward_terms"][..., 0]
                                                      - 0.5 * batch["reward_terms"][..., 1])
                            ).clamp(-3.0, 3.0)
    del reweighed["reward_terms"]
    a, b = shaped.train(batch), plain.train(reweighed)
    assert a["value_loss"] == pytest.approx(b["value_loss"], rel=1e-5)
    for (name, x), y in zip(shaped.model.state_dict().items(), plain.model.state_dict().values(),
                            strict=True):
        assert torch.allclose(x, y, atol=1e-6), name
    # The weights are the learner's own: saved with it, restored under --with_pbt.
    saved = shaped.state_dict()["hyperparams"]
    assert (saved["reward/bonus"], saved["reward/cost"]) == (4.0, 0.5)


def test_pbt_perturbs_the_weights_with_the_other_hyperparameters():
    values = {**HP, "reward/bonus": 1.0, "reward/cost": 2.0}
    for seed in range(20):
        new = perturb(values, np.random.default_rng(seed), 1.1, 1.5)
        assert list(new) == list(values)
        for name in ("reward/bonus", "reward/cost"):
            factor = new[name] / values[name]
            assert 1.1 <= max(factor, 1 / factor) <= 1.5 + 1e-9


def test_the_terms_an_env_names_and_when_they_are_weighed():
    assert reward_term_names({}) == () and reward_term_names({"reward_terms": ["a"]}) == ("a",)
    for bad in ("ab", ["a", "a"], ["a", ""], [3]):
        with pytest.raises(ValueError, match="metadata\\['reward_terms'\\]"):
            reward_term_names({"reward_terms": bad})
    env = ShapedCountingEnv(env_tag=1)
    info = env_info(env)
    assert info.reward_terms == TERMS
    assert weighed_reward_terms(_cfg(), info) == TERMS
    assert weighed_reward_terms(_cfg(pbt_reward_shaping=False), info) == ()
    assert weighed_reward_terms(_cfg(with_pbt=False), info) == ()
    env.metadata = {**env.metadata, "reward_terms": ("x", "x")}
    with pytest.raises(EnvSettingsError, match="appears twice"):
        env_info(env)
