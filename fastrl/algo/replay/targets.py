"""The targets of the replay algorithms' Q-learning (``--algo apex``, ``r2d2``), from the rows
the stores hold (``T`` steps of a trajectory, ``fastrl/algo/replay/store.py``): each step's
n-step return and bootstrap (:func:`nstep_returns`, :func:`sequence_targets`), R2D2's value
rescaling :func:`value_rescale`, and the actors' TD errors that give new rows their first
priorities (:func:`actor_td_errors`)."""

from __future__ import annotations

import torch


def nstep_returns(rewards: torch.Tensor, dones: torch.Tensor, final_step: torch.Tensor,
                  t: torch.Tensor, n: int, gamma: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n-step part of the targets of transitions at step ``t`` ``[B]`` of rows whose
    ``rewards``, ``dones`` are ``[B, T]`` and ``final_step`` ``[B]`` (-1: no time limit).

    Returns ``(returns [B], discounts [B], next_t [B], from_final [B])``: the discounted
    rewards of the ``m`` steps taken (up to ``n``, to the first done, to the row's end); the
    bootstrap's discount ``gamma ** m`` (0 after a termination); the observation
    ``t + m`` to bootstrap from; and whether it is ``final_obs`` instead (a time limit ended
    the episode at the last step taken)."""
    b, horizon = rewards.shape
    steps = t.unsqueeze(1) + torch.arange(n, device=t.device).unsqueeze(0)  # [B, n]
    inside = steps < horizon
    cols = steps.clamp(max=horizon - 1)
    r = rewards.gather(1, cols) * inside
    d = dones.gather(1, cols) & inside
    # A step is taken when it is inside the row and no earlier step of the window ended.
    before = torch.cat([torch.zeros((b, 1), dtype=torch.bool, device=t.device), d[:, :-1]], 1)
    taken = inside & (torch.cumsum(before.int(), 1) == 0)
    powers = gamma ** torch.arange(n, device=t.device, dtype=rewards.dtype)
    returns = (r * taken * powers).sum(1)
    m = taken.sum(1)
    last = t + m - 1
    ended = (d & taken).any(1)
    from_final = ended & (final_step == last)
    discounts = torch.where(ended & ~from_final, 0.0, gamma ** m.to(rewards.dtype))
    return returns, discounts.to(rewards.dtype), t + m, from_final


def sequence_targets(rewards: torch.Tensor, dones: torch.Tensor, final_step: torch.Tensor,
                     nstep: int, gamma: float) -> tuple[torch.Tensor, ...]:
    """The n-step part of every step's target in sequences of ``rewards``, ``dones``
    ``[B, T]`` (``final_step`` ``[B]``): ``(returns, discounts, next_t, from_final)``, each
    ``[B, T]``, as :func:`nstep_returns` gives them per step."""
    b, t = rewards.shape
    steps = torch.arange(t, device=rewards.device).repeat(b)
    out = nstep_returns(rewards.repeat_interleave(t, 0), dones.repeat_interleave(t, 0),
                        final_step.repeat_interleave(t, 0), steps, nstep, gamma)
    return tuple(x.view(b, t) for x in out)


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """R2D2's ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def value_rescale_inv(y: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The inverse of :func:`value_rescale`."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (y.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(y) * (root * root - 1.0)


def actor_td_errors(batch: dict, nstep: int, gamma: float, rescale: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ape-X's actor priorities, from what the acting policy reported for each step of the
    trajectories ``batch`` (the replay algorithms' policy workers write ``Q(s_t, a_t)`` in
    ``log_probs`` and ``max_a Q(s_t, a)`` in ``values``, ``[K, T]``): each step's n-step
    ``|TD error|`` ``[K, T]``, bootstrapped from the actor's greedy value ``m`` steps on (in
    the rescaled space with ``rescale``: R2D2's ``h``), and whether it is known ``[K, T]``.
    It is not where the bootstrap is an observation the actor never valued (the row's last,
    or a time limit's ``final_obs``), unless a termination makes the bootstrap 0."""
    rewards, dones = batch["rewards"].float(), batch["dones"]
    returns, discounts, next_t, from_final = sequence_targets(
        rewards, dones, batch["final_step"], nstep, gamma)
    horizon = rewards.shape[1]
    q_taken, q_greedy = batch["log_probs"].float(), batch["values"].float()
    boot = q_greedy.gather(1, next_t.clamp(max=horizon - 1))
    if rescale:
        boot = value_rescale_inv(boot)
    target = returns + discounts * boot
    if rescale:
        target = value_rescale(target)
    known = ((next_t < horizon) & ~from_final) | (discounts == 0)
    return (target - q_taken).abs(), known
