"""R2D2's learner (``--algo r2d2``): Ape-X's n-step double Q-learning with a dueling head, on
sequences, with the recurrent core (``fastrl.algo.replay.sequence_store`` holds them).

One learner step: sample ``--batch_size`` sequences by priority; unroll the online and the
target network over each sequence's predecessor from the predecessor's stored state, with
no gradient (the burn-in), then over the sequence itself (``T + 1`` observations) from the
state reached (or from the sequence's own stored state where it has no predecessor in the
store); for every step ``t`` of the sequence, the target
``y_t = h(R_t + D_t * h^-1(Q^target(s_{t+m}, argmax_a Q^online(s_{t+m}, a))))`` (``R``,
``D``, ``m``: the n-step return, discount and steps, as Ape-X's, stopping at a done and at
the sequence's end; ``h``: R2D2's invertible value rescaling,
:func:`~fastrl.algo.replay.targets.value_rescale`, off with ``--r2d2_value_rescaling False``);
Huber loss of ``Q(s_t, a_t) - y_t`` averaged over each sequence's steps, weighted by the
sequence's importance weight; new priorities ``eta * max + (1 - eta) * mean`` of the steps'
``|TD error|``. Steps no policy acted, and steps whose target would need the observation a
time limit cut away (the sequence does not hold its recurrent state's successor), are left
out of the loss and of the priorities.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from fastrl.algo.replay.apex import ApexLearner
from fastrl.algo.replay.dueling import chosen_q, dueling_heads
from fastrl.algo.replay.sequence_store import sequence_priorities
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.algo.replay.targets import (
    actor_td_errors,
    sequence_targets,
    value_rescale,
    value_rescale_inv,
)
from fastrl.device import autocast
from fastrl.policy.model import ActorCritic
from fastrl.policy.recurrent import find_cuts
from fastrl.transport.messages import ReplayShare


class R2D2Learner(ApexLearner):
    """:class:`ApexLearner` on sequences: the store is a
    :class:`~fastrl.algo.replay.sequence_store.SequenceStore`, ``--batch_size`` counts
    sequences, and the rate limiter counts the trained steps of each
    (``batch_size * rollout``)."""

    algo = "r2d2"

    def __init__(self, settings: ReplaySettings, model: ActorCritic, obs_space: spaces.Dict,
                 action_space: spaces.Space, device: torch.device, frameskip: int = 1,
                 group=None, columns: dict[str, torch.Tensor] | None = None):
        if model.rnn is None:
            raise ValueError("--algo r2d2 needs the recurrent core (--use_rnn True)")
        super().__init__(settings, model, obs_space, action_space, device, frameskip, group,
                         columns)

    @staticmethod
    def samples_per_batch(settings: ReplaySettings) -> int:
        """The trained steps of ``--batch_size`` sequences."""
        return settings.batch_size * settings.rollout

    def _actor_priorities(self, batch: dict) -> np.ndarray:
        """``--replay_initial_priority actor``: each sequence's mix of its steps' |TD
        errors| from the acting policy's Q-values (in the rescaled space with value
        rescaling), over the acted steps whose bootstrap the actor valued; a sequence without
        one comes in at the highest priority so far."""
        st = self.settings
        td, known = actor_td_errors(batch, st.nstep, st.gamma, st.r2d2_value_rescaling)
        mask = known & (batch["policy_versions"] >= 0)
        return self._fill_unknown(sequence_priorities(td, mask, st.r2d2_eta), mask.any(1))

    def _td_priorities(self, rows: int) -> None:
        """The ``rows`` newest sequences with an acted step take their mixed |TD error|."""
        idx = self.store.newest_rows(rows)
        if idx.size:
            taken, y, mask = self._q_and_targets(self.store.sequences(idx,
                                                                      self.settings.r2d2_burn_in))
            self.store.update_priorities(idx, self._priorities(taken, y, mask).cpu().numpy())

    def _draw(self, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``--batch_size`` rows by priority, their importance weights and predecessors."""
        rows, weights = self.store.draw(self.settings.batch_size, beta)
        prev = self.store.links(rows) if self.settings.r2d2_burn_in else np.full(len(rows), -1)
        return rows, weights, prev

    def _share_loss(self, share: ReplayShare) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The importance-weighted loss summed over ``share``'s sequences (each the mean over
        its trained steps), their priorities ``[K]`` and statistics."""
        data = self.store.gather_sequences(share.index, share.prev)
        taken, y, mask = self._q_and_targets(data)
        m = mask.to(taken.dtype)
        per_step = F.smooth_l1_loss(taken, y, reduction="none").mean(2)  # [B, T]
        per_seq = (per_step * m).sum(1) / m.sum(1).clamp(min=1.0)
        loss_sum = (per_seq * torch.from_numpy(share.weights).to(self.device)).sum()
        steps = m.sum().clamp(min=1.0)
        td_abs = ((taken - y).detach().abs().mean(2) * m).sum() / steps
        q_mean = (taken.detach().mean(2) * m).sum() / steps
        return loss_sum, self._priorities(taken, y, mask), {
            "q_loss": loss_sum.detach() / len(share.index), "q_mean": q_mean,
            "td_error": td_abs, "burn_in_fraction": float(np.mean(share.prev >= 0))}

    def _priorities(self, taken: torch.Tensor, y: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
        td_abs = (taken - y).detach().abs().mean(2)
        return sequence_priorities(td_abs, mask, self.settings.r2d2_eta).float()

    def _start_states(self, net: ActorCritic, data: dict, on_dev: dict) -> torch.Tensor:
        """The state each sequence starts from: after the burn-in over its predecessor where
        it has one (zeroed when the predecessor's last step ended its episode), else its own
        stored state. Under the autocast of the trained unroll and the actors, so that the
        burn-in runs the same core (on a CPU under bf16, the core's bf16 products)."""
        own = on_dev["rnn_states"]
        if "prev_obs" not in data:
            return own
        with torch.no_grad(), autocast(self.precision, own.device):
            burned = net.final_state(on_dev["prev_obs"], on_dev["prev_rnn_states"],
                                     on_dev["prev_resets"], on_dev["prev_cuts"])
            burned = burned * (1.0 - on_dev["prev_last_done"])
        return torch.where(on_dev["has_prev"].unsqueeze(1), burned, own)

    def _q_and_targets(self, data: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``Q(s_t, a_t)`` of the online network (with gradient) and the targets, both
        ``[B, T, D]`` (in the rescaled space with value rescaling), and the steps trained
        ``[B, T]`` bool, for sequences as ``SequenceStore.sequences`` gives them."""
        st, dev = self.settings, self.device
        dones = data["dones"]
        b, t = dones.shape
        resets = torch.cat([torch.zeros((b, 1), dtype=torch.bool), dones], 1)  # [B, T + 1]
        on_dev = {"obs": {k: v.to(dev) for k, v in data["obs"].items()},
                  "rnn_states": data["rnn_states"].to(dev),
                  "has_prev": data["has_prev"].to(dev)}
        if "prev_obs" in data:
            prev_resets = torch.cat([torch.zeros((b, 1), dtype=torch.bool),
                                     data["prev_dones"][:, :-1]], 1)
            on_dev.update(
                prev_obs={k: v.to(dev) for k, v in data["prev_obs"].items()},
                prev_rnn_states=data["prev_rnn_states"].to(dev),
                prev_resets=prev_resets.float().to(dev),
                prev_cuts=find_cuts(prev_resets.numpy(), np.full(b, t - 1)),
                prev_last_done=data["prev_dones"][:, -1:].float().to(dev))
        cuts = find_cuts(resets.numpy())
        online0 = self._start_states(self.model, data, on_dev)
        with autocast(self.precision, dev):
            logits, values = self.model.forward_sequence(
                on_dev["obs"], online0, resets.float().to(dev), cuts=cuts)
        q = [h.view(b, t + 1, -1) for h in dueling_heads(logits.reshape(b * (t + 1), -1),
                                                           values.reshape(-1), self.nvec)]
        with torch.no_grad():
            target0 = self._start_states(self.target, data, on_dev)
            with autocast(self.precision, dev):
                t_logits, t_values = self.target.forward_sequence(
                    on_dev["obs"], target0, resets.float().to(dev), cuts=cuts)
            q_target = [h.view(b, t + 1, -1) for h in dueling_heads(
                t_logits.reshape(b * (t + 1), -1), t_values.reshape(-1), self.nvec)]
            returns, discounts, next_t, from_final = (x.to(dev) for x in sequence_targets(
                data["rewards"], dones, data["final_step"], st.nstep, st.gamma))
            picked = []
            for online_j, target_j in zip(q, q_target, strict=True):
                index = next_t.unsqueeze(2).expand(-1, -1, online_j.shape[2])
                best = online_j.detach().gather(1, index).argmax(2, keepdim=True)
                picked.append(target_j.gather(1, index).gather(2, best).squeeze(2))
            boot = torch.stack(picked, 2)  # [B, T, D]
            if st.r2d2_value_rescaling:
                boot = value_rescale_inv(boot)
            y = returns.unsqueeze(2) + discounts.unsqueeze(2) * boot
            if st.r2d2_value_rescaling:
                y = value_rescale(y)
        actions = data["actions"].to(dev)
        taken = chosen_q([h[:, :t].reshape(b * t, -1) for h in q],
                         actions.reshape(b * t, -1)).view(b, t, -1)
        mask = data["valid"].to(dev) & ~from_final
        return taken.float(), y.float(), mask
