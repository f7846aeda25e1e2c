"""The runner's side of a run, the same in serial and parallel mode: keep the statistics
from the stations' reports, print progress, evaluate, ask the learner for checkpoints, and
stop on the frame or time budget, on Ctrl-C, or (``--env_check strict``) on an env's bad
output.

Each mode gives it one callable, ``turn``, called on every loop iteration: serial mode
polls its three stations there; parallel mode checks on its child processes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from fastrl.errors import EnvOutputError, ExperimentError
from fastrl.experiment.checkpoint import (
    BestKeeper,
    best_checkpoint_path,
    load_checkpoint,
    saved_best,
)
from fastrl.experiment.evaluation import EvalResult, PeriodicEvaluator, write_eval_summaries
from fastrl.experiment.reporter import Reporter, earlier_final_evaluation
from fastrl.experiment.stats import TrainingStats
from fastrl.log import log
from fastrl.runner.wiring import Wiring
from fastrl.transport.messages import (
    CheckpointSaved,
    EnvCheckFailed,
    Fenced,
    LearnerReport,
    NodeLost,
    NodeReport,
    PbtReplaced,
    PolicyReport,
    ReportNow,
    RolloutReport,
    SaveCheckpoint,
)
from fastrl.transport.signals import SAVE_SIGNAL, LauncherSignals

FINAL_SAVE_TIMEOUT = 60.0
# The final evaluation stops after this many times the run's longest evaluation, and no
# sooner than FINAL_EVAL_MIN_SECONDS or this share of the run's own seconds (an env whose
# episodes never end would hold the run; long episodes take long).
FINAL_EVAL_CAP = 3.0
FINAL_EVAL_MIN_SECONDS = 300.0
FINAL_EVAL_RUN_SHARE = 0.1


class RunLoop:
    """Args:
        turn: called once per iteration (see the module docstring).
        note: sees every runner-queue message first (the parallel supervisor's failure
            reports and fence confirmations); None in serial mode.
        poll_timeout: how long one read of the runner queue may wait (0 in serial mode,
            where nothing arrives while this process waits).
        evaluate_in_thread: parallel mode evaluates in a thread beside the loop; serial
            mode evaluates in place, between two polls of the stations.
        pbt: the population (``--with_pbt``, fastrl/algo/pbt/population.py): it sees every
            episode and exchanges policies between two turns when due.
    """

    def __init__(self, wiring: Wiring, stats: TrainingStats, reporter: Reporter,
                 turn: Callable[[], None], note: Callable[[object], None] | None = None,
                 poll_timeout: float = 0.0, evaluator: PeriodicEvaluator | None = None,
                 evaluate_in_thread: bool = False, warmup_seconds: float = 0.0,
                 signals: LauncherSignals | None = None, pbt=None):
        self.wiring = wiring
        self.cfg = wiring.cfg
        self.stats = stats
        self.reporter = reporter
        self.turn = turn
        self.note = note
        self.poll_timeout = poll_timeout
        self.evaluator = evaluator
        self.evaluate_in_thread = evaluate_in_thread
        self.warmup_seconds = warmup_seconds
        self.signals = signals
        self.pbt = stats.pbt = pbt
        # --save_best, made when the run starts: each policy's best so far (a resumed run's
        # from its best.pt), and the recent returns it is judged on: under PBT, those of the
        # episodes its current weights played whole (the population's version floor)
        self.best: BestKeeper | None = None
        self._best_windows: list[deque[float]] = []
        self.interrupted = False  # stopped by a signal (Ctrl-C...), not by the budget
        self.final_checkpoints: dict[int, str] = {}  # policy -> its final checkpoint's path

    def handle(self, msg) -> None:
        """Apply one runner-queue message to the statistics."""
        if self.note is not None:
            self.note(msg)
        stats = self.stats
        if isinstance(msg, RolloutReport):
            for ep in msg.episodes:
                stats.add_episode(ep.episode_return, ep.length, ep.truncated, ep.metrics,
                                  ep.policy)
                if self._best_windows and (self.pbt is None
                                           or ep.version >= self.pbt.floor[ep.policy]):
                    self._best_windows[ep.policy].append(ep.episode_return)
                if self.pbt is not None:
                    self.pbt.add_episode(ep.policy, ep.episode_return, ep.metrics, ep.version)
            stats.env_restarts += msg.env_restarts
            stats.env_recycles += msg.env_recycles
            stats.steps_discarded += msg.steps_discarded
            stats.add_env_faults(msg.faults)
            stats.add_busy("env", msg.busy_seconds)
            stats.splits_held += msg.splits_held
            stats.splits_begun += msg.splits_begun
        elif isinstance(msg, LearnerReport):
            stats.add_learner_frames(msg.samples * stats.frameskip, msg.policy)
            if msg.stats:
                stats.add_learner_stats(msg.stats, msg.version, msg.policy, msg.lags)
            if not self.cfg.sampling_only:
                stats.add_stage_time("learner", msg.samples, msg.busy_seconds)
            stats.add_busy("learner", msg.busy_seconds)
            if msg.stale and self.pbt is not None:
                self.pbt.add_stale(msg.policy, msg.stale)
        elif isinstance(msg, PbtReplaced):
            self.pbt.confirmed(msg)
        elif isinstance(msg, PolicyReport):
            stats.add_stage_time(f"policy_worker_{msg.policy_id}", msg.samples,
                                 msg.busy_seconds)
            stats.add_busy("inference", msg.busy_seconds)
        elif isinstance(msg, Fenced):
            stats.trajectories_discarded += msg.trajectories
            if stats.nodes:  # rollout worker k stands for sampler node k
                stats.nodes[msg.worker_id].trajectories_dropped += msg.trajectories
        elif isinstance(msg, NodeReport):
            stats.nodes[msg.node].report(msg.connected, msg.trajectories, msg.lag_mean,
                                         msg.lag_max)
            stats.add_busy("transfer", msg.busy_seconds)
        elif isinstance(msg, NodeLost):
            node = stats.nodes[msg.node]
            node.losses += 1
            node.trajectories_dropped += msg.in_flight
            stats.trajectories_discarded += msg.in_flight
            log(f"sampler node {msg.node} lost (connection {msg.generation}: {msg.cause}); "
                f"{node.trajectories_dropped} of its trajectories dropped so far; training "
                "goes on with the other nodes")
        elif isinstance(msg, EnvCheckFailed):
            raise EnvOutputError(f"fastrl-rollout-{msg.worker_id}: {msg.error}")
        elif isinstance(msg, CheckpointSaved) and msg.path:
            if msg.best is None:
                log(f"saved {msg.path}")
            else:  # (one line at the end, not one a write)
                stats.best_checkpoints[msg.policy] = {
                    "mean_return": msg.best, "episodes": self.cfg.stats_avg,
                    "env_frames": msg.env_frames}

    def drain(self, timeout: float) -> None:
        for msg in self.wiring.runner_queue.get_many(timeout):
            self.handle(msg)

    def run(self) -> bool:
        """Until the budget is spent or Ctrl-C; return whether a final checkpoint is due."""
        cfg, stats = self.cfg, self.stats
        last_save = time.monotonic()
        if cfg.save_best and not cfg.sampling_only:
            policies = range(self.wiring.num_policies)
            self.best = BestKeeper([self._saved_best(p) for p in policies], cfg.stats_avg,
                                   cfg.save_best_every_sec)
            self._best_windows = [deque(maxlen=cfg.stats_avg) for _ in policies]
        warm = self.warmup_seconds <= 0
        if warm:
            stats.mark_warmup()
        frames_at_start = stats.env_frames
        # (read before this run's own summaries replace the file)
        earlier = earlier_final_evaluation(cfg.experiment_dir)
        try:
            while (stats.env_frames < cfg.train_for_env_steps
                   and stats.run_seconds < cfg.train_for_seconds):
                self.turn()
                self.drain(self.poll_timeout)
                if self.pbt is not None:
                    self._exchange()
                if not warm and stats.run_seconds >= self.warmup_seconds:
                    stats.mark_warmup()
                    warm = True
                self.reporter.maybe_report()
                self._keep_best()
                self._evaluate()
                asked = self.signals is not None and self.signals.take_save_request()
                if asked and cfg.sampling_only:
                    log(f"{SAVE_SIGNAL.name}: nothing to save (sampling only)")
                elif asked or (not cfg.sampling_only
                               and time.monotonic() - last_save >= cfg.save_every_sec):
                    if asked:
                        log(f"{SAVE_SIGNAL.name}: saving a checkpoint now; training goes on")
                    self.ask_to_save(final=False)
                    last_save = time.monotonic()
        except KeyboardInterrupt:
            self.interrupted = True
            by = (self.signals.stopped_by if self.signals is not None else None) or "SIGINT"
            log(f"interrupted ({by}): saving a checkpoint and stopping (a second signal quits "
                "at once)")
        if self.signals is not None:
            self.signals.stopping()
        stats.end_measurement()
        trained = not cfg.sampling_only and stats.env_frames > frames_at_start
        if not trained:  # the final checkpoint is an earlier run's, and so is its evaluation
            stats.final_evaluation = earlier
        return trained

    def collect_last_reports(self, workers: range, timeout: float,
                             alive: Callable[[int], bool] = lambda w: True) -> list[int]:
        """Once the budget is spent: ask each rollout worker in ``workers`` for the episodes
        it holds (it reports every ``REPORT_EVERY["rollout"]`` s; a run shorter than that
        ended with none counted) and read the runner queue until each has answered, or
        ``timeout`` s passed; return those that did not (dead, or stuck in an env call).
        A worker that is not ``alive`` is not waited for. Every message read meanwhile is
        handled as in the run; the children are not checked here (a worker that died at the
        end does not fail the finished run). The learners go on training while this waits,
        which is why the wait is short."""
        waiting, dead = set(workers), set()
        for w in waiting:
            self.wiring.worker_queues[w].put(ReportNow())
        deadline = time.monotonic() + timeout
        while waiting:
            dead |= {w for w in waiting if not alive(w)}
            waiting -= dead
            if not waiting:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for msg in self.wiring.runner_queue.get_many(min(self.poll_timeout, left)):
                if isinstance(msg, RolloutReport) and msg.final:
                    waiting.discard(msg.worker)
                self.handle(msg)
        return sorted(waiting | dead)

    def ask_to_save(self, final: bool) -> None:
        """Ask every policy's learner for a checkpoint with the run's counters."""
        msg = SaveCheckpoint(self.stats.counters(), final)
        for q in self.wiring.learner_queues:
            q.put(msg)

    def final_save(self, turn: Callable[[], None]) -> None:
        """Ask every learner for the final checkpoint and wait for each (``turn`` keeps the
        learners going in serial mode and notices a death in parallel mode)."""
        self._keep_best(last=True)  # (the learner writes it before the final one)
        self.ask_to_save(final=True)
        waiting = set(range(self.wiring.num_policies))
        deadline = time.monotonic() + FINAL_SAVE_TIMEOUT
        while time.monotonic() < deadline:
            turn()
            for msg in self.wiring.runner_queue.get_many(self.poll_timeout):
                if isinstance(msg, CheckpointSaved) and msg.final:
                    log(f"saved {msg.path}")
                    self.final_checkpoints[msg.policy] = msg.path
                    waiting.discard(msg.policy)
                else:
                    self.handle(msg)
            if not waiting:
                break
        else:
            who = ("the learner" if self.wiring.num_policies == 1 else
                   "the learners of policies " + ", ".join(map(str, sorted(waiting))))
            log(f"warning: {who} did not confirm the final checkpoint within "
                f"{FINAL_SAVE_TIMEOUT:.0f} s")
        self.log_best()

    def _exchange(self) -> None:
        """PBT's exchange, when due; a replaced policy's best is judged again only on
        episodes its new weights play whole (the population's floor keeps the others out)."""
        for replaced, _ in self.pbt.maybe_exchange(self.stats.env_frames):
            if self._best_windows:
                self._best_windows[replaced].clear()

    def _keep_best(self, last: bool = False) -> None:
        """Ask a policy's learner for a best checkpoint when its recent mean return is a new
        high (``BestKeeper``); ``last``: the run's end, whatever the period."""
        if self.best is None:
            return
        stats = self.stats
        for policy, value in self.best.due(time.monotonic(), self._best_windows, last):
            self.wiring.learner_queues[policy].put(
                SaveCheckpoint(stats.counters(), False, value))

    def _saved_best(self, policy: int) -> float | None:
        """The mean return of ``policy``'s best checkpoint from an earlier run, for this run to
        beat (named in the log and carried into summary.json); None where there is none, or
        where it averaged another number of episodes than ``--stats_avg`` (then this run's
        first full window replaces it: the two means are not comparable)."""
        saved = saved_best(self.cfg.experiment_dir, policy)
        if saved is None:
            return None
        who = f"policy {policy}'s " if self.wiring.num_policies > 1 else ""
        path = best_checkpoint_path(self.cfg.experiment_dir, policy)
        self.stats.best_checkpoints[policy] = saved  # (until this run writes one)
        if saved["episodes"] != self.cfg.stats_avg:
            log(f"resume: {who}best checkpoint {path} averaged {saved['episodes']} episodes "
                f"(mean return {saved['mean_return']:.3f}), this run --stats_avg "
                f"{self.cfg.stats_avg}: the means do not compare, so this run's first full "
                "window replaces it")
            return None
        log(f"resume: {who}best checkpoint so far has mean return {saved['mean_return']:.3f} "
            f"at {saved['env_frames']:,} frames; only a higher one replaces it")
        return saved["mean_return"]

    def log_best(self) -> None:
        """One line per policy with a best checkpoint (this run's, or an earlier one's that
        this run did not beat)."""
        for policy, best in sorted(self.stats.best_checkpoints.items()):
            who = f"policy {policy}'s " if self.wiring.num_policies > 1 else ""
            log(f"{who}best checkpoint: mean return {best['mean_return']:.3f} over the last "
                f"{best['episodes']} episodes, at {best['env_frames']:,} frames "
                f"({best_checkpoint_path(self.cfg.experiment_dir, policy)}; "
                "enjoy.py --best plays it)")

    def _evaluate(self) -> None:
        ev = self.evaluator
        if ev is None:
            return
        frames = self.stats.env_frames
        if self.evaluate_in_thread:
            ev.maybe_start(frames, self.wiring.weights)
            results = ev.poll()
        else:
            result = ev.maybe_evaluate(frames, self.wiring.weights)
            results = [] if result is None else [(frames, result)]
        self._log_evaluations(results)

    def _log_evaluations(self, results: list[tuple[int, EvalResult]], what: str = "") -> None:
        for at, result in results:
            write_eval_summaries(self.reporter.writer, result, at)
            log(f"{what}evaluation at {at:,} frames: return {result.mean_return:.3f} "
                f"+- {result.std_return:.3f} over {result.episodes} episodes"
                + (f" (video {result.video})" if result.video else ""))

    def final_evaluation(self) -> None:
        """``--eval_every_env_frames``, once the budget is spent and the final checkpoint
        saved: play that checkpoint's weights for ``--eval_episodes`` (blocking), log the
        result, write it to TensorBoard at the frames it was trained on and to the summary.
        Its time is no part of the run's (seconds, FPS). Not after a stop signal; a stop
        signal during it, or ``FINAL_EVAL_CAP`` times the run's longest evaluation (at
        least ``FINAL_EVAL_MIN_SECONDS`` and ``FINAL_EVAL_RUN_SHARE`` of the run's seconds),
        cuts it short."""
        ev, path = self.evaluator, self.final_checkpoints.get(0)
        if ev is None or path is None or self.interrupted:
            return
        if self.evaluate_in_thread:
            self._log_evaluations(ev.poll())  # (those that finished before the end)
        try:
            state = load_checkpoint(path, mmap=True)  # (not a replay store's rows)
        except ExperimentError as exc:  # (the run is over and saved: say so, end cleanly)
            log(f"final evaluation skipped: {exc}")
            return
        frames = int(state["counters"]["env_frames"])
        cap = max(FINAL_EVAL_MIN_SECONDS, FINAL_EVAL_CAP * ev.longest_seconds,
                  FINAL_EVAL_RUN_SHARE * self.stats.run_seconds)
        log(f"final evaluation: {ev.num_episodes} episodes of {path} (at most {cap:.0f} s; a "
            "stop signal cuts it short)")
        signals, deadline = self.signals, time.monotonic() + cap

        def signalled() -> bool:
            return signals is not None and signals.stopped_by is not None

        with self.stats.paused():
            result = ev.evaluate_final(frames, state["learner"]["model"],
                                       lambda: signalled() or time.monotonic() > deadline)
        if result is None:
            why = "by a signal" if signalled() else f"after {cap:.0f} s"
            log(f"final evaluation stopped {why}: the summary has none")
            return
        self._log_evaluations([(frames, result)], "final ")
        self.stats.final_evaluation = {
            "checkpoint": path, "env_frames": frames, "episodes": result.episodes,
            "mean_return": result.mean_return, "std_return": result.std_return,
            "deterministic": ev.deterministic}
