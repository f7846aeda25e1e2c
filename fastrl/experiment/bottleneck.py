"""Which pipeline stage limits a run, from the time each stage spends working.

The stages report their busy seconds: the rollout workers (stepping envs and writing the
buffers), the policy workers (batched inference), the learner (gathering a batch and
training on it) and, with sampler nodes, the links that receive the nodes' trajectories on
the learner node (one per node). A stage's *busy fraction* is its busy time over the wall
time, averaged over its processes. In parallel mode the stages run side by side, so the
one that is busy nearly all the time holds the others back; in serial mode one process
runs them in turn, and the fractions are the shares of its time.

A stage's busy time is wall time, so it includes time spent waiting for a core. The machine's
*CPU busy fraction* (``cpu``: the cores this process may use, from /proc/stat, whoever uses
them) tells the two apart: when nearly every core is busy, the cores limit the run, and more
rollout or policy workers would only share them (measured on a 16-core GPU machine, where
doubling the policy workers halved each one's throughput: perf/log/RESULTS.md).

The advice names the flags to change with their values, from :class:`BottleneckSettings`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

from fastrl.config.settings import REPLAY_ALGOS, CopiedFromConfig
from fastrl.transport.procs import children, named_stat, process_title

STAGES = ("env", "inference", "learner", "transfer")
CPU = "cpu"  # the key of the CPU busy fraction beside the stages'
LABELS = {"env": "env", "inference": "inf", "learner": "learn", "transfer": "xfer", CPU: "cpu"}
# A stage busy at least this much of the time limits the run (parallel mode).
SATURATED = 0.8
# The cores are the limit when at least this share of their time is busy.
CPU_SATURATED = 0.9


@dataclasses.dataclass(frozen=True)
class BottleneckSettings(CopiedFromConfig):
    """The flags the diagnosis reads and names in its advice: each field as the ``Config``
    field of the same name (``--help``)."""

    serial_mode: bool
    async_rl: bool
    algo: str
    num_workers: int
    worker_num_splits: int
    num_policy_workers: int
    policy_threads: int
    num_learners: int
    learner_threads: int
    batch_size: int
    num_epochs: int
    num_batches_per_epoch: int
    replay_samples_per_insert: float


class Diagnosis(NamedTuple):
    stage: str | None  # the limiting stage, "cpu" for the cores, or None when none is saturated
    fractions: dict[str, float]
    advice: str  # one sentence: what limits the run and what to change


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


try:
    _TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError):
    _TICKS_PER_SECOND = 100


def cpu_seconds(cores: set[int] | None = None, stat: str = "/proc/stat") -> float | None:
    """Busy seconds since boot of the CPU cores this process may run on, whoever ran on
    them (``/proc/stat``: every column but idle and iowait); None without /proc/stat."""
    try:
        cores = os.sched_getaffinity(0) if cores is None else cores
        busy = 0
        with open(stat) as f:
            for line in f:
                fields = line.split()
                if not fields or not fields[0].startswith("cpu"):
                    break  # the per-core lines come first
                if fields[0] != "cpu" and int(fields[0][3:]) in cores:
                    ticks = [int(x) for x in fields[1:9]]  # guest time is inside user
                    busy += sum(ticks) - ticks[3] - ticks[4]
    except (AttributeError, OSError, ValueError):
        return None
    return busy / _TICKS_PER_SECOND


def _process_row(proc: str, pid: int) -> tuple[str, float, int] | None:
    """``(kind, cpu seconds, start time in ticks)`` of one process from /proc; None once it
    is gone."""
    row = named_stat(pid, proc)
    if row is None:
        return None
    comm, fields = row
    # A fastrl child by its role, the title's first two words (fastrl-rollout-1,
    # fastrl-learner-p1-1); a child that has exited (no command line left) by its name, which
    # the kernel keeps to 15 characters (fastrl-rollout-); any other program by its name.
    title = process_title(pid, proc)
    name = title if title.startswith("fastrl-") else comm
    kind = "-".join(name.split("-")[:2]) if name.startswith("fastrl-") else comm
    return kind, (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND, int(fields[19])


def process_tree_cpu(root: int | None = None,
                     proc: str = "/proc") -> dict[int, tuple[str, float, int]] | None:
    """CPU seconds (user and system) used so far by ``root`` (default: this process) and every
    process below it: ``{pid: (kind, seconds, start time)}``, the start time telling a reused
    pid apart. The kind is a fastrl child's role (``fastrl-rollout``, ``fastrl-policy``,
    ``fastrl-learner``: its title's first two words), any other program's name (a VizDoom
    engine is ``vizdoom``), and ``root`` itself is ``launcher``. Walks the tree from ``root``
    down, reading only its processes. None where /proc cannot be read (not Linux)."""
    root = os.getpid() if root is None else root
    if _process_row(proc, root) is None:
        return None
    out: dict[int, tuple[str, float, int]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        row = _process_row(proc, pid) if pid not in out else None
        if row is not None:
            out[pid] = ("launcher", *row[1:]) if pid == root else row
            todo.extend(children(pid, proc))
    return out


def cores_by_kind(before: dict[int, tuple[str, float, int]],
                  after: dict[int, tuple[str, float, int]], seconds: float) -> dict[str, float]:
    """Cores each kind of process kept busy between two :func:`process_tree_cpu` snapshots
    ``seconds`` apart, largest first, each process under the kind it had at the start. A
    process started in between counts from its start (its pid may be an old one's); one that
    has exited counts up to its end while it is not yet reaped, and not at all once reaped
    (its figures are gone with it)."""
    used: dict[str, float] = {}
    for pid, (kind, cpu, started) in after.items():
        old = before.get(pid)
        if old is not None and old[2] == started:
            kind, cpu = old[0], cpu - old[1]
        used[kind] = used.get(kind, 0.0) + max(cpu, 0.0)
    return {k: v / max(seconds, 1e-9) for k, v in sorted(used.items(), key=lambda kv: -kv[1])}


def busy_fractions(busy_seconds: dict[str, float], seconds: float,
                   processes: dict[str, int]) -> dict[str, float]:
    """Busy fraction of each stage with reported time: ``busy / (seconds * processes)``,
    capped at 1 (a report may land just after the interval it covers); ``cpu`` (busy core
    seconds, over ``processes["cpu"]`` cores) likewise."""
    out = {}
    if seconds <= 0:
        return out
    for stage in (*STAGES, CPU):
        if stage in busy_seconds and stage in processes:
            out[stage] = min(1.0, busy_seconds[stage] / (seconds * max(processes[stage], 1)))
    return out


def diagnose(fractions: dict[str, float], flags: BottleneckSettings, cores: int,
             device_type: str) -> Diagnosis:
    """Name the stage that limits the run and what to change, from the busy fractions;
    ``device_type`` is what ``--device`` resolved to ("cuda" or "cpu")."""
    stages = {s: f for s, f in fractions.items() if s != CPU}
    if not stages:
        return Diagnosis(None, fractions, "no stage has reported yet")
    stage = max(stages, key=lambda s: stages[s])
    share = f"{stages[stage]:.0%}"
    cpu = fractions.get(CPU)
    cpu_bound = cpu is not None and cpu >= CPU_SATURATED
    if flags.serial_mode:
        return Diagnosis(stage, fractions, (
            f"serial mode: the {_NAMES[stage]} take{'s' if stage == 'learner' else ''} {share} "
            f"of the one process's time; parallel mode (without --serial_mode) runs the stages "
            f"side by side"))
    if cpu_bound and (stage == "inference" or stages[stage] < SATURATED):
        return Diagnosis(CPU, fractions, (
            f"the {cores} CPU cores are {cpu:.0%} busy: the cores limit the run (the busiest "
            f"stage, the {_NAMES[stage]}, works {share} of the time, waiting for a core "
            f"included); more rollout or policy workers would share the same cores: more "
            f"cores, or fewer processes per core (each VizDoom env runs its engine in a "
            f"process of its own)"))
    if stages[stage] < SATURATED:
        return Diagnosis(None, fractions, (
            f"no stage is saturated (the busiest, the {_NAMES[stage]}, works {share} of the "
            f"time): the stages wait on each other or share the {cores} CPU cores"
            + ("; in sync mode (--async_rl False) sampling and learning take turns"
               if not flags.async_rl else "")))
    advice = f"{_NAMES[stage]} busy {share}: " + _advice(stage, flags, cores, device_type,
                                                         cpu_bound)
    return Diagnosis(stage, fractions, advice)


_NAMES = {"env": "rollout workers", "inference": "policy workers", "learner": "learner",
          "transfer": "links to the sampler nodes"}


def _advice(stage: str, flags: BottleneckSettings, cores: int, device_type: str,
            cpu_bound: bool) -> str:
    if stage == "learner":
        tips = ["the learner limits the run"]
        if device_type == "cpu":
            tips.append("a GPU (--device cuda) trains far faster")
        if flags.algo in REPLAY_ALGOS:
            tips.append(f"a lower --replay_samples_per_insert (now "
                        f"{flags.replay_samples_per_insert}) takes fewer learner steps per env "
                        "step (the rate limiter holds the envs back to keep it)")
        elif flags.num_epochs * flags.num_batches_per_epoch > 1:
            tips.append(f"fewer SGD steps per batch (--num_epochs {flags.num_epochs} x "
                        f"--num_batches_per_epoch {flags.num_batches_per_epoch})")
        if device_type == "cuda":
            tips.append(f"a bigger --batch_size (now {flags.batch_size}) uses the GPU better")
            tips.append(f"--num_learners (now {flags.num_learners}) up to the number of GPUs")
        elif not cpu_bound:
            tips.append(f"more --learner_threads (now {flags.learner_threads}) or "
                        f"--num_learners (now {flags.num_learners}) if cores are idle")
        return "; ".join(tips)
    if stage == "transfer":
        return ("receiving trajectories from the sampler nodes limits the run; a faster "
                "network between the nodes, or fewer nodes with more envs each")
    if stage == "inference":
        return (f"inference limits the run; more --num_policy_workers (now "
                f"{flags.num_policy_workers}) or --policy_threads (now {flags.policy_threads}), or "
                f"more envs per worker for bigger inference batches")
    processes = flags.num_workers + flags.num_policy_workers + 1
    tip = (f"more --num_workers (now {flags.num_workers})" if processes < cores and not cpu_bound
           else f"more cores: {processes} processes already share {cores}" if not cpu_bound
           else f"more cores: the {cores} cores are busy")
    split = ("" if flags.worker_num_splits >= 2
             else "; --worker_num_splits 2 overlaps stepping with inference")
    return f"the envs limit the run; {tip}{split}"


def progress_text(fractions: dict[str, float], limit: str | None) -> str:
    """The progress line's part, e.g. ``busy env 45% inf 12% learn 97% cpu 99% (learner)``."""
    if not any(s in fractions for s in STAGES):
        return ""
    parts = " ".join(f"{LABELS[s]} {fractions[s]:.0%}" for s in (*STAGES, CPU)
                     if s in fractions)
    return f"busy {parts}" + (f" ({limit})" if limit else "")
