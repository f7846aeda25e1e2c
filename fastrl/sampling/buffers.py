"""Preallocated trajectory buffers: the data path between rollout, inference and learning.

One slot holds one env's trajectory of ``rollout`` steps (``T``), batch-major, plus the
observation after the last step (``t = T``) so that the learner can bootstrap from the
critic at that observation. In the parallel runner the tensors live in shared memory,
allocated once before any process starts; only slot indices travel on queues.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces

from fastrl.policy.actions import ActionSpec
from fastrl.policy.spaces import storage
from fastrl.sampling.staging import Staging

# Values no env or policy can produce, written into fresh buffers so that a read of data
# that was never written shows up in tests instead of passing silently.
FILL_FLOAT = -42.42
FILL_INT = -42
# The policy version written over the steps of an episode cut short by an env fault: any
# negative version marks a sample the learner must leave out.
INVALID_VERSION = -1


def _fill_value(dtype: torch.dtype) -> float | int:
    return FILL_FLOAT if dtype.is_floating_point else (255 if dtype == torch.uint8 else FILL_INT)


def _torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(1, dtype=np_dtype)).dtype


@dataclass(frozen=True)
class BufferLayout:
    """Everything needed to allocate the buffers again in another process."""

    obs_shapes: dict[str, tuple[int, ...]]
    obs_dtypes: dict[str, torch.dtype]
    num_buffers: int
    rollout: int
    action_dims: int
    rnn_size: int
    # int64 choice indices, or float32 when the action space has continuous parts
    # (fastrl.policy.actions.ActionSpec).
    action_dtype: torch.dtype = torch.int64
    # The env's reward-shaping terms kept per step apart from the reward, for a learner that
    # weighs them itself (--with_pbt: fastrl/algo/pbt/reward_weights.py); 0 keeps none.
    reward_terms: int = 0

    @classmethod
    def from_spaces(cls, obs_space: spaces.Dict, action_space: spaces.Space, num_buffers: int,
                    rollout: int, rnn_size: int, reward_terms: int = 0) -> BufferLayout:
        # Compact: integers stay integers (the one-hots are made by the encoders), in the
        # smallest dtype that holds their range (fastrl.policy.spaces.storage).
        shapes, dtypes = {}, {}
        for key, sub in obs_space.spaces.items():
            try:
                shapes[key], np_dtype = storage(sub)
            except ValueError as exc:
                raise ValueError(f"observation {key!r}: {exc}") from None
            dtypes[key] = _torch_dtype(np_dtype)
        spec = ActionSpec(action_space)
        return cls(shapes, dtypes, num_buffers, rollout, spec.action_dims, rnn_size, spec.dtype,
                   reward_terms)

    def nbytes(self) -> int:
        n, t = self.num_buffers, self.rollout
        total = 0
        for key, shape in self.obs_shapes.items():
            size = torch.empty((), dtype=self.obs_dtypes[key]).element_size()
            total += n * (t + 2) * int(np.prod(shape)) * size  # T + 1 steps and a final obs
        action_size = torch.empty((), dtype=self.action_dtype).element_size()
        total += n * t * (action_size * self.action_dims + 4 + 4 + 4 + 1 + 8
                          + 4 * self.reward_terms)
        total += n * (self.rnn_size * 4 + 8 + 8)
        return total


class TrajectoryBuffers:
    """Tensors ``[num_buffers, rollout (+1), ...]``; see docs/internals.md for the table.

    ``shared=True`` moves them to shared memory so that spawned processes that receive this
    object (it pickles by handle, not by value) see the same storage.
    """

    def __init__(self, layout: BufferLayout, shared: bool = False):
        self.layout = layout
        n, t = layout.num_buffers, layout.rollout
        self.obs: dict[str, torch.Tensor] = {}
        for key, shape in layout.obs_shapes.items():
            dtype = layout.obs_dtypes[key]
            self.obs[key] = torch.full((n, t + 1, *shape), _fill_value(dtype), dtype=dtype)
        self.actions = torch.full((n, t, layout.action_dims),
                                  _fill_value(layout.action_dtype), dtype=layout.action_dtype)
        self.log_probs = torch.full((n, t), FILL_FLOAT, dtype=torch.float32)
        self.values = torch.full((n, t), FILL_FLOAT, dtype=torch.float32)
        self.rewards = torch.full((n, t), FILL_FLOAT, dtype=torch.float32)
        # Each step's reward-shaping terms, already in ``rewards`` (``BufferLayout``).
        self.reward_terms = (torch.zeros((n, t, layout.reward_terms), dtype=torch.float32)
                             if layout.reward_terms else None)
        self.dones = torch.ones((n, t), dtype=torch.bool)
        self.policy_versions = torch.full((n, t), FILL_INT, dtype=torch.int64)
        self.rnn_states = torch.full((n, layout.rnn_size), FILL_FLOAT, dtype=torch.float32)
        # The last observation of an episode cut by a time limit inside the trajectory (the
        # reset observation takes its place in ``obs``), for the learner to bootstrap from;
        # ``final_step`` is the step it follows, -1 for none. One per slot: a second time
        # limit in the same trajectory is treated as a termination (see RolloutWorker).
        self.final_obs = {key: torch.full_like(obs[:, 0], _fill_value(obs.dtype))
                          for key, obs in self.obs.items()}
        self.final_step = torch.full((n,), -1, dtype=torch.int64)
        # Each trajectory's id (fastrl.sampling.rollout_records.traj_id): its env slot and its
        # number in that slot's run, for --algo r2d2 to find a trajectory's predecessor.
        # Read by the replay station itself, not gathered.
        self.traj_ids = torch.full((n,), -1, dtype=torch.int64)
        if shared:
            for tensor in self.tensors():
                tensor.share_memory_()

    def tensors(self) -> list[torch.Tensor]:
        terms = [] if self.reward_terms is None else [self.reward_terms]
        return [*self.obs.values(), self.actions, self.log_probs, self.values, self.rewards,
                self.dones, self.policy_versions, self.rnn_states, *self.final_obs.values(),
                self.final_step, self.traj_ids, *terms]

    def gather(self, indices: list[int] | torch.Tensor, staging: Staging | None = None) -> dict:
        """Copy the trajectories at ``indices`` out of the buffers (one indexed read per key).

        Returns a dict with ``obs`` (dict of ``[B, T+1, ...]``) and ``[B, T]`` tensors,
        ``rnn_states`` ``[B, H]``, ``final_obs`` (dict of ``[B, ...]``) and ``final_step``
        ``[B]``. Without ``staging`` they are new CPU tensors; with one, they are on its
        device, in its kept buffers (valid for its ``depth`` calls: see
        :class:`fastrl.sampling.staging.Staging`). ``host`` holds ``dones`` and
        ``final_step`` again, as numpy arrays on the host (views of the rows gathered there),
        for what the learner decides on the host without reading the device.
        """
        idx = torch.as_tensor(indices, dtype=torch.int64)
        flat = {f"obs/{k}": v for k, v in self.obs.items()}
        flat.update(actions=self.actions, log_probs=self.log_probs, values=self.values,
                    rewards=self.rewards, dones=self.dones,
                    policy_versions=self.policy_versions, rnn_states=self.rnn_states,
                    final_step=self.final_step)
        flat.update({f"final_obs/{k}": v for k, v in self.final_obs.items()})
        if self.reward_terms is not None:
            flat["reward_terms"] = self.reward_terms
        if staging is None:
            out = host = {key: v.index_select(0, idx) for key, v in flat.items()}
        else:
            out = staging.take({key: (v, idx) for key, v in flat.items()})
            host = staging.host_rows()
        batch: dict = {"obs": {}, "final_obs": {},
                       "host": {key: host[key].numpy() for key in ("dones", "final_step")}}
        for key, value in out.items():
            group, _, name = key.partition("/")
            if name:
                batch[group][name] = value
            else:
                batch[key] = value
        return batch
