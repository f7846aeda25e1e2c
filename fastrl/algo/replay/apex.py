"""Ape-X's learner (``--algo apex``): n-step double Q-learning with a dueling head on a
prioritized replay store (``fastrl.algo.replay.store``).

The Q-network is the same :class:`~fastrl.policy.model.ActorCritic` APPO trains, read as a
dueling network: the critic head is the state value ``V(s)``, the actor head's logits are the
advantages, and for each categorical action dimension ``j`` (one for ``Discrete``, one per
entry of a ``MultiDiscrete``: one Q head each)
``Q_j(s, a) = V(s) + A_j(s, a) - mean_a A_j(s, a)``. The greedy action of a head is the argmax
of its advantages, so the policy workers act with ``ActionDistribution.mode()``, and
evaluation and enjoy with deterministic actions play the greedy policy.

One learner step: sample a batch by priority, target
``y_j = R + D * Q_j^target(s', argmax_a Q_j^online(s', a))`` (``R``, ``D``: the n-step return
and bootstrap discount from the store), Huber loss of ``Q_j(s, a_j) - y_j`` weighted by the
importance weights and averaged over heads, new priorities from the mean ``|TD error|`` of
the heads; the target network copies the online one every ``--target_update_every`` steps.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from fastrl.algo.learner import policy_lag
from fastrl.algo.learner_group import LearnerGroup
from fastrl.algo.replay.dueling import chosen_q, dueling_heads
from fastrl.algo.replay.sequence_store import SequenceStore
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.algo.replay.store import (
    PRIORITY_EPS,
    RateLimiter,
    ReplayStore,
    annealed_beta,
    columns_nbytes,
)
from fastrl.algo.replay.targets import actor_td_errors
from fastrl.device import autocast, resolve_precision
from fastrl.log import log
from fastrl.policy.actions import ActionSpec
from fastrl.policy.model import ActorCritic
from fastrl.policy.obs import has_action_mask
from fastrl.policy.spaces import storage
from fastrl.transport.messages import ReplayShare


def q_learning_problem(action_space: spaces.Space, obs_space: spaces.Dict,
                       algo: str = "apex") -> str | None:
    """Why ``--algo apex`` (or ``r2d2``) cannot learn Q-values for these spaces (None when it
    can)."""
    spec = ActionSpec(action_space)
    if spec.num_continuous:
        return (f"--algo {algo} needs Discrete or MultiDiscrete actions (one Q head per "
                f"dimension), not {action_space}: use --algo appo for continuous actions")
    if has_action_mask(obs_space, spec.num_logits):
        return f"--algo {algo} does not take an action_mask observation yet: use --algo appo"
    return None


def double_q_targets(online_next: list[torch.Tensor], target_next: list[torch.Tensor],
                     returns: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """``[B, D]``: per head, ``returns + discounts * Q^target(s', argmax Q^online(s'))``."""
    picked = [t.gather(1, o.argmax(1, keepdim=True)).squeeze(1)
              for o, t in zip(online_next, target_next, strict=True)]
    return returns.unsqueeze(1) + discounts.unsqueeze(1) * torch.stack(picked, 1)


def build_store(settings: ReplaySettings, obs_space: spaces.Dict, action_space: spaces.Space,
                nbytes_only: bool = False, shared: bool = False,
                columns: dict[str, torch.Tensor] | None = None) -> ReplayStore | int:
    """The run's replay store (or only its size in bytes): transitions for ``--algo apex``,
    sequences for ``r2d2``; ``shared``, ``columns``: see ``ReplayStore``."""
    args = _store_args(settings, obs_space, action_space)
    if settings.algo == "r2d2":  # sequences, with the recurrent state stored at each
        rnn = settings.rnn_state_size
        if nbytes_only:
            return SequenceStore.nbytes_for(*args, rnn_size=rnn)
        return SequenceStore(*args, alpha=settings.replay_alpha, rnn_size=rnn,
                             seed=settings.seed, shared=shared, columns=columns)
    if nbytes_only:
        return ReplayStore.nbytes_for(*args)
    return ReplayStore(*args, alpha=settings.replay_alpha, seed=settings.seed, shared=shared,
                       columns=columns)


def shared_store_nbytes(settings: ReplaySettings, obs_space: spaces.Dict,
                        action_space: spaces.Space) -> int:
    """Bytes the store of ``--num_learners`` > 1 places in /dev/shm: its columns (the sum
    tree and the id tables stay in rank 0's memory)."""
    shapes, dtypes, rollout, action_dims, action_dtype, capacity = _store_args(
        settings, obs_space, action_space)
    rows = capacity // rollout
    specs = ReplayStore.column_specs(shapes, dtypes, rows, rollout, action_dims, action_dtype)
    if settings.algo == "r2d2":
        specs.update(SequenceStore.sequence_specs(rows, rollout, settings.rnn_state_size))
    return columns_nbytes(specs)


def _store_args(settings: ReplaySettings, obs_space: spaces.Dict,
                action_space: spaces.Space) -> tuple:
    """``ReplayStore``'s size arguments for the run's spaces."""
    shapes, dtypes = {}, {}
    for key, sub in obs_space.spaces.items():
        shape, np_dtype = storage(sub)
        shapes[key] = shape
        dtypes[key] = torch.from_numpy(np.zeros(1, dtype=np_dtype)).dtype
    spec = ActionSpec(action_space)
    return (shapes, dtypes, settings.rollout, spec.action_dims, spec.dtype,
            settings.replay_capacity)


class ApexLearner:
    """The online and target Q-networks, the optimizer, the replay store and its rate limiter.

    ``samples_trained`` counts transitions inserted (env steps collected), as the run's
    frame counter and checkpoints read it; ``version`` counts learner steps.

    In a ``group`` of learners (``--num_learners``) the store is bound to ``columns`` in
    shared memory. Rank 0 inserts, draws each batch by priority, trains on its share
    ``[0::N]`` and hands rank r the share ``[r::N]`` (:meth:`train`'s ``send``); every rank
    computes its share's loss over the whole batch's count, the gradients are summed over the
    group, every rank takes the same step, and rank 0 updates the priorities of the whole
    batch from every share's TD errors. The other ranks only run :meth:`train_share`."""

    version_floor = 0  # no population-based training with --algo apex (config/checks.py)

    @staticmethod
    def samples_per_batch(settings: ReplaySettings) -> int:
        """Transitions one learner step samples (what the rate limiter counts)."""
        return settings.batch_size

    def __init__(self, settings: ReplaySettings, model: ActorCritic, obs_space: spaces.Dict,
                 action_space: spaces.Space, device: torch.device, frameskip: int = 1,
                 group: LearnerGroup | None = None,
                 columns: dict[str, torch.Tensor] | None = None):
        problem = q_learning_problem(action_space, obs_space, settings.algo)
        if problem:
            raise ValueError(problem)
        self.settings = settings
        self.model = model
        self.device = device
        self.frameskip = frameskip
        self.nvec = ActionSpec(action_space).nvec
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate,
                                          betas=(settings.adam_beta1, settings.adam_beta2),
                                          eps=settings.adam_eps)
        self.store = build_store(settings, obs_space, action_space, columns=columns)
        self.samples_per_step = self.samples_per_batch(settings)
        self.limiter = RateLimiter(settings.replay_samples_per_insert, settings.replay_min_size,
                                   self.samples_per_step, settings.rollout)
        self.precision = resolve_precision(settings.precision, device)
        self.group = group
        self.world_size = 1 if group is None else group.world_size
        self._lag: dict[str, float] = {}  # of the newest inserted steps, for the reports
        self.version = 0
        self.samples_trained = 0
        self.train_seconds = 0.0

    # --- the station's side ------------------------------------------------------------

    def insertable(self, trajectories: int) -> int:
        """How many of ``trajectories`` waiting ones the rate limiter lets in now."""
        return self.limiter.insertable(self.settings.rollout, trajectories)

    def _note_lag(self, batch: dict) -> None:
        """The policy lag of the steps going in: how many learner steps old the weights that
        acted them are when they reach the store."""
        acted, low, mean, high = policy_lag(batch["policy_versions"], self.version).tolist()
        if acted:
            self._lag = {"policy_lag_min": low, "policy_lag_mean": mean, "policy_lag_max": high}

    def insert(self, batch: dict) -> int:
        """Store gathered trajectories (CPU, ``TrajectoryBuffers.gather``); returns the
        transitions they hold."""
        if self.settings.normalize_input:
            t = batch["rewards"].shape[1]
            self.model.update_normalizers({k: v[:, :t].reshape(-1, *v.shape[2:])
                                           for k, v in batch["obs"].items()})
        self._note_lag(batch)
        if not self.settings.value_bootstrap:  # a time limit ends the episode like a death (APPO)
            batch = {**batch, "final_step": torch.full_like(batch["final_step"], -1)}
        actor = self.settings.replay_initial_priority == "actor"
        n = self.store.insert(batch, self._actor_priorities(batch) if actor else None)
        if self.settings.replay_initial_priority == "td":
            with torch.no_grad():
                self._td_priorities(n // self.settings.rollout)
        self.limiter.inserts += n
        self.samples_trained += n
        return n

    def _actor_priorities(self, batch: dict) -> np.ndarray:
        """``--replay_initial_priority actor``: each step's |TD error| ``[K, T]`` from the
        acting policy's own Q-values (``targets.actor_td_errors``); a step whose bootstrap
        the actor never valued comes in at the highest priority so far (this batch's
        included)."""
        td, known = actor_td_errors(batch, self.settings.nstep, self.settings.gamma)
        return self._fill_unknown(td, known)

    def _fill_unknown(self, priorities: torch.Tensor, known: torch.Tensor) -> np.ndarray:
        """``priorities`` (raw |TD errors|) where ``known``, elsewhere the highest raw
        priority so far, this batch's included."""
        top = self.store.max_priority - PRIORITY_EPS
        if bool(known.any()):
            top = max(top, float(priorities[known].max()))
        return torch.where(known, priorities, top).numpy()

    def _td_priorities(self, rows: int) -> None:
        """The acted transitions of the ``rows`` newest rows take their |TD error| as
        priority (``--replay_initial_priority td``)."""
        idx = self.store.newest(rows)
        if idx.size:
            taken, y = self._q_and_targets(
                self.store.transitions(idx, self.settings.nstep, self.settings.gamma))
            self.store.update_priorities(idx, (taken - y).abs().mean(1).cpu().numpy())

    def can_train(self) -> bool:
        # (a store of only steps no policy acted, all at priority 0, has nothing to sample)
        return (self.limiter.can_sample(self.samples_per_step, self.store.size)
                and self.store.tree.total > 0)

    def _beta(self) -> float:
        """The importance-weight exponent now (annealed over the run)."""
        done = self.samples_trained * self.frameskip / self.settings.train_for_env_steps
        return annealed_beta(self.settings.replay_beta, done)

    def _lr(self) -> float:
        """The learning rate of the next step (``--lr_schedule``)."""
        settings = self.settings
        if settings.lr_schedule == "linear_decay":  # from --learning_rate to 0 at the run's end
            done = self.samples_trained * self.frameskip / settings.train_for_env_steps
            return settings.learning_rate * max(0.0, 1.0 - done)
        return self.optimizer.param_groups[0]["lr"]

    def _draw(self, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """A batch drawn by priority: the store's items, their importance weights, and (R2D2)
        each row's predecessor."""
        idx, weights = self.store.draw(self.settings.batch_size, beta)
        return idx, weights, None

    def train(self, send: Callable[[int, ReplayShare], None] | None = None) -> dict[str, float]:
        """One learner step on a batch sampled by priority; its statistics (in a group, of
        rank 0's share). ``send(r, share)`` hands rank r its share (group only)."""
        start = time.perf_counter()
        beta = self._beta()
        index, weights, prev = self._draw(beta)
        self.limiter.samples += self.samples_per_step
        n, lr = self.world_size, self._lr()
        shares = [ReplayShare(index[r::n], weights[r::n], None if prev is None else prev[r::n],
                              lr) for r in range(n)]
        for rank in range(1, n):
            send(rank, shares[rank])
        priorities, stats = self.train_share(shares[0])
        self.store.update_priorities(index, priorities)
        self.train_seconds += time.perf_counter() - start
        return {**stats, "priority_mean": self.store.priority_mean(),
                "replay_size": self.store.size, "samples_per_insert": self.limiter.ratio(),
                "beta": beta, "learning_rate": lr, **self._lag}

    def train_share(self, share: ReplayShare) -> tuple[np.ndarray, dict[str, float]]:
        """One step on ``share`` (the whole batch without a group), in step with the group:
        the new priorities of the whole batch, in its order, and this share's statistics."""
        if self.group is not None and self.settings.normalize_input:
            self.group.broadcast_buffers(self.model)  # rank 0 updates them as data comes in
        loss_sum, priorities, stats = self._share_loss(share)
        stats["grad_norm"] = self._step(loss_sum / self.settings.batch_size, share.lr)
        self._sync_target()
        # The statistics' tensors read in one host sync, after the step was queued.
        names = [k for k, v in stats.items() if isinstance(v, torch.Tensor)]
        values = torch.stack([stats[k].float() for k in names]).tolist() if names else []
        stats.update(zip(names, values))
        if self.group is not None:
            priorities = self.group.interleave(priorities)
        return priorities.cpu().numpy(), stats

    def _share_loss(self, share: ReplayShare) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The importance-weighted Huber loss summed over ``share``'s transitions, their
        |TD error| ``[K]`` (mean over the heads: the new priorities) and statistics (numbers,
        or 0-d tensors on the learner's device)."""
        data = self.store.transitions(share.index, self.settings.nstep, self.settings.gamma)
        taken, y = self._q_and_targets(data)
        w = torch.from_numpy(share.weights).to(self.device)
        loss_sum = (F.smooth_l1_loss(taken, y, reduction="none").mean(1) * w).sum()
        td_abs = (taken - y).detach().abs().mean(1).float()
        return loss_sum, td_abs, {"q_loss": loss_sum.detach() / len(share.index),
                                  "q_mean": taken.detach().mean(), "td_error": td_abs.mean()}

    def _step(self, loss: torch.Tensor, lr: float) -> torch.Tensor:
        """One optimizer step on ``loss`` at learning rate ``lr`` (gradients summed over the
        group, then clipped); returns the gradient norm."""
        max_norm = self.settings.max_grad_norm
        clip = max_norm if max_norm > 0 else float("inf")
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.group is not None:
            self.group.sum_grads(list(self.model.parameters()))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        self.version += 1
        return grad_norm

    def _sync_target(self) -> None:
        """The target network copies the online one every ``--target_update_every`` steps."""
        if self.version % self.settings.target_update_every == 0:
            self.target.load_state_dict(self.model.state_dict())

    def _q_and_targets(self, data: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``Q(s, a)`` of the online network (with gradient) and the double-Q targets, both
        ``[B, D]``, for transitions as ``ReplayStore.transitions`` gives them."""
        dev = self.device
        obs = {k: v.to(dev) for k, v in data["obs"].items()}
        next_obs = {k: v.to(dev) for k, v in data["next_obs"].items()}
        b = data["returns"].shape[0]
        both = {k: torch.cat([obs[k], next_obs[k]]) for k in obs}
        with autocast(self.precision, dev):
            adv, values, _ = self.model.forward_step(both,
                                                     self.model.initial_rnn_state(2 * b, dev))
        q_all = dueling_heads(adv, values, self.nvec)
        q, q_next = [h[:b] for h in q_all], [h[b:].detach() for h in q_all]
        with torch.no_grad(), autocast(self.precision, dev):
            t_adv, t_values, _ = self.target.forward_step(
                next_obs, self.target.initial_rnn_state(b, dev))
            y = double_q_targets(q_next, dueling_heads(t_adv, t_values, self.nvec),
                                 data["returns"].to(dev), data["discounts"].to(dev))
        return chosen_q(q, data["actions"].to(dev)), y

    # --- checkpoints -----------------------------------------------------------------------

    def state_dict(self, store_contents: bool = True) -> dict:
        """``store_contents``: False leaves the store's rows out whatever
        ``--replay_save_contents`` says (a best checkpoint: a resumed run refills them)."""
        lim = self.limiter
        contents = store_contents and self.settings.replay_save_contents
        return {"model": self.model.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "version": self.version,
                "samples_trained": self.samples_trained,
                "replay": self.store.state_dict(contents),
                "limiter": {"inserts": lim.inserts, "samples": lim.samples}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.samples_trained = int(state["samples_trained"])
        if self.group is not None and self.group.rank > 0:
            return  # rank 0 restores the shared store; this rank only reads it
        why = self.store.mismatch(state["replay"]) if state["replay"]["contents"] else None
        if why:
            log(f"resume: the replay store starts empty, the checkpoint's does not fit: {why}")
        if self.store.load_state_dict(state["replay"]):
            self.limiter.inserts = int(state["limiter"]["inserts"])
            self.limiter.samples = int(state["limiter"]["samples"])
        # else the store refills from empty and the ratio counts from there
