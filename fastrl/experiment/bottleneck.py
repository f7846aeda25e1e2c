"""Which pipeline stage limits a run, from the time each stage spends working.

The stages report their busy seconds: the rollout workers (stepping envs and writing the
buffers), the policy workers (batched inference), the learner (gathering a batch and
training on it) and, with sampler nodes, the links that receive the nodes' trajectories on
the learner node (one per node). A stage's *busy fraction* is its busy time over the wall
time, averaged over its processes. In parallel mode the stages run side by side, so the
one that is busy nearly all the time holds the others back; in serial mode one process
runs them in turn, and the fractions are the shares of its time.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from fastrl.config.settings import REPLAY_ALGOS

STAGES = ("env", "inference", "learner", "transfer")
LABELS = {"env": "env", "inference": "inf", "learner": "learn", "transfer": "xfer"}
# A stage busy at least this much of the time limits the run (parallel mode).
SATURATED = 0.8


class Diagnosis(NamedTuple):
    stage: str | None  # the limiting stage, or None when none is saturated
    fractions: dict[str, float]
    advice: str  # one sentence: what limits the run and what to change


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_fractions(busy_seconds: dict[str, float], seconds: float,
                   processes: dict[str, int]) -> dict[str, float]:
    """Busy fraction of each stage with reported time: ``busy / (seconds * processes)``,
    capped at 1 (a report may land just after the interval it covers)."""
    out = {}
    if seconds <= 0:
        return out
    for stage in STAGES:
        if stage in busy_seconds:
            out[stage] = min(1.0, busy_seconds[stage] / (seconds * max(processes[stage], 1)))
    return out


def diagnose(fractions: dict[str, float], cfg: Any, cores: int, device_type: str) -> Diagnosis:
    """Name the stage that limits the run and what to change, from the busy fractions;
    ``device_type`` is what ``cfg.device`` resolved to ("cuda" or "cpu")."""
    if not fractions:
        return Diagnosis(None, fractions, "no stage has reported yet")
    stage = max(fractions, key=lambda s: fractions[s])
    share = f"{fractions[stage]:.0%}"
    if cfg.serial_mode:
        return Diagnosis(stage, fractions, (
            f"serial mode: the {_NAMES[stage]} take{'s' if stage == 'learner' else ''} {share} "
            f"of the one process's time; parallel mode (without --serial_mode) runs the stages "
            f"side by side"))
    if fractions[stage] < SATURATED:
        return Diagnosis(None, fractions, (
            f"no stage is saturated (the busiest, the {_NAMES[stage]}, works {share} of the "
            f"time): the stages wait on each other or share the {cores} CPU cores"
            + ("; in sync mode (--async_rl False) sampling and learning take turns"
               if not cfg.async_rl else "")))
    advice = f"{_NAMES[stage]} busy {share}: " + _advice(stage, cfg, cores, device_type)
    return Diagnosis(stage, fractions, advice)


_NAMES = {"env": "rollout workers", "inference": "policy workers", "learner": "learner",
          "transfer": "links to the sampler nodes"}


def _advice(stage: str, cfg: Any, cores: int, device_type: str) -> str:
    if stage == "learner":
        tips = ["the learner limits the run"]
        if device_type == "cpu":
            tips.append("a GPU (--device cuda) trains far faster")
        if getattr(cfg, "algo", "appo") in REPLAY_ALGOS:
            tips.append(f"a lower --replay_samples_per_insert (now "
                        f"{cfg.replay_samples_per_insert}) takes fewer learner steps per env "
                        "step (the rate limiter holds the envs back to keep it)")
        elif cfg.num_epochs * cfg.num_batches_per_epoch > 1:
            tips.append(f"fewer SGD steps per batch (--num_epochs {cfg.num_epochs} x "
                        f"--num_batches_per_epoch {cfg.num_batches_per_epoch})")
        if device_type == "cuda":
            tips.append(f"a bigger --batch_size (now {cfg.batch_size}) uses the GPU better")
            tips.append(f"--num_learners (now {cfg.num_learners}) up to the number of GPUs")
        else:
            tips.append(f"more --learner_threads (now {cfg.learner_threads}) or "
                        f"--num_learners (now {cfg.num_learners}) if cores are idle")
        return "; ".join(tips)
    if stage == "transfer":
        return ("receiving trajectories from the sampler nodes limits the run; a faster "
                "network between the nodes, or fewer nodes with more envs each")
    if stage == "inference":
        return (f"inference limits the run; more --num_policy_workers (now "
                f"{cfg.num_policy_workers}) or --policy_threads (now {cfg.policy_threads}), or "
                f"more envs per worker for bigger inference batches")
    processes = cfg.num_workers + cfg.num_policy_workers + 1
    tip = (f"more --num_workers (now {cfg.num_workers})" if processes < cores
           else f"more cores: {processes} processes already share {cores}")
    split = ("" if cfg.worker_num_splits >= 2
             else "; --worker_num_splits 2 overlaps stepping with inference")
    return f"the envs limit the run; {tip}{split}"


def progress_text(fractions: dict[str, float], limit: str | None) -> str:
    """The progress line's part, e.g. ``busy env 45% inf 12% learn 97% (learner)``."""
    if not fractions:
        return ""
    parts = " ".join(f"{LABELS[s]} {fractions[s]:.0%}" for s in STAGES if s in fractions)
    return f"busy {parts}" + (f" ({limit})" if limit else "")
