"""The three stations: each wraps one core (rollout worker, policy worker, learner) with the
routing of its messages over a :class:`~fastrl.runner.wiring.Wiring`.

A station reads its inbox, calls its core, and sends what the core produced to the queues
named in the wiring; it does nothing else. The parallel runner runs each station in its own
process (``fastrl/runner/parallel.py``: a loop of ``poll(POLL)`` until told to stop); serial
mode polls the same three stations in turn in one process (``fastrl/runner/serial.py``).
"""

from __future__ import annotations

import functools
import time
from typing import NoReturn

from fastrl.algo.batcher import PendingSlots
from fastrl.algo.learner import Learner
from fastrl.errors import EnvOutputError
from fastrl.experiment.checkpoint import checkpoint_state, save_checkpoint
from fastrl.log import log
from fastrl.runner.fault_log import FaultLog
from fastrl.runner.process_setup import allowed_cores, keep_on_core, worker_core
from fastrl.runner.wiring import Wiring
from fastrl.sampling.agents import MultiAgentRolloutWorker
from fastrl.sampling.backlog import Backlog, backlog_cells
from fastrl.sampling.env_setup import EnvSettings, create_env, reward_scale
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.rollout import RolloutWorker
from fastrl.sampling.rollout_records import StepOutput
from fastrl.sampling.staging import Staging
from fastrl.sampling.startup import CREATING, Activity
from fastrl.transport.messages import (
    ActionsReady,
    BuffersFreed,
    CheckpointSaved,
    EnvCheckFailed,
    Fence,
    Fenced,
    InferenceRequest,
    LearnerReady,
    LearnerReport,
    PbtReplace,
    PbtReplaced,
    PolicyReport,
    Reissue,
    ReportNow,
    Resume,
    RolloutReport,
    SaveCheckpoint,
    TrainShare,
    TrajectoriesReady,
)
from fastrl.transport.stopping import interruptible


class RolloutStation:
    """Rollout worker ``worker_id``: steps its envs when actions arrive, asks the policy
    workers for the next ones, and hands full trajectories to the learner."""

    def __init__(self, wiring: Wiring, worker_id: int, report_every: float):
        self.wiring = wiring
        self.worker_id = worker_id
        self.name = f"fastrl-rollout-{worker_id}"
        self.report_every = report_every
        self.generation = int(wiring.worker_gen[worker_id])
        self.inbox = wiring.worker_queues[worker_id]
        self.envs: list = []
        self.worker: RolloutWorker | None = None
        self._report = RolloutReport([], 0, 0, {})
        self._recycles_told = 0  # the worker's env_recycles already reported
        self._last_report = time.monotonic()
        self.fault_log = FaultLog(self.name)
        self.activity = Activity(wiring.activity, worker_id)  # what it does, for the runner

    def start(self, envs: list | None = None) -> None:
        """Create the envs (unless given) and the worker; send the first requests."""
        w, cfg = self.wiring, self.wiring.cfg
        env_settings = EnvSettings.from_config(cfg)
        if envs is None:  # (the heartbeat ends the start when the run stops meanwhile)
            for i in range(w.envs_per_worker // w.info.num_agents):
                w.beat_or_stop(self.worker_id)
                self.activity(CREATING, i)
                self.envs.append(interruptible(create_env, env_settings))
        else:
            self.envs = envs
        first = self.worker_id * w.per_worker_buffers
        per_round = None
        if not cfg.async_rl:  # sync mode: one learner batch per round, shared by every env
            per_round = cfg.trajectories_per_batch // w.num_envs
        # (a restarted worker must not replay its predecessor's episodes)
        seed = None if cfg.seed is None else cfg.seed + 1_000_003 * self.generation
        worker_type = MultiAgentRolloutWorker if w.info.multi_agent else RolloutWorker
        self.worker = worker_type(
            self.worker_id, self.envs, w.buffers, w.rnn_state,
            list(range(first, first + w.per_worker_buffers)), cfg.worker_num_splits,
            reward_scale=reward_scale(env_settings), reward_clip=cfg.reward_clip,
            action_bounds=cfg.action_bounds, env_check=cfg.env_check,
            trajectories_per_round=per_round, seed=seed,
            env_factory=functools.partial(create_env, env_settings), env_timeout=cfg.env_timeout,
            decorrelate=cfg.decorrelate_envs_on_one_worker, generation=self.generation,
            epoch=int(w.policy_epoch.value), num_policies=w.num_policies,
            policy_seed=w.assign_seed, activity=self.activity,
            backlog=Backlog(backlog_cells(w.backlog, w.num_workers), self.worker_id,
                            w.backlog_limit),
            repeats_left=None if w.repeats is None else w.repeats.left)
        self.envs = self.worker.envs  # the worker replaces faulty envs in this very list
        try:
            self._route(interruptible(self.worker.start, lambda: w.beat_or_stop(self.worker_id)))
        except EnvOutputError as exc:
            self._stop_run(exc)
        if envs is None:  # after the first resets, where an env may start its engine
            self._keep_on_core()

    def _keep_on_core(self) -> None:
        """--worker_cpu_affinity: this worker and the processes its envs started on its core
        (fastrl.runner.process_setup); worker 0 says what was done, once for the run, and any
        worker says where it failed."""
        cfg = self.wiring.cfg
        setting = cfg.worker_cpu_affinity
        cores = allowed_cores()  # (read before this process keeps to one of them)
        core, why = worker_core(cfg, self.wiring.node, self.worker_id, cores)
        pinned = -1
        if core is not None:
            pinned, failed = keep_on_core(core, setting == "on")
            if failed is not None:
                log(f"{self.name}: --worker_cpu_affinity {setting}: could not keep it on core "
                    f"{core} ({failed}); it runs on any core")
                return
            if pinned < 0:
                why = (f"--worker_cpu_affinity {setting}: their envs had started no process of "
                       "their own by their first reset")
        if self.worker_id or self.generation or self.wiring.node:
            return
        if pinned < 0:
            log(f"rollout workers on any core ({why})")
            return
        where = (f"all on core {core}" if len(cores) == 1 else
                 f"the machine's k-th worker on the k-th of cores {','.join(map(str, cores))}, "
                 "round the list")
        log(f"rollout workers on one core each, with the processes their envs started "
            f"(--worker_cpu_affinity {setting}): {where}; worker 0 and the {pinned} "
            f"process(es) its envs started on core {core}")

    def poll(self, timeout: float) -> int:
        """Handle what waits in the inbox (waiting up to ``timeout`` s for something);
        return how many messages there were."""
        try:
            return self._poll(timeout)
        except EnvOutputError as exc:
            self._stop_run(exc)

    def _stop_run(self, exc: EnvOutputError) -> NoReturn:
        """``--env_check strict`` and bad env output: tell the runner to stop the run (rather
        than restart this worker), then fail."""
        self.wiring.runner_queue.put(EnvCheckFailed(self.worker_id, str(exc)))
        raise exc

    def _poll(self, timeout: float) -> int:
        worker = self.worker
        msgs = self.inbox.get_many(timeout)
        start = time.perf_counter()
        # The runner's ask for the last episodes is answered before any env is stepped again
        # (a split's step can take seconds in a slow env; what it ends goes in a later report).
        report_now = any(isinstance(msg, ReportNow) for msg in msgs)
        if report_now:
            self._send_report(final=True)
        for msg in msgs:
            if isinstance(msg, ActionsReady):
                if worker.accepts(msg):
                    self._route(interruptible(worker.on_actions, msg.split_id))
            elif isinstance(msg, BuffersFreed):
                if msg.generation == self.generation:
                    self._route(worker.add_free_buffers(msg.buffers))
            elif isinstance(msg, Resume):
                if msg.generation == self.generation:
                    self._route(worker.resume())
            elif isinstance(msg, Reissue):
                self._route(worker.reissue(msg.epoch))
            elif isinstance(msg, ReportNow):
                pass  # answered above
            else:
                raise TypeError(f"{self.name}: unexpected message {msg!r}")
        released = 0
        if any(split.held for split in worker.splits):  # has the learner's backlog shrunk?
            out = worker.release_held()
            released = len(out.requests)
            self._route(out)
        report = self._report
        if msgs:
            report = self._report = report._replace(
                busy_seconds=report.busy_seconds + time.perf_counter() - start)
        if ((report.episodes or report.env_restarts or report.faults or report.busy_seconds)
                and time.monotonic() - self._last_report >= self.report_every):
            self._send_report(final=False)
        self.fault_log.flush()
        return len(msgs) + released

    def _send_report(self, final: bool) -> None:
        """What happened since the last report, to the runner (``final``: the answer to its
        ``ReportNow``, sent even when empty)."""
        worker = self.worker
        held, begun = worker.backlog.take_counts()
        recycles, self._recycles_told = (worker.env_recycles - self._recycles_told,
                                         worker.env_recycles)
        self.wiring.runner_queue.put(self._report._replace(
            splits_held=held, splits_begun=begun, env_recycles=recycles,
            worker=self.worker_id, final=final))
        self._report = RolloutReport([], 0, 0, {})
        self._last_report = time.monotonic()

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - close every engine even if one fails
                pass

    def _route(self, out: StepOutput) -> None:
        if out.requests:
            self.wiring.policy_queue.put_many(out.requests)
        if out.trajectories:
            queues = self.wiring.learner_queues
            if len(queues) == 1:
                queues[0].put_many(out.trajectories)
            else:  # each to the learner of the policy that acted it
                for msg in out.trajectories:
                    queues[msg.policy].put(msg)
        if out.episodes or out.env_restarts or out.faults:
            r = self._report
            faults = dict(r.faults)
            for fault in out.faults:
                self.fault_log.add(fault)
                faults[fault.kind] = faults.get(fault.kind, 0) + 1
            self._report = RolloutReport(r.episodes + out.episodes,
                                         r.env_restarts + out.env_restarts,
                                         r.steps_discarded + out.steps_discarded, faults,
                                         r.busy_seconds)


class PolicyStation:
    """Policy worker ``policy_id``: acts for every request waiting, in one batch, and tells
    each rollout worker which of its splits may step."""

    def __init__(self, wiring: Wiring, policy_id: int, policy: PolicyWorker,
                 report_every: float):
        self.wiring = wiring
        self.policy_id = policy_id
        self.policy = policy
        self.report_every = report_every
        self._busy = 0.0
        self._samples = 0
        self._last_report = time.monotonic()

    def poll(self, timeout: float) -> int:
        """Act for the requests waiting (up to ``timeout`` s for the first); return how many
        requests there were, stale ones included."""
        w = self.wiring
        requests: list[InferenceRequest] = w.policy_queue.get_many(timeout, 4096)
        n = len(requests)
        if requests:
            # Drop requests of a dead rollout worker or made before a policy worker restart.
            epoch, gens = w.policy_epoch.value, w.worker_gen
            requests = [r for r in requests
                        if r.epoch == epoch and r.generation == gens[r.worker_id]]
        if requests:
            start = time.perf_counter()
            by_worker: dict[int, list[ActionsReady]] = {}
            for ready in self.policy.infer(requests):
                by_worker.setdefault(ready.worker_id, []).append(ready)
            for worker_id, msgs in by_worker.items():
                w.worker_queues[worker_id].put_many(msgs)
            self._busy += time.perf_counter() - start
            self._samples += sum(len(r.buffers) for r in requests)
        if self._samples and time.monotonic() - self._last_report >= self.report_every:
            w.runner_queue.put(PolicyReport(self.policy_id, self._samples, self._busy))
            self._busy, self._samples = 0.0, 0
            self._last_report = time.monotonic()
        return n


class LearnerStation:
    """The learner: collects trajectory slots, trains on each full batch, frees the slots,
    publishes the new weights, and writes checkpoints when the runner asks.

    With ``--num_policies``, the learner of ``policy``: its own inbox
    (``wiring.learner_queues[policy]``), weights (``wiring.policy_weights[policy]``) and
    checkpoint folder; its messages to the runner name the policy."""

    def __init__(self, wiring: Wiring, learner: Learner, report_every: float, policy: int = 0):
        self.wiring = wiring
        self.learner = learner
        self.report_every = report_every
        self.policy = policy
        self.inbox = wiring.learner_queues[policy]
        self.weights = wiring.policy_weights[policy]
        self.rank_queues = wiring.rank_queues_of(policy)
        self.pending = PendingSlots(wiring.per_worker_buffers, list(wiring.worker_gen))
        self.staging = Staging(learner.device)  # batches reach the learner's device through it
        self._samples, self._busy = 0, 0.0
        self._stats: dict = {}
        self._stale = 0  # --with_pbt: trajectories of the old weights dropped since the report
        self._lags: list[tuple[float, float, float]] = []  # each batch's (min, mean, max)
        self._last_report = time.monotonic()
        # After the final checkpoint nothing more trains: a step after it would be counted in
        # the run's summary but missing from the checkpoint (a serial run's summary said 209
        # learner steps beside checkpoint 208, when a batch waited in the same poll).
        self._final_saved = False
        wiring.run_frames.count(policy, learner)  # a resumed one's, before any policy trains

    def announce(self, counters: dict | None, checkpoint: str | None) -> None:
        """Say so, then publish the first weights (the checkpoint's when resuming): the policy
        workers act only once these are there, so no worker's report reaches the runner
        before this LearnerReady."""
        learner = self.learner
        self.wiring.runner_queue.put(LearnerReady(
            counters, checkpoint, learner.version, str(learner.device), learner.precision,
            self.policy, getattr(learner, "hyperparams", None)))
        self.weights.publish(learner.model, learner.version)

    def poll(self, timeout: float) -> int:
        """Handle the messages waiting (up to ``timeout`` s for the first, none while a full
        batch waits), then train on one full batch; return messages handled plus batches
        trained.

        One batch a call: a backlog of batches is trained over several calls, each of which
        reads the queue first, so that a ``Fence`` or ``SaveCheckpoint`` waits for at most one
        batch. A sampler node's link and the supervisor wait for the fence's answer; behind a
        whole backlog (many nodes, a slow learner) that wait could run out."""
        w = self.wiring
        if self._ready() and not self._final_saved:  # (after it, nothing more is trained)
            timeout = 0.0
        msgs = self.inbox.get_many(timeout)
        for msg in msgs:
            if isinstance(msg, TrajectoriesReady):
                if self.learner.version_floor > 0:
                    msg = self._drop_stale(msg)
                self.pending.add(msg)
            elif isinstance(msg, Fence):
                # Everything the dead worker sent came before this message.
                dropped = self.pending.fence(msg.worker_id, msg.generation)
                w.runner_queue.put(Fenced(msg.worker_id, msg.generation, dropped, self.policy))
            elif isinstance(msg, SaveCheckpoint):
                self._save(msg)
            elif isinstance(msg, PbtReplace):
                self._replace(msg)
            else:
                raise TypeError(f"learner: unexpected message {msg!r}")
        work = len(msgs) + (0 if self._final_saved else self._work())
        if time.monotonic() - self._last_report >= self.report_every:
            self._report()
        return work

    def _report(self) -> None:
        """What was trained since the last report, if anything, to the runner."""
        if self._samples or self._stale:
            self.wiring.runner_queue.put(LearnerReport(
                self._stats, self.learner.version, self._samples, self._busy, self.policy,
                self._stale, tuple(self._lags)))
            self._samples, self._busy, self._stats, self._stale, self._lags = 0, 0.0, {}, 0, []
            self._last_report = time.monotonic()

    def _replace(self, msg: PbtReplace) -> None:
        """Population-based training replaces this policy (fastrl/algo/pbt/population.py):
        the donor's current published weights and the new hyperparameters
        (``Learner.take_weights``); the trajectories waiting here were acted by the old
        weights: freed untrained."""
        learner = self.learner
        learner.take_weights(self.wiring.policy_weights[msg.donor], msg.hyperparams)
        dropped = self.pending.take_all()
        self._free(dropped)
        self.weights.publish(learner.model, learner.version)
        self.wiring.runner_queue.put(PbtReplaced(self.policy, msg.donor, msg.exchange,
                                                 learner.version, len(dropped)))

    def _drop_stale(self, msg: TrajectoriesReady) -> TrajectoriesReady:
        """``msg`` without the trajectories acted whole before the last PBT replacement (every
        step's version below the floor), which are freed untrained and counted; one acted
        partly by the new weights stays, its old steps masked out of the loss."""
        versions = self.wiring.buffers.policy_versions[list(msg.buffers)]
        stale = (versions.amax(dim=1) < self.learner.version_floor).tolist()
        if not any(stale):
            return msg
        old = [b for b, s in zip(msg.buffers, stale) if s]
        if msg.generation == self.pending.generations[msg.worker_id]:
            self._stale += len(old)
            self._free(old)
        return msg._replace(buffers=tuple(b for b, s in zip(msg.buffers, stale) if not s))

    def _ready(self) -> bool:
        """Whether there is training to do without waiting for a message."""
        return (len(self.pending) >= self.learner.trajectories_per_batch
                and not self.wiring.cfg.sampling_only)

    def _work(self) -> int:
        """Train on (or, sampling only, free) what waits; how many batches that was."""
        w, cfg = self.wiring, self.wiring.cfg
        work = 0
        if cfg.sampling_only:
            slots = self.pending.take_all()
            if slots:
                self._samples += len(slots) * cfg.rollout
                self._free(slots)
                work += 1
        # Not past a stop request: the runner gives the children a few seconds to exit.
        elif not w.should_stop() and (
                slots := self.pending.take(self.learner.trajectories_per_batch)) is not None:
            self._train(slots)
            work += 1
        return work

    def _train(self, slots: list[int]) -> None:
        w, learner, start = self.wiring, self.learner, time.perf_counter()
        group, frames = learner.group, w.run_frames.total()  # --lr_schedule's clock
        if group is not None:  # every rank trains on its share: rank r on slots r, r + N, ...
            for rank, q in enumerate(self.rank_queues, start=1):  # (and decays on rank 0's clock)
                q.put(TrainShare(slots[rank::group.world_size], frames))
            batch = w.buffers.gather(slots[::group.world_size], self.staging)
            group.barrier()  # every rank has copied its share out
        else:
            batch = w.buffers.gather(slots, self.staging)
        self._free(slots)  # the data is copied out: the slots can be refilled while we train
        self._stats = stats = interruptible(learner.train, batch, frames)  # (a stop may interrupt)
        w.run_frames.count(self.policy, learner)  # every policy's next batch counts this one
        if "policy_lag_mean" in stats:
            self._lags.append((stats["policy_lag_min"], stats["policy_lag_mean"],
                               stats["policy_lag_max"]))
        self._samples += len(slots) * w.cfg.rollout
        self.weights.publish(learner.model, learner.version)
        if not w.cfg.async_rl:
            for worker_id, q in enumerate(w.worker_queues):
                q.put(Resume(learner.version, self.pending.generations[worker_id]))
        self._busy += time.perf_counter() - start

    def _free(self, slots: list[int]) -> None:
        for worker_id, msg in self.pending.freed(slots):
            self.wiring.worker_queues[worker_id].put(msg)

    def _save(self, msg: SaveCheckpoint) -> None:
        w = self.wiring
        if msg.final:
            # The run's summary is written once this checkpoint is confirmed: the steps
            # trained since the last report reach the runner first (one queue, in order).
            self._report()
        if w.cfg.sampling_only:
            w.runner_queue.put(CheckpointSaved("", msg.final, self.policy))
            return
        best = msg.best is not None
        # A best checkpoint is for playing (and resumable): a replay store's contents stay out.
        state = checkpoint_state(w.cfg, w.info, self.learner.state_dict(store_contents=not best),
                                 msg.counters)
        if best:
            state["best"] = {"mean_return": msg.best, "episodes": w.cfg.stats_avg}
        path = save_checkpoint(w.cfg.experiment_dir, state, w.cfg.keep_checkpoints, self.policy,
                               best=best)
        self._final_saved = self._final_saved or msg.final
        w.runner_queue.put(CheckpointSaved(path, msg.final, self.policy, msg.best,
                                           state["counters"]["env_frames"]))


class LearnerRankStation:
    """Learner rank r > 0 (``--num_learners``): trains on the shares rank 0 hands it, in step
    with the other ranks; rank 0 does everything else."""

    def __init__(self, wiring: Wiring, learner: Learner, rank: int, policy: int = 0):
        self.wiring = wiring
        self.learner = learner
        self.inbox = wiring.rank_queues_of(policy)[rank - 1]
        self.staging = Staging(learner.device)

    def poll(self, timeout: float) -> int:
        msgs = self.inbox.get_many(timeout)
        for msg in msgs:
            if not isinstance(msg, TrainShare):
                raise TypeError(f"learner rank: unexpected message {msg!r}")
            batch = self.wiring.buffers.gather(msg.slots, self.staging)
            self.learner.group.barrier()
            interruptible(self.learner.train, batch, msg.run_frames)
        return len(msgs)
