"""The experiment folder: config, ``summary.json``, TensorBoard, progress (checkpoints:
``fastrl.checkpoint``)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections import deque
from typing import Any

import numpy as np

from fastrl.bottleneck import Diagnosis, available_cores, busy_fractions, diagnose, progress_text
from fastrl.cfg import Config
from fastrl.cfg_io import save_config


class ExperimentError(RuntimeError):
    """A problem with the experiment folder that the user must fix (one line)."""


def log(msg: str) -> None:
    # A sampler node's processes name their node (fastrl/runner/node.py sets the variable).
    who = os.environ.get("FASTRL_LOG_PREFIX", "fastrl")
    print(f"[{who} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare_experiment_dir(cfg: Config) -> str:
    """Create (or wipe, with ``--restart_behavior=overwrite``) the folder; save config.json."""
    path = cfg.experiment_dir
    if cfg.restart_behavior == "overwrite" and os.path.isdir(path):
        shutil.rmtree(path)
    try:
        os.makedirs(os.path.join(path, "checkpoints"), exist_ok=True)
        probe = os.path.join(path, ".write_test")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise ExperimentError(
            f"--train_dir={cfg.train_dir}: cannot write the experiment folder {path} "
            f"({exc.strerror})"
        ) from exc
    save_config(cfg, path)
    return path


# --- statistics, summaries, progress --------------------------------------------------


class _Trailing:
    """Timed samples ``(time, value)``: :meth:`push` adds one and returns the oldest of those
    at most ``window`` seconds old, or the newest older one (a rate over a recent window)."""

    def __init__(self, first: tuple[float, Any] | None = None):
        self._samples: deque[tuple[float, Any]] = deque([first] if first else [])

    def push(self, now: float, value: Any, window: float) -> tuple[float, Any]:
        samples = self._samples
        samples.append((now, value))
        while len(samples) > 2 and now - samples[1][0] >= window:
            samples.popleft()
        return samples[0]


class NodeStats:
    """One sampler node, as its link on the learner node sees it."""

    def __init__(self):
        self.connected = False
        self.trajectories = 0  # received
        self.losses = 0  # connections lost (the node died, hung or was cut off)
        self.trajectories_dropped = 0  # lost with them: untrained or on the wire
        self.lag_mean: float | None = None  # over the link's last report
        self.lag_max: int | None = None
        self.lag_max_run = 0  # over the run

    def report(self, connected: bool, trajectories: int, lag_mean: float | None,
               lag_max: int | None) -> None:
        self.connected = connected
        self.trajectories += trajectories
        if lag_mean is not None:
            self.lag_mean, self.lag_max = lag_mean, lag_max
            self.lag_max_run = max(self.lag_max_run, lag_max or 0)

    def summary(self, node: int) -> dict:
        return {"node": node, "connected": self.connected, "trajectories": self.trajectories,
                "losses": self.losses, "trajectories_dropped": self.trajectories_dropped,
                "lag_mean": self.lag_mean, "lag_max": self.lag_max_run}


class TrainingStats:
    """Counters and recent statistics of a run, shared by the serial and parallel runners."""

    def __init__(self, cfg: Config, frameskip: int):
        self.cfg = cfg
        self.frameskip = frameskip
        self.env_frames = 0  # frames the learner trained on (sampling only: collected)
        self.episodes = 0
        self.episodes_truncated = 0  # of ``episodes``, those ended by a time limit (this run)
        self.prior_seconds = 0.0  # wall seconds of earlier runs of this experiment
        self.start_time = time.time()
        self.returns: deque[float] = deque(maxlen=cfg.stats_avg)
        self.lengths: deque[int] = deque(maxlen=cfg.stats_avg)
        self.learner: dict[str, float] = {}
        self.learner_steps = 0
        self.lag_min = math.inf
        self.lag_max = -math.inf
        self.lag_sum = 0.0
        self.lag_batches = 0
        self._fps_window = _Trailing()
        # Faults survived in this run (see docs/reliability.md).
        self.env_restarts = 0  # envs closed and recreated after raising or hanging
        self.steps_discarded = 0  # steps of episodes those env faults cut short
        self.worker_restarts = 0  # rollout/policy worker processes restarted
        self.trajectories_discarded = 0  # complete trajectories of dead workers left untrained
        self._episodes_since_summary: list[tuple[float, int]] = []
        # The measured window of the perf scripts: (time, env_frames) at its start and end,
        # and per pipeline stage (samples, busy seconds) within it.
        self._warmup: tuple[float, int] | None = None
        self._measure_end: tuple[float, int] | None = None
        self._stages: dict[str, tuple[int, float]] = {}
        # Busy seconds of each pipeline stage this run (fastrl/bottleneck.py), counted from
        # the first report on (start-up is no stage's work) to the latest.
        self.busy: dict[str, float] = {}
        self._busy_span: list[float] = []
        # Sampler nodes (--num_sampler_nodes): what each link reports.
        self.nodes = [NodeStats() for _ in range(cfg.num_sampler_nodes)]

    @property
    def run_seconds(self) -> float:
        return time.time() - self.start_time

    def counters(self) -> dict:
        return {"env_frames": self.env_frames, "episodes": self.episodes,
                "wall_seconds": self.prior_seconds + self.run_seconds}

    def mark_warmup(self) -> None:
        """Start of the measured window reported as ``measured_fps`` (perf scripts)."""
        self._warmup = (time.time(), self.env_frames)
        self._stages = {}

    def end_measurement(self) -> None:
        """End of the measured window (before the final checkpoint and shutdown)."""
        self._measure_end = (time.time(), self.env_frames)

    def measured(self) -> dict | None:
        if self._warmup is None:
            return None
        t0, f0 = self._warmup
        t1, f1 = self._measure_end or (time.time(), self.env_frames)
        seconds = max(t1 - t0, 1e-9)
        out = {"fps": (f1 - f0) / seconds, "env_frames": f1 - f0, "seconds": seconds}
        for name, (samples, busy) in self._stages.items():
            out[name] = {"samples_per_busy_second": samples / busy if busy > 0 else None,
                         "busy_fraction": busy / seconds}
        return out

    def add_stage_time(self, name: str, samples: int, busy_seconds: float) -> None:
        """A pipeline stage (learner, policy worker) processed ``samples`` in ``busy_seconds``."""
        if self._warmup is None:
            return
        samples0, busy0 = self._stages.get(name, (0, 0.0))
        self._stages[name] = (samples0 + samples, busy0 + busy_seconds)

    def add_busy(self, stage: str, seconds: float) -> None:
        """Busy seconds of a pipeline stage (``fastrl.bottleneck.STAGES``)."""
        now = time.time()
        if not self._busy_span:  # starts the clock; what it covers came before
            self._busy_span = [now, now]
            return
        self._busy_span[1] = now
        self.busy[stage] = self.busy.get(stage, 0.0) + seconds

    def stage_processes(self) -> dict[str, int]:
        cfg = self.cfg
        nodes = max(cfg.num_sampler_nodes, 1)  # every node runs the workers the flags say
        return {"env": cfg.num_workers * nodes, "inference": cfg.num_policy_workers * nodes,
                "learner": 1, "transfer": cfg.num_sampler_nodes}

    def diagnose(self, busy: dict[str, float], seconds: float) -> Diagnosis:
        fractions = busy_fractions(busy, seconds, self.stage_processes())
        return diagnose(fractions, self.cfg, available_cores())

    def add_episode(self, episode_return: float, length: int, truncated: bool = False) -> None:
        """A finished episode; ``truncated``: a time limit ended it, not the env."""
        self.episodes += 1
        self.episodes_truncated += truncated
        self.returns.append(episode_return)
        self.lengths.append(length)
        self._episodes_since_summary.append((episode_return, length))

    def add_learner_stats(self, stats: dict[str, float], learner_steps: int) -> None:
        self.learner = stats
        self.learner_steps = learner_steps
        if "policy_lag_min" in stats:
            self.lag_min = min(self.lag_min, stats["policy_lag_min"])
            self.lag_max = max(self.lag_max, stats["policy_lag_max"])
            self.lag_sum += stats["policy_lag_mean"]
            self.lag_batches += 1

    def fps(self, window: float = 30.0) -> float:
        """Frames per second over the last ``window`` seconds."""
        now = time.time()
        t0, f0 = self._fps_window.push(now, self.env_frames, window)
        return (self.env_frames - f0) / (now - t0) if now > t0 else 0.0

    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    def summary(self, fps: float) -> dict:
        lag = None
        if self.lag_batches:
            lag = {"min": self.lag_min, "mean": self.lag_sum / self.lag_batches,
                   "max": self.lag_max}
        return {
            "env": self.cfg.env,
            "experiment": self.cfg.experiment,
            "env_frames": self.env_frames,
            "agent_steps": self.env_frames // max(self.frameskip, 1),
            "wall_seconds": round(self.prior_seconds + self.run_seconds, 3),
            "run_seconds": round(self.run_seconds, 3),
            "fps": round(fps, 1),
            "episodes": self.episodes,
            "episodes_truncated_this_run": self.episodes_truncated,
            "mean_episode_return": self.mean_return(),
            "mean_episode_length": float(np.mean(self.lengths)) if self.lengths else None,
            "episodes_averaged": len(self.returns),
            "policy_lag": lag,
            "learner_steps": self.learner_steps,
            "env_restarts": self.env_restarts,
            "steps_discarded": self.steps_discarded,
            "worker_restarts": self.worker_restarts,
            "trajectories_discarded": self.trajectories_discarded,
            "measured": self.measured(),
            "bottleneck": self._bottleneck(),
            **({"sampler_nodes": [n.summary(i) for i, n in enumerate(self.nodes)]}
               if self.nodes else {}),
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def _bottleneck(self) -> dict:
        span = self._busy_span[1] - self._busy_span[0] if self._busy_span else 0.0
        d = self.diagnose(self.busy, span)
        return {"stage": d.stage, "busy_fraction": {k: round(v, 3) for k, v in d.fractions.items()},
                "advice": d.advice}

    def take_new_episodes(self) -> list[tuple[float, int]]:
        eps, self._episodes_since_summary = self._episodes_since_summary, []
        return eps


BUSY_WINDOW = 30.0  # seconds of busy time behind each progress line's fractions


class Reporter:
    """Writes TensorBoard scalars, ``summary.json`` and console progress at their cadences."""

    def __init__(self, cfg: Config, experiment_dir: str, stats: TrainingStats):
        from torch.utils.tensorboard import SummaryWriter

        self.cfg = cfg
        self.dir = experiment_dir
        self.stats = stats
        self.writer = SummaryWriter(log_dir=os.path.join(experiment_dir, "tb"))
        self._last_log = time.time()
        self._last_summary = time.time()
        # (time, busy seconds per stage) at recent progress lines: the line's busy fractions
        # cover the last BUSY_WINDOW seconds, as reports arrive in lumps (one per learner batch).
        self._busy_history = _Trailing((time.time(), {}))

    def maybe_report(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._last_summary >= self.cfg.summaries_every_sec:
            self._last_summary = now
            self.write_summaries()
        if force or now - self._last_log >= self.cfg.log_every_sec:
            self._last_log = now
            self.print_progress()

    def write_summaries(self) -> dict:
        s = self.stats
        fps = s.fps()
        step = s.env_frames
        w = self.writer
        for ret, length in s.take_new_episodes():
            w.add_scalar("episode/return", ret, step)
            w.add_scalar("episode/length", length, step)
        if s.returns:
            w.add_scalar("episode/mean_return", s.mean_return(), step)
        w.add_scalar("perf/fps", fps, step)
        w.add_scalar("faults/env_restarts", s.env_restarts, step)
        w.add_scalar("faults/worker_restarts", s.worker_restarts, step)
        w.add_scalar("faults/trajectories_discarded", s.trajectories_discarded, step)
        for i, node in enumerate(s.nodes):
            w.add_scalar(f"nodes/{i}/connection_losses", node.losses, step)
            if node.lag_mean is not None:
                w.add_scalar(f"nodes/{i}/policy_lag_mean", node.lag_mean, step)
        names = {"policy_loss": "train/policy_loss", "value_loss": "train/value_loss",
                 "entropy": "train/entropy", "kl": "train/kl",
                 "clip_fraction": "train/clip_fraction",
                 "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
                 "policy_lag_min": "policy_lag/min", "policy_lag_mean": "policy_lag/mean",
                 "policy_lag_max": "policy_lag/max"}
        for key, tag in names.items():
            if key in s.learner:
                w.add_scalar(tag, s.learner[key], step)
        w.flush()
        summary = s.summary(fps)
        write_json_atomic(os.path.join(self.dir, "summary.json"), summary)
        return summary

    def print_progress(self) -> None:
        s = self.stats
        ret = s.mean_return()
        ret_txt = "n/a" if ret is None else f"{ret:.3f} (last {len(s.returns)})"
        lag = s.learner
        lag_txt = (f"{lag['policy_lag_min']:.0f}/{lag['policy_lag_mean']:.1f}/"
                   f"{lag['policy_lag_max']:.0f}"
                   if "policy_lag_mean" in lag else "n/a")
        now = time.time()
        t0, busy0 = self._busy_history.push(now, dict(s.busy), BUSY_WINDOW)
        d = s.diagnose({k: v - busy0.get(k, 0.0) for k, v in s.busy.items()}, now - t0)
        busy_txt = progress_text(d.fractions, d.stage if not self.cfg.serial_mode else None)
        log(f"frames {s.env_frames:,} | fps {s.fps():,.0f} | return {ret_txt} | "
            f"lag min/mean/max {lag_txt} | learner steps {s.learner_steps:,}"
            + (f" | {busy_txt}" if busy_txt else "") + node_text(s.nodes))

    def close(self) -> dict:
        summary = self.write_summaries()
        self.writer.close()
        return summary


def write_json_atomic(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)


def node_text(nodes: list[NodeStats]) -> str:
    """The progress line's part about sampler nodes: how many are connected, and each one's
    policy lag (mean/max over its last second), e.g. ``| nodes 2/2 up, lag 0: 1.2/3 1: 1.4/4``."""
    if not nodes:
        return ""
    up = sum(n.connected for n in nodes)
    lags = " ".join(f"{i}: {n.lag_mean:.1f}/{n.lag_max}" for i, n in enumerate(nodes)
                    if n.connected and n.lag_mean is not None)
    return f" | nodes {up}/{len(nodes)} up" + (f", lag {lags}" if lags else "")


def print_final_summary(summary: dict) -> None:
    ret = summary["mean_episode_return"]
    lag = summary["policy_lag"]
    lines = [
        "training finished",
        f"  env frames      {summary['env_frames']:,}",
        f"  wall time       {summary['run_seconds']:.0f} s this run "
        f"({summary['wall_seconds']:.0f} s in total)",
        f"  mean return     {'n/a' if ret is None else f'{ret:.3f}'} over the last "
        f"{summary['episodes_averaged']} episodes",
        f"  learner steps   {summary['learner_steps']:,}",
    ]
    if lag:
        lines.append(f"  policy lag      min {lag['min']:.0f}, mean {lag['mean']:.2f}, "
                     f"max {lag['max']:.0f}")
    if summary.get("env_restarts") or summary.get("worker_restarts"):
        lines.append(f"  faults          {summary['env_restarts']} env restarts, "
                     f"{summary['worker_restarts']} worker restarts, "
                     f"{summary['trajectories_discarded']} trajectories discarded")
    for node in summary.get("sampler_nodes", []):
        lines.append(f"  sampler node {node['node']}  {node['trajectories']:,} trajectories, "
                     f"lag max {node['lag_max']}, {node['losses']} connection(s) lost, "
                     f"{node['trajectories_dropped']} trajectories dropped")
    bottleneck = summary.get("bottleneck")
    if bottleneck and bottleneck["busy_fraction"]:
        lines.append("  busy            " + progress_text(bottleneck["busy_fraction"], None)[5:]
                     + " of the run")
        lines.append(f"  bottleneck      {bottleneck['advice']}")
    for line in lines:
        log(line)
    sys.stdout.flush()
