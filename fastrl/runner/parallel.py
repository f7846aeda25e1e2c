"""Parallel mode: each station in its own process, over shared memory and faster-fifo queues.

``build_wiring`` (``fastrl/runner/wiring.py``) allocates every buffer and queue once, before
any process starts, and says who talks to whom. The children are thin shells: each builds
its station (``fastrl/runner/stations.py``) and polls it until told to stop. This process
starts the learner, the policy workers and the rollout workers together: the learner restores
a checkpoint and publishes the weights while the workers start their envs, and the policy
workers act only once the weights are there (sampler nodes start once the learner is ready);
it keeps the statistics from their reports
(``fastrl/runner/run_loop.py``, shared with serial mode) and checks on every child each loop
turn, so that a crash or a hang is noticed at once (``fastrl/runner/supervisor.py``).

Faults (docs/reliability.md has the whole story): a learner failure stops the run with the
learner's traceback; a rollout or policy worker that dies or hangs is killed with its
process group (the env engines it started) and restarted, up to --max_worker_restarts
times per --restart_window, its stale data fenced off. Ctrl-C or SIGTERM saves a checkpoint
and stops; a second one kills everything at once.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import torch

from fastrl.algo.pbt.population import PbtSettings, Population
from fastrl.config.settings import Config
from fastrl.device import check_learner_devices
from fastrl.errors import ExperimentError
from fastrl.experiment.checkpoint import restore_counters
from fastrl.experiment.evaluation import PeriodicEvaluator
from fastrl.experiment.folder import prepare_experiment_dir, undone_if_refused
from fastrl.experiment.reporter import Reporter, ReportSettings, print_final_summary
from fastrl.experiment.stats import StatsSettings, TrainingStats
from fastrl.experiment.wandb_run import WandbRun, start_wandb
from fastrl.log import log
from fastrl.runner.children import POLL, start_learners, start_sampling
from fastrl.runner.link import NodeLink, host_store, publish_config
from fastrl.runner.memory import MemoryBudget, buffers_per_env, memory_budget
from fastrl.runner.process_setup import seed_everything
from fastrl.runner.run_loop import RunLoop
from fastrl.runner.run_start import (
    announce_inputs,
    announce_recipe,
    build_model,
    check_env_settings,
    start_evaluator,
)
from fastrl.runner.sampler_node import local_node_main
from fastrl.runner.supervisor import Child, ChildError, Supervisor
from fastrl.runner.wiring import Wiring, build_wiring
from fastrl.sampling.env_setup import EnvSettings, probe_env
from fastrl.transport.messages import ChildFailed, Fenced, LearnerReady
from fastrl.transport.procs import check_queue_layout, kill_descendants
from fastrl.transport.signals import LauncherSignals, quit_status
from fastrl.transport.startup import process_context

__all__ = ["ChildError", "ParallelRunner", "run_parallel"]


# --- the runner -------------------------------------------------------------------------

# How long the runner waits for the rollout workers' last reports after the budget. A worker
# answers before its next env step (within a poll of 0.05 s when its envs are quick); one in a
# slow env call is not waited for longer, since the learners train on meanwhile.
LAST_REPORTS_TIMEOUT = 1.0


class ParallelRunner:
    def __init__(self, cfg: Config, warmup_seconds: float = 0.0):
        self.cfg = cfg
        self.warmup_seconds = warmup_seconds
        self.ctx = process_context()
        self.shared: Wiring | None = None
        self.supervisor: Supervisor | None = None
        self.evaluator: PeriodicEvaluator | None = None
        self.loop: RunLoop | None = None
        self.exp_dir: str | None = None
        self.signals = LauncherSignals(self._quit_now)
        self.store = None  # the learner node's store, where sampler nodes connect
        self.links: list[NodeLink] = []
        self.budget: MemoryBudget | None = None  # the trajectory buffers' (runner/memory.py)
        self.wandb_run: WandbRun | None = None  # --with_wandb

    # The tests drive these directly (they play the learner).
    @property
    def restart_workers(self) -> bool:
        return self.supervisor.restart_workers

    @restart_workers.setter
    def restart_workers(self, on: bool) -> None:
        self.supervisor.restart_workers = on

    @property
    def children(self) -> dict:
        return self.supervisor.children

    def _check_children(self) -> None:
        self.supervisor.check_children()

    def setup(self) -> Wiring:
        """Validate, prepare the experiment folder and allocate every shared buffer and queue."""
        cfg = self.cfg
        check_learner_devices(cfg.device, cfg.num_learners)  # fail early on a bad device
        seed_everything(cfg.seed)
        info = probe_env(EnvSettings.from_config(cfg))
        check_env_settings(cfg, info)
        announce_recipe(cfg, info)
        model = build_model(cfg, info, torch.device("cpu"))
        announce_inputs(info, model)
        self.budget = memory_budget()  # before the buffers take their share (for the log)
        if cfg.num_sampler_nodes:
            # Sampler node k plays rollout worker k: it owns the slots of a node's envs. Each
            # node fills one slot per env of its own, so together they hold what one machine's
            # slots would, unless that is less than a whole batch per node: training must go
            # on while only one node is connected.
            slots = cfg.num_envs * info.num_agents  # a node's env slots
            slots_per_env = max(buffers_per_env(cfg, cfg.num_sampler_nodes * slots) - 1,
                                -(-cfg.trajectories_per_batch // slots) + 1)
            self.shared = wiring = build_wiring(cfg, info, model, cfg.num_sampler_nodes,
                                                cfg.num_envs, ctx=self.ctx,
                                                slots_per_env=slots_per_env)
            try:
                self.store = host_store(cfg.node_port)
            except RuntimeError as exc:
                raise ExperimentError(f"--node_port={cfg.node_port}: cannot listen there "
                                      f"({str(exc).splitlines()[0]})") from None
            publish_config(self.store, cfg)
            wiring.node_port = self.store.port
        else:
            self.shared = wiring = build_wiring(cfg, info, model, cfg.num_workers,
                                                cfg.num_envs_per_worker, ctx=self.ctx)
        # Only a run that passed its checks (build_wiring's of the shared memory too, and the
        # W&B run's start) gets a folder and a config.json (a refused one would leave a config
        # that the next bare command resumes).
        with undone_if_refused(cfg):
            self.exp_dir = prepare_experiment_dir(cfg)
            self.wandb_run = start_wandb(cfg, self.exp_dir)  # before any child starts
        check_queue_layout(wiring.learner_queue.q)  # the lock repair must know the layout
        self.supervisor = Supervisor(wiring, self.ctx, self._pump)
        # Evaluation plays in a thread of this process, on the CPU, with its own env.
        self.evaluator = start_evaluator(cfg, info, model, "cpu", self.exp_dir)
        return wiring

    def start_sampling(self) -> None:
        cfg = self.cfg
        if not cfg.num_sampler_nodes:
            start_sampling(cfg, self.supervisor)
            return
        for node in range(cfg.num_sampler_nodes):
            link = NodeLink(self.shared, self.store, node, self.supervisor.fenced)
            link.start()
            self.links.append(link)
            if cfg.start_sampler_nodes:
                self.supervisor.start(Child(f"fastrl-node-{node}", "node", node, 1,
                                            local_node_main))
        if not cfg.start_sampler_nodes:
            log(f"waiting for {cfg.num_sampler_nodes} sampler node(s); on each machine run: "
                f"python -m fastrl.node --connect {socket.gethostname()}:{self.store.port} "
                f"--node_rank K  (K = 0 to {cfg.num_sampler_nodes - 1})")

    def run(self) -> dict:
        cfg = self.cfg
        reporter = None
        self.signals.__enter__()
        try:
            wiring = self.setup()
            stats = TrainingStats(StatsSettings.from_config(cfg), wiring.info.frameskip,
                                  wiring.info.time_limit, wiring.info.num_agents)
            start_learners(cfg, self.supervisor)
            if not cfg.num_sampler_nodes:
                # The workers start while the learners do: policy workers wait for their first
                # weights, and nothing they report can come before a LearnerReady.
                self.start_sampling()
            readies, early = self._wait_for_learners(timeout=120)
            for ready in readies:
                if ready.counters:
                    restore_counters(stats, ready.counters, ready.version, ready.policy)
                    log(f"resumed from {ready.checkpoint} at {ready.counters['env_frames']:,} "
                        "frames")
            if self.evaluator is not None:
                self.evaluator.resume_at(stats.env_frames)
            ready = readies[0]
            if cfg.num_sampler_nodes:
                self.start_sampling()
            stats.start_time = time.time()
            reporter = Reporter(ReportSettings.from_config(cfg), self.exp_dir, stats,
                                self.wandb_run)
            self._log_start(wiring, ready)
            pbt = (Population(PbtSettings.from_config(cfg), self.exp_dir, wiring.learner_queues,
                              readies, reporter.writer) if cfg.with_pbt else None)
            self.loop = loop = RunLoop(wiring, stats, reporter, self._turn,
                                       note=self.supervisor.note, poll_timeout=POLL,
                                       evaluator=self.evaluator, evaluate_in_thread=True,
                                       warmup_seconds=self.warmup_seconds,
                                       signals=self.signals, pbt=pbt)
            for msg in early:
                loop.handle(msg)
            self.supervisor.restart_workers = cfg.max_worker_restarts > 0
            save_due = loop.run()
            self.supervisor.restart_workers = False
            if (save_due or cfg.sampling_only) and not cfg.num_sampler_nodes:
                # The rollout workers' last episodes (up to a report period's) before the
                # counters are saved and summed up.
                silent = loop.collect_last_reports(range(cfg.num_workers), LAST_REPORTS_TIMEOUT,
                                                   self._rollout_alive)
                if silent:
                    log(f"rollout worker(s) {', '.join(map(str, silent))} did not send their "
                        f"last episodes (gone, or busy for over {LAST_REPORTS_TIMEOUT:g} s); "
                        "the summary counts those reported before")
            if save_due:
                learners = [c for c in self.supervisor.children.values() if c.kind == "learner"]
                loop.final_save(lambda: [self.supervisor.check_exit(c) for c in learners])
                loop.final_evaluation()
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
            if self.wandb_run is not None:
                self.wandb_run.finish(sys.exc_info()[1])
            self.signals.__exit__()

    def _turn(self) -> None:
        self.supervisor.check_children()
        self.loop.stats.worker_restarts = self.supervisor.restarts

    def _rollout_alive(self, worker_id: int) -> bool:
        """Whether rollout worker ``worker_id``'s process is running (not dead or being
        restarted)."""
        child = self.supervisor.children.get(f"fastrl-rollout-{worker_id}")
        return child is not None and child.proc is not None and child.proc.is_alive()

    def _pump(self, timeout: float) -> None:
        """Read the runner queue once (the supervisor calls this while it waits)."""
        if self.loop is not None:
            self.loop.drain(timeout)
        else:
            for msg in self.shared.runner_queue.get_many(timeout):
                self.supervisor.note(msg)

    def _wait_for_learners(self, timeout: float) -> tuple[list[LearnerReady], list]:
        """Every policy's ``LearnerReady``, in policy order, and the workers' messages read
        meanwhile (their first reports, for the run loop's statistics)."""
        early = []
        deadline = time.monotonic() + timeout
        ready: dict[int, LearnerReady] = {}
        while time.monotonic() < deadline:
            for msg in self.shared.runner_queue.get_many(POLL):
                if isinstance(msg, LearnerReady):
                    ready[msg.policy] = msg
                elif isinstance(msg, (ChildFailed, Fenced)):
                    self.supervisor.note(msg)
                else:
                    early.append(msg)
            if len(ready) == self.cfg.num_policies:
                return [ready[k] for k in sorted(ready)], early
            self.supervisor.check_children()
        missing = sorted(set(range(self.cfg.num_policies)) - set(ready))
        raise ChildError(f"timed out after {timeout:.0f} s waiting for the learner"
                         + (f"s of policies {missing}" if self.cfg.num_policies > 1 else "")
                         + " to start")

    def _log_start(self, wiring: Wiring, ready: LearnerReady) -> None:
        """The start-up line. The device and precision are the learner's (the policy workers
        resolve the same flags on the same device): resolving the precision here would create
        a CUDA context in this process, which runs no model, for the whole run."""
        cfg, layout = self.cfg, wiring.layout
        mode = "sampling only" if cfg.sampling_only else ("async" if cfg.async_rl else "sync")
        nodes = (f"{cfg.num_sampler_nodes} sampler nodes of " if cfg.num_sampler_nodes else "")
        log(f"parallel mode ({mode}): {cfg.env}, {nodes}{cfg.num_workers} workers x "
            f"{cfg.num_envs_per_worker} envs in {cfg.worker_num_splits} splits, "
            f"{cfg.num_policy_workers} policy worker(s), "
            + (f"{cfg.num_learners} learners, " if cfg.num_learners > 1 else "")
            + (f"{cfg.num_policies} policies, " if cfg.num_policies > 1 else "")
            + f"device {ready.device} ({ready.precision}), {layout.num_buffers} trajectory "
            f"buffers ({layout.nbytes() / 2**20:.0f} MiB"
            + (f"; memory budget {self.budget.describe(': ')}" if self.budget else "")
            + f"), experiment {self.exp_dir}")

    # -- signals ------------------------------------------------------------------------

    def _quit_now(self, signum: int) -> None:
        """A second stop signal: kill every child (their engines' shared memory goes with
        them) and exit at once."""
        log(f"{signal.Signals(signum).name} again: killing every worker and exiting now")
        if self.supervisor is not None:
            self.supervisor.kill_all()
        kill_descendants()  # the fork server, and what a dying child may have left
        os._exit(quit_status(signum))

    def shutdown(self) -> None:
        """Stop the evaluator and every child, then close the queues' doorbell pipes."""
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
        for link in self.links:  # the nodes stop their own workers when told goodbye
            link.stopping.set()
        for link in self.links:
            link.stop()
        self.links = []
        if self.supervisor is not None:
            self.supervisor.stop_all()
        if self.shared is not None:
            self.shared.close()
        self.store = None


def run_parallel(cfg: Config, warmup_seconds: float = 0.0) -> dict:
    return ParallelRunner(cfg, warmup_seconds).run()
