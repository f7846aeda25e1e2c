"""The policy worker core: batched inference over whatever requests are waiting.

Observations are gathered from the trajectory buffers with one indexed read per key, the
model runs once under ``torch.inference_mode`` on the worker's device, actions, log-probs,
values and the new recurrent states come back to the host in one transfer (:func:`to_host`),
and they and the acting policy version are written into the same buffer positions with one
indexed write each.
"""

from __future__ import annotations

import functools

import torch

from fastrl.algo.replay.dueling import chosen_q, dueling_heads, greedy_q
from fastrl.algo.replay.exploration import RepeatedExploration, epsilon_greedy
from fastrl.device import autocast
from fastrl.policy.acting_layout import for_small_batches
from fastrl.policy.actions import ActionSpec
from fastrl.policy.bf16_encoders import lowp_encoders, refresh
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import ActorCritic
from fastrl.policy.obs import lowest_obs
from fastrl.policy.recurrent import lowp_acting_core
from fastrl.sampling.buffers import TrajectoryBuffers
from fastrl.sampling.graphed import GraphedActor
from fastrl.sampling.sde import HeldNoise
from fastrl.sampling.staging import Staging
from fastrl.sampling.weights import WeightsSource
from fastrl.transport.messages import ActionsReady, InferenceRequest


class PolicyWorker:
    """Runs the policy for batches of :class:`InferenceRequest`.

    Args:
        model: the actor-critic, already on ``device``.
        buffers: trajectory buffers (CPU, possibly shared).
        rnn_state: ``[num_envs_total, H]`` recurrent state per env (CPU, possibly shared).
        weights: where the learner's weights come from (in serial mode, the learner's
            model itself: see :class:`fastrl.sampling.weights.LocalWeights`).
        precision: the resolved ``--precision`` ("fp32", "bf16" or "fp16"; the learner's,
            ``fastrl.device.resolve_precision``): the encoders' autocast.
        cuda_graphs: ``--policy_cuda_graphs``: on a CUDA device, replay each model's acting
            step from CUDA graphs (:class:`fastrl.sampling.graphed.GraphedActor`); not with
            ``epsilons``.
        action_noise_every: ``--action_noise_every``: under ``--action_log_std sde`` (the
            model has ``sde_log_std``), the steps each env slot keeps its exploration matrix
            (fastrl/sampling/sde.py); such a worker replays no CUDA graphs.
        (These three come without defaults: the caller passes the run's. The keywords after
        them default to their feature off: no Config flag sets them.)
        deterministic: take the most likely action instead of sampling.
        epsilons: ``--algo apex``: ``[num_env_slots]``, each env slot's exploration rate
            (indexed like ``rnn_state``): the greedy action (``mode``), replaced by a uniform
            one with that probability (see :func:`ape_x_epsilons`).
        repeats: with ``epsilons``, ``--apex_epsilon_repeat_mu``'s held random actions
            (:class:`RepeatedExploration`, the wiring's: every policy worker reads a slot's
            one state, and the rollout workers end a repeat with its episode); None: plain
            epsilon-greedy.
        others: ``--num_policies`` > 1: ``(model, weights)`` of policies 1, 2, ...
            (``model`` and ``weights`` are policy 0's). Each model loads its own weights; a
            batch's rows are grouped by ``InferenceRequest.policies`` and each group is acted
            by its policy's model, from one gather of the observations and with one transfer
            back.
        held_noise: under ``--action_log_std sde``, the env slots' exploration matrices
            shared by several policy workers (``Wiring.held_noise``); default: this worker's
            own.
    """

    def __init__(self, model: ActorCritic, action_space, buffers: TrajectoryBuffers,
                 rnn_state: torch.Tensor, device: torch.device,
                 weights: WeightsSource, *, precision: str, cuda_graphs: bool,
                 action_noise_every: int,
                 deterministic: bool = False, epsilons: torch.Tensor | None = None,
                 others: list[tuple[ActorCritic, WeightsSource]] = (),
                 held_noise: HeldNoise | None = None,
                 repeats: RepeatedExploration | None = None):
        self.model = model
        self.buffers = buffers
        self.rnn_state = rnn_state
        self.device = device
        self.weights = weights
        self.deterministic = deterministic
        self.precision = precision
        self.action_spec = ActionSpec(action_space)
        self.epsilons = epsilons
        self.repeats = repeats if epsilons is not None else None
        # -1 until weights are loaded: the model's own initial weights are never used to act
        # (they are not the learner's, whatever their version says).
        self.policy_version = -1
        self.models = [model, *(m for m, _ in others)]
        self.sources = [weights, *(source for _, source in others)]
        self.versions = [-1] * len(self.models)  # of every policy, policy_version's included
        # Observations and memory reach the device through buffers kept from call to call.
        self.staging = Staging(device)
        # Under bf16, each model's encoders with their weights already in bf16, refreshed at
        # every load: autocast then casts nothing (fastrl/policy/bf16_encoders.py).
        self._lowp = ([lowp_encoders(m.encoders) for m in self.models]
                      if precision == "bf16" else None)
        if self.device.type == "cpu":
            # Small batches' GEMMs: weights stored column by column (fastrl/policy/
            # acting_layout.py), in the models this worker owns: not in serial mode's, which
            # is the learner's own.
            # Under bf16 the recurrent core's products take bf16 weights: kept so, rather
            # than cast at every call (fastrl/policy/recurrent.py, lowp_acting_core).
            for m, source in zip(self.models, self.sources, strict=True):
                if getattr(source, "model", None) is not m:
                    for_small_batches(m)
                    if precision == "bf16" and m.rnn is not None:
                        lowp_acting_core(m.rnn, self.device)
        self._flat_obs = {k: v.view(-1, *v.shape[2:]) for k, v in buffers.obs.items()}
        self._steps = buffers.layout.rollout + 1  # observation rows per slot
        # --action_log_std sde: every env slot's exploration matrix, held for a while.
        self._held = None
        sde = model.sde_log_std
        if sde is not None and not deterministic:
            self._held = held_noise if held_noise is not None else HeldNoise(
                rnn_state.shape[0], sde.shape[0], sde.shape[1], action_noise_every, device)
        self._graphed = None
        if cuda_graphs and self.device.type == "cuda" and epsilons is None \
                and self._held is None:
            self._graphed = self.graphed_actors()

    def graphed_actors(self, capture=None) -> list[GraphedActor]:
        """Each policy's acting step replayed from CUDA graphs, whose inputs begin at the
        lowest observation of the model's space (``capture(step)``: tests' stand-in for the
        capture of ``step``, on a CPU)."""
        fill = lowest_obs(self.model.obs_space)
        actors = []
        for k in range(len(self.models)):
            step = functools.partial(self._act_eager, k, e_idx=None)
            actors.append(GraphedActor(step, self.device, max_rows=self.rnn_state.shape[0],
                                       name=f"policy {k} acting", fill=fill,
                                       capture=None if capture is None else capture(step)))
        return actors

    def maybe_update_weights(self) -> None:
        """Load the newest published weights if their version differs from the loaded ones
        (a negative published version means nothing was published yet)."""
        published = self.weights.version()
        if published >= 0 and published != self.policy_version:
            self.policy_version = self.weights.load_into(self.model)
            self._loaded(0)
        if len(self.models) > 1:
            self.versions[0] = self.policy_version
            for k in range(1, len(self.models)):
                published = self.sources[k].version()
                if published >= 0 and published != self.versions[k]:
                    self.versions[k] = self.sources[k].load_into(self.models[k])
                    self._loaded(k)

    def _loaded(self, k: int) -> None:
        """Policy ``k``'s model took new weights."""
        if self._lowp is not None:
            refresh(self._lowp[k], self.models[k].encoders)

    @property
    def has_weights(self) -> bool:
        """Whether every model holds weights it may act with."""
        return self.policy_version >= 0 and min(self.versions[1:], default=0) >= 0

    def infer(self, requests: list[InferenceRequest]) -> list[ActionsReady]:
        """Act for every env in ``requests``; return who may step now."""
        if not requests:
            return []
        self.maybe_update_weights()
        if not self.has_weights:
            raise RuntimeError("policy worker asked to act before the learner published weights")
        env_ids: list[int] = []
        bufs: list[int] = []
        steps: list[int] = []
        policies: list[int] = []
        for req in requests:
            env_ids += req.env_ids
            bufs += req.buffers
            steps += [req.t] * len(req.buffers)
            if len(self.models) > 1:
                policies += req.policies or [0] * len(req.buffers)
        b_idx = torch.tensor(bufs, dtype=torch.int64)
        t_idx = torch.tensor(steps, dtype=torch.int64)
        e_idx = torch.tensor(env_ids, dtype=torch.int64)
        rows = b_idx * self._steps + t_idx  # row of (slot, step) in the flattened obs
        staged = self.staging.take({"rnn": (self.rnn_state, e_idx),
                                    **{f"obs/{k}": (v, rows) for k, v in self._flat_obs.items()}})
        h = staged.pop("rnn")
        obs = {key[4:]: value for key, value in staged.items()}
        if policies:
            actions, log_probs, values, new_h, versions = self._act_per_policy(obs, h, policies,
                                                                                e_idx)
        else:
            actions, log_probs, values, new_h = self._act(0, obs, h, e_idx)
            versions = self.policy_version
        actions, log_probs, values, new_h = to_host(
            [actions.to(self.buffers.actions.dtype), log_probs.float(), values.float(),
             new_h.float()])
        self.buffers.actions[b_idx, t_idx] = actions
        self.buffers.log_probs[b_idx, t_idx] = log_probs
        self.buffers.values[b_idx, t_idx] = values
        self.buffers.policy_versions[b_idx, t_idx] = versions
        if new_h.shape[-1]:
            self.rnn_state[e_idx] = new_h
        return [ActionsReady(req.worker_id, req.split_id, req.t, req.generation, req.epoch)
                for req in requests]

    def _act(self, k: int, obs: dict, h: torch.Tensor, e_idx: torch.Tensor | None):
        """Policy ``k``'s actions, log-probs, values and new recurrent states for the rows
        (replayed from a CUDA graph with ``cuda_graphs``; valid until the next call)."""
        if self._graphed is not None:
            return self._graphed[k](obs, h)
        return self._act_eager(k, obs, h, e_idx)

    def _act_eager(self, k: int, obs: dict, h: torch.Tensor, e_idx: torch.Tensor | None):
        encoders = None if self._lowp is None else self._lowp[k]
        # No autocast cache: it would only keep casts within one call (each weight is cast
        # once per call anyway), and a CUDA graph capture needs it off.
        model = self.models[k]
        held = self._held if model.sde_log_std is not None else None
        with torch.inference_mode(), autocast(self.precision, self.device, cache=False):
            features = None
            if held is None:
                logits, values, new_h = model.forward_step(obs, h, encoders)
            else:
                logits, values, new_h, features = model.forward_step(obs, h, encoders,
                                                                     with_features=True)
            dist = ActionDistribution(logits, self.action_spec)
            if self.epsilons is not None:
                if self.repeats is not None:
                    actions = self.repeats.choose(dist.mode(), self.epsilons[e_idx],
                                                  self.action_spec.nvec, e_idx)
                else:
                    actions = epsilon_greedy(dist.mode(), self.epsilons[e_idx].to(self.device),
                                             self.action_spec.nvec)
                # The replay algorithms keep no log-probs or state values: the slots' columns
                # take the actor's Q(s, a) and max_a Q(s, a) instead (mean over the heads),
                # which Ape-X's actor priorities read (sequences.actor_td_errors).
                q = dueling_heads(logits.float(), values.float(), self.action_spec.nvec)
                return actions, chosen_q(q, actions).mean(1), greedy_q(q).mean(1), new_h
            if self.deterministic:
                actions = dist.mode()
            elif held is not None:
                actions = dist.sample(held.standard_noise(features, model.sde_log_std, e_idx))
            else:
                actions = dist.sample()
            log_probs = dist.log_prob(actions)
        return actions, log_probs, values, new_h

    def _act_per_policy(self, obs: dict, h: torch.Tensor, policies: list[int],
                        e_idx: torch.Tensor):
        """Each policy's rows (``policies[i]`` acts for row ``i``) acted by its own model,
        put back in row order; also the acting version of every row (host, int64).
        ``e_idx``: the rows' env slots (host)."""
        pol = torch.tensor(policies, dtype=torch.int64)
        versions = torch.tensor(self.versions, dtype=torch.int64)[pol]
        parts = []
        for k in sorted(set(policies)):
            rows = (pol == k).nonzero().squeeze(1)
            dev_rows = rows.to(self.device)
            sub = {key: value[dev_rows] for key, value in obs.items()}
            parts.append((dev_rows, self._act(k, sub, h[dev_rows], e_idx[rows])))
        if len(parts) == 1:  # one policy acts for the whole batch
            return (*parts[0][1], versions)
        n = len(policies)
        out = []
        for i in range(4):
            first = parts[0][1][i]
            full = torch.empty((n, *first.shape[1:]), dtype=first.dtype, device=first.device)
            for dev_rows, outputs in parts:
                full[dev_rows] = outputs[i]
            out.append(full)
        return (*out, versions)


def to_host(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` (each ``[B, ...]``, of 4- or 8-byte dtypes) on the host, in one transfer
    from a device (:func:`one_transfer`): on a GPU every separate copy would make the host
    wait for the device once more. Parts already on the CPU are handed back as they are."""
    if all(part.device.type == "cpu" for part in parts):
        return list(parts)
    return one_transfer(parts)


def one_transfer(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` copied to the host with one ``.cpu()``: their bytes cross side by side as
    int32 words, a bit copy, so every value arrives exact whatever its dtype (int64 actions
    included: no float rounding of large indices)."""
    words = []
    for part in parts:
        if part.element_size() not in (4, 8):
            raise ValueError(f"one_transfer: 4- or 8-byte dtypes only, got {part.dtype}")
        words.append(part.reshape(part.shape[0], -1).contiguous().view(torch.int32))
    host = torch.cat(words, dim=1).cpu()
    out, start = [], 0
    for part, word in zip(parts, words, strict=True):
        chunk = host[:, start:start + word.shape[1]]
        start += word.shape[1]
        if part.element_size() != 4:
            chunk = chunk.contiguous()  # a wider view needs aligned rows
        out.append(chunk.view(part.dtype).reshape(part.shape))
    return out
