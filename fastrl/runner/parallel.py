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
then the policy workers, then the rollout workers; it watches every child's exit code on
each loop turn, so a crash is noticed at once and reported with the child's traceback.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.multiprocessing as tmp
from faster_fifo import Queue

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
from fastrl.messages import ActionsReady, EpisodeStats, TrajectoriesReady
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


class Resume(NamedTuple):
    """Sync mode: new weights are published; start the next round."""

    version: int


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


class EpisodesReport(NamedTuple):
    episodes: list[EpisodeStats]


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


def _child_setup(name: str, threads: int) -> None:
    # Children ignore Ctrl-C: the runner stops them with a message and joins them, so that
    # every checkpoint and engine is closed in order. A new process group also keeps the
    # terminal's SIGINT away from their own children (the VizDoom engine processes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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


def _get_many(q, max_messages: int = 1024) -> list:
    try:
        return q.get_many(block=True, timeout=POLL, max_messages_to_get=max_messages)
    except queue.Empty:
        return []


# --- the children -----------------------------------------------------------------------


def rollout_worker_main(shared: Shared, worker_id: int) -> None:
    from fastrl.rollout import RolloutWorker, StepOutput

    cfg = shared.cfg
    envs = []
    worker = None
    try:
        for _ in range(cfg.num_envs_per_worker):
            envs.append(create_env(cfg))
        first = worker_id * shared.per_worker_buffers
        per_round = None
        if not cfg.async_rl:
            per_round = (cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout) // cfg.num_envs
        worker = RolloutWorker(worker_id, envs, shared.buffers, shared.rnn_state,
                               list(range(first, first + shared.per_worker_buffers)),
                               cfg.worker_num_splits, reward_scale(cfg), cfg.reward_clip,
                               trajectories_per_round=per_round,
                               seed=None if cfg.seed is None else cfg.seed)
        inbox = shared.worker_queues[worker_id]
        episodes: list[EpisodeStats] = []
        last_report = time.time()

        def route(out: StepOutput) -> None:
            if out.requests:
                shared.policy_queue.put_many(out.requests, block=True, timeout=10)
            if out.trajectories:
                shared.learner_queue.put_many(out.trajectories, block=True, timeout=10)
            episodes.extend(out.episodes)

        route(worker.start())
        while not _should_stop(shared):
            for msg in _get_many(inbox):
                if isinstance(msg, ActionsReady):
                    route(worker.on_actions(msg.split_id))
                elif isinstance(msg, BuffersFreed):
                    route(worker.add_free_buffers(msg.buffers))
                elif isinstance(msg, Resume):
                    route(worker.resume())
                else:
                    raise TypeError(f"rollout worker {worker_id}: unexpected message {msg!r}")
            if episodes and time.time() - last_report > 0.5:
                shared.runner_queue.put(EpisodesReport(episodes), timeout=10)
                episodes = []
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
    device = resolve_device(cfg.device)
    model = build_model(cfg, shared.info, device)
    model.eval()
    policy = PolicyWorker(model, shared.info.action_space, shared.buffers, shared.rnn_state,
                          device, weights=shared.weights,
                          precision=resolve_precision(cfg.precision, device))
    policy.maybe_update_weights()
    busy, samples, last_report = 0.0, 0, time.time()
    while not _should_stop(shared):
        requests = _get_many(shared.policy_queue, max_messages=4096)
        if requests:
            start = time.perf_counter()
            by_worker: dict[int, list[ActionsReady]] = {}
            for ready in policy.infer(requests):
                by_worker.setdefault(ready.worker_id, []).append(ready)
            for worker_id, msgs in by_worker.items():
                shared.worker_queues[worker_id].put_many(msgs, block=True, timeout=10)
            busy += time.perf_counter() - start
            samples += sum(len(r.buffers) for r in requests)
        if time.time() - last_report > 1.0:
            shared.runner_queue.put(PolicyReport(policy_id, samples, busy), timeout=10)
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
    shared.runner_queue.put(LearnerReady(counters, path, learner.version), timeout=10)

    per_worker = shared.per_worker_buffers
    n_batch = learner.trajectories_per_batch
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
            shared.worker_queues[w].put(BuffersFreed(tuple(bufs)), timeout=10)

    while not _should_stop(shared):
        for msg in _get_many(shared.learner_queue):
            if isinstance(msg, TrajectoriesReady):
                pending.extend(msg.buffers)
            elif isinstance(msg, SaveCheckpoint):
                if not cfg.sampling_only:
                    ckpt = checkpoint_state(cfg, shared.info, learner.state_dict(), msg.counters)
                    saved = save_checkpoint(cfg.experiment_dir, ckpt, cfg.keep_checkpoints)
                    shared.runner_queue.put(CheckpointSaved(saved, msg.final), timeout=10)
                else:
                    shared.runner_queue.put(CheckpointSaved("", msg.final), timeout=10)
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
                for q in shared.worker_queues:
                    q.put(Resume(learner.version), timeout=10)
            busy += time.perf_counter() - start
        if samples and time.time() - last_report > 0.5:
            shared.runner_queue.put(LearnerReport(stats, learner.version, samples, busy), timeout=10)
            samples, busy = 0, 0.0
            last_report = time.time()


# --- the runner -------------------------------------------------------------------------


class ParallelRunner:
    def __init__(self, cfg: Config, warmup_seconds: float = 0.0):
        self.cfg = cfg
        self.warmup_seconds = warmup_seconds
        self.ctx = tmp.get_context("spawn")
        self.procs: list[tuple[str, Any]] = []
        self.evaluator: PeriodicEvaluator | None = None

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
            policy_queue=Queue(QUEUE_BYTES),
            worker_queues=[Queue(QUEUE_BYTES) for _ in range(cfg.num_workers)],
            learner_queue=Queue(QUEUE_BYTES),
            runner_queue=Queue(QUEUE_BYTES),
            stop=self.ctx.Event(),
            per_worker_buffers=cfg.num_envs_per_worker * per_env,
            parent_pid=os.getpid(),
        )
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
            self._start(f"fastrl-policy-{p}", cfg.policy_threads, policy_worker_main, p)
        for w in range(cfg.num_workers):
            self._start(f"fastrl-rollout-{w}", 1, rollout_worker_main, w)

    def run(self) -> dict:
        cfg = self.cfg
        stats = None
        reporter = None
        try:
            shared = self.setup()
            stats = TrainingStats(cfg, shared.info.frameskip)
            self._start("fastrl-learner", cfg.learner_threads, learner_main)
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
        finally:
            if reporter is not None:
                reporter.close()
            self.shutdown()

    # -- supervision --------------------------------------------------------------------

    def _start(self, name: str, threads: int, target, *args) -> None:
        proc = self.ctx.Process(target=_run_child, args=(name, threads, target, self.shared, *args),
                                name=name, daemon=False)
        proc.start()
        self.procs.append((name, proc))

    def _check_children(self) -> None:
        for name, proc in self.procs:
            if proc.exitcode is not None:
                failure = self._drain_failure(name)
                if failure is not None:
                    raise failure
                code = proc.exitcode
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                raise ChildError(f"{name} died unexpectedly ({how})")

    def _drain_failure(self, name: str) -> ChildError | None:
        deadline = time.time() + 2.0
        while time.time() < deadline:
            for msg in _get_many(self.shared.runner_queue):
                if isinstance(msg, ChildFailed):
                    return self._failure(msg)
        return None

    def _failure(self, msg: ChildFailed) -> ChildError:
        log(f"{msg.name} failed; its traceback:\n{msg.traceback.rstrip()}")
        return ChildError(f"{msg.name} failed: {msg.error}")

    def _wait_for(self, kind, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for msg in _get_many(self.shared.runner_queue):
                if isinstance(msg, ChildFailed):
                    raise self._failure(msg)
                if isinstance(msg, kind):
                    return msg
            self._check_children()
        raise ChildError(f"timed out after {timeout:.0f} s waiting for {kind.__name__}")

    def _loop(self, stats: TrainingStats, reporter: Reporter) -> None:
        cfg = self.cfg
        last_save = time.time()
        warm = self.warmup_seconds <= 0
        if warm:
            stats.mark_warmup()
        frames_at_start = stats.env_frames
        try:
            while stats.env_frames < cfg.train_for_env_steps and stats.run_seconds < cfg.train_for_seconds:
                for msg in _get_many(self.shared.runner_queue):
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
                    self.shared.learner_queue.put(SaveCheckpoint(stats.counters(), False), timeout=10)
                    last_save = time.time()
        except KeyboardInterrupt:
            log("interrupted: saving a checkpoint and stopping (Ctrl-C again to quit at once)")
            signal.signal(signal.SIGINT, signal.default_int_handler)
        stats.end_measurement()
        if not cfg.sampling_only and stats.env_frames > frames_at_start:
            self._final_save(stats)

    def _handle(self, msg, stats: TrainingStats) -> None:
        if isinstance(msg, EpisodesReport):
            for ep in msg.episodes:
                stats.add_episode(ep.episode_return, ep.length)
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
        elif isinstance(msg, ChildFailed):
            raise self._failure(msg)

    def _final_save(self, stats: TrainingStats) -> None:
        self.shared.learner_queue.put(SaveCheckpoint(stats.counters(), True), timeout=10)
        deadline = time.time() + 60
        while time.time() < deadline:
            for msg in _get_many(self.shared.runner_queue):
                if isinstance(msg, CheckpointSaved) and msg.final:
                    log(f"saved {msg.path}")
                    return
                self._handle(msg, stats)
            self._check_children()
        log("warning: the learner did not confirm the final checkpoint within 60 s")

    def shutdown(self) -> None:
        """Stop every child: a stop flag, a join with a timeout, then terminate, then kill."""
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
        if not self.procs:
            return
        self.shared.stop.set()
        deadline = time.time() + 10
        for _, proc in self.procs:
            proc.join(timeout=max(0.1, deadline - time.time()))
        for name, proc in self.procs:
            if proc.is_alive():
                log(f"{name} did not stop in time; terminating it")
                proc.terminate()
                proc.join(timeout=3)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=3)
        self.procs = []


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
