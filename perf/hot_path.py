#!/usr/bin/env python
"""The hot path's cores in one process, without running envs: ``Learner.train`` on a batch
gathered the learner station's way, ``SharedWeights.publish`` of the new weights, and
``PolicyWorker.infer`` on one inference batch, each timed call by call on random data in the
shapes of ``--env`` (one env is made once to read its spaces).

    python perf/hot_path.py --env doom_basic --device cpu --repeats 8

Settings are train.py's (the env's recommended ones included); any other flag goes to the
config (e.g. --use_rnn False, --advantages batch). Prints one JSON object on its last line:
seconds per call (median, min, max) of each core, and the settings.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time

import torch
from _harness import emit  # also puts the repository on sys.path


def _timed(fn, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median": round(statistics.median(times), 5), "min": round(min(times), 5),
            "max": round(max(times), 5), "calls": repeats}


def _fill(buffers, cfg, action_space, gen: torch.Generator) -> None:
    """Plausible trajectories: random pixels, episode ends about every 60 steps, a time
    limit in one slot out of four."""
    for obs in buffers.obs.values():
        obs.copy_(torch.randint(0, 256, obs.shape, generator=gen).to(obs.dtype))
    for obs in buffers.final_obs.values():
        obs.copy_(torch.randint(0, 256, obs.shape, generator=gen).to(obs.dtype))
    n, t = buffers.log_probs.shape
    actions = [torch.as_tensor(action_space.sample()) for _ in range(n * t)]
    buffers.actions.copy_(torch.stack(actions).reshape(buffers.actions.shape))
    buffers.log_probs.copy_(-1.0 - torch.rand(n, t, generator=gen))
    buffers.values.copy_(torch.randn(n, t, generator=gen) * 0.1)
    buffers.rewards.copy_(torch.randn(n, t, generator=gen))
    buffers.dones.copy_(torch.rand(n, t, generator=gen) < 1 / 60)
    buffers.policy_versions.zero_()
    buffers.rnn_states.copy_(torch.randn(buffers.rnn_states.shape, generator=gen) * 0.1)
    limited = torch.arange(n) % 4 == 0
    steps = torch.randint(0, t, (n,), generator=gen)
    buffers.final_step.copy_(torch.where(limited, steps, -1))
    buffers.dones[limited, steps[limited]] = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=8, help="timed calls of each core")
    parser.add_argument("--infer_batch", type=int, default=64, help="envs per inference batch")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the learner's "
                        "and the policy workers' default is 1)")
    parser.add_argument("--infer_policies", type=int, default=1,
                        help="models the inference batch is split among (--num_policies): "
                        "row i acts with policy i mod P, each policy from its own weights")
    parser.add_argument("--profile", default="", metavar="FILE",
                        help="also profile --repeats inference calls (torch.profiler, CPU and "
                        "CUDA) and write the operators' table, by CPU time, to FILE")
    args, extra = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    from fastrl.runner.process_setup import keep_freed_memory

    # As in the learner and policy worker processes (fastrl/runner/supervisor.py): without
    # it every large tensor is a fresh mmap, and doom_basic's learner step measured 0.96 s
    # here against 0.76 s in the real process (page faults on 70-116 MB activations).
    keep_freed_memory()

    from fastrl.algo.learner import Learner, LearnerSettings
    from fastrl.run_config import parse_config
    from fastrl.runner.run_start import build_model
    from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
    from fastrl.sampling.env_setup import EnvSettings, probe_env
    from fastrl.sampling.inference import PolicyWorker
    from fastrl.sampling.staging import Staging
    from fastrl.sampling.weights import SharedWeights
    from fastrl.transport.messages import InferenceRequest

    cfg = parse_config(["--env", args.env, "--device", args.device, "--experiment", "perf",
                        *extra])
    device = torch.device(args.device)
    info = probe_env(EnvSettings.from_config(cfg))
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = build_model(cfg, info, device)
    learner = Learner(LearnerSettings.from_config(cfg), model, info.action_space, device,
                      frameskip=info.frameskip)
    n = cfg.trajectories_per_batch
    slots = max(n, args.infer_batch)
    layout = BufferLayout.from_spaces(info.obs_space, info.action_space, num_buffers=slots,
                                      rollout=cfg.rollout, rnn_size=model.rnn_state_size)
    buffers = TrajectoryBuffers(layout)
    _fill(buffers, cfg, info.action_space, gen)
    staging = Staging(device)
    weights = SharedWeights(model, multiprocessing.get_context("spawn"))

    def train() -> None:
        learner.train(buffers.gather(list(range(n)), staging))
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def publish() -> None:
        weights.publish(model, learner.version)

    acting = build_model(cfg, info, device)
    rnn_state = torch.zeros(slots, model.rnn_state_size)
    others = []
    for _ in range(1, args.infer_policies):  # every policy's weights are its own
        other = build_model(cfg, info, device)
        source = SharedWeights(other, multiprocessing.get_context("spawn"))
        source.publish(other, 0)
        others.append((build_model(cfg, info, device), source))
    worker = PolicyWorker(acting, info.action_space, buffers, rnn_state, device, weights,
                          precision=learner.precision, others=others,
                          cuda_graphs=cfg.policy_cuda_graphs,
                          action_noise_every=cfg.action_noise_every)
    envs = tuple(range(args.infer_batch))
    policies = tuple(i % args.infer_policies for i in envs) if others else ()
    requests = [InferenceRequest(0, 0, 0, envs, envs, 0, 0, policies)]

    def infer() -> None:
        worker.infer(requests)

    train()  # warm-up: the optimizer's state, the staging buffers, lazy kernels
    publish()
    infer()
    result = {
        "learner_train_s": _timed(train, args.repeats),
        "publish_s": _timed(publish, args.repeats),
        "infer_s": _timed(infer, args.repeats),
        "samples_per_batch": n * cfg.rollout,
        "settings": {"env": args.env, "device": str(device), "precision": learner.precision,
                     "threads": args.threads, "infer_batch": args.infer_batch,
                     "infer_policies": args.infer_policies,
                     "policy_cuda_graphs": cfg.policy_cuda_graphs,
                     "use_rnn": cfg.use_rnn, "rnn_type": cfg.rnn_type,
                     "advantages": cfg.advantages, "batch_size": cfg.batch_size,
                     "rollout": cfg.rollout, "num_epochs": cfg.num_epochs,
                     "num_batches_per_epoch": cfg.num_batches_per_epoch, "extra": extra},
        "host": {"machine": platform.node(), "cpus": os.cpu_count(),
                 "date": time.strftime("%Y-%m-%d")},
    }
    if args.profile:
        _profile(infer, args.repeats, device, args.profile)
    emit(result)


def _profile(fn, repeats: int, device: torch.device, path: str) -> None:
    """Where a call's time goes: the operators of ``repeats`` calls, by total CPU time (on a
    GPU, the host's time issuing work against the device's time running it)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
    with open(path, "w") as f:
        f.write(f"{repeats} calls\n{table}\n")


if __name__ == "__main__":
    main()
