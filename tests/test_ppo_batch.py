"""``--advantages batch``: targets and advantages once per batch, single-step minibatches.

Checked against the trajectory path (one SGD step over the whole batch must be the same
update either way), against a slow GAE reference, and end to end in every mode.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from gymnasium import spaces

from fastrl.algo.appo import LossParams, return_targets_and_advantages
from fastrl.algo.learner import Learner, LearnerSettings
from fastrl.config.checks import validate
from fastrl.config.settings import Config
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from tests.test_parallel import run_train

VEC = spaces.Box(-1.0, 1.0, (5,))
BOX = spaces.Box(-1.0, 1.0, (3,))
DISCRETE = spaces.Discrete(4)


def _batch(b: int, t: int, action_space: spaces.Space, seed: int = 0, rnn_size: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    if isinstance(action_space, spaces.Box):
        actions = torch.randn(b, t, 3, generator=gen)
    else:
        actions = torch.randint(0, 4, (b, t, 1), generator=gen)
    dones = torch.rand(b, t, generator=gen) < 0.15
    final_step = torch.full((b,), -1, dtype=torch.long)
    final_step[0] = 2  # a time limit cut trajectory 0 after step 2
    dones[0, 2] = True
    versions = torch.zeros(b, t, dtype=torch.long)
    versions[1, t - 2:] = -1  # an invalid tail (an env fault)
    return {
        "obs": {"obs": torch.randn(b, t + 1, 5, generator=gen)},
        "actions": actions,
        "log_probs": -1.0 - torch.rand(b, t, generator=gen),
        "values": torch.randn(b, t, generator=gen) * 0.1,
        "rewards": torch.randn(b, t, generator=gen),
        "dones": dones,
        "policy_versions": versions,
        "rnn_states": torch.randn(b, rnn_size, generator=gen),
        "final_obs": {"obs": torch.randn(b, 5, generator=gen)},
        "final_step": final_step,
    }


def _cfg(**overrides) -> Config:
    settings = dict(rollout=8, batch_size=48, num_batches_per_epoch=1, num_epochs=1,
                    use_rnn=False, encoder_mlp_layers=[16], device="cpu", precision="fp32",
                    normalize_returns=False, exploration_loss_coeff=0.01, ppo_clip_value=0.2)
    settings.update(overrides)
    return Config(**settings)


@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
@pytest.mark.parametrize("use_rnn", [False, True], ids=["ff", "gru"])
@pytest.mark.parametrize("with_vtrace", [False, True], ids=["gae", "vtrace"])
def test_one_step_over_the_whole_batch_is_the_same_update_either_way(action_space, use_rnn,
                                                                        with_vtrace):
    # With a single SGD step both ways compute the targets from the same critic, so the
    # parameters after it must agree (the batch path shuffles steps, which a sum ignores).
    torch.manual_seed(0)
    cfg_traj = _cfg(use_rnn=use_rnn, rnn_size=8, with_vtrace=with_vtrace)
    settings = ModelSettings.from_config(cfg_traj)
    model = ActorCritic(VEC, action_space, settings)
    twin = copy.deepcopy(model)
    batch = _batch(6, 8, action_space, rnn_size=model.rnn_state_size)
    cpu = torch.device("cpu")
    Learner(LearnerSettings.from_config(cfg_traj), model, action_space, cpu).train(batch)
    cfg_batch = _cfg(use_rnn=use_rnn, rnn_size=8, with_vtrace=with_vtrace, advantages="batch")
    stats = Learner(LearnerSettings.from_config(cfg_batch), twin, action_space, cpu).train(batch)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert stats["num_valid"] == 6 * 8 - 2
    assert any(not torch.equal(a, b) for a, b in zip(
        model.parameters(), ActorCritic(VEC, action_space, settings).parameters()))


def test_single_steps_make_minibatches_smaller_than_a_trajectory():
    cfg = _cfg(rollout=16, batch_size=8, num_batches_per_epoch=12, num_epochs=3,
               advantages="batch", normalize_returns=True)
    assert validate(cfg) == []
    model = ActorCritic(VEC, BOX, ModelSettings.from_config(cfg))
    learner = Learner(LearnerSettings.from_config(cfg), model, BOX, torch.device("cpu"))
    batch = _batch(6, 16, BOX)
    stats = learner.train(batch)
    assert learner.version == 3 * 12  # 96 steps in minibatches of 8, three epochs
    assert stats["num_valid"] == 8 or 0 < stats["num_valid"] <= 8
    # The return normaliser saw the batch's targets once (the valid steps), not per step.
    assert float(model.returns_normalizer.count) == 6 * 16 - 2


def test_a_rollout_longer_than_the_minibatch_needs_single_steps():
    assert validate(_cfg(rollout=128, batch_size=64, num_batches_per_epoch=32,
                         advantages="batch")) == []
    errors = validate(_cfg(rollout=128, batch_size=64, num_batches_per_epoch=32))
    assert any("--batch_size=64" in e and "--rollout=128" in e for e in errors)
    errors = validate(_cfg(rollout=128, batch_size=64, num_batches_per_epoch=32,
                           advantages="batch", use_rnn=True))
    assert any("--batch_size=64" in e for e in errors)
    errors = validate(_cfg(rollout=128, batch_size=48, num_batches_per_epoch=1,
                           advantages="batch"))
    assert any("num_batches_per_epoch" in e for e in errors)


def _slow_gae(rewards, values, bootstrap, dones, valid, gamma, lam):
    b, t = rewards.shape
    adv = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        nxt_adv, nxt_value = 0.0, float(bootstrap[i]) if valid[i, -1] else 0.0
        for s in reversed(range(t)):
            if not valid[i, s]:
                nxt_adv, nxt_value = 0.0, 0.0
                continue
            cont = 0.0 if dones[i, s] else 1.0
            delta = float(rewards[i, s]) + gamma * cont * nxt_value - float(values[i, s])
            nxt_adv = delta + gamma * lam * cont * nxt_adv
            adv[i, s] = nxt_adv
            nxt_value = float(values[i, s])
    return adv, adv + values.double() * valid


def test_gae_targets_and_advantages_against_a_slow_reference():
    gen = torch.Generator().manual_seed(5)
    b, t = 5, 9
    rewards, values = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    bootstrap = torch.randn(b, generator=gen)
    dones = torch.rand(b, t, generator=gen) < 0.2
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[2, 6:] = False
    params = LossParams(gamma=0.97, ppo_clip_ratio=0.2, value_loss_coeff=0.5,
                        exploration_loss_coeff=0.0, with_vtrace=False, gae_lambda=0.9)
    log_ratio = torch.randn(b, t, generator=gen)  # ignored without V-trace
    vs, adv = return_targets_and_advantages(log_ratio, values, bootstrap, rewards, dones, valid,
                                            params)
    ref_adv, ref_vs = _slow_gae(rewards, values, bootstrap, dones, valid, 0.97, 0.9)
    torch.testing.assert_close(adv[valid].double(), ref_adv[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vs[valid].double(), ref_vs[valid], rtol=1e-5, atol=1e-5)


MODES = {"serial": ["--serial_mode"], "async": [], "sync": ["--async_rl", "False"]}


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", sorted(MODES))
def test_single_step_minibatches_train_in_every_mode(tmp_path, mode):
    args = ["--env", "tests.continuous_env:Reach-v0", "--recipe", "pixels",
            *MODES[mode], "--train_dir", str(tmp_path),
            "--experiment", "x", "--device", "cpu", "--seed", "1", "--num_workers", "2",
            "--num_envs_per_worker", "2", "--rollout", "32", "--batch_size", "16",
            "--num_batches_per_epoch", "8", "--num_epochs", "2", "--advantages", "batch",
            "--use_rnn", "False", "--encoder_mlp_layers", "16", "--train_for_env_steps", "1024",
            "--log_every_sec", "1", "--summaries_every_sec", "1"]
    if mode == "serial":
        summary = run_serial(parse_config(args))
    else:
        proc = run_train(args, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 1024
    assert summary["learner_steps"] >= 1024 // 128 * 16
