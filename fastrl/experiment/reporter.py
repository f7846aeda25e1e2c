"""Reports of a run: TensorBoard scalars, ``summary.json`` and the console progress lines."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastrl.config.settings import CopiedFromConfig
from fastrl.experiment.bottleneck import (
    progress_text,
)
from fastrl.experiment.checkpoint import checkpoint_dir
from fastrl.experiment.folder import write_json_atomic
from fastrl.experiment.stats import NodeStats, TrainingStats, _Trailing
from fastrl.log import log

if TYPE_CHECKING:
    from fastrl.experiment.wandb_run import WandbRun

BUSY_WINDOW = 30.0  # seconds of busy time behind each progress line's fractions
SUMMARY_FILE = "summary.json"  # in the experiment folder


def earlier_final_evaluation(exp_dir: str) -> dict | None:
    """The ``final_evaluation`` of the summary an earlier run left in ``exp_dir``, if its
    checkpoint is still in this experiment (found by its name: the folder may have been
    moved or copied since), with that path; else None."""
    try:
        with open(os.path.join(exp_dir, SUMMARY_FILE)) as fh:
            final = json.load(fh).get("final_evaluation")
        path = os.path.join(checkpoint_dir(exp_dir), os.path.basename(final["checkpoint"]))
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None
    return {**final, "checkpoint": path} if os.path.isfile(path) else None


@dataclass(frozen=True)
class ReportSettings(CopiedFromConfig):
    """The reports' cadences and whether the run is serial (its progress line names no
    limiting stage): each field as the ``Config`` field of the same name."""

    summaries_every_sec: float
    log_every_sec: float
    serial_mode: bool


class Reporter:
    """Writes TensorBoard scalars (and W&B's: ``wandb_run``), ``summary.json`` and console
    progress at their cadences."""

    def __init__(self, settings: ReportSettings, experiment_dir: str, stats: TrainingStats,
                 wandb_run: WandbRun | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.settings = settings
        self.dir = experiment_dir
        self.stats = stats
        # Every scalar of the run goes through this writer (evaluation's and PBT's too); with
        # --with_wandb it sends each to W&B as well.
        writer = SummaryWriter(log_dir=os.path.join(experiment_dir, "tb"))
        self.writer = writer if wandb_run is None else wandb_run.tee(writer)
        self._last_log = time.time()
        self._last_summary = time.time()
        # (time, busy seconds per stage) at recent progress lines: the line's busy fractions
        # cover the last BUSY_WINDOW seconds, as reports arrive in lumps (one per learner batch).
        self._busy_history = _Trailing((time.time(), {}))
        self._warned_long_episodes = False  # said once a run (TrainingStats.long_episodes)

    def maybe_report(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._last_summary >= self.settings.summaries_every_sec:
            self._last_summary = now
            self.write_summaries()
        if force or now - self._last_log >= self.settings.log_every_sec:
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
        for metrics in s.take_new_metrics():
            for name, value in metrics.items():
                w.add_scalar(f"episode_metrics/{name}", value, step)
        for name, mean in s.mean_metrics().items():
            w.add_scalar(f"episode_metrics/mean_{name}", mean, step)
        w.add_scalar("perf/fps", fps, step)
        w.add_scalar("faults/env_restarts", s.env_restarts, step)
        w.add_scalar("envs/recycled", s.env_recycles, step)
        for kind, n in s.env_faults.items():
            w.add_scalar(f"faults/env_{kind}", n, step)
        w.add_scalar("faults/worker_restarts", s.worker_restarts, step)
        w.add_scalar("faults/trajectories_discarded", s.trajectories_discarded, step)
        for i, node in enumerate(s.nodes):
            w.add_scalar(f"nodes/{i}/connection_losses", node.losses, step)
            if node.lag_mean is not None:
                w.add_scalar(f"nodes/{i}/policy_lag_mean", node.lag_mean, step)
        for key, tag in LEARNER_TAGS.items():
            if key in s.learner and not s.policies:
                w.add_scalar(tag, s.learner[key], step)
        for k, p in enumerate(s.policies):  # --num_policies > 1: every policy's own curves
            prefix = f"policy_{k}/"
            for ret, length in p.new_episodes:
                w.add_scalar(prefix + "episode_return", ret, step)
                w.add_scalar(prefix + "episode_length", length, step)
            p.new_episodes = []
            if p.returns:
                w.add_scalar(prefix + "mean_return", p.mean_return(), step)
            for name, mean in p.mean_metrics().items():
                w.add_scalar(f"{prefix}episode_metrics/mean_{name}", mean, step)
            w.add_scalar(prefix + "env_frames", p.env_frames, step)
            w.add_scalar(prefix + "learner_steps", p.learner_steps, step)
            for key, tag in LEARNER_TAGS.items():
                if key in p.learner:
                    w.add_scalar(prefix + tag, p.learner[key], step)
        w.flush()
        if not self._warned_long_episodes:
            warning = s.long_episodes()
            if warning:
                log(warning)
                self._warned_long_episodes = True
        summary = s.summary(fps)
        write_json_atomic(os.path.join(self.dir, SUMMARY_FILE), summary)
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
        busy = s.busy_now()
        t0, busy0 = self._busy_history.push(now, busy, BUSY_WINDOW)
        d = s.diagnose({k: v - busy0.get(k, 0.0) for k, v in busy.items()}, now - t0)
        busy_txt = progress_text(d.fractions, d.stage if not self.settings.serial_mode else None)
        log(f"frames {s.env_frames:,} | fps {s.fps():,.0f} | return {ret_txt} | "
            f"lag min/mean/max {lag_txt} | learner steps {s.learner_steps:,}"
            + (f" | {busy_txt}" if busy_txt else "") + node_text(s.nodes)
            + policies_text(s.policies))

    def close(self) -> dict:
        summary = self.write_summaries()
        self.writer.close()
        return summary


# The learner's statistics and their TensorBoard tags (``policy_{k}/`` before each with
# several policies).
LEARNER_TAGS = {"policy_loss": "train/policy_loss", "value_loss": "train/value_loss",
                "entropy": "train/entropy", "kl": "train/kl",
                "clip_fraction": "train/clip_fraction",
                "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
                "adv_std": "train/adv_std", "ratio_mean": "train/ratio_mean",
                "policy_lag_min": "policy_lag/min", "policy_lag_mean": "policy_lag/mean",
                "policy_lag_max": "policy_lag/max",
                "stale_samples": "pbt/stale_samples",  # --with_pbt (fastrl/algo/pbt/population.py)
                # --algo apex, r2d2 (fastrl/algo/replay/apex.py, r2d2.py, runner/replay_station.py)
                "q_loss": "train/q_loss", "q_mean": "train/q_mean", "td_error": "train/td_error",
                "priority_mean": "replay/priority_mean", "replay_size": "replay/size",
                "samples_per_insert": "replay/samples_per_insert", "beta": "replay/beta",
                "epsilon_min": "replay/epsilon_min", "epsilon_max": "replay/epsilon_max",
                "burn_in_fraction": "replay/burn_in_fraction"}


def policies_text(policies) -> str:
    """The progress line's part about each policy (``--num_policies`` > 1): its recent mean
    return and learner steps, e.g. ``| policies 0: 3.1 @ 42, 1: 2.7 @ 40``."""
    if not policies:
        return ""
    return " | policies " + ", ".join(
        f"{k}: {'n/a' if p.mean_return() is None else f'{p.mean_return():.2f}'} @ "
        f"{p.learner_steps:,}" for k, p in enumerate(policies))


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
                     + (f"p50 {lag['p50']}, p95 {lag['p95']}, " if "p50" in lag else "")
                     + f"max {lag['max']:.0f} learner steps (mean and percentiles: of each "
                     "batch's mean)")
    held = summary.get("splits_held") or {}
    if held.get("held"):
        lines.append(f"  splits held     before {held['held']:,} of {held['begun']:,} starts, "
                     "while enough trajectories waited for the learner (--max_batches_waiting)")
    if summary.get("episode_metrics"):
        lines.append("  episode metrics " + ", ".join(
            f"{name} {mean:.2f}" for name, mean in summary["episode_metrics"].items())
            + " (recent means)")
    if summary.get("env_restarts") or summary.get("worker_restarts"):
        lines.append(f"  faults          {summary['env_restarts']} env restarts, "
                     f"{summary['worker_restarts']} worker restarts, "
                     f"{summary['trajectories_discarded']} trajectories discarded")
    if summary.get("env_recycles"):
        lines.append(f"  envs recycled   {summary['env_recycles']:,} (made anew at an episode "
                     "boundary: --env_recycle_episodes, --env_recycle_mb)")
    faults = {kind: n for kind, n in summary.get("env_faults", {}).items() if n}
    if faults:
        lines.append("  env faults      " + ", ".join(f"{kind} {n}" for kind, n in faults.items())
                     + f" ({summary['steps_discarded']:,} steps left out of training)")
    final = summary.get("final_evaluation")
    if final:
        lines.append(f"  evaluation      return {final['mean_return']:.3f} +- "
                     f"{final['std_return']:.3f} over {final['episodes']} episodes of the final "
                     f"checkpoint ({'most likely' if final['deterministic'] else 'sampled'} "
                     "actions)")
    for p in summary.get("policies", []):
        ret = p["mean_episode_return"]
        lines.append(f"  policy {p['policy']}        {p['env_frames']:,} frames, mean return "
                     f"{'n/a' if ret is None else f'{ret:.3f}'} over {p['episodes_averaged']} "
                     f"episodes, {p['learner_steps']:,} learner steps (version {p['version']})"
                     + "".join(f", {name} {mean:.2f}"
                               for name, mean in p.get("episode_metrics", {}).items()))
    pbt = summary.get("pbt")
    if pbt:
        lines.append(f"  pbt             {pbt['exchanges']} exchanges in {pbt['rankings']} "
                     f"rankings by {pbt['objective']}; policies replaced "
                     + ", ".join(f"{k}: {n}" for k, n in enumerate(pbt["replaced"]))
                     + f"; {sum(pbt['stale_trajectories_dropped'])} stale trajectories dropped")
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
