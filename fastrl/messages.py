"""The small messages that travel between components (tensors stay in the buffers)."""

from __future__ import annotations

from typing import NamedTuple


class InferenceRequest(NamedTuple):
    """Rollout worker -> policy worker: observations of one split are ready.

    The observation of env ``env_ids[i]`` is in buffer slot ``buffers[i]`` at step ``t``; the
    policy writes the action (and log-prob, value, version) to the same place.
    """

    worker_id: int
    split_id: int
    t: int
    env_ids: tuple[int, ...]
    buffers: tuple[int, ...]


class ActionsReady(NamedTuple):
    """Policy worker -> rollout worker ``worker_id``: split ``split_id`` may step."""

    worker_id: int
    split_id: int


class TrajectoriesReady(NamedTuple):
    """Rollout worker -> learner: these buffer slots hold complete trajectories."""

    worker_id: int
    buffers: tuple[int, ...]


class EpisodeStats(NamedTuple):
    """One finished episode: the env's native return and its length in agent steps."""

    env_id: int
    episode_return: float
    length: int
