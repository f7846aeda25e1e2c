"""The loss terms added for learning across the suite, each against a slow reference written
close to its definition: the symmetric KL to the uniform policy, value clipping around the
behaviour values, the importance-ratio clamp, return normalisation, and the time-limit
bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.appo import LossParams, appo_loss
from fastrl.algo.learner import _add_time_limit_bootstrap
from fastrl.algo.vtrace import vtrace
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.normalize import ReturnNormalizer
from tests.test_appo_loss import make_batch

PARAMS = dict(gamma=0.9, ppo_clip_ratio=0.2, value_loss_coeff=0.5, exploration_loss_coeff=0.01)


@pytest.mark.parametrize("space", [spaces.Discrete(4), spaces.MultiDiscrete([3, 2, 5])])
def test_symmetric_kl_to_uniform_matches_a_loop(space):
    nvec = [space.n] if isinstance(space, spaces.Discrete) else list(space.nvec)
    logits = torch.randn(6, sum(nvec), dtype=torch.float64,
                         generator=torch.Generator().manual_seed(0))
    got = ActionDistribution(logits, space).symmetric_kl_to_uniform()
    for row in range(6):
        expected, offset = 0.0, 0
        for n in nvec:
            p = torch.softmax(logits[row, offset:offset + n], 0).tolist()
            offset += n
            kl_u_p = sum((1 / n) * (math.log(1 / n) - math.log(pi)) for pi in p)
            kl_p_u = sum(pi * (math.log(pi) - math.log(1 / n)) for pi in p)
            expected += kl_u_p + kl_p_u
        assert float(got[row]) == pytest.approx(expected, rel=1e-5)
    uniform = ActionDistribution(torch.zeros(2, sum(nvec)), space).symmetric_kl_to_uniform()
    torch.testing.assert_close(uniform, torch.zeros(2))


def _reference_value_loss(values, targets, behaviour, clip, coeff):
    total = 0.0
    for v, g, old in zip(values.flatten().tolist(), targets.flatten().tolist(),
                         behaviour.flatten().tolist(), strict=True):
        err = (g - v) ** 2
        if clip:
            clipped = old + min(max(v - old, -clip), clip)
            err = max(err, (g - clipped) ** 2)
        total += err
    return coeff * 0.5 * total / values.numel()


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("clip", [0.0, 0.2])
def test_value_loss_with_clipping_and_normalisation_matches_a_loop(clip, normalized):
    b, t = 3, 5
    batch = make_batch(b, t, seed=4)
    g = torch.Generator().manual_seed(9)
    behaviour_values = batch["values"].detach()[:, :t] + 0.3 * torch.randn(b, t, generator=g,
                                                                           dtype=torch.float64)
    mean, std = torch.tensor(0.7, dtype=torch.float64), torch.tensor(2.5, dtype=torch.float64)
    params = LossParams(**PARAMS, ppo_clip_value=clip)
    loss, stats, vs = appo_loss(**batch, params=params, behaviour_values=behaviour_values,
                                value_normalizer=(mean, std) if normalized else None,
                                return_targets=True)
    # The targets are V-trace on the values in return units.
    values = batch["values"].detach()
    raw = values * std + mean if normalized else values
    log_rhos = (batch["target_log_probs"] - batch["behaviour_log_probs"]).detach()
    ref_vs, _ = vtrace(log_rhos.t(), (PARAMS["gamma"] * (~batch["dones"])).double().t(),
                       batch["rewards"].t(), raw[:, :t].t(), raw[:, t], lambda_=1.0)
    torch.testing.assert_close(vs, ref_vs.t(), rtol=1e-5, atol=1e-6)
    targets = (vs - mean) / std if normalized else vs
    expected = _reference_value_loss(values[:, :t], targets, behaviour_values, clip,
                                     PARAMS["value_loss_coeff"])
    assert float(stats["value_loss"]) == pytest.approx(expected, rel=1e-9)


def test_ratio_clamp_bounds_the_surrogate():
    b, t = 2, 4
    batch = make_batch(b, t, seed=1)
    with torch.no_grad():
        batch["target_log_probs"][0, 0] = batch["behaviour_log_probs"][0, 0] + 10.0  # ratio e^10
    clamped = LossParams(**PARAMS, ratio_clamp=20.0)
    _, stats = appo_loss(**batch, params=clamped)
    _, free = appo_loss(**batch, params=LossParams(**PARAMS))
    ratio = torch.exp(batch["target_log_probs"] - batch["behaviour_log_probs"]).detach()
    assert float(free["ratio_mean"]) == pytest.approx(float(ratio.mean()))
    assert float(stats["ratio_mean"]) == pytest.approx(float(ratio.clamp(1 / 20, 20).mean()))
    with pytest.raises(ValueError, match="ratio_clamp"):
        LossParams(**PARAMS, ratio_clamp=0.5)


def test_exploration_term_replaces_negative_entropy():
    b, t = 2, 3
    batch = make_batch(b, t, seed=2)
    penalty = torch.rand(b, t, dtype=torch.float64, requires_grad=True)
    _, with_penalty = appo_loss(**batch, params=LossParams(**PARAMS), exploration=penalty)
    expected = PARAMS["exploration_loss_coeff"] * float(penalty.detach().mean())
    assert float(with_penalty["entropy_loss"]) == pytest.approx(expected)


def test_return_normalizer_matches_numpy_over_everything_seen():
    norm = ReturnNormalizer()
    mean, std = norm.mean_std()
    assert (float(mean), float(std)) == (0.0, 1.0)  # the identity before any update
    rng = np.random.default_rng(0)
    seen = []
    for n in (5, 1, 40, 7):
        x = rng.normal(3.0, 2.0, size=n)
        seen.append(x)
        norm.update(torch.from_numpy(x))
    everything = np.concatenate(seen)
    mean, std = norm.mean_std()
    assert float(mean) == pytest.approx(everything.mean(), rel=1e-6)
    assert float(std) == pytest.approx(everything.std(), rel=1e-6)
    norm.update(torch.zeros(0))  # no data: no change
    assert float(norm.count) == everything.size


def test_time_limit_bootstrap_adds_discounted_value_at_the_cut_step():
    rewards = torch.zeros(3, 4)
    final_step = torch.tensor([2, -1, 0])
    final_values = torch.tensor([1.5, 99.0, -2.0])
    out = _add_time_limit_bootstrap(rewards, final_step, final_values, 0.9, None)
    expected = torch.zeros(3, 4)
    expected[0, 2] = 0.9 * 1.5
    expected[2, 0] = 0.9 * -2.0
    torch.testing.assert_close(out, expected)
    # Normalised critic: the value is taken back to return units first.
    norm = (torch.tensor(1.0), torch.tensor(2.0))
    out = _add_time_limit_bootstrap(rewards, final_step, final_values, 0.9, norm)
    assert float(out[0, 2]) == pytest.approx(0.9 * (1.5 * 2.0 + 1.0))
