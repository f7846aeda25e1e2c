"""The rollout worker core: steps envs and writes what they return into trajectory buffers.

The worker's envs are split into ``worker_num_splits`` groups. A group steps only after the
policy has written its actions; while one group waits for inference the other steps
(double-buffered sampling). The class does no I/O of its own: each method returns the
messages it produced, and the shell that drives it (serial runner or worker process)
routes them. This keeps the logic testable in-process.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from fastrl.policy.actions import ActionSpec
from fastrl.policy.obs import obs_to_dict, random_legal_action
from fastrl.sampling.buffers import INVALID_VERSION, TrajectoryBuffers
from fastrl.transport.messages import (
    ActionsReady,
    EpisodeStats,
    InferenceRequest,
    TrajectoriesReady,
)

# An env that fails this many times in a row while being recreated is beyond repair: the
# worker stops with the cause (and the runner decides whether to restart the worker).
ENV_RESTART_ATTEMPTS = 3


class EnvTimeout(Exception):
    """An env call ran past ``env_timeout`` seconds."""


class EnvBroken(RuntimeError):
    """An env kept failing while it was being recreated."""


@dataclass
class StepOutput:
    """What one call on the worker produced, for its station to route."""

    requests: list[InferenceRequest] = field(default_factory=list)
    trajectories: list[TrajectoriesReady] = field(default_factory=list)
    episodes: list[EpisodeStats] = field(default_factory=list)
    env_restarts: int = 0  # envs closed and recreated after a fault
    steps_discarded: int = 0  # steps of the partial episodes those faults cut short
    faults: list[str] = field(default_factory=list)  # one line per env fault, for the log


@dataclass
class _Split:
    env_ids: list[int]  # global env ids
    local: list[int]  # indices into the worker's env list
    buffers: list[int] = field(default_factory=list)
    t: int = 0
    waiting_for_buffers: bool = False
    paused: bool = False  # sync mode: round finished, waiting for new weights
    trajectories_this_round: int = 0
    pending_obs: list | None = None  # first observations of the next trajectory
    request_epoch: int = -1  # epoch of the request in flight; -1: none in flight


class RolloutWorker:
    """Owns ``len(envs)`` envs (global ids ``worker_id * len(envs) + i``) and buffer slots.

    Args:
        worker_id: index of this worker.
        envs: the worker's envs, created by the caller.
        buffers: the shared trajectory buffers.
        rnn_state: ``[num_envs_total, H]`` current recurrent state of every env; the policy
            writes it after each step, this worker zeroes it when an episode ends.
        free_buffers: slot indices this worker may fill at the start.
        num_splits: groups to split the envs into.
        reward_scale, reward_clip: applied to the training reward (the returned episode
            return stays native).
        trajectories_per_round: sync mode (``async_rl=False``): each split pauses after
            this many trajectories per env until :meth:`resume` is called; ``None`` = async.
        seed: base seed; env ``e`` is reset with ``seed + e`` on its first reset.
        env_factory: makes a replacement env. With it, an env that raises in ``step`` or
            ``reset`` (or, with ``env_timeout``, runs too long) is closed and recreated: the
            steps of its unfinished episode in the current trajectory are marked invalid
            (the learner leaves them out), the episode is not reported, and the fault is
            counted. Without it, the env's exception propagates.
        env_timeout: seconds one env call may take (0 = no limit). Enforced with SIGALRM,
            so only in the main thread, and only for envs that return to Python (a call
            stuck in C code is caught by the runner's heartbeat check instead).
        generation, epoch: stamped on every request (see ``InferenceRequest``).
        decorrelate: at :meth:`start`, env ``e`` (global id) first takes ``e * rollout``
            random actions (episodes that end meanwhile are reset and not reported), so that
            envs with fixed-length episodes do not end and reset in lock-step.
        action_bounds: how continuous actions are bounded for the env
            (``fastrl.policy.actions.ActionSpec``).

    A time limit (``truncated`` without ``terminated``) ends the episode for the learner like
    a termination (``dones``), but the episode's last observation is kept in the slot's
    ``final_obs`` with ``final_step = t`` so that the learner can bootstrap from its value.
    A slot keeps one: a second time limit within the same trajectory (only when the limit is
    shorter than the rollout) is left as a plain end of episode and counted in
    ``truncations_not_bootstrapped``.
    """

    def __init__(self, worker_id: int, envs: list[gym.Env], buffers: TrajectoryBuffers,
                 rnn_state: torch.Tensor, free_buffers: list[int], num_splits: int,
                 reward_scale: float = 1.0, reward_clip: float = 1000.0,
                 trajectories_per_round: int | None = None, seed: int | None = None,
                 env_factory: Callable[[], gym.Env] | None = None, env_timeout: float = 0.0,
                 generation: int = 0, epoch: int = 0, decorrelate: bool = False,
                 action_bounds: str = "clip"):
        if len(envs) % num_splits:
            raise ValueError(f"{len(envs)} envs cannot be split into {num_splits} equal groups")
        self.worker_id = worker_id
        self.envs = envs
        self.buffers = buffers
        self.rollout = buffers.layout.rollout
        self.reward_scale = reward_scale
        self.reward_clip = reward_clip
        self.trajectories_per_round = trajectories_per_round
        self.seed = seed
        self.env_factory = env_factory
        self.generation = generation
        self.epoch = epoch
        self.decorrelate = decorrelate
        self.truncations_not_bootstrapped = 0
        self.free: deque[int] = deque(free_buffers)
        self._timer = _CallTimer(env_timeout)
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
        self._has_rnn = buffers.layout.rnn_size > 0
        first = worker_id * len(envs)
        per_split = len(envs) // num_splits
        self.splits = [
            _Split(env_ids=[first + i for i in range(s * per_split, (s + 1) * per_split)],
                   local=list(range(s * per_split, (s + 1) * per_split)))
            for s in range(num_splits)
        ]
        action_space = envs[0].action_space
        self._to_env = ActionSpec(action_space, action_bounds).to_env
        # The common case without a call: a Discrete action is its index.
        self._discrete = isinstance(action_space, spaces.Discrete) and action_space.start == 0
        self._ep_return = np.zeros(len(envs), dtype=np.float64)
        self._ep_len = np.zeros(len(envs), dtype=np.int64)
        # the step where each env's episode began in its current trajectory
        self._ep_start = np.zeros(len(envs), dtype=np.int64)
        self._versions_np = buffers.policy_versions.numpy()

    # -- public API ---------------------------------------------------------------------

    def start(self) -> StepOutput:
        """Reset every env, write the first observations; return a request per split."""
        out = StepOutput()
        for s, split in enumerate(self.splits):
            first_obs = []
            for i, e in zip(split.local, split.env_ids):
                seed = None if self.seed is None else self.seed + e
                obs = self._new_episode(i, e, 0, out, seed=seed)
                if self.decorrelate:
                    obs = self._random_steps(i, e * self.rollout, obs, seed, out)
                first_obs.append(obs_to_dict(obs))
            split.pending_obs = first_obs
            self._begin_trajectories(s, out)
        return out

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
        t = split.t
        bufs = split.buffers
        actions = self._actions_np[bufs, t]  # one indexed read: [n, D]
        next_obs = []
        for j, (i, e) in enumerate(zip(split.local, split.env_ids)):
            action = int(actions[j, 0]) if self._discrete else self._to_env(actions[j])
            b = bufs[j]
            try:
                step = self.envs[i].step
                obs, reward, terminated, truncated, info = self._timer.call(step, action)
            except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
                # The episode is cut short: its steps in this trajectory are left out of
                # training, and the next step starts a new episode in a new env.
                start = int(self._ep_start[i])
                self._versions_np[b, start:t + 1] = INVALID_VERSION
                self._rewards_np[b, t] = 0.0
                self._dones_np[b, t] = True
                out.steps_discarded += t + 1 - start
                next_obs.append(obs_to_dict(self._new_episode(i, e, t + 1, out, fault=exc)))
                continue
            done = terminated or truncated
            r = float(reward)
            clip = self.reward_clip
            self._rewards_np[b, t] = max(-clip, min(clip, r * self.reward_scale))
            self._dones_np[b, t] = done
            self._ep_return[i] += r
            self._ep_len[i] += 1
            if done:
                time_limit = bool(truncated and not terminated)
                if time_limit:
                    self._keep_final_obs(b, t, obs_to_dict(obs))
                episode = info.get("episode")
                if episode is not None:
                    ret, length = float(episode["r"]), int(episode["l"])
                else:
                    ret, length = float(self._ep_return[i]), int(self._ep_len[i])
                metrics = info.get("episode_metrics")
                out.episodes.append(EpisodeStats(e, ret, length, time_limit,
                                                 dict(metrics) if isinstance(metrics, dict)
                                                 else None))
                obs = self._new_episode(i, e, t + 1, out)
            next_obs.append(obs_to_dict(obs))
        split.t = t + 1
        if split.t < self.rollout:
            for key, arr in self._obs_np.items():
                for j, b in enumerate(bufs):
                    arr[b, split.t] = next_obs[j][key]
            out.requests.append(self._request(split_id))
            return out
        # Trajectories complete: the observation after the last step is the bootstrap
        # observation of these slots and the first observation of the next ones.
        for key, arr in self._obs_np.items():
            for j, b in enumerate(bufs):
                arr[b, self.rollout] = next_obs[j][key]
        out.trajectories.append(TrajectoriesReady(self.worker_id, tuple(bufs), self.generation))
        split.buffers = []
        split.pending_obs = next_obs
        split.trajectories_this_round += 1
        per_round = self.trajectories_per_round
        if per_round is not None and split.trajectories_this_round >= per_round:
            split.paused = True
            return out
        self._begin_trajectories(split_id, out)
        return out

    def add_free_buffers(self, indices) -> StepOutput:
        """Slots came back from the learner; splits that waited for them start again."""
        self.free.extend(indices)
        out = StepOutput()
        for s, split in enumerate(self.splits):
            if split.waiting_for_buffers and not split.paused:
                self._begin_trajectories(s, out)
        return out

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

    def _keep_final_obs(self, b: int, t: int, obs: dict) -> None:
        """Slot ``b``'s episode hit a time limit at step ``t``: keep its last observation."""
        if self._final_step_np[b] >= 0:
            self.truncations_not_bootstrapped += 1
            return
        for key, arr in self._final_obs_np.items():
            arr[b] = obs[key]
        self._final_step_np[b] = t

    def _random_steps(self, i: int, steps: int, obs, seed: int | None, out: StepOutput):
        """Env ``i`` takes ``steps`` random actions (resetting when an episode ends); return
        the observation it is left at. Nothing is recorded or reported; an env fault ends
        the random steps with a new env, as in training."""
        env = self.envs[i]
        if seed is not None:
            env.action_space.seed(seed)
        try:
            for _ in range(steps):
                action = random_legal_action(env.action_space, obs)
                obs, _, terminated, truncated, _ = self._timer.call(env.step, action)
                if terminated or truncated:
                    obs = self._timer.call(env.reset)[0]
        except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
            return self._replace_env(i, exc, out)
        return obs

    def _request(self, split_id: int) -> InferenceRequest:
        split = self.splits[split_id]
        split.request_epoch = self.epoch
        return InferenceRequest(self.worker_id, split_id, split.t, tuple(split.env_ids),
                                tuple(split.buffers), self.generation, self.epoch)

    def _new_episode(self, i: int, e: int, first_step: int, out: StepOutput,
                     seed: int | None = None, fault: Exception | None = None):
        """Env ``i`` (global id ``e``) begins an episode at step ``first_step`` of its current
        trajectory: reset it (or, after ``fault``, replace it); return its first observation.
        A reset that fails replaces the env too (a finished episode stays valid)."""
        self._ep_return[i] = 0.0
        self._ep_len[i] = 0
        self._ep_start[i] = first_step
        self._policy_rnn_np[e] = 0.0
        if fault is None:
            try:
                return self._timer.call(self.envs[i].reset, seed=seed)[0]
            except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
                fault = exc
        return self._replace_env(i, fault, out)

    def _replace_env(self, i: int, cause: Exception, out: StepOutput):
        """Close env ``i`` after ``cause``, make a new one and reset it; return its first
        observation. Raises the fault itself without an env factory, and :class:`EnvBroken`
        when the replacement keeps failing."""
        if self.env_factory is None:
            raise cause
        env_id = self.worker_id * len(self.envs) + i
        out.faults.append(f"env {env_id}: {type(cause).__name__}: {cause}; recreating it")
        for _ in range(ENV_RESTART_ATTEMPTS):
            try:
                self.envs[i].close()
            except Exception:  # noqa: BLE001 - the old env may be half dead
                pass
            out.env_restarts += 1
            try:
                self.envs[i] = self.env_factory()
                return self._timer.call(self.envs[i].reset)[0]
            except Exception as exc:  # noqa: BLE001
                cause = exc
        raise EnvBroken(f"env {env_id} failed {ENV_RESTART_ATTEMPTS} times in a row while being "
                        f"recreated; last error: {type(cause).__name__}: {cause}") from cause

    def _begin_trajectories(self, split_id: int, out: StepOutput) -> None:
        split = self.splits[split_id]
        n = len(split.env_ids)
        if len(self.free) < n:
            split.waiting_for_buffers = True
            return
        split.waiting_for_buffers = False
        split.buffers = [self.free.popleft() for _ in range(n)]
        split.t = 0
        self._ep_start[split.local] = 0
        self._final_step_np[split.buffers] = -1
        for key, arr in self._obs_np.items():
            for j, b in enumerate(split.buffers):
                arr[b, 0] = split.pending_obs[j][key]
        if self._has_rnn:
            self._rnn_np[split.buffers] = self._policy_rnn_np[split.env_ids]
        split.pending_obs = None
        out.requests.append(self._request(split_id))


class _CallTimer:
    """Runs a call with a SIGALRM deadline of ``seconds`` (0: no deadline, or not in the
    main thread, where signals cannot be used)."""

    def __init__(self, seconds: float):
        in_main = threading.current_thread() is threading.main_thread()
        self.seconds = seconds if seconds > 0 and in_main else 0.0
        self._armed = False
        if self.seconds:
            signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum, frame) -> None:
        if self._armed:  # a late alarm after the call returned is ignored
            self._armed = False
            raise EnvTimeout(f"env call took longer than {self.seconds:g} s")

    def call(self, fn, *args, **kwargs):
        if not self.seconds:
            return fn(*args, **kwargs)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
