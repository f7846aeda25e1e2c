"""The APPO loss: masking of invalid samples, on-policy behaviour, gradient direction."""

from __future__ import annotations

import pytest
import torch

from fastrl.algo.appo import LossParams, appo_loss
from fastrl.algo.vtrace import vtrace

PARAMS = LossParams(
    gamma=0.95, ppo_clip_ratio=0.1, value_loss_coeff=0.5, exploration_loss_coeff=0.01
)
GRAD_KEYS = ("target_log_probs", "entropy", "values")


def make_batch(batch: int, num_steps: int, seed: int) -> dict[str, torch.Tensor]:
    """Random float64 batch-major inputs, all valid; the GRAD_KEYS are leaves with grad."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    behaviour = -torch.rand(batch, num_steps, generator=g, dtype=torch.float64) * 2.0
    return {
        "target_log_probs": (behaviour + 0.3 * randn(batch, num_steps)).requires_grad_(True),
        "entropy": torch.rand(batch, num_steps, generator=g, dtype=torch.float64).requires_grad_(
            True
        ),
        "behaviour_log_probs": behaviour,
        "values": randn(batch, num_steps + 1).requires_grad_(True),
        "rewards": randn(batch, num_steps),
        "dones": torch.rand(batch, num_steps, generator=g) < 0.2,
        "valid": torch.ones(batch, num_steps, dtype=torch.bool),
    }


def garbage_like(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Same shape and dtype as ``x``: large random values sprinkled with NaN and +-inf."""
    g = torch.Generator().manual_seed(seed)
    if x.dtype == torch.bool:
        return torch.rand(x.shape, generator=g) < 0.5
    out = torch.randn(x.shape, generator=g, dtype=x.dtype) * 1e6
    choice = torch.randint(0, 4, x.shape, generator=g)
    out[choice == 1] = float("nan")
    out[choice == 2] = float("inf")
    out[choice == 3] = float("-inf")
    return out


def run(inputs: dict[str, torch.Tensor], params: LossParams = PARAMS):
    """Loss, stats and the gradients of the loss with respect to GRAD_KEYS."""
    for key in GRAD_KEYS:
        inputs[key].grad = None
    loss, stats = appo_loss(**inputs, params=params)
    loss.backward()
    grads = {key: inputs[key].grad.clone() for key in GRAD_KEYS}
    return loss.detach(), stats, grads


def leaf(x: torch.Tensor, key: str) -> torch.Tensor:
    x = x.detach().clone()
    return x.requires_grad_(True) if key in GRAD_KEYS else x


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_appended_garbage_trajectories_have_no_influence(with_vtrace: bool) -> None:
    params = LossParams(**{**vars(PARAMS), "with_vtrace": with_vtrace})
    batch, extra, num_steps = 6, 4, 8
    clean = make_batch(batch, num_steps, seed=0)
    ref_loss, ref_stats, ref_grads = run(clean, params)

    padded = {}
    for i, (key, x) in enumerate(clean.items()):
        tail = garbage_like(x[:extra], seed=100 + i)
        if key == "valid":
            tail = torch.zeros_like(tail)
        padded[key] = leaf(torch.cat([x.detach(), tail]), key)
    loss, stats, grads = run(padded, params)

    assert torch.isfinite(ref_loss)
    torch.testing.assert_close(loss, ref_loss)
    assert stats.keys() == ref_stats.keys()
    for key in stats:
        torch.testing.assert_close(stats[key], ref_stats[key], msg=key)
    for key in GRAD_KEYS:
        torch.testing.assert_close(grads[key][:batch], ref_grads[key], msg=key)
        assert torch.all(grads[key][batch:] == 0), key


def test_garbage_in_invalid_tail_steps_has_no_influence() -> None:
    """Two different garbage fillings of the same invalid steps give identical results."""
    batch, num_steps = 5, 10
    base = make_batch(batch, num_steps, seed=1)
    valid = torch.ones(batch, num_steps, dtype=torch.bool)
    valid[0, 6:] = False  # invalid tail: the bootstrap value is garbage too
    valid[1, :] = False
    valid[2, -1] = False
    invalid_values = torch.cat([~valid, ~valid[:, -1:]], dim=1)

    results = []
    for seed in (10, 20):
        filled = {}
        for i, (key, x) in enumerate(base.items()):
            if key == "valid":
                filled[key] = valid
                continue
            mask = invalid_values if key == "values" else ~valid
            filled[key] = leaf(torch.where(mask, garbage_like(x, seed + i), x.detach()), key)
        results.append(run(filled))

    (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = results
    assert torch.isfinite(loss_a)
    torch.testing.assert_close(loss_a, loss_b)
    for key in stats_a:
        assert torch.isfinite(stats_a[key]), key
        torch.testing.assert_close(stats_a[key], stats_b[key], msg=key)
    for key in GRAD_KEYS:
        torch.testing.assert_close(grads_a[key], grads_b[key], msg=key)
        assert torch.all(torch.isfinite(grads_a[key])), key
    assert torch.all(grads_a["target_log_probs"][~valid] == 0)
    assert stats_a["num_valid"].item() == valid.sum().item()


def test_on_policy_ratio_is_one_and_nothing_clipped() -> None:
    inputs = make_batch(4, 7, seed=2)
    inputs["target_log_probs"] = leaf(inputs["behaviour_log_probs"], "target_log_probs")
    loss, stats, grads = run(inputs)
    assert stats["clip_fraction"].item() == 0.0
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(stats["kl"], torch.tensor(0.0, dtype=torch.float64))
    # With ratio 1 the surrogate is the mean of the normalised advantages, i.e. zero, and
    # its gradient with respect to each log-prob is -adv_normalised / N.
    torch.testing.assert_close(stats["policy_loss"], torch.tensor(0.0, dtype=torch.float64))
    vs, pg = vtrace(
        torch.zeros(7, 4, dtype=torch.float64),
        PARAMS.gamma * (~inputs["dones"]).double().t(),
        inputs["rewards"].t(),
        inputs["values"][:, :7].detach().t(),
        inputs["values"][:, 7].detach(),
    )
    pg = pg.t()
    adv = (pg - pg.mean()) / (pg.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(grads["target_log_probs"], -adv / adv.numel())


def test_off_policy_ratios_get_clipped() -> None:
    inputs = make_batch(4, 7, seed=3)
    loss, stats, _ = run(inputs)
    ratio = torch.exp(inputs["target_log_probs"] - inputs["behaviour_log_probs"]).detach()
    expected = ((ratio - 1).abs() > PARAMS.ppo_clip_ratio).double().mean()
    assert 0.0 < expected.item() < 1.0
    torch.testing.assert_close(stats["clip_fraction"], expected)
    kl = (inputs["behaviour_log_probs"] - inputs["target_log_probs"]).detach().mean()
    torch.testing.assert_close(stats["kl"], kl)


def test_matches_direct_formula_when_all_valid() -> None:
    inputs = make_batch(3, 6, seed=4)
    loss, stats, _ = run(inputs)
    tlp, blp = inputs["target_log_probs"].detach(), inputs["behaviour_log_probs"]
    values = inputs["values"].detach()
    vs, pg = vtrace(
        (tlp - blp).t(),
        PARAMS.gamma * (~inputs["dones"]).double().t(),
        inputs["rewards"].t(),
        values[:, :6].t(),
        values[:, 6],
    )
    vs, pg = vs.t(), pg.t()
    adv = (pg - pg.mean()) / (pg.std(unbiased=False) + 1e-8)
    ratio = torch.exp(tlp - blp)
    clipped = ratio.clamp(1 - PARAMS.ppo_clip_ratio, 1 + PARAMS.ppo_clip_ratio)
    policy = -torch.min(ratio * adv, clipped * adv).mean()
    value = PARAMS.value_loss_coeff * 0.5 * ((vs - values[:, :6]) ** 2).mean()
    entropy = -PARAMS.exploration_loss_coeff * inputs["entropy"].detach().mean()
    torch.testing.assert_close(stats["policy_loss"], policy)
    torch.testing.assert_close(stats["value_loss"], value)
    torch.testing.assert_close(stats["entropy_loss"], entropy)
    torch.testing.assert_close(loss, policy + value + entropy)
    torch.testing.assert_close(stats["value_target_mean"], vs.mean())


def test_policy_gradient_favours_rewarded_action() -> None:
    """Two-armed bandit: a few Adam steps on the logits raise the rewarded arm's probability."""
    torch.manual_seed(0)
    batch, num_steps = 16, 4
    logits = torch.zeros(2, requires_grad=True)
    baseline = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([logits, baseline], lr=0.1)
    for _ in range(15):
        dist = torch.distributions.Categorical(logits=logits.expand(batch, num_steps, 2))
        actions = dist.sample()
        log_probs = dist.log_prob(actions)
        loss, _ = appo_loss(
            target_log_probs=log_probs,
            entropy=dist.entropy(),
            behaviour_log_probs=log_probs.detach(),
            values=baseline.expand(batch, num_steps + 1),
            rewards=(actions == 1).float(),
            dones=torch.ones(batch, num_steps, dtype=torch.bool),
            valid=torch.ones(batch, num_steps, dtype=torch.bool),
            params=PARAMS,
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.softmax(logits, dim=0)[1].item() > 0.8


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_value_loss_zero_at_vtrace_targets(with_vtrace: bool) -> None:
    """Values that satisfy the Bellman equation are their own V-trace targets."""
    params = LossParams(**{**vars(PARAMS), "with_vtrace": with_vtrace})
    inputs = make_batch(5, 9, seed=5)
    values = torch.empty(5, 10, dtype=torch.float64)
    values[:, 9] = torch.randn(5, dtype=torch.float64)
    for t in range(8, -1, -1):
        values[:, t] = (
            inputs["rewards"][:, t]
            + params.gamma * (~inputs["dones"][:, t]).double() * values[:, t + 1]
        )
    inputs["values"] = values.requires_grad_(True)
    _, stats, grads = run(inputs, params)
    assert stats["value_loss"].item() == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(grads["values"], torch.zeros_like(values), rtol=0, atol=1e-12)
    torch.testing.assert_close(stats["value_target_mean"], values[:, :9].detach().mean())


def test_without_vtrace_targets_are_nstep_returns() -> None:
    params = LossParams(
        **{**vars(PARAMS), "with_vtrace": False, "vtrace_rho": 0.5, "vtrace_c": 0.5}
    )
    inputs = make_batch(3, 5, seed=6)
    _, stats, _ = run(inputs, params)
    returns = torch.empty(3, 6, dtype=torch.float64)
    returns[:, 5] = inputs["values"][:, 5].detach()
    for t in range(4, -1, -1):
        returns[:, t] = (
            inputs["rewards"][:, t]
            + params.gamma * (~inputs["dones"][:, t]).double() * returns[:, t + 1]
        )
    torch.testing.assert_close(stats["value_target_mean"], returns[:, :5].mean())


def test_all_invalid_gives_zero_loss_with_grad() -> None:
    inputs = make_batch(3, 4, seed=7)
    for i, key in enumerate(("target_log_probs", "entropy", "values", "rewards")):
        inputs[key] = leaf(garbage_like(inputs[key], seed=i), key)
    inputs["valid"] = torch.zeros(3, 4, dtype=torch.bool)
    loss, stats = appo_loss(**inputs, params=PARAMS)
    assert loss.item() == 0.0
    assert loss.requires_grad
    loss.backward()
    for key in GRAD_KEYS:
        assert torch.all(inputs[key].grad == 0), key
    assert stats["num_valid"].item() == 0
    for key, value in stats.items():
        assert torch.isfinite(value), key
        assert not value.requires_grad, key


def test_bad_inputs_raise() -> None:
    good = make_batch(3, 4, seed=8)
    bad_cases = [
        {"target_log_probs": good["target_log_probs"][0]},
        {"entropy": good["entropy"][:, :3]},
        {"values": good["values"][:, :4]},
        {"rewards": good["rewards"][:2]},
        {"dones": good["dones"].float()},
        {"valid": good["valid"].long()},
    ]
    for override in bad_cases:
        with pytest.raises(ValueError, match="appo_loss"):
            appo_loss(**{**good, **override}, params=PARAMS)
    with pytest.raises(ValueError):
        LossParams(gamma=1.5, ppo_clip_ratio=0.1, value_loss_coeff=0.5, exploration_loss_coeff=0.0)


def test_invalid_steps_cut_the_trajectory_like_an_episode_end() -> None:
    """A valid step followed by invalid ones is treated as the last step of an episode."""
    batch, num_steps = 3, 8
    inputs = make_batch(batch, num_steps, seed=9)
    inputs["dones"] = torch.zeros(batch, num_steps, dtype=torch.bool)
    valid = torch.ones(batch, num_steps, dtype=torch.bool)
    valid[0, 3:5] = False  # a gap: steps 0-2 are cut from steps 5-7
    valid[1, 6:] = False  # an invalid tail
    loss_gap, stats_gap, grads_gap = run({**inputs, "valid": valid})

    dones = inputs["dones"].clone()
    dones[0, 2] = dones[1, 5] = True
    loss_done, stats_done, grads_done = run({**inputs, "valid": valid, "dones": dones})

    torch.testing.assert_close(loss_gap, loss_done)
    for key in stats_gap:
        torch.testing.assert_close(stats_gap[key], stats_done[key], msg=key)
    for key in GRAD_KEYS:
        torch.testing.assert_close(grads_gap[key], grads_done[key], msg=key)
