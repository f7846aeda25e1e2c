"""The parallel runner: rollout workers, policy workers and a learner in their own processes.

Who talks to whom (every queue is a faster-fifo queue carrying small messages; tensors stay
in shared memory allocated here, once, before any process starts):

    rollout worker w --InferenceRequest------> policy queue (shared by policy workers)
    policy worker    --ActionsReady----------> worker queue w
    rollout worker w --TrajectoriesReady-----> learner queue
    learner          --BuffersFreed, Resume--> worker queue w
    everyone         --reports, failures-----> runner queue (this process)
    runner           --SaveCheckpoint--------> learner queue

The runner starts the learner first (it restores a checkpoint and publishes the weights),
then the policy workers, then the rollout workers; it watches every child's exit code and
heartbeat on each loop turn, so a crash or a hang is noticed at once.

Faults (docs/reliability.md has the whole story):
- A learner failure stops the run with the learner's traceback.
- A rollout or policy worker that dies or hangs is killed with its process group (the env
  engines it started) and restarted, up to --max_worker_restarts times per
  --restart_window. Stale messages of the dead incarnation are fenced off by numbers
  stamped on every request: ``worker_gen[w]`` counts restarts of rollout worker ``w``
  (policy workers drop requests of an older generation, the learner drops that worker's
  untrained trajectories and frees its slots, the new worker ignores answers meant for its
  predecessor), and ``policy_epoch`` counts policy worker restarts (requests of an older
  epoch are dropped, and every rollout worker asks again for the splits still waiting).
- Ctrl-C or SIGTERM saves a checkpoint and stops; a second one kills everything at once.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.multiprocessing as tmp

from fastrl.buffers import BufferLayout, TrajectoryBuffers
from fastrl.cfg import Config
from fastrl.device import resolve_precision
from fastrl.evaluation import PeriodicEvaluator, write_eval_summaries
from fastrl.experiment import (
    ExperimentError,
    Reporter,
    TrainingStats,
    log,
    prepare_experiment_dir,
    print_final_summary,
    save_checkpoint,
)
from fastrl.mailbox import Mailbox
from fastrl.malloc import keep_freed_memory
from fastrl.messages import ActionsReady, EpisodeStats, TrajectoriesReady
from fastrl.procs import kill_group, release_queue_locks
from fastrl.runner.common import (
    EnvInfo,
    buffers_per_env,
    build_model,
    checkpoint_state,
    create_env,
    probe_env,
    resolve_device,
    restore_counters,
    restore_learner,
    reward_scale,
    seed_everything,
)

QUEUE_BYTES = 4 * 1024 * 1024
POLL = 0.05  # seconds every blocking get waits before checking for stop


# --- control messages ------------------------------------------------------------------


class BuffersFreed(NamedTuple):
    buffers: tuple[int, ...]
    generation: int = 0  # of the rollout worker the slots belong to


class Resume(NamedTuple):
    """Sync mode: new weights are published; start the next round."""

    version: int
    generation: int = 0


class Fence(NamedTuple):
    """Runner -> learner: rollout worker ``worker_id`` died; its next incarnation is
    ``generation``. Drop its untrained trajectories; its slots are free again."""

    worker_id: int
    generation: int


class Fenced(NamedTuple):
    """Learner -> runner: done; ``trajectories`` untrained trajectories were dropped."""

    worker_id: int
    generation: int
    trajectories: int


class Reissue(NamedTuple):
    """Runner -> rollout workers: a policy worker was restarted; requests older than
    ``epoch`` are dropped, so ask again for every split still waiting for actions."""

    epoch: int


class SaveCheckpoint(NamedTuple):
    counters: dict
    final: bool


class LearnerReady(NamedTuple):
    counters: dict | None
    checkpoint: str | None
    version: int


class LearnerReport(NamedTuple):
    stats: dict
    version: int
    samples: int  # samples trained (or, sampling only, collected) since the last report
    busy_seconds: float  # time spent in gather + train since the last report


class PolicyReport(NamedTuple):
    policy_id: int
    samples: int
    busy_seconds: float  # time spent in inference since the last report


class CheckpointSaved(NamedTuple):
    path: str
    final: bool


class RolloutReport(NamedTuple):
    episodes: list[EpisodeStats]
    env_restarts: int
    steps_discarded: int


class ChildFailed(NamedTuple):
    name: str
    error: str
    traceback: str


class ChildError(RuntimeError):
    """A worker process failed; the message names it and its exception."""


# --- shared weights ---------------------------------------------------------------------


class SharedWeights:
    """The learner's newest weights in one flat shared tensor, with a version counter.

    A lock keeps a policy worker from reading weights half-written by the learner.
    """

    def __init__(self, model: torch.nn.Module, ctx):
        self.numel = sum(t.numel() for t in model.state_dict().values())
        self.flat = torch.zeros(self.numel, dtype=torch.float32).share_memory_()
        self._version = ctx.Value("q", -1, lock=False)
        self._lock = ctx.Lock()

    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        with torch.no_grad():
            parts = [t.detach().reshape(-1).float() for t in model.state_dict().values()]
            cpu = torch.cat(parts).cpu()
        with self._lock:
            self.flat.copy_(cpu)
            self._version.value = version

    def load_into(self, model: torch.nn.Module) -> int:
        with self._lock:
            flat = self.flat.clone()
            version = int(self._version.value)
        offset = 0
        with torch.no_grad():
            for tensor in model.state_dict().values():
                n = tensor.numel()
                tensor.copy_(flat[offset:offset + n].view_as(tensor))
                offset += n
        return version


# --- process plumbing -------------------------------------------------------------------


@dataclass
class Shared:
    """Everything the children receive: shared tensors, queues, flags."""

    cfg: Config
    info: EnvInfo
    layout: BufferLayout
    buffers: TrajectoryBuffers
    rnn_state: torch.Tensor
    weights: SharedWeights
    policy_queue: Any
    worker_queues: list
    learner_queue: Any
    runner_queue: Any
    stop: Any  # multiprocessing Event
    per_worker_buffers: int
    parent_pid: int
    worker_gen: Any  # int64 per rollout worker: restarts so far
    policy_epoch: Any  # int64: policy worker restarts so far
    heartbeat: Any  # float64 per rollout worker, then per policy worker: time.time() of the last sign of life
    policy_ticks: Any  # int64 per policy worker: loop turns

    def beat(self, slot: int) -> None:
        self.heartbeat[slot] = time.time()

    def mailboxes(self) -> list[Mailbox]:
        return [self.policy_queue, self.learner_queue, self.runner_queue, *self.worker_queues]

    def policy_slot(self, policy_id: int) -> int:
        """Heartbeat slot of a policy worker (rollout worker ``w`` has slot ``w``)."""
        return self.cfg.num_workers + policy_id


def _child_setup(name: str, threads: int) -> None:
    # Children ignore Ctrl-C: the runner stops them with a message and joins them, so that
    # every checkpoint and engine is closed in order. A new process group also keeps the
    # terminal's SIGINT away from their own children (the VizDoom engine processes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # `kill -USR1 <pid>` prints where a worker is (for a run that seems stuck).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        os.setpgrp()
    except OSError:
        pass
    try:
        from setproctitle import setproctitle

        setproctitle(name)
    except ImportError:
        pass
    torch.set_num_threads(threads)
    keep_freed_memory()


def _run_child(name: str, threads: int, target, shared: Shared, *args) -> None:
    _child_setup(name, threads)
    try:
        target(shared, *args)
    except BaseException as exc:  # noqa: BLE001 - report everything, then exit non-zero
        try:
            shared.runner_queue.put(ChildFailed(name, f"{type(exc).__name__}: {exc}",
                                                traceback.format_exc()), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        raise SystemExit(1) from None


def _should_stop(shared: Shared) -> bool:
    return shared.stop.is_set() or os.getppid() != shared.parent_pid


# --- the children -----------------------------------------------------------------------


def rollout_worker_main(shared: Shared, worker_id: int) -> None:
    from fastrl.rollout import RolloutWorker, StepOutput

    cfg = shared.cfg
    generation = int(shared.worker_gen[worker_id])
    envs = []
    worker = None
    try:
        for _ in range(cfg.num_envs_per_worker):
            shared.beat(worker_id)
            envs.append(create_env(cfg))
        first = worker_id * shared.per_worker_buffers
        per_round = None
        if not cfg.async_rl:
            per_round = (cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout) // cfg.num_envs
        seed = None
        if cfg.seed is not None:  # a restarted worker must not replay its predecessor's episodes
            seed = cfg.seed + 1_000_003 * generation
        worker = RolloutWorker(worker_id, envs, shared.buffers, shared.rnn_state,
                               list(range(first, first + shared.per_worker_buffers)),
                               cfg.worker_num_splits, reward_scale(cfg), cfg.reward_clip,
                               trajectories_per_round=per_round, seed=seed,
                               env_factory=lambda: create_env(cfg), env_timeout=cfg.env_timeout,
                               decorrelate=cfg.decorrelate_envs_on_one_worker,
                               generation=generation, epoch=int(shared.policy_epoch.value))
        envs = worker.envs  # the worker replaces faulty envs in this list; close what it holds
        inbox = shared.worker_queues[worker_id]
        report = RolloutReport([], 0, 0)
        last_report = time.time()
        faults_logged = 0

        def route(out: StepOutput) -> None:
            nonlocal report, faults_logged
            for line in out.faults:
                faults_logged += 1
                n = faults_logged
                if n <= 10 or n % 100 == 0:  # an env that fails all the time must not flood the log
                    log(f"fastrl-rollout-{worker_id}: {line}" + ("" if n <= 10 else f" (env fault {n} of this worker)"))
            if out.requests:
                shared.policy_queue.put_many(out.requests)
            if out.trajectories:
                shared.learner_queue.put_many(out.trajectories)
            if out.episodes or out.env_restarts:
                report = RolloutReport(report.episodes + out.episodes,
                                       report.env_restarts + out.env_restarts,
                                       report.steps_discarded + out.steps_discarded)

        shared.beat(worker_id)
        route(worker.start())
        while not _should_stop(shared):
            shared.beat(worker_id)
            for msg in inbox.get_many(POLL):
                if isinstance(msg, ActionsReady):
                    if worker.accepts(msg):
                        route(worker.on_actions(msg.split_id))
                elif isinstance(msg, BuffersFreed):
                    if msg.generation == generation:
                        route(worker.add_free_buffers(msg.buffers))
                elif isinstance(msg, Resume):
                    if msg.generation == generation:
                        route(worker.resume())
                elif isinstance(msg, Reissue):
                    route(worker.reissue(msg.epoch))
                else:
                    raise TypeError(f"rollout worker {worker_id}: unexpected message {msg!r}")
            if (report.episodes or report.env_restarts) and time.time() - last_report > 0.5:
                shared.runner_queue.put(report)
                report = RolloutReport([], 0, 0)
                last_report = time.time()
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - close every engine
                pass


def policy_worker_main(shared: Shared, policy_id: int) -> None:
    from fastrl.inference import PolicyWorker

    cfg = shared.cfg
    slot = shared.policy_slot(policy_id)
    shared.beat(slot)
    device = resolve_device(cfg.device)
    model = build_model(cfg, shared.info, device)
    model.eval()
    policy = PolicyWorker(model, shared.info.action_space, shared.buffers, shared.rnn_state,
                          device, weights=shared.weights,
                          precision=resolve_precision(cfg.precision, device))
    # Act only with the learner's weights (its checkpoint's, when resuming): wait for the
    # first publication instead of acting with this process's own random initialisation.
    while not _should_stop(shared):
        shared.beat(slot)
        policy.maybe_update_weights()
        if policy.has_weights:
            break
        time.sleep(0.01)
    busy, samples, last_report = 0.0, 0, time.time()
    while not _should_stop(shared):
        # The runner waits for this counter to move before it reuses a dead worker's slots:
        # a batch begun before a restart has then been written out.
        shared.policy_ticks[policy_id] += 1
        shared.beat(slot)
        requests = shared.policy_queue.get_many(POLL, 4096)
        if requests:
            epoch = shared.policy_epoch.value
            gens = shared.worker_gen
            requests = [r for r in requests if r.epoch == epoch and r.generation == gens[r.worker_id]]
        if requests:
            start = time.perf_counter()
            by_worker: dict[int, list[ActionsReady]] = {}
            for ready in policy.infer(requests):
                by_worker.setdefault(ready.worker_id, []).append(ready)
            for worker_id, msgs in by_worker.items():
                shared.worker_queues[worker_id].put_many(msgs)
            busy += time.perf_counter() - start
            samples += sum(len(r.buffers) for r in requests)
        if time.time() - last_report > 1.0:
            shared.runner_queue.put(PolicyReport(policy_id, samples, busy))
            busy, samples, last_report = 0.0, 0, time.time()


def learner_main(shared: Shared) -> None:
    from fastrl.learner import Learner

    cfg = shared.cfg
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    model = build_model(cfg, shared.info, device)
    learner = Learner(cfg, model, shared.info.action_space, device)
    counters, path = restore_learner(learner, cfg, shared.info, device)
    shared.weights.publish(learner.model, learner.version)
    shared.runner_queue.put(LearnerReady(counters, path, learner.version))

    per_worker = shared.per_worker_buffers
    n_batch = learner.trajectories_per_batch
    generations = list(shared.worker_gen)  # the incarnation of each rollout worker
    pending: list[int] = []
    samples = 0
    busy = 0.0
    last_report = time.time()
    stats: dict = {}

    def free(indices: list[int]) -> None:
        by_worker: dict[int, list[int]] = {}
        for b in indices:
            by_worker.setdefault(b // per_worker, []).append(b)
        for w, bufs in by_worker.items():
            shared.worker_queues[w].put(BuffersFreed(tuple(bufs), generations[w]))

    while not _should_stop(shared):
        for msg in shared.learner_queue.get_many(POLL):
            if isinstance(msg, TrajectoriesReady):
                if msg.generation == generations[msg.worker_id]:
                    pending.extend(msg.buffers)
            elif isinstance(msg, Fence):
                # Everything the dead worker sent came before this message: drop what of it
                # is not trained yet (its slots now belong to the next incarnation).
                w = msg.worker_id
                kept = [b for b in pending if b // per_worker != w]
                dropped = len(pending) - len(kept)  # one slot holds one trajectory
                pending = kept
                generations[w] = msg.generation
                shared.runner_queue.put(Fenced(w, msg.generation, dropped))
            elif isinstance(msg, SaveCheckpoint):
                if not cfg.sampling_only:
                    ckpt = checkpoint_state(cfg, shared.info, learner.state_dict(), msg.counters)
                    saved = save_checkpoint(cfg.experiment_dir, ckpt, cfg.keep_checkpoints)
                    shared.runner_queue.put(CheckpointSaved(saved, msg.final))
                else:
                    shared.runner_queue.put(CheckpointSaved("", msg.final))
            else:
                raise TypeError(f"learner: unexpected message {msg!r}")
        if cfg.sampling_only:
            if pending:
                samples += len(pending) * cfg.rollout
                free(pending)
                pending = []
        while len(pending) >= n_batch and not cfg.sampling_only:
            start = time.perf_counter()
            idx, pending = pending[:n_batch], pending[n_batch:]
            batch = shared.buffers.gather(idx, device)
            free(idx)  # the data is copied out: the slots can be refilled while we train
            stats = learner.train(batch)
            samples += n_batch * cfg.rollout
            shared.weights.publish(learner.model, learner.version)
            if not cfg.async_rl:
                for w, q in enumerate(shared.worker_queues):
                    q.put(Resume(learner.version, generations[w]))
            busy += time.perf_counter() - start
        if samples and time.time() - last_report > 0.5:
            shared.runner_queue.put(LearnerReport(stats, learner.version, samples, busy))
            samples, busy = 0, 0.0
            last_report = time.time()


# --- the runner -------------------------------------------------------------------------


@dataclass
class Child:
    """A child process the runner supervises, and how to start it again."""

    name: str
    kind: str  # "learner", "policy" or "rollout"
    index: int
    threads: int
    target: Any
    proc: Any = None
    failures: deque = field(default_factory=deque)  # times of its past crashes


class ParallelRunner:
    def __init__(self, cfg: Config, warmup_seconds: float = 0.0):
        self.cfg = cfg
        self.warmup_seconds = warmup_seconds
        self.ctx = tmp.get_context("spawn")
        self.children: dict[str, Child] = {}
        self.evaluator: PeriodicEvaluator | None = None
        self.stats: TrainingStats | None = None
        self.restart_workers = False  # on only while the training loop runs
        self._failures: dict[str, ChildFailed] = {}
        self._fenced: dict[int, int] = {}
        self._interrupted = False
        self._watchdog: threading.Thread | None = None
        self._watchdog_stop = threading.Event()

    def setup(self) -> Shared:
        """Validate, prepare the experiment folder and allocate every shared buffer and queue."""
        cfg = self.cfg
        resolve_device(cfg.device)  # fail early on a bad device
        self.exp_dir = prepare_experiment_dir(cfg)
        seed_everything(cfg.seed)
        info = probe_env(cfg)
        model = build_model(cfg, info, torch.device("cpu"))
        per_env = buffers_per_env(cfg, cfg.num_envs)
        layout = BufferLayout.from_spaces(info.obs_space, info.action_space,
                                          cfg.num_envs * per_env, cfg.rollout, model.rnn_state_size)
        _check_shm(layout)
        self.shared = Shared(
            cfg=cfg, info=info, layout=layout,
            buffers=TrajectoryBuffers(layout, shared=True),
            rnn_state=torch.zeros((cfg.num_envs, model.rnn_state_size)).share_memory_(),
            weights=SharedWeights(model, self.ctx),
            # Restartable workers' mailboxes get doorbells (see fastrl/mailbox.py).
            policy_queue=Mailbox(QUEUE_BYTES, doorbell=True),
            worker_queues=[Mailbox(QUEUE_BYTES, doorbell=True) for _ in range(cfg.num_workers)],
            learner_queue=Mailbox(QUEUE_BYTES, doorbell=False),
            runner_queue=Mailbox(QUEUE_BYTES, doorbell=False),
            stop=self.ctx.Event(),
            per_worker_buffers=cfg.num_envs_per_worker * per_env,
            parent_pid=os.getpid(),
            worker_gen=self.ctx.Array("q", cfg.num_workers, lock=False),
            policy_epoch=self.ctx.Value("q", 0, lock=False),
            heartbeat=self.ctx.Array("d", cfg.num_workers + cfg.num_policy_workers, lock=False),
            policy_ticks=self.ctx.Array("q", cfg.num_policy_workers, lock=False),
        )
        self._watchdog = threading.Thread(target=self._release_dead_locks, name="fastrl-lock-watchdog",
                                          daemon=True)
        self._watchdog.start()
        if cfg.eval_every_env_frames:
            # Evaluation plays in a thread of this process, on the CPU, with its own env.
            self.evaluator = PeriodicEvaluator(create_env(cfg), model, cfg.eval_every_env_frames,
                                               cfg.eval_episodes, cfg.eval_deterministic, "cpu",
                                               seed=cfg.seed)
        return self.shared

    def start_sampling(self) -> None:
        """Start the policy workers, then the rollout workers."""
        cfg = self.cfg
        for p in range(cfg.num_policy_workers):
            self._start(Child(f"fastrl-policy-{p}", "policy", p, cfg.policy_threads, policy_worker_main))
        for w in range(cfg.num_workers):
            self._start(Child(f"fastrl-rollout-{w}", "rollout", w, 1, rollout_worker_main))

    def run(self) -> dict:
        cfg = self.cfg
        stats = None
        reporter = None
        handlers = self._install_signal_handlers()
        try:
            shared = self.setup()
            self.stats = stats = TrainingStats(cfg, shared.info.frameskip)
            self._start(Child("fastrl-learner", "learner", 0, cfg.learner_threads, learner_main))
            ready = self._wait_for(LearnerReady, timeout=120)
            if ready.counters:
                restore_counters(stats, ready.counters, ready.version)
                log(f"resumed from {ready.checkpoint} at {stats.env_frames:,} frames")
            self.start_sampling()
            stats.start_time = time.time()
            reporter = Reporter(cfg, self.exp_dir, stats)
            device = resolve_device(cfg.device)
            mode = "sampling only" if cfg.sampling_only else ("async" if cfg.async_rl else "sync")
            layout = shared.layout
            log(f"parallel mode ({mode}): {cfg.env}, {cfg.num_workers} workers x {cfg.num_envs_per_worker} envs "
                f"in {cfg.worker_num_splits} splits, {cfg.num_policy_workers} policy worker(s), "
                f"device {device} ({resolve_precision(cfg.precision, device)}), {layout.num_buffers} trajectory buffers "
                f"({layout.nbytes() / 2**20:.0f} MiB), experiment {self.exp_dir}")
            self._loop(stats, reporter)
            summary = reporter.close()
            reporter = None
            print_final_summary(summary)
            return summary
        except KeyboardInterrupt:
            # Interrupted before training began: nothing to save.
            log("interrupted before training started")
            raise
        finally:
            if reporter is not None:
                reporter.close()
            self.shutdown()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)

    # -- signals ------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict:
        """Ctrl-C and SIGTERM: the first stops the run (checkpoint, clean shutdown), a second
        kills every child and exits at once."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum, frame) -> None:
        if self._interrupted:
            log(f"{signal.Signals(signum).name} again: killing every worker and exiting now")
            self._kill_all()
            os._exit(130)
        self._interrupted = True
        raise KeyboardInterrupt

    def _kill_all(self) -> None:
        for child in self.children.values():
            if child.proc is not None and child.proc.pid is not None:
                kill_group(child.proc.pid, wait=0.5)

    # -- supervision --------------------------------------------------------------------

    def _queues(self) -> list:
        return [box.q for box in self.shared.mailboxes()]

    def _release_dead_locks(self) -> None:
        """A thread: when a child dies holding a queue's lock, release it. This must not wait
        for the main loop, which may itself be blocked on that lock."""
        done: set[int] = set()
        while not self._watchdog_stop.wait(0.1):
            for child in list(self.children.values()):
                proc = child.proc
                if proc is not None and proc.pid not in done and proc.exitcode is not None:
                    done.add(proc.pid)
                    if release_queue_locks(self._queues(), proc.pid):
                        log(f"released a queue lock that {child.name} held when it died")

    def _slot(self, child: Child) -> int:
        return child.index if child.kind == "rollout" else self.shared.policy_slot(child.index)

    def _start(self, child: Child) -> None:
        if child.kind != "learner":
            self.shared.beat(self._slot(child))  # its clock starts now, not at its first beat
        args = (child.name, child.threads, child.target, self.shared)
        if child.kind != "learner":
            args += (child.index,)
        child.proc = self.ctx.Process(target=_run_child, args=args, name=child.name, daemon=False)
        child.proc.start()
        self.children[child.name] = child

    def _check_children(self) -> None:
        """Notice dead or hung children; restart workers or stop the run (raises ChildError)."""
        now = time.time()
        for child in list(self.children.values()):
            if self._check_exit(child):
                continue
            if child.kind != "learner" and now - self.shared.heartbeat[self._slot(child)] > self.cfg.worker_timeout:
                kill_group(child.proc.pid)
                child.proc.join(timeout=5)
                self._on_death(child, f"sent no heartbeat for {self.cfg.worker_timeout:.0f} s (hung) and was killed",
                               reported=False)

    def _check_exit(self, child: Child) -> bool:
        """If ``child`` has exited, handle its death (raises, or restarts it); say whether it had."""
        code = child.proc.exitcode
        if code is None:
            return False
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        # Only a child that exited by itself (code 1 after an exception) sends a report.
        self._on_death(child, f"died unexpectedly ({how})", reported=code > 0)
        return True

    def _on_death(self, child: Child, how: str, reported: bool) -> None:
        release_queue_locks(self._queues(), child.proc.pid)
        failure = self._take_failure(child.name, wait=1.0 if reported else 0.0)
        # What it left outside Python: env engines in its process group, their shared memory.
        kill_group(child.proc.pid)
        cause = f"failed: {failure.error}" if failure is not None else how
        if child.kind == "learner" or not self.restart_workers:
            raise ChildError(f"{child.name} {cause}")
        now = time.time()
        child.failures.append(now)
        while child.failures and now - child.failures[0] > self.cfg.restart_window:
            child.failures.popleft()
        if len(child.failures) > self.cfg.max_worker_restarts:
            raise ChildError(f"{child.name} {cause} ({len(child.failures)} failures within "
                             f"{self.cfg.restart_window:.0f} s; --max_worker_restarts={self.cfg.max_worker_restarts})")
        log(f"{child.name} {cause}; restarting it (restart {len(child.failures)} of at most "
            f"{self.cfg.max_worker_restarts} within {self.cfg.restart_window:.0f} s)")
        start = time.time()
        if child.kind == "rollout":
            self._restart_rollout(child)
        else:
            self._restart_policy(child)
        if self.stats is not None:
            self.stats.worker_restarts += 1
        log(f"{child.name} restarted in {time.time() - start:.1f} s")

    def _restart_rollout(self, child: Child) -> None:
        shared, w = self.shared, child.index
        generation = shared.worker_gen[w] + 1
        shared.worker_gen[w] = generation  # from now on policy workers drop its old requests
        ticks = list(shared.policy_ticks)
        shared.learner_queue.put(Fence(w, generation))
        self._pump_until(lambda: self._fenced.get(w) == generation, 120,
                         f"the learner to release {child.name}'s buffers")
        self._wait_policy_ticks(ticks)
        self._start(child)

    def _restart_policy(self, child: Child) -> None:
        shared = self.shared
        epoch = shared.policy_epoch.value + 1
        shared.policy_epoch.value = epoch  # requests from before are dropped from now on
        self._wait_policy_ticks(list(shared.policy_ticks), exclude=child.index)
        self._start(child)
        for q in shared.worker_queues:
            q.put(Reissue(epoch))

    def _wait_policy_ticks(self, ticks: list[int], exclude: int | None = None) -> None:
        """Wait until every live policy worker finished the batch it was in at ``ticks``."""
        for p, tick in enumerate(ticks):
            child = self.children.get(f"fastrl-policy-{p}")
            if p == exclude or child is None:
                continue
            deadline = time.time() + 10
            while self.shared.policy_ticks[p] < tick + 2 and child.proc.is_alive() and time.time() < deadline:
                time.sleep(0.005)

    def _pump_until(self, done, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        learner = self.children.get("fastrl-learner")
        while not done():
            if time.time() > deadline:
                raise ChildError(f"timed out after {timeout:.0f} s waiting for {what}")
            for msg in self.shared.runner_queue.get_many(POLL):
                self._handle(msg, self.stats)
            if learner is not None:
                self._check_exit(learner)

    def _take_failure(self, name: str, wait: float) -> ChildFailed | None:
        """The failure report of ``name``, waiting up to ``wait`` seconds for it to arrive."""
        deadline = time.time() + wait
        while name not in self._failures and time.time() < deadline:
            for msg in self.shared.runner_queue.get_many(POLL):
                self._handle(msg, self.stats)
        return self._failures.pop(name, None)

    def _wait_for(self, kind, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for msg in self.shared.runner_queue.get_many(POLL):
                if isinstance(msg, kind):
                    return msg
                self._handle(msg, self.stats)
            self._check_children()
        raise ChildError(f"timed out after {timeout:.0f} s waiting for {kind.__name__}")

    def _loop(self, stats: TrainingStats, reporter: Reporter) -> None:
        cfg = self.cfg
        last_save = time.time()
        warm = self.warmup_seconds <= 0
        if warm:
            stats.mark_warmup()
        frames_at_start = stats.env_frames
        self.restart_workers = cfg.max_worker_restarts > 0
        try:
            while stats.env_frames < cfg.train_for_env_steps and stats.run_seconds < cfg.train_for_seconds:
                for msg in self.shared.runner_queue.get_many(POLL):
                    self._handle(msg, stats)
                self._check_children()
                if not warm and stats.run_seconds >= self.warmup_seconds:
                    stats.mark_warmup()
                    warm = True
                reporter.maybe_report()
                if self.evaluator is not None:
                    self.evaluator.maybe_start(stats.env_frames, self.shared.weights)
                    for frames, result in self.evaluator.poll():
                        write_eval_summaries(reporter.writer, result, frames)
                        log(f"evaluation at {frames:,} frames: return {result.mean_return:.3f} "
                            f"+- {result.std_return:.3f} over {result.episodes} episodes")
                if not cfg.sampling_only and time.time() - last_save >= cfg.save_every_sec:
                    self.shared.learner_queue.put(SaveCheckpoint(stats.counters(), False))
                    last_save = time.time()
        except KeyboardInterrupt:
            log("interrupted: saving a checkpoint and stopping (interrupt again to quit at once)")
        self.restart_workers = False
        stats.end_measurement()
        if not cfg.sampling_only and stats.env_frames > frames_at_start:
            self._final_save(stats)

    def _handle(self, msg, stats: TrainingStats | None) -> None:
        if isinstance(msg, ChildFailed):
            log(f"{msg.name} failed; its traceback:\n{msg.traceback.rstrip()}")
            self._failures[msg.name] = msg
        elif isinstance(msg, Fenced):
            self._fenced[msg.worker_id] = msg.generation
            if stats is not None:
                stats.trajectories_discarded += msg.trajectories
        elif stats is None:
            return
        elif isinstance(msg, RolloutReport):
            for ep in msg.episodes:
                stats.add_episode(ep.episode_return, ep.length, ep.truncated)
            stats.env_restarts += msg.env_restarts
            stats.steps_discarded += msg.steps_discarded
        elif isinstance(msg, LearnerReport):
            stats.env_frames += msg.samples * stats.frameskip
            if msg.stats:
                stats.add_learner_stats(msg.stats, msg.version)
            if not self.cfg.sampling_only:
                stats.add_stage_time("learner", msg.samples, msg.busy_seconds)
        elif isinstance(msg, PolicyReport):
            stats.add_stage_time(f"policy_worker_{msg.policy_id}", msg.samples, msg.busy_seconds)
        elif isinstance(msg, CheckpointSaved):
            if msg.path:
                log(f"saved {msg.path}")

    def _final_save(self, stats: TrainingStats) -> None:
        self.shared.learner_queue.put(SaveCheckpoint(stats.counters(), True))
        deadline = time.time() + 60
        while time.time() < deadline:
            for msg in self.shared.runner_queue.get_many(POLL):
                if isinstance(msg, CheckpointSaved) and msg.final:
                    log(f"saved {msg.path}")
                    return
                self._handle(msg, stats)
            self._check_exit(self.children["fastrl-learner"])
        log("warning: the learner did not confirm the final checkpoint within 60 s")

    def shutdown(self) -> None:
        """Stop every child: a stop flag, a join with a timeout, then kill; then clear what
        each left behind (engines in its process group and their shared memory)."""
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
        self._watchdog_stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=2)
            self._watchdog = None
        if self.children:
            self.shared.stop.set()
            deadline = time.time() + 10
            procs = [(c.name, c.proc) for c in self.children.values()]
            for _, proc in procs:
                proc.join(timeout=max(0.1, deadline - time.time()))
            for name, proc in procs:
                if proc.is_alive():
                    log(f"{name} did not stop in time; killing it")
                kill_group(proc.pid)
                proc.join(timeout=3)
            self.children = {}
        shared = getattr(self, "shared", None)
        if shared is not None:  # the doorbell pipes
            for box in shared.mailboxes():
                box.close()


def _check_shm(layout: BufferLayout) -> None:
    need = layout.nbytes()
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise ExperimentError(
            f"trajectory buffers need {need / 2**20:.0f} MiB of shared memory but /dev/shm has "
            f"{free / 2**20:.0f} MiB free: lower --num_envs_per_worker, --num_workers, --rollout or --batch_size"
        )


def run_parallel(cfg: Config, warmup_seconds: float = 0.0) -> dict:
    return ParallelRunner(cfg, warmup_seconds).run()
