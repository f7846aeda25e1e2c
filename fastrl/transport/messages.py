"""Every message that travels between the components (tensors stay in the buffers).

The same messages flow in serial and in parallel mode; ``fastrl/runner/wiring.py`` says who
sends which to whom. Stamps that fence off a restarted worker's stale data (``generation``:
restarts of one rollout worker; ``epoch``: restarts of any policy worker) have no default
value: a message built without them fails at once instead of being silently accepted.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# --- the data path ------------------------------------------------------------------------


class InferenceRequest(NamedTuple):
    """Rollout worker -> policy worker: observations of one split are ready.

    The observation of env ``env_ids[i]`` is in buffer slot ``buffers[i]`` at step ``t``; the
    policy writes the action (and log-prob, value, version) to the same place. A policy
    worker drops a request whose ``generation`` or ``epoch`` is out of date.
    ``policies[i]`` (``--num_policies`` > 1) is the policy that acts for ``env_ids[i]``;
    empty: policy 0 acts for all.
    """

    worker_id: int
    split_id: int
    t: int
    env_ids: tuple[int, ...]
    buffers: tuple[int, ...]
    generation: int
    epoch: int
    policies: tuple[int, ...] = ()


class ActionsReady(NamedTuple):
    """Policy worker -> rollout worker ``worker_id``: split ``split_id`` may step.

    The other fields echo the request, so that the worker can ignore a stale answer.
    """

    worker_id: int
    split_id: int
    t: int
    generation: int
    epoch: int


class TrajectoriesReady(NamedTuple):
    """Rollout worker -> learner of ``policy``: these buffer slots hold complete
    trajectories, every step acted by ``policy``."""

    worker_id: int
    buffers: tuple[int, ...]
    generation: int
    policy: int = 0


class BuffersFreed(NamedTuple):
    """Learner -> rollout worker: these slots are copied out and may be filled again."""

    buffers: tuple[int, ...]
    generation: int  # of the rollout worker the slots belong to


class ReportNow(NamedTuple):
    """Runner -> rollout worker, once the budget is spent: send the episodes you hold now (a
    ``RolloutReport`` with ``final`` set, even an empty one), without waiting for the report
    period, so that the summary and the final checkpoint count them."""


class Resume(NamedTuple):
    """Learner -> rollout worker, sync mode: new weights are published; start the next round."""

    version: int
    generation: int


class EpisodeStats(NamedTuple):
    """One finished episode: the env's native return, its length in agent steps, whether
    a time limit cut it (``truncated``) rather than the env ending it, and the env's own
    figures about it (``info["episode_metrics"]``: frags, deaths... by name), if any; the
    policy that acted its last step, and the oldest version of that policy's weights that
    acted any of its steps (steps another policy acted before this one took over are not
    counted): population-based training ranks a policy's new weights only on episodes they
    acted whole."""

    env_id: int
    episode_return: float
    length: int
    truncated: bool
    metrics: dict[str, float] | None = None
    policy: int = 0
    version: int = 0


# --- supervision -----------------------------------------------------------------------------


class Fence(NamedTuple):
    """Runner -> learner: rollout worker ``worker_id`` died; its next incarnation is
    ``generation``. Drop its untrained trajectories; its slots are free again."""

    worker_id: int
    generation: int


class Fenced(NamedTuple):
    """Learner of ``policy`` -> runner: done; ``trajectories`` untrained trajectories
    were dropped."""

    worker_id: int
    generation: int
    trajectories: int
    policy: int = 0


class Reissue(NamedTuple):
    """Runner -> rollout workers: a policy worker was restarted; requests older than
    ``epoch`` are dropped, so ask again for every split still waiting for actions."""

    epoch: int


class ChildFailed(NamedTuple):
    """Any child -> runner, just before it exits: its exception and traceback."""

    name: str
    error: str
    traceback: str


# --- checkpoints -----------------------------------------------------------------------------


class LearnerReady(NamedTuple):
    """Learner -> runner: the checkpoint (if any) is restored and the weights published;
    ``device`` and ``precision`` are what the learner resolved ``--device`` and
    ``--precision`` to (the runner, which must not touch CUDA, reports them)."""

    counters: dict | None
    checkpoint: str | None
    version: int
    device: str
    precision: str
    policy: int = 0  # whose learner (--num_policies)
    hyperparams: dict | None = None  # the learner's own (--with_pbt: saved with its checkpoint)


class TrainShare(NamedTuple):
    """Learner rank 0 -> learner rank r (``--num_learners``): train on these trajectory slots,
    rank r's share of the batch rank 0 is training on."""

    slots: list[int]
    run_frames: int  # the run's trained env frames: --lr_schedule's clock, rank 0's reading


class ReplayShare(NamedTuple):
    """Learner rank 0 -> learner rank r (``--algo apex|r2d2`` with ``--num_learners``): rank
    r's share of the batch rank 0 drew from the shared replay store, to train on in step with
    the other ranks."""

    index: Any  # np.ndarray [K]: transitions (apex) or rows (r2d2) of the store
    weights: Any  # np.ndarray [K] float32: their importance weights (of the whole batch)
    prev: Any  # r2d2: np.ndarray [K], each row's predecessor for the burn-in (-1: none)
    lr: float  # the learning rate of this step (rank 0 keeps the schedule)


class SaveCheckpoint(NamedTuple):
    """Runner -> learner: write a checkpoint with these run counters; ``best``: the mean
    return that makes it the policy's new best (``best.pt``, ``--save_best``)."""

    counters: dict
    final: bool
    best: float | None = None


class CheckpointSaved(NamedTuple):
    """Learner -> runner: written to ``path`` ("" when only sampling: nothing to save);
    ``best``: the mean return of a best checkpoint, ``env_frames`` the frames the policy had
    trained on when it was written."""

    path: str
    final: bool
    policy: int = 0
    best: float | None = None
    env_frames: int = 0


# --- population-based training (--with_pbt; fastrl/algo/pbt/population.py) -------------


class PbtReplace(NamedTuple):
    """Runner -> the learner of a replaced policy: take policy ``donor``'s current (published)
    weights and these hyperparameters, reset the optimizer, drop the experience the old
    weights acted."""

    donor: int
    hyperparams: dict
    exchange: int  # the exchange's number in the run (pbt.jsonl)


class PbtReplaced(NamedTuple):
    """Learner -> runner: done; ``version`` is the new weights' (the floor below which samples
    are left out), ``dropped`` the trajectories waiting for a batch that were dropped."""

    policy: int
    donor: int
    exchange: int
    version: int
    dropped: int


# --- reports (to the runner, which keeps the statistics) ------------------------------------


# What went wrong in an env fault (``RolloutReport.faults``): it raised, it ran past
# --env_timeout, or its output did not fit what the worker writes it into (a reward that is
# not a finite real number; an observation key missing, of the wrong shape or dtype, a float
# observation with NaN or inf, or a Discrete or MultiDiscrete one out of its range; a
# terminated or truncated flag that is no bool; an info that is no dict, or whose episode
# figures are not numbers: fastrl/sampling/env_faults.py).
ENV_FAULT_KINDS = ("exception", "timeout", "reward", "obs_missing", "obs_shape", "obs_dtype",
                   "obs_nonfinite", "obs_range", "flags", "info")


class RolloutReport(NamedTuple):
    """Rollout worker -> runner: episodes finished, env faults and busy time since the last
    report."""

    episodes: list[EpisodeStats]
    env_restarts: int
    steps_discarded: int
    faults: dict[str, int]  # env faults by kind (ENV_FAULT_KINDS); a kind without any is absent
    busy_seconds: float = 0.0  # time spent stepping envs and routing their output
    # --max_batches_waiting: splits held (fastrl.sampling.backlog) and splits begun
    splits_held: int = 0
    splits_begun: int = 0
    env_recycles: int = 0  # envs made anew at an episode boundary (--env_recycle_episodes|mb)
    worker: int = -1  # the reporting rollout worker (set on a ``final`` report)
    final: bool = False  # the answer to ``ReportNow``: everything held until then is in it


class EnvCheckFailed(NamedTuple):
    """Rollout worker -> runner, with ``--env_check strict``: an env's output was bad
    (``error`` names the env, the key, what was expected and what came). The run stops."""

    worker_id: int
    error: str


class LearnerReport(NamedTuple):
    """Learner -> runner."""

    stats: dict  # the last training step's statistics ({} when none since the last report)
    version: int
    samples: int  # samples trained (or, sampling only, collected) since the last report
    busy_seconds: float  # time spent in gather + train since the last report
    policy: int = 0  # whose learner (--num_policies)
    # --with_pbt: trajectories acted entirely before this policy's last replacement, dropped
    # untrained since the last report
    stale: int = 0
    # each batch's policy lag (min, mean, max over its steps, in learner steps) since the last
    # report; empty where the learner reports only its last step's (``stats``)
    lags: tuple[tuple[float, float, float], ...] = ()


class NodeReport(NamedTuple):
    """A sampler node's link (on the learner node) -> runner, about once a second."""

    node: int
    connected: bool
    trajectories: int  # received since the last report
    lag_mean: float | None  # policy lag of their samples (learner version - acting version)
    lag_max: int | None
    busy_seconds: float  # time spent receiving and unpacking trajectories


class NodeLost(NamedTuple):
    """A sampler node's link -> runner: the node's connection ``generation`` ended with
    ``cause``; ``in_flight`` trajectories were on the wire (the learner's untrained ones are
    counted by the ``Fenced`` that preceded this)."""

    node: int
    generation: int
    cause: str
    in_flight: int


class PolicyReport(NamedTuple):
    """Policy worker -> runner."""

    policy_id: int
    samples: int
    busy_seconds: float  # time spent in inference since the last report
