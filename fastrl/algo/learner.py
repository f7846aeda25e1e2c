"""The learner core: APPO (PPO-clip on V-trace advantages) over complete trajectories.

Two ways to form the SGD steps (``--advantages``):

- ``minibatch`` (APPO, the default): each minibatch is a set of whole trajectories; its value
  targets and advantages are computed in the step itself, from the critic as it trains.
- ``batch`` (PPO): the targets and advantages of the whole batch are computed once, before
  the first step, by the model as it is then; feed-forward models then shuffle single steps
  into the minibatches (recurrent ones still take whole trajectories).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from fastrl.algo.appo import LossParams, appo_loss, clipped_loss, return_targets_and_advantages
from fastrl.algo.learner_group import LearnerGroup
from fastrl.algo.pbt.reward_weights import RewardWeights
from fastrl.config.settings import Config, CopiedFromConfig
from fastrl.device import autocast, resolve_precision
from fastrl.policy.actions import ActionSpec, exploration_problem
from fastrl.policy.compiled import compile_encoders
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import NORMALIZER_FRAMES, ActorCritic
from fastrl.policy.recurrent import Cuts, find_cuts
from fastrl.sampling.env_setup import EnvSettings, reward_scale

# What population-based training (fastrl/algo/pbt/population.py) perturbs, per policy's learner;
# also the weights of the env's reward-shaping terms, if it names them (``reward/<term>``).
PBT_HYPERPARAMS = ("learning_rate", "exploration_loss_coeff", "gamma")


@dataclass(frozen=True)
class LearnerSettings(CopiedFromConfig):
    """What the APPO learner reads, each as the ``Config`` field of the same name (``--help``),
    copied once by :meth:`from_config` (no defaults of its own); the learner never sees the
    whole config. ``loss``: ``appo_loss``'s hyperparameters; ``reward_scale``: the resolved
    ``--reward_scale`` (the env's recommended scale when unset), for the shaping terms."""

    loss: LossParams
    exploration_loss: str  # "entropy" or "symmetric_kl"
    learning_rate: float  # the start of this policy's own, under --with_pbt
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    max_grad_norm: float  # 0: no clipping
    lr_schedule: str  # "constant" or "linear_decay" (to 0 at train_for_env_steps)
    train_for_env_steps: int
    learner_compile: bool
    precision: str  # "auto", "fp32" or "bf16" (fastrl.device.resolve_precision)
    batch_size: int  # steps in a minibatch (every learner's share together)
    rollout: int
    trajectories_per_batch: int  # a whole batch, every learner's share
    num_epochs: int
    advantages: str  # "minibatch" or "batch"
    max_policy_lag: int
    normalize_input: bool  # update the model's input statistics from each batch
    value_bootstrap: bool  # bootstrap a time-limited episode's last step
    reward_scale: float
    reward_clip: float

    @classmethod
    def from_config(cls, cfg: Config) -> LearnerSettings:
        """Each field read by name (a field missing from ``cfg`` raises AttributeError); every
        one of ``LossParams``' too, so that none of its defaults stands in for the flag."""
        loss = LossParams(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(LossParams)})
        return super().from_config(cfg, loss=loss,
                                   reward_scale=reward_scale(EnvSettings.from_config(cfg)))


class Learner:
    """Owns the trainable model and its optimizer; ``version`` counts SGD steps (plus one per
    PBT replacement: :meth:`take_weights`).

    :meth:`train` takes a batch gathered from the trajectory buffers (see
    ``TrajectoryBuffers.gather``), already on ``device``.

    Nothing in an SGD step reads the device back: what decides the work of a step (where the
    recurrent unroll is cut, which trajectories end at a time limit, the minibatch order) is
    computed on the host, from the host copies of ``dones`` and ``final_step`` that come with
    the batch and from a permutation drawn on the CPU; the statistics of a batch cross in one
    transfer at its end. On a GPU every read back would make the host wait until the device
    has caught up.
    """

    def __init__(self, settings: LearnerSettings, model: ActorCritic, action_space,
                 device: torch.device, frameskip: int = 1, group: LearnerGroup | None = None,
                 reward_terms: tuple[str, ...] = ()):
        self.settings = settings
        self.model = model
        self.action_spec = ActionSpec(action_space)
        problem = exploration_problem(settings.exploration_loss, self.action_spec)
        if problem:
            raise ValueError(f"{problem} ({action_space})")
        self.device = device
        self.optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate,
                                          betas=(settings.adam_beta1, settings.adam_beta2),
                                          eps=settings.adam_eps)
        if settings.learner_compile:
            compile_encoders(model)  # fastrl/policy/compiled.py
        self.params = settings.loss  # PBT replaces gamma and the exploration coefficient
        self.precision = resolve_precision(settings.precision, device)
        self.learning_rate = settings.learning_rate  # this policy's own under --with_pbt
        # The env's shaping terms, weighed by this learner (fastrl/algo/pbt/reward_weights.py).
        self.shaping = (RewardWeights(reward_terms, settings.reward_scale, settings.reward_clip,
                                      device) if reward_terms else None)
        self.version = 0
        # Samples acted by a version below this are left out of the loss: after a PBT
        # replacement, the experience the old weights acted (see take_weights).
        self.version_floor = 0
        self.samples_trained = 0
        self.train_seconds = 0.0
        self.frameskip = frameskip  # env frames per sample (fastrl.algo.run_frames)
        # Several learners (fastrl/algo/learner_group.py): this one trains on its share of
        # each batch.
        self.group = group
        self.world_size = 1 if group is None else group.world_size
        self._reduce = None if group is None else group.sum_

    @property
    def trajectories_per_minibatch(self) -> int:
        """This learner's share of a minibatch (trajectory minibatches)."""
        return self.settings.batch_size // self.settings.rollout // self.world_size

    @property
    def trajectories_per_batch(self) -> int:
        """A whole batch (every learner's share)."""
        return self.settings.trajectories_per_batch

    def train(self, batch: dict, run_frames: int | None = None) -> dict[str, float]:
        """Run ``num_epochs`` x ``num_batches_per_epoch`` SGD steps on ``batch``.

        ``batch`` holds ``obs`` (dict of ``[B, T+1, ...]``), ``actions`` ``[B, T, D]``,
        ``log_probs``/``values``/``rewards``/``dones``/``policy_versions`` ``[B, T]``,
        ``rnn_states`` ``[B, H]``, and ``final_obs`` (dict of ``[B, ...]``) with
        ``final_step`` ``[B]`` (see ``TrajectoryBuffers``), and optionally ``host``: numpy
        arrays of ``dones`` and ``final_step`` on the host (``TrajectoryBuffers.gather`` adds
        them; without them they are read back from the batch). ``run_frames``: the run's
        trained env frames before this batch, every policy's (``fastrl.algo.run_frames``),
        the clock of ``--lr_schedule linear_decay``; None: this learner's own. Returns scalar
        statistics of the last step plus the policy lag of the batch, read from the device in
        one transfer.
        """
        start = time.perf_counter()
        settings = self.settings
        batch = dict(batch)
        host = batch.pop("host", None) or _host_part(batch)
        # Read at the end with the other statistics: on a GPU, reading a value here would
        # make the host wait for the batch's copy before it queues any training work.
        lag = policy_lag(batch["policy_versions"], self.version)
        if settings.normalize_input:
            frames = _normalizer_frames(batch["obs"], batch["log_probs"].shape[1])
            self.model.update_normalizers(frames, self._reduce)
        if settings.lr_schedule == "linear_decay":  # to 0 where the run stops
            frames = self.samples_trained * self.frameskip if run_frames is None else run_frames
            done = frames / settings.train_for_env_steps
            for group in self.optimizer.param_groups:
                group["lr"] = self.learning_rate * max(0.0, 1.0 - done)
        if settings.advantages == "batch":
            last = self._train_on_fixed_targets(batch, host)
        else:
            last = self._train_on_trajectories(batch, host)
        if self.version_floor:  # PBT: acted steps left out as the old weights' (take_weights)
            v = batch["policy_versions"]
            last["stale_samples"] = ((v >= 0) & (v < self.version_floor)).sum()
        # One transfer for every statistic (0-d tensors; stacking widens dtypes, exactly).
        values = torch.cat([torch.stack(list(last.values())), lag]).tolist()
        stats: dict[str, float] = dict(zip(last, values))
        acted, lag_min, lag_mean, lag_max = values[len(last):]
        if acted:
            stats.update(policy_lag_min=lag_min, policy_lag_mean=lag_mean,
                         policy_lag_max=lag_max)
        stats["learning_rate"] = self.optimizer.param_groups[0]["lr"]
        self.samples_trained += int(batch["log_probs"].numel()) * self.world_size
        self.train_seconds += time.perf_counter() - start
        return stats

    def _train_on_trajectories(self, batch: dict, host: dict) -> dict[str, torch.Tensor]:
        last: dict[str, torch.Tensor] = {}
        for mb, host_mb in self._minibatches(batch, host, self.trajectories_per_minibatch):
            last = self._sgd_step(mb, host_mb)
        return last

    def _train_on_fixed_targets(self, batch: dict, host: dict) -> dict[str, torch.Tensor]:
        """``--advantages batch``: targets and advantages once, then shuffled minibatches of
        single steps (feed-forward) or whole trajectories (recurrent)."""
        prepared = self._fixed_targets(batch, host)
        if self.model.rnn is None:
            prepared = _as_single_steps(prepared)
            host = {}  # a feed-forward step needs no cuts
        unit_len = prepared["log_probs"].shape[1]
        last: dict[str, torch.Tensor] = {}
        for mb, host_mb in self._minibatches(
                prepared, host, max(1, self.settings.batch_size // unit_len // self.world_size)):
            last = self._sgd_step_fixed(mb, host_mb)
        return last

    def _minibatches(self, data: dict, host: dict, per_minibatch: int):
        """``num_epochs`` passes over ``data`` (entries ``[units, ...]``), each in a new random
        order, in minibatches of ``per_minibatch`` units (the whole of it, unshuffled, when
        it fits in one); yields each with the same rows of the host arrays ``host``.

        The order is drawn on the CPU: the host selects its rows with it, and the device gets
        it by an asynchronous copy."""
        units = data["log_probs"].shape[0]
        for _ in range(self.settings.num_epochs):
            if units <= per_minibatch:
                yield data, host
                continue
            order = torch.randperm(units)
            host_order, device_order = order.numpy(), self._to_device(order)
            for start_idx in range(0, units, per_minibatch):
                rows = host_order[start_idx:start_idx + per_minibatch]
                yield (_select(data, device_order[start_idx:start_idx + per_minibatch]),
                       {k: v[rows] for k, v in host.items()})

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A small host tensor on the device without waiting for it: on CUDA through pinned
        memory with ``non_blocking`` (a pageable source would be a synchronous copy)."""
        if self.device.type == "cpu":
            return host
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def _valid(self, versions: torch.Tensor) -> torch.Tensor:
        """The samples that take part in the loss: acted (not cut short by an env fault), at
        most ``--max_policy_lag`` versions old, and not older than the last PBT replacement."""
        return ((versions >= self.version_floor)
                & ((self.version - versions) <= self.settings.max_policy_lag))

    @torch.no_grad()
    def _fixed_targets(self, batch: dict, host: dict) -> dict:
        """The batch's value targets (critic units) and advantages from the model as it is,
        with the steps that take part (``valid``) and what the SGD steps read."""
        dones = batch["dones"]
        b, t = dones.shape
        normalizer = self.model.returns_normalizer
        logits, values, rewards, value_norm = self._forward_trajectories(batch, host)
        logits, values = logits.float(), values.float()
        dist = ActionDistribution(logits[:, :t].reshape(b * t, -1), self.action_spec)
        log_ratio = dist.log_prob(batch["actions"].reshape(b * t, -1)).reshape(b, t)
        log_ratio = log_ratio - batch["log_probs"]
        valid = self._valid(batch["policy_versions"])
        vs, advantages = return_targets_and_advantages(
            log_ratio, values[:, :t], values[:, t], rewards, dones, valid, self.params, value_norm)
        if normalizer is not None:
            normalizer.update(vs, self._reduce, valid)
            mean, std = normalizer.mean_std()
            targets = (vs - mean) / std
        else:
            targets = vs
        moments = torch.stack([torch.where(valid, vs, 0.0).sum(), valid.sum()]).double()
        if self._reduce is not None:
            self._reduce(moments)
        self._value_target_mean = (moments[0] / moments[1].clamp(min=1)).float()
        return {
            "obs": {k: v[:, :t] for k, v in batch["obs"].items()},
            "rnn_states": batch["rnn_states"], "actions": batch["actions"],
            "log_probs": batch["log_probs"], "values": batch["values"], "dones": dones,
            "advantages": advantages, "targets": targets, "valid": valid,
        }

    def _sgd_step_fixed(self, mb: dict, host: dict) -> dict[str, torch.Tensor]:
        b, t = mb["log_probs"].shape
        resets = torch.zeros((b, t), device=self.device)
        resets[:, 1:] = mb["dones"][:, :-1].float()
        cuts = None
        if self.model.rnn is not None:
            host_resets = np.zeros((b, t), dtype=bool)
            host_resets[:, 1:] = host["dones"][:, :-1]
            cuts = find_cuts(host_resets)
        with autocast(self.precision, self.device):
            logits, values = self.model.forward_sequence(mb["obs"], mb["rnn_states"], resets,
                                                         cuts=cuts)
        dist = ActionDistribution(logits.reshape(b * t, -1), self.action_spec)
        target_log_probs = dist.log_prob(mb["actions"].reshape(b * t, -1)).reshape(b, t)
        exploration = self._exploration(dist, b, t)
        loss, stats = clipped_loss(
            target_log_probs, dist.entropy().reshape(b, t), mb["log_probs"], values.float(),
            mb["advantages"], mb["targets"], mb["valid"], self.params, exploration=exploration,
            behaviour_values=mb["values"], reduce=self._reduce)
        stats["value_target_mean"] = self._value_target_mean
        return self._apply(loss, stats)

    def _sgd_step(self, mb: dict, host: dict) -> dict[str, torch.Tensor]:
        dones = mb["dones"]
        b, t = dones.shape
        normalizer = self.model.returns_normalizer
        logits, values, rewards, value_norm = self._forward_trajectories(mb, host)
        dist = ActionDistribution(logits[:, :t].reshape(b * t, -1), self.action_spec)
        actions = mb["actions"].reshape(b * t, -1)
        target_log_probs = dist.log_prob(actions).reshape(b, t)
        entropy = dist.entropy().reshape(b, t)
        exploration = self._exploration(dist, b, t)
        valid = self._valid(mb["policy_versions"])
        loss, stats, targets = appo_loss(
            target_log_probs, entropy, mb["log_probs"], values, rewards, dones, valid, self.params,
            exploration=exploration, behaviour_values=mb.get("values"), value_normalizer=value_norm,
            return_targets=True, reduce=self._reduce)
        if normalizer is not None:
            normalizer.update(targets, self._reduce, valid)
        return self._apply(loss, stats)

    def _exploration(self, dist: ActionDistribution, b: int, t: int) -> torch.Tensor | None:
        """The per-sample exploration penalty ``[B, T]`` (None: the entropy bonus)."""
        if self.settings.exploration_loss == "symmetric_kl":
            return dist.symmetric_kl_to_uniform().reshape(b, t)
        return None

    def _forward_trajectories(self, batch: dict, host: dict) -> tuple:
        """The model over whole trajectories (``obs`` ``[B, T + 1, ...]``): logits
        ``[B, T + 1, P]`` and values ``[B, T + 1]`` (with gradient), the rewards with the
        time-limit bootstrap added, and the return normaliser's ``(mean, std)`` (or None).
        ``host``: the batch's ``dones`` and ``final_step`` as host arrays."""
        dones = batch["dones"]
        b, t = dones.shape
        # The hidden state is zeroed before step t+1 when step t ended an episode.
        resets = torch.zeros((b, t + 1), device=self.device)
        resets[:, 1:] = dones.float()
        normalizer = self.model.returns_normalizer
        value_norm = None if normalizer is None else normalizer.mean_std()
        rewards = batch["rewards"]
        if self.shaping is not None:
            rewards = self.shaping.apply(rewards, batch["reward_terms"])
        bootstrap = self.settings.value_bootstrap and "final_step" in batch
        final_step = host["final_step"] if bootstrap else None
        cuts: Cuts | None = None
        if self.model.rnn is not None:
            host_resets = np.zeros((b, t + 1), dtype=bool)
            host_resets[:, 1:] = host["dones"]
            cuts = find_cuts(host_resets, final_step)
        extra: dict = {}
        if bootstrap:
            rows = torch.from_numpy(np.flatnonzero(final_step >= 0))
            extra = dict(final_obs=batch["final_obs"], final_step=batch["final_step"],
                         final_rows=self._to_device(rows))
        with autocast(self.precision, self.device):
            out = self.model.forward_sequence(batch["obs"], batch["rnn_states"], resets,
                                              cuts=cuts, **extra)
        if bootstrap:
            rewards = _add_time_limit_bootstrap(rewards, batch["final_step"], out[2].detach(),
                                                self.params.gamma, value_norm)
        return out[0], out[1], rewards, value_norm

    def _apply(self, loss: torch.Tensor, stats: dict) -> dict[str, torch.Tensor]:
        """One optimizer step on ``loss``; ``stats`` plus the gradient norm and the loss."""
        max_norm = self.settings.max_grad_norm
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.group is not None:
            self.group.sum_grads(list(self.model.parameters()))
        if max_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        else:
            grad_norm = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in self.model.parameters()
                                       if p.grad is not None))
        self.optimizer.step()
        self.version += 1
        stats = dict(stats)
        stats["grad_norm"] = grad_norm.detach()
        stats["loss"] = loss.detach()
        return stats

    @property
    def hyperparams(self) -> dict[str, float]:
        """This learner's own values of ``PBT_HYPERPARAMS`` (the flags' unless PBT set them)."""
        return {"learning_rate": self.learning_rate,
                "exploration_loss_coeff": self.params.exploration_loss_coeff,
                "gamma": self.params.gamma,
                **(self.shaping.hyperparams() if self.shaping is not None else {})}

    def set_hyperparams(self, values: dict) -> None:
        """Train from now on with these ``PBT_HYPERPARAMS``: the optimizer's learning rate
        (the base of ``--lr_schedule``), the loss's gamma and exploration coefficient, and
        the shaping terms' weights (``reward/<term>``)."""
        self.learning_rate = float(values["learning_rate"])
        self.params = dataclasses.replace(
            self.params, gamma=float(values["gamma"]),
            exploration_loss_coeff=float(values["exploration_loss_coeff"]))
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate
        if self.shaping is not None:
            self.shaping.set(values)

    def take_weights(self, source, hyperparams: dict) -> None:
        """A PBT replacement: the donor's current weights from ``source`` (its published
        ``WeightsSource``), a fresh optimizer state (Adam's moments were estimated for the
        old weights; the donor's are not published), the new hyperparameters, and a new
        version that is also the floor below which samples are left out of the loss."""
        source.load_into(self.model)
        self.optimizer.state.clear()
        self.set_hyperparams(hyperparams)
        self.version += 1
        self.version_floor = self.version

    def state_dict(self, store_contents: bool = True) -> dict:
        """``store_contents``: the replay learners' (no store here)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "samples_trained": self.samples_trained,
            "hyperparams": self.hyperparams,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.samples_trained = int(state["samples_trained"])


def policy_lag(versions: torch.Tensor, version: int) -> torch.Tensor:
    """``[steps acted, min, mean, max]`` of ``version - versions`` over the steps a policy
    acted (a negative version marks a step of an episode cut short by an env fault), as one
    tensor, without reading anything back from the device."""
    acted = versions >= 0
    lag = (version - versions).float()
    count = acted.sum().float()
    big = torch.finfo(torch.float32).max
    return torch.stack([
        count,
        torch.where(acted, lag, big).min(),
        torch.where(acted, lag, 0.0).sum() / count.clamp(min=1.0),
        torch.where(acted, lag, -big).max(),
    ])


def _add_time_limit_bootstrap(rewards: torch.Tensor, final_step: torch.Tensor,
                              final_values: torch.Tensor, gamma: float,
                              value_norm: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``rewards`` ``[B, T]`` plus ``gamma * V(final observation)`` at the step where a time
    limit cut each trajectory's episode (``final_step`` ``[B]``, -1: none). The step stays a
    done step, so the return is the same as if the episode had gone on with that value.
    Scattered, not indexed by the rows that have one: that would read them back."""
    if value_norm is not None:
        final_values = final_values * value_norm[1] + value_norm[0]
    bonus = torch.where(final_step >= 0, gamma * final_values.to(rewards.dtype), 0.0)
    return rewards.scatter_add(1, final_step.clamp(min=0).unsqueeze(1), bonus.unsqueeze(1))


def _host_part(batch: dict) -> dict:
    """``dones`` and ``final_step`` of a batch that came without them on the host, read back
    (one transfer each when the batch is on a device; a batch from
    ``TrajectoryBuffers.gather`` brings them)."""
    return {k: batch[k].cpu().numpy() for k in ("dones", "final_step") if k in batch}


def _normalizer_frames(obs: dict, t: int) -> dict:
    """About ``NORMALIZER_FRAMES`` acted frames of ``obs`` (dict of ``[B, T+1, ...]``), spread
    evenly over time steps and taken from every trajectory, as dict of ``[N, ...]``."""
    b = next(iter(obs.values())).shape[0]
    step = max(1, min(t, b * t // NORMALIZER_FRAMES))
    return {k: v[:, :t:step].reshape(-1, *v.shape[2:]) for k, v in obs.items()}


def _as_single_steps(prepared: dict) -> dict:
    """``[B, T, ...]`` entries as ``B * T`` one-step trajectories ``[B * T, 1, ...]`` (for
    feed-forward models, whose steps do not depend on each other)."""
    b, t = prepared["log_probs"].shape
    out: dict = {}
    for key, value in prepared.items():
        if key == "obs":
            out[key] = {k: v.reshape(b * t, 1, *v.shape[2:]) for k, v in value.items()}
        elif key == "rnn_states":
            out[key] = value.new_zeros((b * t, value.shape[-1]))
        else:
            out[key] = value.reshape(b * t, 1, *value.shape[2:])
    return out


def _select(batch: dict, idx: torch.Tensor) -> dict:
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            out[key] = {k: v.index_select(0, idx) for k, v in value.items()}
        else:
            out[key] = value.index_select(0, idx)
    return out
