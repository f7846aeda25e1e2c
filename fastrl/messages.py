"""The small messages that travel between components (tensors stay in the buffers)."""

from __future__ import annotations

from typing import NamedTuple


class InferenceRequest(NamedTuple):
    """Rollout worker -> policy worker: observations of one split are ready.

    The observation of env ``env_ids[i]`` is in buffer slot ``buffers[i]`` at step ``t``; the
    policy writes the action (and log-prob, value, version) to the same place.

    ``generation`` counts restarts of the rollout worker and ``epoch`` restarts of any policy
    worker; a policy worker drops a request whose numbers are out of date (see
    ``fastrl/runner/parallel.py``: that is how a restarted worker's stale requests are fenced).
    """

    worker_id: int
    split_id: int
    t: int
    env_ids: tuple[int, ...]
    buffers: tuple[int, ...]
    generation: int = 0
    epoch: int = 0


class ActionsReady(NamedTuple):
    """Policy worker -> rollout worker ``worker_id``: split ``split_id`` may step.

    The other fields echo the request, so that the worker can ignore a stale answer.
    """

    worker_id: int
    split_id: int
    t: int = 0
    generation: int = 0
    epoch: int = 0


class TrajectoriesReady(NamedTuple):
    """Rollout worker -> learner: these buffer slots hold complete trajectories."""

    worker_id: int
    buffers: tuple[int, ...]
    generation: int = 0


class EpisodeStats(NamedTuple):
    """One finished episode: the env's native return, its length in agent steps, and whether
    a time limit cut it (``truncated``) rather than the env ending it."""

    env_id: int
    episode_return: float
    length: int
    truncated: bool
