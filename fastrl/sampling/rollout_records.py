"""The rollout worker's records (``fastrl/sampling/rollout.py``): what one call on it
produces (:class:`StepOutput`), its splits (:class:`Split`), and each trajectory's id
(:func:`traj_id`, written by :class:`TrajectoryTags`), what ``--algo r2d2`` links sequences
by. Which policy fills each slot is ``fastrl/sampling/policy_assignment.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fastrl.sampling.env_faults import EnvFault
from fastrl.transport.messages import EpisodeStats, InferenceRequest, TrajectoriesReady


@dataclass
class StepOutput:
    """What one call on the worker produced, for its station to route."""

    requests: list[InferenceRequest] = field(default_factory=list)
    trajectories: list[TrajectoriesReady] = field(default_factory=list)
    episodes: list[EpisodeStats] = field(default_factory=list)
    env_restarts: int = 0  # envs closed and recreated after a fault
    steps_discarded: int = 0  # steps of the partial episodes those faults cut short
    faults: list[EnvFault] = field(default_factory=list)  # for the log and the counts


@dataclass
class Split:
    env_ids: list[int]  # global env ids
    local: list[int]  # indices into the worker's env list
    buffers: list[int] = field(default_factory=list)
    t: int = 0
    waiting_for_buffers: bool = False
    paused: bool = False  # sync mode: round finished, waiting for new weights
    held: bool = False  # async mode: too many trajectories wait for the learner (backlog.py)
    reserved: bool = False  # its trajectories were begun after a hold (backlog.py)
    trajectories_this_round: int = 0
    pending_obs: list | None = None  # first observations of the next trajectory
    request_epoch: int = -1  # epoch of the request in flight; -1: none in flight
    # The policy acting for each slot of the current trajectories (--num_policies > 1);
    # empty with one policy: policy 0 acts for every slot.
    policies: tuple[int, ...] = ()


# A trajectory id: env slot, the rollout worker's generation and the trajectory's number in
# that env slot's run, packed in one int64 (``traj_id``); -1 in a slot never tagged. On the
# learner node of a run with sampler nodes, the node's number plus one goes above them
# (``from_node``): env slots below 2**14 per node, nodes 0 to 126.
_COUNT_BITS = 32
_GEN_BITS = 10
_ENV_BITS = 14
_NODE_SHIFT = _COUNT_BITS + _GEN_BITS + _ENV_BITS


def traj_id(env: np.ndarray, generation: int, count: np.ndarray) -> np.ndarray:
    """The ids of trajectories number ``count`` of env slots ``env`` (a rollout worker of
    ``generation``): consecutive trajectories of one env slot in one worker's life have
    consecutive ids, so that a replay store finds a trajectory's predecessor (the id one
    less: ``fastrl.algo.replay.sequence_store``)."""
    env = np.asarray(env, dtype=np.int64)
    head = (env << _GEN_BITS) | (int(generation) & ((1 << _GEN_BITS) - 1))
    return (head << _COUNT_BITS) | (np.asarray(count, dtype=np.int64) & ((1 << _COUNT_BITS) - 1))


def from_node(ids: np.ndarray, node: int) -> np.ndarray:
    """Trajectory ids that sampler node ``node`` tagged, told apart from every other node's
    (the same env slot number on two nodes is two env slots); untagged ids (-1) stay."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.where(ids >= 0, ids | (np.int64(node + 1) << _NODE_SHIFT), ids)


class TrajectoryTags:
    """Writes each new trajectory's :func:`traj_id` into its slot (``TrajectoryBuffers
    .traj_ids``, a numpy view): what ``--algo r2d2`` links sequences by."""

    def __init__(self, traj_ids: np.ndarray, generation: int):
        self.traj_ids = traj_ids
        self.generation = generation
        self.counts: dict[int, int] = {}  # global env id -> trajectories begun

    def tag(self, buffers: list[int], env_ids: list[int]) -> None:
        counts = [self.counts.get(e, 0) for e in env_ids]
        self.traj_ids[buffers] = traj_id(np.asarray(env_ids), self.generation, np.asarray(counts))
        for e, c in zip(env_ids, counts, strict=True):
            self.counts[e] = c + 1
