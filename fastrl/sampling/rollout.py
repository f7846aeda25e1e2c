"""The rollout worker core: steps envs and writes what they return into trajectory buffers.

The worker's envs are split into ``worker_num_splits`` groups. A group steps only after the
policy has written its actions; while one group waits for inference the other steps
(double-buffered sampling). The class does no I/O of its own: each method returns the
messages it produced, and the shell that drives it (serial runner or worker process)
routes them. This keeps the logic testable in-process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from fastrl.env_registry import recycles
from fastrl.policy.actions import ActionSpec
from fastrl.policy.obs import as_dict_space
from fastrl.sampling.backlog import Backlog
from fastrl.sampling.buffers import INVALID_VERSION, TrajectoryBuffers
from fastrl.sampling.env_faults import (
    CallTimer,
    EnvBroken,
    EnvFault,
    EnvOutputError,
    ObsCheck,
    check_step,
    count_in_row,
    describe,
    fault_kind,
    write_reward_terms,
)
from fastrl.sampling.policy_assignment import PolicyAssignment, by_policy
from fastrl.sampling.rollout_records import Split, StepOutput, TrajectoryTags
from fastrl.sampling.startup import CREATING, STEPPING, Activity, Decorrelation, EnvStartup
from fastrl.transport.messages import (
    ActionsReady,
    EpisodeStats,
    InferenceRequest,
    TrajectoriesReady,
)

# An env that fails this many times in a row while being recreated is beyond repair: the
# worker stops with the cause (and the runner decides whether to restart the worker).
ENV_RESTART_ATTEMPTS = 3
ENV_CHECKS = ("warn", "strict")  # --env_check
NO_VERSION = np.iinfo(np.int64).max  # no step of the episode acted yet (EpisodeStats.version)


class RolloutWorker(EnvStartup):
    """Owns ``len(envs)`` envs (global ids ``worker_id * len(envs) + i``) and buffer slots.

    Args:
        worker_id: index of this worker.
        envs: the worker's envs, created by the caller.
        buffers: the shared trajectory buffers.
        rnn_state: ``[num_envs_total, H]`` current recurrent state of every env; the policy
            writes it after each step, this worker zeroes it when an episode ends.
        free_buffers: slot indices this worker may fill at the start.
        num_splits: groups to split the envs into.

        The flags' values come without defaults (the caller passes the run's: ``Config``'s
        defaults are the only ones); the keywords after them default to their feature off
        (async, unseeded, no env replaced, no time limit, one policy, no backlog).

        reward_scale, reward_clip: applied to the training reward (episode returns stay
            native); with ``buffers.reward_terms`` the learner clips
            (fastrl/algo/pbt/reward_weights.py).
        trajectories_per_round: sync mode (``async_rl=False``): each split pauses after
            this many trajectories per env until :meth:`resume` is called; ``None`` = async.
        seed: base seed; env ``e`` is reset with ``seed + e`` on its first reset.
        env_factory: makes a replacement env. With it, an env that faults in ``step`` or
            ``reset`` (raises, runs past ``env_timeout``, or returns bad output: see
            ``fastrl.sampling.env_faults``) is closed and recreated: the steps of its
            unfinished episode in the current trajectory are marked invalid (the learner
            leaves them out), the episode is not reported, and the fault is counted by kind.
            Without it, the fault propagates. An env that faults ``ENV_FAULTS_IN_A_ROW`` times
            in a row, each after fewer than ``ENV_GOOD_STEPS`` good steps, stops the worker
            (:class:`EnvBroken`; both in ``fastrl.sampling.env_faults``).
        env_timeout: seconds one env call may take (0 = no limit; SIGALRM: see CallTimer).
        generation, epoch: stamped on every request (see ``InferenceRequest``).
        decorrelate: at :meth:`start`, env ``e`` (global id) first takes up to ``e * rollout``
            random actions, unreported, within a time budget: no lock-step resets.
        action_bounds: how continuous actions are bounded for the env
            (``fastrl.policy.actions.ActionSpec``).
        env_check: ``"warn"``: bad env output is a fault like any other; ``"strict"``: it
            raises :class:`~fastrl.errors.EnvOutputError` at once, naming the env.
        num_policies, policy_seed: ``--num_policies``: each slot's policy, drawn per episode
            (``fastrl.sampling.rollout_records.PolicyAssignment``, seeded with ``policy_seed``,
            the same for every worker of a run); a trajectory goes to its policy's learner.
        activity: where it records what it is doing (``fastrl.sampling.startup.Activity``).
        backlog: holds splits while enough trajectories wait (``fastrl.sampling.backlog``).
        repeats_left: ``--apex_epsilon_repeat_mu``: every env slot's steps left of its held
            random action (``RepeatedExploration.left``); this worker zeroes a slot's with its
            recurrent state when an episode begins, so a repeat ends with its episode.

    A time limit (``truncated`` without ``terminated``) ends the episode for the learner like
    a termination (``dones``), but the episode's last observation is kept in the slot's
    ``final_obs`` with ``final_step = t`` so that the learner can bootstrap from its value.
    A slot keeps one: a second time limit within the same trajectory (only when the limit is
    shorter than the rollout) is left as a plain end of episode and counted in
    ``truncations_not_bootstrapped``.
    """

    def __init__(self, worker_id: int, envs: list[gym.Env], buffers: TrajectoryBuffers,
                 rnn_state: torch.Tensor, free_buffers: list[int], num_splits: int, *,
                 reward_scale: float, reward_clip: float, action_bounds: str, env_check: str,
                 trajectories_per_round: int | None = None, seed: int | None = None,
                 env_factory: Callable[[], gym.Env] | None = None, env_timeout: float = 0.0,
                 generation: int = 0, epoch: int = 0, decorrelate: bool = False,
                 num_policies: int = 1, policy_seed=None, activity: Activity | None = None,
                 backlog: Backlog | None = None, repeats_left: torch.Tensor | None = None):
        if len(envs) % num_splits:
            raise ValueError(f"{len(envs)} envs cannot be split into {num_splits} equal groups")
        if env_check not in ENV_CHECKS:
            raise ValueError(f"env_check={env_check!r}: must be one of {ENV_CHECKS}")
        self.worker_id = worker_id
        self.envs = envs
        self.buffers = buffers
        self.rollout = buffers.layout.rollout
        self.reward_scale = reward_scale
        # --with_pbt: the env's shaping terms kept apart; the learner weighs them and clips.
        self._terms_np = None if buffers.reward_terms is None else buffers.reward_terms.numpy()
        self.reward_clip = reward_clip if self._terms_np is None else float("inf")
        self.trajectories_per_round = trajectories_per_round
        self.seed = seed
        self.env_factory = env_factory
        self.env_recycles = 0  # envs made anew at an episode boundary (--env_recycle_*)
        self.generation = generation
        self.epoch = epoch
        self.decorrelate = decorrelate
        self.activity = activity if activity is not None else Activity()
        self.backlog = backlog if backlog is not None else Backlog(None, worker_id, None)
        self._repeats_left_np = None if repeats_left is None else repeats_left.numpy()
        self._stepping = [Activity.code(STEPPING, i) for i in range(len(envs))]
        self.truncations_not_bootstrapped = 0
        self.free: deque[int] = deque(free_buffers)
        self._timer = CallTimer(env_timeout)
        self.strict = env_check == "strict"
        # numpy views share memory with the (possibly shared) tensors; numpy's small
        # indexed writes cost far less than torch's per-call overhead on this hot path.
        self._obs_np = {k: v.numpy() for k, v in buffers.obs.items()}
        self._actions_np = buffers.actions.numpy()
        self._rewards_np = buffers.rewards.numpy()
        self._dones_np = buffers.dones.numpy()
        self._rnn_np = buffers.rnn_states.numpy()
        self._policy_rnn_np = rnn_state.numpy()
        self._final_obs_np = {k: v.numpy() for k, v in buffers.final_obs.items()}
        self._final_step_np = buffers.final_step.numpy()
        self._tags = TrajectoryTags(buffers.traj_ids.numpy(), generation)
        self._check_obs = ObsCheck(self._obs_np, as_dict_space(envs[0].observation_space))
        self._has_rnn = buffers.layout.rnn_size > 0
        first = worker_id * len(envs)
        self.decorrelation = Decorrelation(  # global env e asks for e x rollout random steps
            self.rollout * sum(range(first, first + len(envs))) * decorrelate, self.activity)
        per_split = len(envs) // num_splits
        self.splits = [
            Split(env_ids=[first + i for i in range(s * per_split, (s + 1) * per_split)],
                   local=list(range(s * per_split, (s + 1) * per_split)))
            for s in range(num_splits)
        ]
        action_space = envs[0].action_space
        self._to_env = ActionSpec(action_space, action_bounds).to_env
        self._discrete = isinstance(action_space, spaces.Discrete) and action_space.start == 0
        self._ep_return = np.zeros(len(envs), dtype=np.float64)
        self._ep_len = np.zeros(len(envs), dtype=np.int64)
        # the step where each env's episode began in its current trajectory
        self._ep_start = np.zeros(len(envs), dtype=np.int64)
        self._versions_np = buffers.policy_versions.numpy()
        # the oldest version that acted each env's episode in its earlier trajectories
        self._ep_version = np.full(len(envs), NO_VERSION, dtype=np.int64)
        self._faults_in_a_row = [0] * len(envs)  # per slot: see env_faults.count_in_row
        self._good_steps = [0] * len(envs)  # each env's, since its last fault
        self.num_policies, self.policy_seed = num_policies, policy_seed
        self.assign = PolicyAssignment(len(envs), num_policies, policy_seed,
                                       [s.local for s in self.splits], 1, worker_id * num_splits)

    # -- public API ---------------------------------------------------------------------

    def accepts(self, ready: ActionsReady) -> bool:
        """Whether ``ready`` answers the request now in flight for its split (a message for
        an earlier incarnation of this worker, or an answer that was re-requested after a
        policy worker restart, is stale and must be ignored)."""
        if ready.generation != self.generation or not 0 <= ready.split_id < len(self.splits):
            return False
        split = self.splits[ready.split_id]
        return split.request_epoch == ready.epoch and split.t == ready.t and bool(split.buffers)

    def reissue(self, epoch: int) -> StepOutput:
        """A policy worker was restarted and requests from before ``epoch`` are dropped:
        ask again for every split still waiting for actions."""
        self.epoch = epoch
        out = StepOutput()
        for s, split in enumerate(self.splits):
            if 0 <= split.request_epoch < epoch:
                out.requests.append(self._request(s))
        return out

    def on_actions(self, split_id: int) -> StepOutput:
        """The policy wrote actions for ``split_id``: step its envs once."""
        out = StepOutput()
        split = self.splits[split_id]
        split.request_epoch = -1
        t, bufs = split.t, split.buffers
        actions = self._actions_np[bufs, t]  # one indexed read: [n, D]; Discrete: the index
        actions = actions[:, 0].tolist() if self._discrete else [self._to_env(a) for a in actions]
        return self._stepped(split_id, self._step_split(split, t, bufs, actions, out), out)

    def _step_split(self, split: Split, t: int, bufs: list[int], actions: list,
                    out: StepOutput) -> list[dict]:
        """Step the split's envs with one action per slot; each slot's next observation."""
        next_obs, cells, at = [], self.activity.cells, self.activity.index
        for i, e, b, action in zip(split.local, split.env_ids, bufs, actions):
            cells[at] = self._stepping[i]  # what the runner names if this step hangs
            next_obs.append(self._step(i, e, b, t, action, out))
        return next_obs

    def _stepped(self, split_id: int, next_obs: list[dict], out: StepOutput) -> StepOutput:
        """The split stepped: ask for the next actions, or hand the full trajectories over."""
        split = self.splits[split_id]
        split.t += 1
        if split.t < self.rollout:
            self._write_obs(split.buffers, split.t, next_obs)
            out.requests.append(self._request(split_id))
        else:
            self._complete_trajectories(split_id, next_obs, out)
        return out

    def add_free_buffers(self, indices) -> StepOutput:
        """Slots came back from the learner; splits that waited for them (or were held) go."""
        self.free.extend(indices)
        self.backlog.freed(len(indices))
        out = StepOutput()
        for s, split in enumerate(self.splits):
            if (split.waiting_for_buffers or split.held) and not split.paused:
                self._begin_trajectories(s, out)
        return out

    def release_held(self) -> StepOutput:
        """Held splits begin again if the learner's backlog has shrunk enough."""
        return self.add_free_buffers(())

    def resume(self) -> StepOutput:
        """Sync mode: the learner published new weights; paused splits start a new round."""
        out = StepOutput()
        for s, split in enumerate(self.splits):
            if split.paused:
                split.paused = False
                split.trajectories_this_round = 0
                self._begin_trajectories(s, out)
        return out

    @property
    def all_paused(self) -> bool:
        return all(split.paused for split in self.splits)

    # -- internals ----------------------------------------------------------------------

    def _step(self, i: int, e: int, b: int, t: int, action, out: StepOutput) -> dict:
        """Env ``i`` (global id ``e``, filling slot ``b``) takes step ``t`` with ``action``;
        record it and return the observation that comes next (a new episode's first when
        this step ended one or faulted)."""
        try:  # all is checked before anything is written: no step is half-recorded
            obs, reward, terminated, truncated, info = self._timer.call(self.envs[i].step, action)
            obs = self._check_obs(obs)
            reward, terminated, truncated, info = check_step(reward, terminated, truncated, info)
            if self._terms_np is not None:
                write_reward_terms(self._terms_np[b, t], info.get("reward_terms"))
        except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
            return self._cut_episode(i, e, b, t, exc, out)
        self._good_steps[i] += 1
        clip = self.reward_clip  # the training reward; the episode's return stays native
        self._rewards_np[b, t] = max(-clip, min(clip, reward * self.reward_scale))
        self._ep_return[i] += reward
        self._ep_len[i] += 1
        done = terminated or truncated
        self._dones_np[b, t] = done
        if not done:
            return obs
        self._end_episode(i, e, b, t, obs, truncated and not terminated, info, out)
        return self._new_episode(i, e, t + 1, out)

    def _cut_episode(self, i: int, e: int, b: int, t: int, fault: Exception,
                     out: StepOutput) -> dict:
        """Env ``i`` faulted at step ``t``: its episode is cut short, its steps in this
        trajectory are left out of training, and the next step begins a new episode in a new
        env; return that env's first observation."""
        start = int(self._ep_start[i])
        self._versions_np[b, start:t + 1] = INVALID_VERSION
        self._rewards_np[b, t] = 0.0
        self._dones_np[b, t] = True
        out.steps_discarded += t + 1 - start
        self.assign.episode_ended(i)
        return self._new_episode(i, e, t + 1, out, fault=fault)

    def _end_episode(self, i: int, e: int, b: int, t: int, obs: dict, time_limit: bool,
                     info: dict, out: StepOutput) -> None:
        """Env ``i``'s episode ended at step ``t`` (``time_limit``: truncated, not
        terminated): report it."""
        if time_limit:
            self._keep_final_obs(b, t, obs)
        episode = info.get("episode")
        if episode is not None:
            ret, length = float(episode["r"]), int(episode["l"])
        else:
            ret, length = float(self._ep_return[i]), int(self._ep_len[i])
        metrics = info.get("episode_metrics")  # the env's own numbers for the episode
        acted = self._versions_np[b, self._ep_start[i]:t + 1]  # its steps in this trajectory
        version = min(int(self._ep_version[i]), int(acted.min()))
        out.episodes.append(EpisodeStats(e, ret, length, time_limit,
                                         dict(metrics) if isinstance(metrics, dict) else None,
                                         self.assign.episode_ended(i), version))
        self._faults_in_a_row[i] = 0

    def _keep_final_obs(self, b: int, t: int, obs: dict) -> None:
        """Slot ``b``'s episode hit a time limit at step ``t``: keep its last observation."""
        if self._final_step_np[b] >= 0:
            self.truncations_not_bootstrapped += 1
            return
        for key, arr in self._final_obs_np.items():
            arr[b] = obs[key]
        self._final_step_np[b] = t

    def _complete_trajectories(self, split_id: int, next_obs: list[dict],
                               out: StepOutput) -> None:
        """The split's slots are full: the observation after the last step is their bootstrap
        observation and the first of the next ones; hand them to the learner and begin the
        next (unless the sync-mode round is over)."""
        split = self.splits[split_id]
        self._write_obs(split.buffers, self.rollout, next_obs)
        # the versions that acted each unfinished episode here, before the slots leave
        acted = np.arange(self.rollout) >= self._ep_start[split.local, None]
        oldest = np.where(acted, self._versions_np[split.buffers], NO_VERSION).min(axis=1)
        self._ep_version[split.local] = np.minimum(self._ep_version[split.local], oldest)
        if split.policies:  # to the learner of the policy that acted each slot
            out.trajectories.extend(TrajectoriesReady(self.worker_id, bufs, self.generation, k)
                                    for k, bufs in by_policy(split.buffers, split.policies).items())
        else:
            out.trajectories.append(TrajectoriesReady(self.worker_id, tuple(split.buffers),
                                                      self.generation))
        self.backlog.handed_in(split, len(split.buffers))
        split.buffers = []
        split.pending_obs = next_obs
        split.trajectories_this_round += 1
        per_round = self.trajectories_per_round
        if per_round is not None and split.trajectories_this_round >= per_round:
            split.paused = True
            return
        self._begin_trajectories(split_id, out)

    def _write_obs(self, bufs: list[int], t: int, obs: list[dict]) -> None:  # obs[j] -> bufs[j]
        for key, arr in self._obs_np.items():
            for j, b in enumerate(bufs):
                arr[b, t] = obs[j][key]

    def _request(self, split_id: int) -> InferenceRequest:
        split = self.splits[split_id]
        split.request_epoch = self.epoch
        return InferenceRequest(self.worker_id, split_id, split.t, tuple(split.env_ids),
                                tuple(split.buffers), self.generation, self.epoch,
                                split.policies)

    def _new_episode(self, i: int, e: int, first_step: int, out: StepOutput,
                     seed: int | None = None, fault: Exception | None = None) -> dict:
        """Env ``i`` (global id ``e``) begins an episode at step ``first_step`` of its current
        trajectory: reset it (or, after ``fault``, replace it); return its first observation.
        A reset that fails replaces the env too (a finished episode stays valid)."""
        self._ep_return[i] = 0.0
        self._ep_len[i] = 0
        self._ep_start[i] = first_step
        self._ep_version[i] = NO_VERSION
        self._forget_acting(e)
        return self._reset_or_replace(i, out, seed, fault)

    def _forget_acting(self, e: int) -> None:
        """Env slot ``e`` begins an episode: its acting recurrent state and its held random
        action (``repeats_left``) start afresh."""
        self._policy_rnn_np[e] = 0.0
        if self._repeats_left_np is not None:
            self._repeats_left_np[e] = 0

    def _reset_or_replace(self, i: int, out: StepOutput, seed: int | None = None,
                          fault: Exception | None = None):
        """Env ``i``'s first observation (a multi-agent env's, one per agent): reset it, or
        replace it after ``fault`` or after a reset that fails."""
        if fault is None:
            try:
                return self._reset(i, seed)
            except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
                fault = exc
        return self._replace_env(i, fault, out)

    def _reset(self, i: int, seed: int | None = None) -> dict:  # env i's first obs, checked
        before = recycles(self.envs[i])
        try:
            obs = self._timer.call(self.envs[i].reset, seed=seed)[0]
        finally:  # (a recycle whose new env then fails to reset was still a recycle)
            self.env_recycles += max(0, recycles(self.envs[i]) - before)
        return self._check_obs(obs, "reset")

    def _replace_env(self, i: int, cause: Exception, out: StepOutput) -> dict:
        """Close env ``i`` after ``cause``, make a new one and reset it; return its first
        observation. Raises the fault itself without an env factory, bad output at once with
        ``env_check="strict"``, and :class:`EnvBroken` when the env faults too often or its
        replacement keeps failing."""
        env_id = self.worker_id * len(self.envs) + i
        self._count_fault(i, env_id, cause, out)
        for _ in range(ENV_RESTART_ATTEMPTS):
            try:
                self.envs[i].close()
            except Exception:  # noqa: BLE001 - the old env may be half dead
                pass
            out.env_restarts += 1
            try:
                self.activity(CREATING, i)
                self.envs[i] = self.env_factory()
                return self._reset(i)
            except Exception as exc:  # noqa: BLE001
                self._stop_if_strict(env_id, exc)
                cause = exc
        raise EnvBroken(f"env {env_id} failed {ENV_RESTART_ATTEMPTS} times in a row while being "
                        f"recreated; last error: {type(cause).__name__}: {cause}") from cause

    def _count_fault(self, i: int, env_id: int, cause: Exception, out: StepOutput) -> None:
        """Env ``i`` faulted: record it, or raise (see :meth:`_replace_env`)."""
        self._stop_if_strict(env_id, cause)
        if self.env_factory is None:
            raise cause
        fault = EnvFault(env_id, fault_kind(cause), describe(cause), type(cause).__name__)
        out.faults.append(fault)
        good, self._good_steps[i] = self._good_steps[i], 0
        count_in_row(self._faults_in_a_row, self._slots_of(i), good, fault, cause)  # or broken

    def _slots_of(self, i: int) -> range:  # env i's slots (in _faults_in_a_row)
        return range(i, i + 1)

    def _stop_if_strict(self, env_id: int, cause: Exception) -> None:
        if self.strict and isinstance(cause, EnvOutputError):
            raise EnvOutputError(f"env {env_id}: {cause} (--env_check strict stops at the first "
                                 "bad output; --env_check warn recreates the env and goes on)",
                                 cause.kind) from cause

    def _begin_trajectories(self, split_id: int, out: StepOutput) -> None:
        split = self.splits[split_id]
        n = len(split.env_ids)
        if self.backlog.holds_back(split):
            return
        if len(self.free) < n:
            split.waiting_for_buffers = True
            return
        split.waiting_for_buffers = False
        self.backlog.began(split, n)
        split.buffers = [self.free.popleft() for _ in range(n)]
        split.t = 0
        self._ep_start[split.local] = 0
        self._final_step_np[split.buffers] = -1
        self._tags.tag(split.buffers, split.env_ids)
        self._write_obs(split.buffers, 0, split.pending_obs)
        if self.num_policies > 1:  # the policies drawn at episode ends take over here
            before = self.assign.current[split.local]
            split.policies = self.assign.begin(split.local, split.env_ids, self._policy_rnn_np)
            # (versions are per policy: a new one's episode version counts its own steps)
            self._ep_version[np.asarray(split.local)[before != split.policies]] = NO_VERSION
        if self._has_rnn:
            self._rnn_np[split.buffers] = self._policy_rnn_np[split.env_ids]
        split.pending_obs = None
        out.requests.append(self._request(split_id))
