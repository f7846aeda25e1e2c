"""The rollout worker core: steps envs and writes what they return into trajectory buffers.

The worker's envs are split into ``worker_num_splits`` groups. A group steps only after the
policy has written its actions; while one group waits for inference the other steps
(double-buffered sampling). The class does no I/O of its own: each method returns the
messages it produced, and the shell that drives it (serial runner or worker process)
routes them. This keeps the logic testable in-process.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from fastrl.buffers import TrajectoryBuffers
from fastrl.messages import EpisodeStats, InferenceRequest, TrajectoriesReady


@dataclass
class StepOutput:
    """What one call on the worker produced, for the shell to route."""

    requests: list[InferenceRequest] = field(default_factory=list)
    trajectories: list[TrajectoriesReady] = field(default_factory=list)
    episodes: list[EpisodeStats] = field(default_factory=list)
    agent_steps: int = 0

    def extend(self, other: StepOutput) -> None:
        self.requests += other.requests
        self.trajectories += other.trajectories
        self.episodes += other.episodes
        self.agent_steps += other.agent_steps


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


def dict_obs(obs) -> dict:
    return obs if isinstance(obs, dict) else {"obs": obs}


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
    """

    def __init__(self, worker_id: int, envs: list[gym.Env], buffers: TrajectoryBuffers,
                 rnn_state: torch.Tensor, free_buffers: list[int], num_splits: int,
                 reward_scale: float = 1.0, reward_clip: float = 1000.0,
                 trajectories_per_round: int | None = None, seed: int | None = None):
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
        self.free: deque[int] = deque(free_buffers)
        # numpy views share memory with the (possibly shared) tensors; numpy's small
        # indexed writes cost far less than torch's per-call overhead on this hot path.
        self._obs_np = {k: v.numpy() for k, v in buffers.obs.items()}
        self._actions_np = buffers.actions.numpy()
        self._rewards_np = buffers.rewards.numpy()
        self._dones_np = buffers.dones.numpy()
        self._rnn_np = buffers.rnn_states.numpy()
        self._policy_rnn_np = rnn_state.numpy()
        self._has_rnn = buffers.layout.rnn_size > 0
        first = worker_id * len(envs)
        per_split = len(envs) // num_splits
        self.splits = [
            _Split(env_ids=[first + i for i in range(s * per_split, (s + 1) * per_split)],
                   local=list(range(s * per_split, (s + 1) * per_split)))
            for s in range(num_splits)
        ]
        action_space = envs[0].action_space
        self._discrete = isinstance(action_space, spaces.Discrete)
        self._ep_return = np.zeros(len(envs), dtype=np.float64)
        self._ep_len = np.zeros(len(envs), dtype=np.int64)

    # -- public API ---------------------------------------------------------------------

    def start(self) -> StepOutput:
        """Reset every env, write the first observations; return a request per split."""
        out = StepOutput()
        for s, split in enumerate(self.splits):
            first_obs = []
            for i, e in zip(split.local, split.env_ids):
                seed = None if self.seed is None else self.seed + e
                obs, _ = self.envs[i].reset(seed=seed)
                self._policy_rnn_np[e] = 0.0
                first_obs.append(dict_obs(obs))
            split.pending_obs = first_obs
            self._begin_trajectories(s, out)
        return out

    def on_actions(self, split_id: int) -> StepOutput:
        """The policy wrote actions for ``split_id``: step its envs once."""
        out = StepOutput()
        split = self.splits[split_id]
        t = split.t
        bufs = split.buffers
        actions = self._actions_np[bufs, t]  # one indexed read: [n, D]
        next_obs = []
        for j, (i, e) in enumerate(zip(split.local, split.env_ids)):
            action = int(actions[j, 0]) if self._discrete else actions[j]
            obs, reward, terminated, truncated, info = self.envs[i].step(action)
            done = terminated or truncated
            b = bufs[j]
            r = float(reward)
            self._rewards_np[b, t] = max(-self.reward_clip, min(self.reward_clip, r * self.reward_scale))
            self._dones_np[b, t] = done
            self._ep_return[i] += r
            self._ep_len[i] += 1
            if done:
                episode = info.get("episode")
                if episode is not None:
                    ret, length = float(episode["r"]), int(episode["l"])
                else:
                    ret, length = float(self._ep_return[i]), int(self._ep_len[i])
                out.episodes.append(EpisodeStats(e, ret, length))
                self._ep_return[i] = 0.0
                self._ep_len[i] = 0
                obs, _ = self.envs[i].reset()
                self._policy_rnn_np[e] = 0.0
            next_obs.append(dict_obs(obs))
        out.agent_steps = len(bufs)
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
        out.trajectories.append(TrajectoriesReady(self.worker_id, tuple(bufs)))
        split.buffers = []
        split.pending_obs = next_obs
        split.trajectories_this_round += 1
        if self.trajectories_per_round is not None and split.trajectories_this_round >= self.trajectories_per_round:
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

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing must go on for the other envs
                pass

    # -- internals ----------------------------------------------------------------------

    def _request(self, split_id: int) -> InferenceRequest:
        split = self.splits[split_id]
        return InferenceRequest(self.worker_id, split_id, split.t, tuple(split.env_ids), tuple(split.buffers))

    def _begin_trajectories(self, split_id: int, out: StepOutput) -> None:
        split = self.splits[split_id]
        n = len(split.env_ids)
        if len(self.free) < n:
            split.waiting_for_buffers = True
            return
        split.waiting_for_buffers = False
        split.buffers = [self.free.popleft() for _ in range(n)]
        split.t = 0
        for key, arr in self._obs_np.items():
            for j, b in enumerate(split.buffers):
                arr[b, 0] = split.pending_obs[j][key]
        if self._has_rnn:
            self._rnn_np[split.buffers] = self._policy_rnn_np[split.env_ids]
        split.pending_obs = None
        out.requests.append(self._request(split_id))
