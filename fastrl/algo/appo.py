"""The APPO loss: PPO-clip surrogate on V-trace advantages, value regression, entropy bonus.

``appo_loss`` is a pure function of tensors so that it can be tested without a model.
Inputs are batch-major ``[B, T]``, as stored in the trajectory buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.algo.vtrace import vtrace

# Keeps the advantage normalisation finite when all valid advantages are equal.
ADV_STD_EPS = 1e-8

# Sums a float64 tensor over the learners in place and returns it (several learners).
Reduce = Callable[[Tensor], Tensor]


@dataclass
class LossParams:
    """Hyperparameters of ``appo_loss``.

    ``vtrace_rho`` clips the importance ratio both in the value-target deltas and in the
    policy-gradient advantages; ``vtrace_c`` clips the trace coefficients. With
    ``with_vtrace=False`` the targets are lambda-returns (all ratios taken as 1) and the
    advantages GAE(lambda), as in PPO.
    ``gae_lambda`` decays the traces (lambda-returns; 1.0 is plain V-trace).
    ``ppo_clip_value`` > 0 clips the new value to ``behaviour_values +- ppo_clip_value`` and
    takes the larger of the clipped and unclipped squared errors (needs ``behaviour_values``).
    ``ratio_clamp`` > 0 clamps the importance ratio to ``[1 / x, x]`` in the surrogate, so that
    one sample with a vanishing behaviour probability cannot dominate the loss.
    """

    gamma: float
    ppo_clip_ratio: float
    value_loss_coeff: float
    exploration_loss_coeff: float
    vtrace_rho: float = 1.0
    vtrace_c: float = 1.0
    with_vtrace: bool = True
    gae_lambda: float = 1.0
    ppo_clip_value: float = 0.0
    ratio_clamp: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not self.ppo_clip_ratio > 0.0:
            raise ValueError(f"ppo_clip_ratio must be positive, got {self.ppo_clip_ratio}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.ppo_clip_value < 0.0:
            raise ValueError(f"ppo_clip_value must be >= 0, got {self.ppo_clip_value}")
        if self.ratio_clamp != 0.0 and not self.ratio_clamp > 1.0:
            raise ValueError(f"ratio_clamp must be 0 (off) or > 1, got {self.ratio_clamp}")
        if not (self.vtrace_rho > 0.0 and self.vtrace_c > 0.0):
            raise ValueError(
                f"vtrace_rho and vtrace_c must be positive, got {self.vtrace_rho}, {self.vtrace_c}"
            )


def _check_shapes(tensors: dict[str, Tensor]) -> None:
    """``appo_loss``'s tensors, by argument name: ``[B, T]`` each, ``values`` ``[B, T + 1]``,
    ``dones`` and ``valid`` bool."""
    target_log_probs, values = tensors["target_log_probs"], tensors["values"]
    if target_log_probs.dim() != 2 or target_log_probs.shape[1] < 1:
        raise ValueError(
            "appo_loss: target_log_probs must be batch-major [B, T] with T >= 1, "
            f"got {tuple(target_log_probs.shape)}"
        )
    b, t = target_log_probs.shape
    for name in ("entropy", "behaviour_log_probs", "rewards", "dones", "valid"):
        x = tensors[name]
        if x.shape != (b, t):
            raise ValueError(f"appo_loss: {name} must be [B, T] = {(b, t)}, got {tuple(x.shape)}")
    if values.shape != (b, t + 1):
        raise ValueError(
            f"appo_loss: values must be [B, T + 1] = {(b, t + 1)}, got {tuple(values.shape)}"
        )
    for name in ("dones", "valid"):
        if (x := tensors[name]).dtype != torch.bool:
            raise ValueError(f"appo_loss: {name} must be a bool tensor, got {x.dtype}")


def appo_loss(
    target_log_probs: Tensor,
    entropy: Tensor,
    behaviour_log_probs: Tensor,
    values: Tensor,
    rewards: Tensor,
    dones: Tensor,
    valid: Tensor,
    params: LossParams,
    *,
    exploration: Tensor | None = None,
    behaviour_values: Tensor | None = None,
    value_normalizer: tuple[Tensor, Tensor] | None = None,
    return_targets: bool = False,
    reduce: Reduce | None = None,
) -> tuple[Tensor, dict[str, Tensor]] | tuple[Tensor, dict[str, Tensor], Tensor]:
    """APPO loss over a batch of ``B`` trajectories of ``T`` steps.

    Args:
        target_log_probs: ``[B, T]`` log-prob of the taken actions under the current policy
            (carries the policy gradient).
        entropy: ``[B, T]`` entropy of the current policy (carries gradient).
        behaviour_log_probs: ``[B, T]`` log-prob of the taken actions under the policy that
            acted (no gradient is taken through it).
        values: ``[B, T + 1]`` current critic (carries gradient); ``values[:, T]`` is the value
            of the observation after the last step and only serves as the V-trace bootstrap.
        rewards: ``[B, T]`` training rewards.
        dones: ``[B, T]`` bool, step ``t`` ended an episode.
        valid: ``[B, T]`` bool, the samples that take part in the loss.
        params: hyperparameters.
        exploration: ``[B, T]`` per-sample exploration penalty to minimise (carries gradient),
            e.g. the symmetric KL divergence to the uniform policy; ``None``: ``-entropy``.
        behaviour_values: ``[B, T]`` values the acting policy computed (critic units), for
            value clipping (``params.ppo_clip_value``); no gradient is taken through them.
        value_normalizer: ``(mean, std)`` (0-d tensors) of the returns: ``values`` and
            ``behaviour_values`` are then in normalised units, ``std * v + mean`` is the value
            V-trace uses, and the value loss compares ``values`` with the normalised targets
            ``(vs - mean) / std``.
        return_targets: also return the V-trace targets ``vs`` ``[B, T]`` in return units
            (detached), e.g. to update a return normaliser.
        reduce: with several learners, sums a tensor over them in place (see
            :func:`clipped_loss`); None for one learner.

    Returns:
        ``(loss, stats)``: the scalar loss
        ``policy_loss + value_loss + entropy_loss``, and a dict of detached 0-d float tensors:
        ``policy_loss``, ``value_loss`` (already scaled by ``value_loss_coeff``),
        ``entropy_loss`` (scaled by ``exploration_loss_coeff``), ``entropy`` (mean),
        ``kl`` (mean of ``behaviour - target`` log-prob: the single-sample estimate of
        KL(behaviour || target), as actions were drawn from the behaviour policy),
        ``ratio_mean``, ``clip_fraction`` (fraction with ``|ratio - 1| > ppo_clip_ratio``),
        ``adv_mean`` and ``adv_std`` (of the V-trace advantages before normalisation),
        ``value_target_mean`` and ``num_valid``. Means are over valid samples only.

    Invalid samples have no influence whatsoever: their entries (which may be NaN or inf) are
    replaced by neutral constants before any arithmetic, so within V-trace an invalid step acts
    as a terminal step with zero reward and value, and the bootstrap value of a trajectory is
    used only when its last step is valid. Masking is meant for whole trajectories or for
    invalid tails: a valid step followed by an invalid one gets its targets as if the episode
    had ended after it.
    With no valid sample the loss is a zero still connected to the inputs' graph.
    """
    _check_shapes(dict(target_log_probs=target_log_probs, entropy=entropy,
                       behaviour_log_probs=behaviour_log_probs, values=values, rewards=rewards,
                       dones=dones, valid=valid))
    num_steps = target_log_probs.shape[1]
    # Both callees replace invalid entries (which may be NaN or inf) before any arithmetic.
    vs, pg_adv = return_targets_and_advantages(
        (target_log_probs - behaviour_log_probs).detach(), values[:, :num_steps].detach(),
        values[:, num_steps].detach(), rewards, dones, valid, params, value_normalizer)
    targets = vs if value_normalizer is None else (vs - value_normalizer[0]) / value_normalizer[1]
    loss, stats = clipped_loss(
        target_log_probs, entropy, behaviour_log_probs, values[:, :num_steps], pg_adv, targets,
        valid, params, exploration=exploration, behaviour_values=behaviour_values, reduce=reduce)
    target_sum = torch.where(valid, vs, 0.0).sum().double().reshape(1)
    if reduce is not None:
        reduce(target_sum)
    stats["value_target_mean"] = (target_sum[0] / stats["num_valid"].clamp(min=1)).to(vs.dtype)
    if return_targets:
        return loss, stats, vs.detach()
    return loss, stats


@torch.no_grad()
def return_targets_and_advantages(
    log_ratio: Tensor,
    values: Tensor,
    bootstrap: Tensor,
    rewards: Tensor,
    dones: Tensor,
    valid: Tensor,
    params: LossParams,
    value_normalizer: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Value targets ``vs`` and advantages ``[B, T]`` (return units, no gradient) of a batch of
    trajectories: V-trace with ``params.gae_lambda``-decayed traces, or with every ratio taken
    as 1 (``with_vtrace=False``: GAE(lambda) targets and advantages).

    ``log_ratio`` is target minus behaviour log-prob ``[B, T]``; ``values`` ``[B, T]`` and
    ``bootstrap`` ``[B]`` (the value after the last step) are the critic's, in normalised units
    when ``value_normalizer`` is given. Invalid steps act as terminal steps with zero reward
    and value (see :func:`appo_loss`).
    """
    step_values = torch.where(valid, values, 0.0)
    boot = torch.where(valid[:, -1], bootstrap, 0.0)
    if value_normalizer is not None:
        ret_mean, ret_std = value_normalizer
        step_values = torch.where(valid, step_values * ret_std + ret_mean, 0.0)
        boot = torch.where(valid[:, -1], boot * ret_std + ret_mean, 0.0)
    rew = torch.where(valid, rewards, 0.0)
    done = dones | ~valid
    discounts = params.gamma * (~done).to(step_values.dtype)
    if params.with_vtrace:
        log_rhos = torch.where(valid, log_ratio, 0.0)
        rho_clip, c_clip = params.vtrace_rho, params.vtrace_c
    else:
        log_rhos, rho_clip, c_clip = torch.zeros_like(step_values), None, None
    vs, pg_adv = vtrace(
        log_rhos.t(), discounts.t(), rew.t(), step_values.t(), boot,
        clip_rho_threshold=rho_clip, clip_pg_rho_threshold=rho_clip, clip_c_threshold=c_clip,
        lambda_=params.gae_lambda,
    )
    vs, pg_adv = vs.t(), pg_adv.t()
    if not params.with_vtrace:
        # PPO's GAE(lambda) advantage is the lambda-return minus the value. V-trace's
        # ``r + gamma * vs[t+1] - V`` would give the first step's successor a trace of 1.
        pg_adv = torch.where(valid, vs - step_values, 0.0)
    return vs, pg_adv


def clipped_loss(
    target_log_probs: Tensor,
    entropy: Tensor,
    behaviour_log_probs: Tensor,
    values: Tensor,
    advantages: Tensor,
    targets: Tensor,
    valid: Tensor,
    params: LossParams,
    *,
    exploration: Tensor | None = None,
    behaviour_values: Tensor | None = None,
    reduce: Reduce | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO-clip surrogate on ``advantages`` (normalised here over the valid samples), the
    (optionally clipped) squared error of ``values`` against ``targets`` (both in critic
    units) and the exploration term. Every tensor has one shape (any, e.g. ``[B, T]`` or
    ``[N]``); ``advantages``, ``targets`` and ``behaviour_*`` carry no gradient.

    With several learners, each holding a share of the minibatch, ``reduce`` sums a float64
    tensor over them in place. The advantage statistics and the number of valid samples are
    then the whole minibatch's, and each learner's loss is its share's sum over the whole
    minibatch's count: the sum of the learners' gradients is the gradient of one learner on
    the whole minibatch. The statistics returned are the whole minibatch's too.

    Returns the loss and the statistics :func:`appo_loss` lists, but ``value_target_mean``.
    """
    # Sanitise first: torch.where also routes zero gradient (never NaN) to invalid entries.
    target_lp = torch.where(valid, target_log_probs, 0.0)
    behaviour_lp = torch.where(valid, behaviour_log_probs, 0.0).detach()
    ent = torch.where(valid, entropy, 0.0)
    step_values = torch.where(valid, values, 0.0)
    adv_raw = torch.where(valid, advantages, 0.0).detach()
    targets = torch.where(valid, targets, 0.0).detach()
    adv64 = adv_raw.double()
    moments = torch.stack([valid.sum().double(), adv64.sum(), adv64.square().sum()])
    if reduce is not None:
        reduce(moments)
    num_valid = moments[0]
    denom = num_valid.clamp(min=1).to(target_lp.dtype)

    def masked_mean(x: Tensor) -> Tensor:
        return torch.where(valid, x, 0.0).sum() / denom

    adv_mean64 = moments[1] / moments[0].clamp(min=1)
    adv_var = (moments[2] / moments[0].clamp(min=1) - adv_mean64.square()).clamp(min=0)
    adv_mean, adv_std = adv_mean64.to(adv_raw.dtype), adv_var.sqrt().to(adv_raw.dtype)
    adv = (adv_raw - adv_mean) / (adv_std + ADV_STD_EPS)

    log_ratio = target_lp - behaviour_lp
    ratio = torch.exp(log_ratio)
    if params.ratio_clamp:
        ratio = torch.clamp(ratio, 1.0 / params.ratio_clamp, params.ratio_clamp)
    clip = params.ppo_clip_ratio
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv)
    policy_loss = -masked_mean(surrogate)

    value_error = (targets - step_values) ** 2
    if params.ppo_clip_value:
        if behaviour_values is None:
            raise ValueError("appo_loss: ppo_clip_value needs behaviour_values")
        old = torch.where(valid, behaviour_values, 0.0).detach()
        clipped = old + torch.clamp(
            step_values - old, -params.ppo_clip_value, params.ppo_clip_value
        )
        value_error = torch.max(value_error, (targets - clipped) ** 2)
    value_loss = params.value_loss_coeff * 0.5 * masked_mean(value_error)
    mean_entropy = masked_mean(ent)
    if exploration is None:
        entropy_loss = -params.exploration_loss_coeff * mean_entropy
    else:
        entropy_loss = params.exploration_loss_coeff * masked_mean(
            torch.where(valid, exploration, 0.0)
        )
    loss = policy_loss + value_loss + entropy_loss

    with torch.no_grad():
        shares = {  # this learner's part of each whole-minibatch mean
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy_loss": entropy_loss,
            "entropy": mean_entropy,
            "kl": masked_mean(-log_ratio),
            "ratio_mean": masked_mean(ratio),
            "clip_fraction": masked_mean(((ratio - 1.0).abs() > clip).to(ratio.dtype)),
        }
        if reduce is not None:
            summed = reduce(torch.stack(list(shares.values())).double())
            shares = dict(zip(shares, summed.to(target_lp.dtype)))
        stats = {**shares, "adv_mean": adv_mean, "adv_std": adv_std,
                 "num_valid": num_valid.to(target_lp.dtype)}
    return loss, {k: v.detach() for k, v in stats.items()}
