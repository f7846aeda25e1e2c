#!/usr/bin/env python
"""The machine's limit for a config's model and env, and a run's FPS as a fraction of it.

    PYTHONPATH=. python perf/limit.py --env doom_basic [any train.py flag]
    PYTHONPATH=. python perf/limit.py --env doom_basic --precision fp32 --fps 3600
    PYTHONPATH=. python perf/limit.py --summary train_dir/<experiment>/summary.json

Four measured pieces (docs/performance.md, "The machine's limit"):

- FLOPs per trained sample: one real ``Learner.train`` call (forward over the trajectories
  and their last observation, loss, backward, ``num_epochs`` passes) on a batch of the
  config's shape, counted by ``torch.utils.flop_counter.FlopCounterMode`` and split by the
  dtype each matmul/conv ran in; plus the optimizer step (Adam and gradient clipping, ~16
  elementwise FLOPs per parameter per SGD step, counted by hand: FlopCounterMode counts
  matmuls and convolutions only).
- FLOPs per inferred sample: the policy worker's acting step (``forward_step`` under
  inference mode and autocast, then the action drawn).
- The matmul peak: the best of a few timed square matmuls (2048 on a CPU, 8192 on a GPU) in
  each dtype the model runs in, on all this process's cores (and on the learner's
  ``--learner_threads``, for the learner's own ceiling).
- The bare env's cost per frame: the env (a bare DoomGame or ale-py env where there is one,
  else the env itself) stepped with random actions by one process per core, each with the
  run's envs per worker, in CPU seconds (the processes' and their engines') per simulator
  frame.

FPS counts simulator frames (frameskip included), and every agent step is one inferred and
one trained sample, so ``flop_per_frame = (train + infer) / frameskip``. On a CPU everything
shares the cores: ``limit = 1 / (sum_d flop_per_frame_d / peak_d + env_cost / cores)``. With
a CUDA device the model runs on the GPU and the envs on the CPU cores, side by side:
``limit = 1 / max(sum_d flop_per_frame_d / gpu_peak_d, env_cost / cores)``.

``--summary`` reads the experiment's ``config.json`` beside it for the settings, and the
run's measured FPS (``measured.fps``, else ``fps``). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections import Counter
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Adam (foreach, no weight decay: lerp 3, square-average 4, sqrt/divide/eps 3, update 3) and
# clip_grad_norm_ (squares and sum 2, scale 1), per parameter per SGD step.
OPTIMIZER_FLOPS_PER_PARAM = 16
CPU_MATMUL_SIZE = 2048
GPU_MATMUL_SIZE = 8192
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
NAMES = {v: k for k, v in DTYPES.items()}


class _FlopsByDtype(FlopCounterMode):
    """FlopCounterMode that also sums each counted op's FLOPs by the dtype of its first
    tensor argument (under autocast the convolutions run in bf16 and the GRU in fp32)."""

    def __init__(self) -> None:
        super().__init__(display=False)
        self.by_dtype: Counter = Counter()

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry:
            flops = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            dtype = first.dtype if first is not None else torch.float32
            self.by_dtype[NAMES.get(dtype, "fp32")] += flops
        return super()._count_flops(func_packet, out, args, kwargs)


def count_flops(fn) -> dict[str, float]:
    """FLOPs of ``fn()`` by dtype name ("fp32", "bf16")."""
    with _FlopsByDtype() as counter:
        fn()
    if sum(counter.by_dtype.values()) != counter.get_total_flops():  # torch changed its hook
        return {"fp32": float(counter.get_total_flops())}
    return {k: float(v) for k, v in counter.by_dtype.items()}


def _scaled(flops: dict[str, float], factor: float) -> dict[str, float]:
    return {k: v * factor for k, v in flops.items()}


def _filled_batch(cfg, info, model, trajectories: int, device: torch.device) -> dict:
    """A learner batch of ``trajectories`` x ``cfg.rollout`` steps, as the learner station
    gathers it: zeros (valid observations, actions and states), acted by version 0, no
    episode end."""
    from fastrl.runner.wiring import weighed_reward_terms
    from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
    from fastrl.sampling.staging import Staging

    layout = BufferLayout.from_spaces(info.obs_space, info.action_space, trajectories,
                                      cfg.rollout, model.rnn_state_size,
                                      len(weighed_reward_terms(cfg, info)))
    buffers = TrajectoryBuffers(layout)
    for tensor in [*buffers.obs.values(), *buffers.final_obs.values(), buffers.actions,
                   buffers.log_probs, buffers.values, buffers.rewards, buffers.rnn_states,
                   buffers.policy_versions]:
        tensor.zero_()
    buffers.dones.zero_()
    return buffers.gather(list(range(trajectories)), Staging(device))


def train_flops_per_sample(cfg, info, model, device: torch.device,
                           trajectories: int = 2) -> dict[str, float]:
    """FLOPs by dtype to train one sample: one ``Learner.train`` call (``num_epochs`` passes)
    on ``trajectories`` trajectories, over their samples (every counted op's FLOPs grow with
    the rows, so a few trajectories give the batch's figure), plus the optimizer's FLOPs per
    SGD step over the samples of a minibatch (``batch_size``)."""
    from fastrl.algo.learner import Learner, LearnerSettings
    from fastrl.runner.wiring import weighed_reward_terms

    if cfg.sampling_only:
        return {}
    cfg = dataclasses.replace(cfg, num_batches_per_epoch=1, num_learners=1)
    learner = Learner(LearnerSettings.from_config(cfg), model, info.action_space, device,
                      frameskip=info.frameskip, reward_terms=weighed_reward_terms(cfg, info))
    batch = _filled_batch(cfg, info, model, trajectories, device)
    flops = _scaled(count_flops(lambda: learner.train(batch)),
                    1.0 / (trajectories * cfg.rollout))
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    minibatch = max(1, cfg.batch_size // cfg.rollout) * cfg.rollout
    flops["fp32"] = (flops.get("fp32", 0.0)
                     + OPTIMIZER_FLOPS_PER_PARAM * params * cfg.num_epochs / minibatch)
    return flops


def infer_flops_per_sample(info, model, device: torch.device, precision: str,
                           rows: int = 16) -> dict[str, float]:
    """FLOPs by dtype to act for one env step: the policy worker's acting step
    (``PolicyWorker._act_eager``) on ``rows`` envs, over ``rows``."""
    from fastrl.device import autocast
    from fastrl.policy.distributions import ActionDistribution
    from fastrl.sampling.buffers import BufferLayout

    model.eval()
    layout = BufferLayout.from_spaces(info.obs_space, info.action_space, 1, 1,
                                      model.rnn_state_size)
    obs = {k: torch.zeros((rows, *shape), dtype=layout.obs_dtypes[k], device=device)
           for k, shape in layout.obs_shapes.items()}
    h = model.initial_rnn_state(rows, device)

    def act() -> None:
        with torch.inference_mode(), autocast(precision, device, cache=False):
            logits, _, _ = model.forward_step(obs, h)
            dist = ActionDistribution(logits, model.action_spec)
            dist.log_prob(dist.sample())

    return _scaled(count_flops(act), 1.0 / rows)


def matmul_peak(dtype: torch.dtype, threads: int, device: torch.device,
                n: int | None = None, seconds: float = 0.4) -> float:
    """FLOP/s of the best of a few timed ``n`` x ``n`` matmuls in ``dtype`` with ``threads``
    torch threads (on a GPU, of 10 matmuls in a row; threads do not matter there)."""
    cuda = device.type == "cuda"
    n = n or (GPU_MATMUL_SIZE if cuda else CPU_MATMUL_SIZE)
    inner = 10 if cuda else 1
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        torch.mm(a, b)
        sync()
        best, reps, start = math.inf, 0, time.perf_counter()
        while reps < 3 or time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b)
            sync()
            best = min(best, (time.perf_counter() - t0) / inner)
            reps += 1
    finally:
        torch.set_num_threads(before)
    return 2.0 * n**3 / best


def env_cost_per_frame(cfg, seconds: float = 2.0) -> tuple[float, str]:
    """Seconds of one core per simulator frame of the bare env, with the cores full: one
    stepping process per core, each with the run's ``--num_envs_per_worker`` envs and random
    actions (``perf/env_fps.py``), the CPU time of those processes and of their engines over
    the frames they made, after a second of warm-up; and what was stepped. A single env timed
    by the clock would count the round trips' waits to its engine process as work (108 against
    51.5 us for doom_basic on a 2-core VM: perf/log/RESULTS.md)."""
    import env_fps

    bare, what = _bare_kind(cfg.env)
    cores = len(os.sched_getaffinity(0))
    argv = ["--env", cfg.env, "--num_workers", str(cores), "--num_envs_per_worker",
            str(cfg.num_envs_per_worker), "--seconds", str(seconds), "--warmup", "1",
            "--seed", str(0 if cfg.seed is None else cfg.seed)]
    if cfg.env_frameskip is not None:
        argv += ["--frameskip", str(cfg.env_frameskip)]
    result, _ = env_fps.measure(env_fps.parse_args(argv + ["--bare"] * bare))
    cost = result["core_seconds_per_frame"]
    if cost is None:  # no /proc: the cores' wall time, every core taken to be busy
        cost = cores / result["fps"]
    return cost, (f"{what}, {cores} process{'es' * (cores > 1)} x {cfg.num_envs_per_worker}, "
                  "CPU time")


def _bare_kind(env: str) -> tuple[bool, str]:
    if env.startswith("ALE/"):
        return True, "bare ale-py env"
    try:
        from envs.doom_scenarios import SCENARIOS
    except ImportError:
        return False, "fastrl env"
    if env in SCENARIOS and SCENARIOS[env].bots is None:
        return True, "bare DoomGame"
    return False, "fastrl env"


def limit_fps(flop_per_frame: dict[str, float], peaks: dict[str, float],
              env_cost: float, cores: int, gpu: bool = False) -> float:
    """Frames per second the machine allows: on a CPU the model's and the envs' work share
    the cores, ``1 / (sum_d flops_d / peak_d + env_cost / cores)``; on a GPU they run side
    by side, ``1 / max(sum_d flops_d / peak_d, env_cost / cores)``. ``peaks`` in FLOP/s by
    dtype name, ``env_cost`` in seconds of one core per frame."""
    model = sum(flops / peaks[dtype] for dtype, flops in flop_per_frame.items() if flops)
    env = env_cost / cores
    seconds = max(model, env) if gpu else model + env
    return 1.0 / seconds


def measure(cfg, env_seconds: float = 2.0) -> dict[str, Any]:
    """Every piece of the limit of ``cfg`` on this machine, and the limit (see the module
    docstring)."""
    from fastrl.device import learner_device, resolve_device, resolve_precision
    from fastrl.runner.run_start import build_model, check_env_settings
    from fastrl.sampling.env_setup import EnvSettings, probe_env

    if cfg.algo != "appo":
        raise ValueError(f"--algo={cfg.algo}: limit.py counts the APPO learner only "
                         "(--algo appo)")
    device = learner_device(resolve_device(cfg.device), 0)
    precision = resolve_precision(cfg.precision, device)
    cores = len(os.sched_getaffinity(0))
    info = probe_env(EnvSettings.from_config(cfg))
    check_env_settings(cfg, info)
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)  # only for the counting runs' speed
    try:
        model = build_model(cfg, info, device)  # as the learner and policy workers build it
        train = train_flops_per_sample(cfg, info, model, device)
        infer = infer_flops_per_sample(info, model, device, precision)
    finally:
        torch.set_num_threads(threads)
    per_frame = {d: (train.get(d, 0.0) + infer.get(d, 0.0)) / info.frameskip
                 for d in sorted(set(train) | set(infer))}
    gpu = device.type == "cuda"
    peaks = {d: matmul_peak(DTYPES[d], cores, device) for d in per_frame}
    learner_peaks = peaks
    if not gpu and cfg.learner_threads != cores:
        learner_peaks = {d: matmul_peak(DTYPES[d], cfg.learner_threads, device) for d in train}
    env_cost, env_kind = env_cost_per_frame(cfg, env_seconds)
    learner_ceiling = (1.0 / sum(f / info.frameskip / learner_peaks[d] for d, f in train.items())
                       if any(train.values()) else None)
    return {
        "env": cfg.env, "device": str(device), "precision": precision, "cores": cores,
        "learner_threads": cfg.learner_threads, "frameskip": info.frameskip,
        "rollout": cfg.rollout, "batch_size": cfg.batch_size, "num_epochs": cfg.num_epochs,
        "train_flop_per_sample": train, "infer_flop_per_sample": infer,
        "flop_per_frame": per_frame,
        "matmul_peak_flops": peaks, "learner_matmul_peak_flops": learner_peaks,
        "env_seconds_per_frame": env_cost, "env_stepped": env_kind,
        "learner_ceiling_fps": learner_ceiling,
        "limit_fps": limit_fps(per_frame, peaks, env_cost, cores, gpu),
    }


def _m(flops: dict[str, float]) -> str:
    total = sum(flops.values())
    parts = ", ".join(f"{d} {v / 1e6:.2f}" for d, v in flops.items() if v)
    return f"{total / 1e6:.2f} MFLOP" + (f" ({parts})" if len(flops) > 1 else "")


def report_lines(r: dict[str, Any], fps: float | None = None) -> list[str]:
    """The measurement in words; with ``fps``, that FPS as a fraction of the limit."""
    gpu = r["device"].startswith("cuda")
    where = "the GPU" if gpu else f"{r['cores']} core{'s' * (r['cores'] > 1)}"
    lines = [
        f"limit of this machine for {r['env']} ({r['device']}, {r['precision']}, "
        f"frameskip {r['frameskip']}, rollout {r['rollout']}, batch {r['batch_size']}, "
        f"{r['num_epochs']} epoch{'s' * (r['num_epochs'] > 1)})",
        f"  train per sample   {_m(r['train_flop_per_sample'])} (forward, backward, optimizer)",
        f"  infer per sample   {_m(r['infer_flop_per_sample'])}",
        f"  per env frame      {_m(r['flop_per_frame'])}",
        "  matmul peak        " + ", ".join(
            f"{d} {v / 1e9:.0f} GFLOP/s" for d, v in r["matmul_peak_flops"].items())
        + f" on {where}",
    ]
    if not gpu and r["learner_matmul_peak_flops"] is not r["matmul_peak_flops"]:
        lines.append("  learner's threads  " + ", ".join(
            f"{d} {v / 1e9:.0f} GFLOP/s" for d, v in r["learner_matmul_peak_flops"].items())
            + f" on {r['learner_threads']} thread{'s' * (r['learner_threads'] > 1)}")
    lines.append(f"  env per frame      {r['env_seconds_per_frame'] * 1e6:.1f} us of one core "
                 f"({r['env_stepped']})")
    if r["learner_ceiling_fps"] and not gpu:
        lines.append(f"  learner alone      {r['learner_ceiling_fps']:,.0f} frames/s (its "
                     f"{r['learner_threads']} thread{'s' * (r['learner_threads'] > 1)} at the "
                     "matmul peak, training only)")
    lines.append(f"  limit              {r['limit_fps']:,.0f} frames/s")
    if fps is not None:
        lines.append(f"  this run           {fps:,.0f} frames/s = "
                     f"{fps / r['limit_fps']:.0%} of the limit")
    return lines


def _fps_of_summary(path: str) -> tuple[float, str]:
    """The measured FPS in a run's ``summary.json`` and its experiment folder."""
    try:
        with open(path) as fh:
            summary = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--summary={path}: cannot read it as JSON ({exc})") from None
    measured = summary.get("measured") if isinstance(summary, dict) else None
    fps = (measured or {}).get("fps") if isinstance(measured, dict) else None
    if fps is None and isinstance(summary, dict):
        fps = summary.get("fps")
    if not isinstance(fps, (int, float)) or fps <= 0:
        raise ValueError(f"--summary={path}: no positive 'fps' in it (a run's summary.json "
                         "holds one)")
    return float(fps), os.path.dirname(os.path.abspath(path))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]  # one line, not the usage
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from fastrl.config.settings import ConfigError
    from fastrl.run_config import parse_config
    from fastrl.train import user_error_types

    p = _Parser(
        prog="limit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other flag is taken as train.py's (see train.py --help).",
        allow_abbrev=False)
    p.add_argument("--fps", type=float, default=None, help="a run's FPS, to print its fraction")
    p.add_argument("--summary", default=None, metavar="PATH",
                   help="a run's summary.json: its settings (config.json beside it) and FPS")
    p.add_argument("--env_seconds", type=float, default=2.0,
                   help="seconds of env stepping timed (default 2)")
    args, extra = p.parse_known_args(argv)
    try:
        if args.fps is not None and not (args.fps > 0 and math.isfinite(args.fps)):
            raise ValueError(f"--fps={args.fps}: must be a positive number of frames/s")
        if not args.env_seconds > 0:
            raise ValueError(f"--env_seconds={args.env_seconds}: must be positive")
        fps = args.fps
        if args.summary is not None:
            summary_fps, exp_dir = _fps_of_summary(args.summary)
            if not os.path.isfile(os.path.join(exp_dir, "config.json")):
                raise ValueError(f"--summary={args.summary}: no config.json beside it")
            fps = fps if fps is not None else summary_fps
            extra = ["--train_dir", os.path.dirname(exp_dir),
                     "--experiment", os.path.basename(exp_dir), *extra]
        else:  # the flags alone: never resume a saved config by accident
            extra = ["--restart_behavior", "overwrite", *extra]
        cfg = parse_config(extra, prog="limit.py")
        result = measure(cfg, args.env_seconds)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"limit.py: error: {line}", file=sys.stderr)
        sys.exit(2)
    except (ValueError, *user_error_types()) as exc:
        print(f"limit.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
    for line in report_lines(result, fps):
        print(line)
    if fps is not None:
        result.update(fps=fps, fraction=fps / result["limit_fps"])
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
