"""V-trace off-policy return targets (Espeholt et al., 2018, "IMPALA", section 4.1)."""

from __future__ import annotations

import torch
from torch import Tensor


def _clip(rhos: Tensor, threshold: float | None) -> Tensor:
    return rhos if threshold is None else torch.clamp(rhos, max=threshold)


def _check_inputs(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    thresholds: dict[str, float | None],
) -> None:
    if log_rhos.dim() != 2 or log_rhos.shape[0] < 1:
        raise ValueError(
            "vtrace: log_rhos must be time-major [T, B] with T >= 1, "
            f"got shape {tuple(log_rhos.shape)}"
        )
    for name, t in (("discounts", discounts), ("rewards", rewards), ("values", values)):
        if t.shape != log_rhos.shape:
            raise ValueError(
                f"vtrace: {name} must have the shape of log_rhos {tuple(log_rhos.shape)} ([T, B]), "
                f"got {tuple(t.shape)}"
            )
    if bootstrap_value.shape != log_rhos.shape[1:]:
        raise ValueError(
            f"vtrace: bootstrap_value must be [B] = {tuple(log_rhos.shape[1:])}, "
            f"got {tuple(bootstrap_value.shape)}"
        )
    for name, t in (
        ("log_rhos", log_rhos),
        ("discounts", discounts),
        ("rewards", rewards),
        ("values", values),
        ("bootstrap_value", bootstrap_value),
    ):
        if not t.is_floating_point():
            raise ValueError(f"vtrace: {name} must be a floating-point tensor, got {t.dtype}")
    for name, threshold in thresholds.items():
        if threshold is not None and not threshold > 0:
            raise ValueError(f"vtrace: {name} must be positive or None, got {threshold}")


def vtrace(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace value targets and policy-gradient advantages for a batch of trajectories.

    All sequence tensors are time-major, ``T`` steps by ``B`` trajectories:

    Args:
        log_rhos: ``[T, B]`` log importance ratios ``log pi(a_t|x_t) - log mu(a_t|x_t)``
            (target policy ``pi``, behaviour policy ``mu``).
        discounts: ``[T, B]`` per-step discount, ``gamma * (1 - done_t)``; 0 where step ``t``
            ended an episode, so nothing after it leaks back.
        rewards: ``[T, B]`` reward received after step ``t``.
        values: ``[T, B]`` critic estimates ``V(x_t)``.
        bootstrap_value: ``[B]`` critic estimate ``V(x_T)`` of the observation after the last step.
        clip_rho_threshold: ``rho_bar`` in the value-target deltas; None disables clipping.
        clip_pg_rho_threshold: clip of the ratio that weights the policy-gradient advantage;
            None disables clipping.
        clip_c_threshold: ``c_bar``, the clip of the trace coefficients; None disables clipping.
        lambda_: trace decay, ``c_t = lambda_ * min(c_bar, rho_t)`` (the paper's remark on
            mixing in a lambda); 1.0 is plain V-trace; on-policy, ``vs`` are then the
            lambda-returns (lower variance, more bias).

    Returns:
        ``(vs, pg_advantages)``, both ``[T, B]`` with the dtype of the inputs, detached:

        - ``vs_t = V(x_t) + delta_t + discount_t * c_t * (vs_{t+1} - V(x_{t+1}))`` with
          ``delta_t = min(rho_bar, rho_t) * (r_t + discount_t * V(x_{t+1}) - V(x_t))``,
          ``c_t = lambda_ * min(c_bar, rho_t)`` and ``vs_T = V(x_T) = bootstrap_value``;
        - ``pg_advantages_t = min(pg_rho_bar, rho_t) * (r_t + discount_t * vs_{t+1} - V(x_t))``.

    Raises:
        ValueError: on shapes other than the above, non-float inputs or a non-positive threshold.
    """
    _check_inputs(
        log_rhos,
        discounts,
        rewards,
        values,
        bootstrap_value,
        {
            "clip_rho_threshold": clip_rho_threshold,
            "clip_pg_rho_threshold": clip_pg_rho_threshold,
            "clip_c_threshold": clip_c_threshold,
        },
    )
    with torch.no_grad():
        rhos = torch.exp(log_rhos)
        clipped_rhos = _clip(rhos, clip_rho_threshold)
        cs = _clip(rhos, clip_c_threshold) * lambda_

        values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * values_next - values)
        trace_coeffs = discounts * cs

        # vs_minus_v[t] = vs_t - V(x_t), accumulated from the end; vs_T - V(x_T) = 0.
        vs_minus_v = torch.empty_like(deltas)
        acc = torch.zeros_like(deltas[0])
        for t in range(deltas.shape[0] - 1, -1, -1):
            acc = deltas[t] + trace_coeffs[t] * acc
            vs_minus_v[t] = acc
        vs = values + vs_minus_v

        vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_rhos = _clip(rhos, clip_pg_rho_threshold)
        pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return vs.detach(), pg_advantages.detach()
