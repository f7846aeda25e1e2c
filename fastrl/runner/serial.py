"""Serial mode: the rollout, policy and learner stations polled in turn in one process.

The very stations and wiring of parallel mode, over in-process queues (``LocalQueue``)
instead of faster-fifo mailboxes: the way to debug and profile, and to test learning
deterministically (a seeded run repeats).
"""

from __future__ import annotations

import sys

import torch

from fastrl.algo.pbt.population import PbtSettings, Population
from fastrl.config.settings import Config
from fastrl.device import resolve_device
from fastrl.experiment.checkpoint import restore_counters
from fastrl.experiment.folder import prepare_experiment_dir, undone_if_refused
from fastrl.experiment.reporter import Reporter, ReportSettings, print_final_summary
from fastrl.experiment.stats import StatsSettings, TrainingStats
from fastrl.experiment.wandb_run import start_wandb
from fastrl.log import log
from fastrl.runner.cores import make_learner, make_policy_worker
from fastrl.runner.process_setup import keep_freed_memory, seed_everything
from fastrl.runner.replay_station import make_learner_station
from fastrl.runner.run_loop import RunLoop
from fastrl.runner.run_start import (
    announce_inputs,
    announce_recipe,
    check_env_settings,
    start_evaluator,
)
from fastrl.runner.stations import PolicyStation, RolloutStation
from fastrl.runner.wiring import build_wiring
from fastrl.sampling.env_setup import EnvSettings, create_env, env_info
from fastrl.transport.messages import LearnerReady
from fastrl.transport.signals import LauncherSignals


class SerialStall(RuntimeError):
    """No station had anything to do: the pipeline is stuck (a bug, never a user error)."""


def run_serial(cfg: Config, warmup_seconds: float = 0.0) -> dict:
    """Train (or only sample, with ``--sampling_only``) until a stop condition; return the
    summary."""
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    keep_freed_memory()
    # One process does it all: --learner_threads intra-op threads (default 1), not torch's
    # default of one per core, which on a busy 2-core machine doubled CartPole's run time
    # (threads spinning at each op's barrier; perf/log/RESULTS.md, "Default recipes").
    torch.set_num_threads(cfg.learner_threads)
    signals = LauncherSignals().__enter__()  # a second stop signal quits at once
    envs = []  # worker 0's, until its station holds them
    rollouts: list[RolloutStation] = []
    reporter = evaluator = wandb_run = None
    try:
        env_settings = EnvSettings.from_config(cfg)
        envs.extend(create_env(env_settings) for _ in range(cfg.num_envs_per_worker))
        info = env_info(envs[0], env_settings.env_obs_layout)
        check_env_settings(cfg, info)
        with undone_if_refused(cfg):  # only once the checks have passed
            exp_dir = prepare_experiment_dir(cfg)
            wandb_run = start_wandb(cfg, exp_dir)  # --with_wandb
        announce_recipe(cfg, info)
        # One learner per policy (--num_policies), each with its own checkpoints.
        made = [make_learner(cfg, info, device, policy=k) for k in range(cfg.num_policies)]
        learners = [learner for learner, _, _ in made]
        learner = learners[0]
        announce_inputs(info, learner.model)
        # Every rollout worker of parallel mode, as a station polled in turn: the same env
        # count, splits, slots and batches as a parallel run of these settings.
        wiring = build_wiring(cfg, info, learner.model, num_workers=cfg.num_workers,
                              envs_per_worker=len(envs), models=[m.model for m in learners])
        learner_stations = [make_learner_station(wiring, m, 0.0, k) for k, m in enumerate(learners)]
        stats = TrainingStats(StatsSettings.from_config(cfg), info.frameskip, info.time_limit,
                              info.num_agents)
        readies = []
        for k, (station, (_, counters, path)) in enumerate(zip(learner_stations, made)):
            station.announce(counters, path)
            ready = wiring.runner_queue.get_many(0.0)
            assert len(ready) == 1 and isinstance(ready[0], LearnerReady), ready
            readies += ready
            if counters is not None:
                restore_counters(stats, counters, learners[k].version, k)
                log(f"resumed from {path} at {counters['env_frames']:,} frames")
        policy = PolicyStation(wiring, 0, make_policy_worker(
            wiring, learner.model, device, learner.precision,
            others=[m.model for m in learners[1:]]), 0.0)
        rollouts.extend(RolloutStation(wiring, w, report_every=0.0)
                        for w in range(cfg.num_workers))
        first, envs = envs, []  # worker 0's station holds them from here on
        for station in rollouts:
            station.start(first if station.worker_id == 0 else None)
        reporter = Reporter(ReportSettings.from_config(cfg), exp_dir, stats, wandb_run)
        evaluator = start_evaluator(cfg, info, learner.model, device, exp_dir, stats.env_frames)
        n_params = sum(p.numel() for p in learner.model.parameters())
        log(f"serial mode: {cfg.env}, {cfg.num_workers} workers x {cfg.num_envs_per_worker} envs "
            f"in {cfg.worker_num_splits} splits, "
            f"device {device} ({learner.precision}), model {n_params:,} parameters, "
            f"experiment {exp_dir}")
        if cfg.worker_cpu_affinity == "on":
            log("--worker_cpu_affinity on: serial mode runs everything in one process, which "
                "stays free to use any core")

        def learn() -> int:
            return sum(station.poll(0.0) for station in learner_stations)

        def turn() -> None:
            moved = sum(r.poll(0.0) for r in rollouts) + policy.poll(0.0) + learn()
            if not moved:
                raise SerialStall("serial runner stalled: no station had anything to do")

        pbt = (Population(PbtSettings.from_config(cfg), exp_dir, wiring.learner_queues, readies,
                          reporter.writer) if cfg.with_pbt else None)
        loop = RunLoop(wiring, stats, reporter, turn, evaluator=evaluator,
                       warmup_seconds=warmup_seconds, signals=signals, pbt=pbt)
        if loop.run():
            loop.final_save(learn)
            loop.final_evaluation()
        summary = reporter.close()
        reporter = None
        print_final_summary(summary)
        return summary
    finally:
        if evaluator is not None:
            evaluator.close()
        if reporter is not None:
            reporter.close()
        # A worker may have replaced faulty envs in its station's list.
        for env in [*envs, *(env for r in rollouts for env in r.envs)]:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - free every engine even if one fails
                pass
        if wandb_run is not None:
            wandb_run.finish(sys.exc_info()[1])
        signals.__exit__()
