"""V-trace against slow references written straight from the definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastrl.algo.vtrace import vtrace

GAMMA = 0.9


def make_inputs(
    num_steps: int, batch: int, seed: int, dtype: torch.dtype = torch.float64
) -> dict[str, torch.Tensor]:
    """Random time-major inputs with episode ends (discount 0) inside the rollout."""
    rng = np.random.default_rng(seed)
    dones = rng.random((num_steps, batch)) < 0.25
    if num_steps > 2:
        dones[num_steps // 2, 0] = True  # at least one episode end mid-rollout
    arrays = {
        "log_rhos": rng.normal(0.0, 1.0, (num_steps, batch)),
        "discounts": GAMMA * (1.0 - dones),
        "rewards": rng.normal(0.0, 1.0, (num_steps, batch)),
        "values": rng.normal(0.0, 1.0, (num_steps, batch)),
        "bootstrap_value": rng.normal(0.0, 1.0, (batch,)),
    }
    return {k: torch.tensor(v, dtype=dtype) for k, v in arrays.items()}


def clipped(x: float, threshold: float | None) -> float:
    return x if threshold is None else min(threshold, x)


def reference_vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rho_bar: float | None,
    pg_rho_bar: float | None,
    c_bar: float | None,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-recursive definition, element by element:

    vs_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discount_i * lam * c_i) * delta_t,
    delta_t = rho_t * (r_t + discount_t * V(x_{t+1}) - V(x_t)),
    pg_adv_s = pg_rho_s * (r_s + discount_s * vs_{s+1} - V(x_s)),  V(x_T) = vs_T = bootstrap.
    """
    num_steps, batch = log_rhos.shape
    lr, d, r = log_rhos.tolist(), discounts.tolist(), rewards.tolist()
    v, boot = values.tolist(), bootstrap_value.tolist()
    vs = [[0.0] * batch for _ in range(num_steps)]
    pg = [[0.0] * batch for _ in range(num_steps)]
    for b in range(batch):

        def value(t: int, b: int = b) -> float:
            return boot[b] if t == num_steps else v[t][b]

        for s in range(num_steps):
            total = 0.0
            for t in range(s, num_steps):
                weight = 1.0
                for i in range(s, t):
                    weight *= d[i][b] * lam * clipped(math.exp(lr[i][b]), c_bar)
                rho_t = clipped(math.exp(lr[t][b]), rho_bar)
                delta_t = rho_t * (r[t][b] + d[t][b] * value(t + 1) - value(t))
                total += weight * delta_t
            vs[s][b] = value(s) + total
        for s in range(num_steps):
            vs_next = boot[b] if s == num_steps - 1 else vs[s + 1][b]
            pg_rho = clipped(math.exp(lr[s][b]), pg_rho_bar)
            pg[s][b] = pg_rho * (r[s][b] + d[s][b] * vs_next - value(s))
    return torch.tensor(vs, dtype=torch.float64), torch.tensor(pg, dtype=torch.float64)


@pytest.mark.parametrize("num_steps", [1, 5, 32])
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("clip", [None, 1.0, 0.5, 3.7])
def test_matches_nested_sum_definition(num_steps: int, batch: int, clip: float | None) -> None:
    inputs = make_inputs(num_steps, batch, seed=num_steps * 100 + batch)
    vs, pg = vtrace(
        **inputs, clip_rho_threshold=clip, clip_pg_rho_threshold=clip, clip_c_threshold=clip
    )
    ref_vs, ref_pg = reference_vtrace(**inputs, rho_bar=clip, pg_rho_bar=clip, c_bar=clip)
    torch.testing.assert_close(vs, ref_vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pg, ref_pg, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("rho_bar", "pg_rho_bar", "c_bar"), [(1.0, None, 0.5), (3.7, 0.5, None)])
def test_thresholds_are_independent(
    rho_bar: float | None, pg_rho_bar: float | None, c_bar: float | None
) -> None:
    inputs = make_inputs(9, 4, seed=3)
    vs, pg = vtrace(
        **inputs,
        clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=pg_rho_bar,
        clip_c_threshold=c_bar,
    )
    ref_vs, ref_pg = reference_vtrace(**inputs, rho_bar=rho_bar, pg_rho_bar=pg_rho_bar, c_bar=c_bar)
    torch.testing.assert_close(vs, ref_vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pg, ref_pg, rtol=1e-10, atol=1e-10)


def reference_nstep_returns(
    rewards: torch.Tensor, dones: torch.Tensor, bootstrap_value: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Forward sum of discounted rewards up to the episode end, else up to the bootstrap."""
    num_steps, batch = rewards.shape
    out = torch.zeros(num_steps, batch, dtype=torch.float64)
    for b in range(batch):
        for s in range(num_steps):
            ret, ended = 0.0, False
            for t in range(s, num_steps):
                ret += gamma ** (t - s) * rewards[t, b].item()
                if dones[t, b]:
                    ended = True
                    break
            if not ended:
                ret += gamma ** (num_steps - s) * bootstrap_value[b].item()
            out[s, b] = ret
    return out


@pytest.mark.parametrize(("num_steps", "batch"), [(1, 1), (5, 7), (32, 3)])
def test_on_policy_is_nstep_return(num_steps: int, batch: int) -> None:
    inputs = make_inputs(num_steps, batch, seed=7)
    inputs["log_rhos"] = torch.zeros_like(inputs["log_rhos"])
    dones = inputs["discounts"] == 0
    vs, pg = vtrace(**inputs)
    expected = reference_nstep_returns(inputs["rewards"], dones, inputs["bootstrap_value"], GAMMA)
    torch.testing.assert_close(vs, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pg, expected - inputs["values"], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_preserved_and_outputs_detached(dtype: torch.dtype) -> None:
    inputs = make_inputs(6, 3, seed=11, dtype=dtype)
    for tensor in inputs.values():
        tensor.requires_grad_(True)
    vs, pg = vtrace(**inputs)
    assert vs.dtype == dtype and pg.dtype == dtype
    assert vs.shape == (6, 3) and pg.shape == (6, 3)
    assert not vs.requires_grad and not pg.requires_grad


def test_float32_close_to_float64() -> None:
    inputs = make_inputs(32, 7, seed=5)
    vs64, pg64 = vtrace(**inputs)
    vs32, pg32 = vtrace(**{k: v.float() for k, v in inputs.items()})
    torch.testing.assert_close(vs32.double(), vs64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pg32.double(), pg64, rtol=1e-5, atol=1e-5)


def test_bad_shapes_raise() -> None:
    good = make_inputs(5, 3, seed=0)
    bad_cases = [
        {"log_rhos": good["log_rhos"][:, 0]},  # 1-D
        {"log_rhos": good["log_rhos"][:0]},  # T = 0
        {"discounts": good["discounts"][:4]},
        {"rewards": good["rewards"].t()},
        {"values": good["values"].unsqueeze(-1)},
        {"bootstrap_value": good["bootstrap_value"][:2]},
        {"bootstrap_value": good["bootstrap_value"].unsqueeze(0)},
    ]
    for override in bad_cases:
        with pytest.raises(ValueError, match="vtrace"):
            vtrace(**{**good, **override})


def test_non_float_or_bad_threshold_raise() -> None:
    good = make_inputs(5, 3, seed=0)
    with pytest.raises(ValueError, match="floating-point"):
        vtrace(**{**good, "rewards": good["rewards"].long()})
    with pytest.raises(ValueError, match="positive"):
        vtrace(**good, clip_c_threshold=0.0)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
def test_lambda_decays_the_traces(lam: float) -> None:
    inputs = make_inputs(9, 5, seed=11)
    vs, pg = vtrace(**inputs, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0,
                    clip_c_threshold=1.0, lambda_=lam)
    ref_vs, ref_pg = reference_vtrace(**inputs, rho_bar=1.0, pg_rho_bar=1.0, c_bar=1.0, lam=lam)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(pg, ref_pg)


def test_lambda_zero_on_policy_is_one_step_td() -> None:
    inputs = make_inputs(6, 3, seed=5)
    inputs["log_rhos"] = torch.zeros_like(inputs["log_rhos"])
    vs, _ = vtrace(**inputs, lambda_=0.0)
    v_next = torch.cat([inputs["values"][1:], inputs["bootstrap_value"][None]])
    torch.testing.assert_close(vs, inputs["rewards"] + inputs["discounts"] * v_next)
