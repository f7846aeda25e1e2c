"""The one place that creates every buffer and queue, for serial and parallel mode alike.

Who talks to whom (``fastrl/transport/messages.py`` has every message; tensors stay in the
buffers)::

    rollout worker w --InferenceRequest---------> policy_queue (shared by the policy workers)
    policy worker    --ActionsReady-------------> worker_queues[w]
    rollout worker w --TrajectoriesReady--------> learner_queues[k]   (k: the acting policy)
    learner          --BuffersFreed, Resume-----> worker_queues[w]
    runner           --Fence, SaveCheckpoint----> learner_queues[k]   (every k)
    runner           --Reissue------------------> worker_queues[w]   (every w)
    learner (rank 0) --TrainShare---------------> its ranks' queues (--num_learners > 1;
                                                  rank_queues_of(policy)[r - 1])
    sampler node k   --trajectories, reports----> its link, which plays rollout worker k
                       (--num_sampler_nodes; fastrl/runner/link.py, fastrl/runner/sampler_node.py)
    learner          --LearnerReady, Fenced,
                       CheckpointSaved----------> runner_queue
    learner k        --weights------------------> policy_weights[k] (every policy worker)
    learner k        --its trained frames-------> run_frames slot k (every learner reads
                                                  the sum: --lr_schedule's clock)

``--num_policies P``: one learner per policy, each with its own queue
(``learner_queues[k]``; ``learner_queue`` is policy 0's) and weights (``policy_weights[k]``;
``weights`` is policy 0's). The trajectory slots, worker queues and policy queue are shared:
a slot belongs to its rollout worker, whichever policy's learner it is sent to, and that
learner frees it back to the worker.
    everyone         --reports, ChildFailed-----> runner_queue

Parallel mode puts the buffers in shared memory and the queues in faster-fifo mailboxes, and
hands the :class:`Wiring` to every child process; serial mode builds the same wiring with
plain tensors and :class:`~fastrl.transport.queues.LocalQueue` queues, and drives the same stations
(``fastrl/runner/stations.py``) in one process.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from multiprocessing import sharedctypes
from typing import Any

import torch

from fastrl.algo.learner_group import free_port
from fastrl.algo.replay.apex import build_store, shared_store_nbytes
from fastrl.algo.replay.exploration import RepeatedExploration
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.algo.run_frames import RunFrames
from fastrl.config.settings import REPLAY_ALGOS, Config
from fastrl.errors import ExperimentError
from fastrl.policy.actions import ActionSpec
from fastrl.runner.memory import buffers_per_env, shm_free
from fastrl.sampling.backlog import backlog_limit
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.env_setup import EnvInfo
from fastrl.sampling.sde import HeldNoise
from fastrl.sampling.weights import LocalWeights, SharedWeights, WeightsSource
from fastrl.transport.mailbox import Mailbox
from fastrl.transport.procs import Lifeline
from fastrl.transport.queues import LocalQueue, MessageQueue
from fastrl.transport.stopping import StopFlag, StopRequested

QUEUE_BYTES = 4 * 1024 * 1024


@dataclass
class Wiring:
    """Everything the components share: buffers, queues, weights and the fencing counters."""

    cfg: Config
    info: EnvInfo
    num_workers: int
    envs_per_worker: int  # env slots: one per agent (fastrl.sampling.agents), so envs x agents
    layout: BufferLayout
    buffers: TrajectoryBuffers
    rnn_state: torch.Tensor  # [num_envs, H]: each env's recurrent state while acting
    weights: WeightsSource
    policy_queue: MessageQueue
    worker_queues: list[MessageQueue]
    learner_queue: MessageQueue
    runner_queue: MessageQueue
    stop: StopFlag  # set when the children must stop
    # Parallel mode: the runner that built this wiring; a child stops when it goes.
    parent: Lifeline | None
    worker_gen: Any  # int64 per rollout worker: its restarts so far
    policy_epoch: Any  # .value: policy worker restarts so far
    heartbeat: Any  # float64 per rollout worker, then per policy worker: monotonic time
    policy_ticks: Any  # int64 per policy worker: loop turns
    # Several learners (--num_learners): the inboxes of ranks 1.. and the port of their
    # torch.distributed rendezvous.
    rank_queues: list[MessageQueue] = field(default_factory=list)
    learner_port: int = 0
    learner_ports: list[int] = field(default_factory=list)  # one group per policy
    # --algo apex|r2d2 with --num_learners > 1: the replay store's tensors, in shared memory
    # (every rank binds its store to them; fastrl/algo/replay/store.py).
    replay_columns: dict[str, torch.Tensor] | None = None
    # Sampler nodes (--num_sampler_nodes): the port of the learner node's store, where they
    # connect. On the learner node "rollout worker" k stands for sampler node k.
    node_port: int = 0
    # On a sampler node: its number (its env slots follow those of the nodes before it in
    # the run's count, as --algo apex's epsilons do); 0 elsewhere.
    node: int = 0
    # Every policy's trained env frames, the clock of --lr_schedule linear_decay.
    run_frames: RunFrames = field(default_factory=lambda: RunFrames(1))
    # --num_policies: every policy's learner queue and weights (item 0: learner_queue and
    # weights themselves); filled in by __post_init__ for one policy.
    learner_queues: list[MessageQueue] = field(default_factory=list)
    policy_weights: list[WeightsSource] = field(default_factory=list)
    # --num_policies: the seed of the policy draws, which every rollout worker shares
    # (fastrl.sampling.rollout_records.PolicyAssignment): --seed, or drawn once for the run.
    assign_seed: int = 0
    # int64 per rollout worker: what it is doing (fastrl.sampling.startup.Activity), for the
    # runner to say when it kills the worker as hung.
    activity: Any = None
    # int64 [2, num_workers]: each rollout worker's trajectories waiting for the learner and
    # reserved (fastrl.sampling.backlog: backlog_cells gives the array).
    backlog: Any = None
    # --action_log_std sde with several policy workers in parallel mode: the env slots'
    # exploration matrices, which every policy worker reads (fastrl/sampling/sde.py); None
    # where one policy worker keeps its own.
    held_noise: HeldNoise | None = None
    # --apex_epsilon_repeat_mu: the env slots' held random actions, which the policy workers
    # read and write and the rollout workers end with each episode
    # (fastrl/algo/replay/exploration.py); shared memory in parallel mode.
    repeats: RepeatedExploration | None = None
    # This process's own: whether its main thread has seen the stop flag (a child that has
    # not within a grace time is interrupted: fastrl.transport.stopping).
    stop_seen: bool = False

    def __post_init__(self):
        if not self.learner_queues:
            self.learner_queues = [self.learner_queue]
        if not self.policy_weights:
            self.policy_weights = [self.weights]
        if not self.learner_ports:
            self.learner_ports = [self.learner_port]

    @property
    def num_policies(self) -> int:
        return len(self.policy_weights)

    def rank_queues_of(self, policy: int) -> list[MessageQueue]:
        """The inboxes of ranks 1.. of ``policy``'s learner (--num_learners > 1)."""
        n = self.cfg.num_learners - 1
        return self.rank_queues[policy * n:(policy + 1) * n]

    @property
    def num_envs(self) -> int:
        return self.num_workers * self.envs_per_worker

    @property
    def backlog_limit(self) -> int | None:
        """Trajectories that may wait for the learners before splits are held
        (``--max_batches_waiting``): async APPO only (a replay learner takes trajectories
        one by one; sync mode waits for its round)."""
        cfg = self.cfg
        if not cfg.async_rl or cfg.algo in REPLAY_ALGOS:
            return None
        return backlog_limit(cfg.max_batches_waiting, cfg.trajectories_per_batch,
                             self.envs_per_worker // cfg.worker_num_splits, self.num_policies)

    @property
    def per_worker_buffers(self) -> int:
        return self.layout.num_buffers // self.num_workers

    def worker_of(self, slot: int) -> int:
        """The rollout worker that owns trajectory slot ``slot``."""
        return slot // self.per_worker_buffers

    def beat(self, slot: int) -> None:
        self.heartbeat[slot] = time.monotonic()

    def beat_or_stop(self, slot: int) -> None:
        """A heartbeat from long work (a worker's start) that the stop flag ends at once."""
        self.heartbeat[slot] = time.monotonic()
        if self.should_stop():
            raise StopRequested("the run is stopping")

    def policy_slot(self, policy_id: int) -> int:
        """Heartbeat slot of a policy worker (rollout worker ``w`` has slot ``w``)."""
        return self.num_workers + policy_id

    def should_stop(self) -> bool:
        if self.stop.is_set() or (self.parent is not None and not self.parent.alive()):
            self.stop_seen = True
            return True
        return False

    def queues(self) -> list[MessageQueue]:
        return [self.policy_queue, *self.learner_queues, self.runner_queue, *self.worker_queues,
                *self.rank_queues]

    def close(self) -> None:
        for q in self.queues():
            q.close()


def weighed_reward_terms(cfg: Config, info: EnvInfo) -> tuple[str, ...]:
    """The env's shaping terms each policy's learner weighs itself: all it names under
    ``--with_pbt`` with ``--pbt_reward_shaping`` (fastrl/algo/pbt/reward_weights.py), else none."""
    return info.reward_terms if cfg.with_pbt and cfg.pbt_reward_shaping else ()


class _Counter:
    """``.value`` like a shared ``multiprocessing.Value``, for one process."""

    def __init__(self, value: int = 0):
        self.value = value


def build_wiring(cfg: Config, info: EnvInfo, model: torch.nn.Module, num_workers: int,
                 envs_per_worker: int, ctx=None, slots_per_env: int | None = None,
                 models: list[torch.nn.Module] | None = None,
                 node: int | None = None) -> Wiring:
    """Allocate buffers and queues for ``num_workers`` rollout workers of ``envs_per_worker``
    envs of ``info.num_agents`` agents each: every agent is an env slot, and past this point
    "envs" count slots (``Wiring.envs_per_worker``, ``num_envs``). With a multiprocessing
    context ``ctx`` everything lives in shared memory (parallel mode, the weights published by
    copy); without, in this process (serial mode, where the policy acts with ``model``
    itself). ``slots_per_env``: trajectory slots per env slot (default: room for two learner
    batches, see ``buffers_per_env``). ``models``: serial mode with ``--num_policies`` > 1,
    every policy's learner model (``model`` is the first). ``node``: the wiring of sampler
    node ``node`` (``fastrl/runner/sampler_node.py``), which has no learners: no replay store (the
    learner node's) and no learner ranks' inboxes."""
    envs_per_worker *= info.num_agents
    num_envs = num_workers * envs_per_worker
    if slots_per_env is None:
        slots_per_env = buffers_per_env(cfg, num_envs)
    layout = BufferLayout.from_spaces(info.obs_space, info.action_space,
                                      num_envs * slots_per_env, cfg.rollout,
                                      model.rnn_state_size,
                                      len(weighed_reward_terms(cfg, info)))
    parallel = ctx is not None
    n_policy = cfg.num_policy_workers if parallel else 1
    models = models or [model] * cfg.num_policies
    with_store = (parallel and cfg.algo in REPLAY_ALGOS and cfg.num_learners > 1
                  and node is None)
    if parallel:
        check_shared_memory(shared_memory_parts(cfg, info, layout, models, num_envs,
                                                with_store))
    # The tensors before the mailboxes: torch's shared memory lives in /dev/shm only, where
    # a mailbox (multiprocessing's heap) takes room only while there is some and otherwise
    # falls back to the temp folder. Made first, the mailboxes could leave the tensors none.
    buffers = TrajectoryBuffers(layout, shared=parallel)
    rnn_state = torch.zeros((num_envs, model.rnn_state_size))
    if parallel:
        rnn_state.share_memory_()
    held_noise = None
    if exploration_matrices(cfg, model, num_envs, parallel):
        held_noise = HeldNoise(num_envs, *model.sde_log_std.shape, cfg.action_noise_every,
                               shared=True)
    repeats = None
    if explores_with_repeats(cfg):
        repeats = RepeatedExploration(num_envs, action_dims(info), cfg.apex_epsilon_repeat_mu,
                                      shared=parallel)
    policy_weights: list[WeightsSource] = (
        [SharedWeights(m, ctx) for m in models] if parallel else [LocalWeights(m) for m in models])
    replay_columns = (build_store(ReplaySettings.from_config(cfg), info.obs_space,
                                  info.action_space, shared=True).columns()
                      if with_store else None)
    run_frames = RunFrames(len(models), shared=parallel)
    if parallel:
        # Restartable workers' mailboxes get doorbells (see fastrl/transport/mailbox.py).
        policy_queue = Mailbox(QUEUE_BYTES, doorbell=True)
        worker_queues = [Mailbox(QUEUE_BYTES, doorbell=True) for _ in range(num_workers)]
        learner_queues = [Mailbox(QUEUE_BYTES, doorbell=False) for _ in models]
        runner_queue = Mailbox(QUEUE_BYTES, doorbell=False)
        stop = StopFlag(shared=True)
        ranks = 0 if node is not None else (cfg.num_learners - 1) * len(models)
        rank_queues = [Mailbox(QUEUE_BYTES, doorbell=False) for _ in range(ranks)]
    else:
        policy_queue, runner_queue = LocalQueue(), LocalQueue()
        learner_queues = [LocalQueue() for _ in models]
        worker_queues = [LocalQueue() for _ in range(num_workers)]
        stop = StopFlag(shared=False)
        rank_queues = []
    ports = _free_ports(len(models)) if rank_queues else [0] * len(models)
    return Wiring(
        cfg=cfg, info=info, num_workers=num_workers, envs_per_worker=envs_per_worker,
        layout=layout, buffers=buffers, rnn_state=rnn_state,
        weights=policy_weights[0], policy_queue=policy_queue, worker_queues=worker_queues,
        learner_queue=learner_queues[0], runner_queue=runner_queue, stop=stop,
        parent=Lifeline() if parallel else None,
        worker_gen=sharedctypes.RawArray("q", num_workers),
        policy_epoch=sharedctypes.RawValue("q", 0) if parallel else _Counter(),
        heartbeat=sharedctypes.RawArray("d", num_workers + n_policy),
        activity=sharedctypes.RawArray("q", num_workers),
        backlog=sharedctypes.RawArray("q", 2 * num_workers),
        policy_ticks=sharedctypes.RawArray("q", n_policy),
        rank_queues=rank_queues,
        learner_port=ports[0], learner_ports=ports,
        learner_queues=learner_queues, policy_weights=policy_weights,
        replay_columns=replay_columns, node=node or 0,
        run_frames=run_frames,
        assign_seed=cfg.seed if cfg.seed is not None else secrets.randbits(63),
        held_noise=held_noise, repeats=repeats,
    )


def exploration_matrices(cfg: Config, model: torch.nn.Module, num_envs: int,
                         parallel: bool) -> int:
    """Bytes of the env slots' exploration matrices the wiring shares (``--action_log_std
    sde`` with several policy workers in parallel mode; 0 without)."""
    sde = getattr(model, "sde_log_std", None)
    if sde is None or not parallel or cfg.num_policy_workers < 2:
        return 0
    return 4 * num_envs * sde.numel()


def action_dims(info: EnvInfo) -> int:
    """The categorical action dimensions of the env (what epsilon-greedy chooses)."""
    return len(ActionSpec(info.action_space).nvec)


def explores_with_repeats(cfg: Config) -> bool:
    """Whether the run's actors hold their random actions (``--apex_epsilon_repeat_mu``
    under ``--algo apex`` or ``r2d2``)."""
    return cfg.algo in REPLAY_ALGOS and bool(cfg.apex_epsilon_repeat_mu)


def exploration_repeats(cfg: Config, info: EnvInfo, num_envs: int, parallel: bool) -> int:
    """Bytes of the env slots' held random actions the wiring shares
    (``--apex_epsilon_repeat_mu`` in parallel mode; 0 without)."""
    if not explores_with_repeats(cfg) or not parallel:
        return 0
    return 8 * num_envs * (1 + action_dims(info))


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports (each policy's learner group meets on its own)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def shared_memory_parts(cfg: Config, info: EnvInfo, layout: BufferLayout,
                        models: list[torch.nn.Module], num_envs: int,
                        with_store: bool) -> dict[str, int]:
    """Bytes by each torch shared tensor of parallel mode (``build_wiring`` allocates them),
    all of which must fit in /dev/shm: the trajectory buffers, the published weights, the
    acting recurrent states and, ``with_store``, the replay store of ``--num_learners`` > 1.
    The mailboxes are not counted: they fall back to the temp folder when /dev/shm is full."""
    parts = {"trajectory buffers": layout.nbytes(),
             "weights": sum(4 * t.numel() for m in models for t in m.state_dict().values()),
             "recurrent states": 4 * num_envs * layout.rnn_size}
    matrices = exploration_matrices(cfg, models[0], num_envs, parallel=True)
    if matrices:
        parts["exploration matrices"] = matrices
    repeats = exploration_repeats(cfg, info, num_envs, parallel=True)
    if repeats:
        parts["exploration repeats"] = repeats
    if with_store:
        parts["replay store"] = shared_store_nbytes(ReplaySettings.from_config(cfg),
                                                    info.obs_space, info.action_space)
    return parts


# What lowers each part of the shared memory, for the error that names it.
SHARED_MEMORY_FLAGS = {
    "replay store": "--replay_capacity (the replay store; --num_learners 1 keeps it in the "
                    "learner's memory)",
    "trajectory buffers": "--num_envs_per_worker, --num_workers, --rollout or --batch_size "
                          "(the trajectory buffers)",
    "weights": "--encoder_mlp_layers, --encoder_fc_size, --rnn_size or --num_policies (the "
               "published weights)",
    "recurrent states": "--rnn_size, --num_envs_per_worker or --num_workers (the acting "
                        "recurrent states)",
    "exploration matrices": "--num_policy_workers 1, --encoder_mlp_layers, --rnn_size or "
                            "--num_envs_per_worker (--action_log_std sde's exploration "
                            "matrices)",
    "exploration repeats": "--num_envs_per_worker or --num_workers "
                           "(--apex_epsilon_repeat_mu's held actions)",
}


def check_shared_memory(parts: dict[str, int]) -> None:
    """Refuse, in one line naming the sizes, the free room and what to change, a run whose
    shared memory (``parts``, bytes by what holds it) does not fit /dev/shm's free space all
    together; each part alone is not enough. What to change: the flags of the biggest parts,
    biggest first, as many parts as could make up what is missing."""
    need, free = sum(parts.values()), shm_free()
    if free is None or need <= free:
        return
    sizes = ", ".join(f"{name} {_size(n)}" for name, n in parts.items())
    fixes, covered = [], 0
    for name, n in sorted(parts.items(), key=lambda kv: -kv[1]):
        if covered >= need - free:
            break
        fixes.append(SHARED_MEMORY_FLAGS[name])
        covered += n
    raise ExperimentError(f"the run needs {_size(need)} of shared memory ({sizes}) but "
                          f"/dev/shm has {_size(free)} free: lower {', or '.join(fixes)}; or "
                          "give /dev/shm more room (docker run --shm-size)")


def _size(nbytes: int) -> str:
    if nbytes < 2**20:
        return f"{nbytes / 2**10:.0f} KiB"
    return f"{nbytes / 2**20:,.{1 if nbytes < 10 * 2**20 else 0}f} MiB"
