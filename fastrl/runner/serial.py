"""Serial mode: the rollout, inference and learner components driven in one process.

The same classes as the parallel runner, called in order with no queues between them: the
way to debug and profile, and to test learning deterministically (a seeded run repeats).
"""

from __future__ import annotations

from collections import deque

import torch

from fastrl.buffers import BufferLayout, TrajectoryBuffers
from fastrl.cfg import Config
from fastrl.evaluation import PeriodicEvaluator, write_eval_summaries
from fastrl.experiment import (
    Reporter,
    TrainingStats,
    log,
    prepare_experiment_dir,
    print_final_summary,
    save_checkpoint,
)
from fastrl.inference import PolicyWorker
from fastrl.learner import Learner
from fastrl.malloc import keep_freed_memory
from fastrl.rollout import RolloutWorker, StepOutput
from fastrl.runner.common import (
    buffers_per_env,
    build_model,
    checkpoint_state,
    create_env,
    env_info,
    resolve_device,
    restore_counters,
    restore_learner,
    reward_scale,
    seed_everything,
)


def run_serial(cfg: Config, warmup_seconds: float = 0.0) -> dict:
    """Train (or only sample, with ``--sampling_only``) until a stop condition; return the summary."""
    device = resolve_device(cfg.device)
    exp_dir = prepare_experiment_dir(cfg)
    seed_everything(cfg.seed)
    keep_freed_memory()
    n_envs = cfg.num_envs_per_worker
    envs = [create_env(cfg) for _ in range(n_envs)]
    worker = None
    reporter = None
    evaluator = None
    try:
        info = env_info(envs[0])
        model = build_model(cfg, info, device)
        learner = Learner(cfg, model, info.action_space, device)
        stats = TrainingStats(cfg, info.frameskip)
        counters, path = restore_learner(learner, cfg, info, device)
        if counters is not None:
            restore_counters(stats, counters, learner.version)
            log(f"resumed from {path} at {stats.env_frames:,} frames")
        per_env = buffers_per_env(cfg, n_envs)
        layout = BufferLayout.from_spaces(info.obs_space, info.action_space, n_envs * per_env,
                                          cfg.rollout, model.rnn_state_size)
        buffers = TrajectoryBuffers(layout)
        rnn_state = torch.zeros((n_envs, model.rnn_state_size))
        per_round = None
        if not cfg.async_rl:
            per_round = learner.trajectories_per_batch // n_envs
        worker = RolloutWorker(0, envs, buffers, rnn_state, list(range(layout.num_buffers)),
                               cfg.worker_num_splits, reward_scale(cfg), cfg.reward_clip,
                               trajectories_per_round=per_round, seed=cfg.seed,
                               env_factory=lambda: create_env(cfg), env_timeout=cfg.env_timeout,
                               decorrelate=cfg.decorrelate_envs_on_one_worker)
        policy = PolicyWorker(model, info.action_space, buffers, rnn_state, device,
                              version_fn=lambda: learner.version, precision=learner.precision)
        reporter = Reporter(cfg, exp_dir, stats)
        if cfg.eval_every_env_frames:
            evaluator = PeriodicEvaluator(create_env(cfg), model, cfg.eval_every_env_frames,
                                          cfg.eval_episodes, cfg.eval_deterministic, device,
                                          seed=cfg.seed, start_frames=stats.env_frames)
        log(f"serial mode: {cfg.env}, {n_envs} envs in {cfg.worker_num_splits} splits, device {device} ({learner.precision}), "
            f"model {sum(p.numel() for p in model.parameters()):,} parameters, experiment {exp_dir}")
        _loop(cfg, worker, policy, learner, buffers, stats, reporter, exp_dir, info, device,
              warmup_seconds, evaluator)
        summary = reporter.close()
        reporter = None
        print_final_summary(summary)
        return summary
    finally:
        if evaluator is not None:
            evaluator.close()
        if reporter is not None:
            reporter.close()
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - free every engine even if one fails
                pass


def _loop(cfg, worker, policy, learner, buffers, stats, reporter, exp_dir, info, device,
              warmup_seconds, evaluator) -> None:
    requests: deque = deque()
    ready: list[int] = []
    last_save = stats.run_seconds
    frames_at_start = stats.env_frames

    def route(out: StepOutput) -> None:
        requests.extend(out.requests)
        for traj in out.trajectories:
            ready.extend(traj.buffers)
        for ep in out.episodes:
            stats.add_episode(ep.episode_return, ep.length, ep.truncated)
        stats.agent_steps_collected += out.agent_steps
        stats.env_restarts += out.env_restarts
        stats.steps_discarded += out.steps_discarded
        for line in out.faults:
            log(line)
        if cfg.sampling_only:
            stats.env_frames += out.agent_steps * info.frameskip

    def save() -> None:
        state = checkpoint_state(cfg, info, learner.state_dict(), stats.counters())
        path = save_checkpoint(exp_dir, state, cfg.keep_checkpoints)
        log(f"saved {path}")

    route(worker.start())
    n_batch = learner.trajectories_per_batch
    warm = False
    try:
        while stats.env_frames < cfg.train_for_env_steps and stats.run_seconds < cfg.train_for_seconds:
            if not warm and stats.run_seconds >= warmup_seconds:
                stats.mark_warmup()
                warm = True
            batch_requests = list(requests)
            requests.clear()
            for ready_msg in policy.infer(batch_requests):
                route(worker.on_actions(ready_msg.split_id))
            if cfg.sampling_only:
                if ready:
                    route(worker.add_free_buffers(ready))
                    ready.clear()
            while len(ready) >= n_batch and not cfg.sampling_only:
                idx, ready[:] = ready[:n_batch], ready[n_batch:]
                batch = buffers.gather(idx, device)
                route(worker.add_free_buffers(idx))
                train_stats = learner.train(batch)
                stats.env_frames += int(batch["rewards"].numel()) * info.frameskip
                stats.add_learner_stats(train_stats, learner.version)
                if worker.all_paused:
                    route(worker.resume())
                if evaluator is not None:
                    result = evaluator.maybe_evaluate(stats.env_frames, learner.model)
                    if result is not None:
                        write_eval_summaries(reporter.writer, result, stats.env_frames)
                        log(f"evaluation at {stats.env_frames:,} frames: return "
                            f"{result.mean_return:.3f} +- {result.std_return:.3f} over {result.episodes} episodes")
            if not requests and not ready:
                raise RuntimeError("serial runner stalled: no inference requests and no data to train on")
            reporter.maybe_report()
            if stats.run_seconds - last_save >= cfg.save_every_sec:
                save()
                last_save = stats.run_seconds
    except KeyboardInterrupt:
        log("interrupted: saving a checkpoint and stopping")
    stats.end_measurement()
    if not cfg.sampling_only and stats.env_frames > frames_at_start:
        save()
