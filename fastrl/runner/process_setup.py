"""Each process's own set-up, first thing: its random numbers (:func:`seed_everything`, one
stream per process), its allocator (:func:`keep_freed_memory`) and, for a rollout worker, its
core (:func:`worker_core`, :func:`keep_on_core`).

**A rollout worker on one core.** A VizDoom env's step is a round trip between the worker and
the env's engine process: the worker wakes the engine and sleeps until it answers. When the two
may run on any core, the wake-up often lands on another core, which then preempts whatever ran
there (an inter-processor interrupt, costly in a VM) and starts cold. A ``perf record`` of a
rollout worker in a 2-core doom_basic run found 44% of its CPU in the kernel's context switches
and wake-ups. Pinning worker w and the engines it starts (they inherit the affinity) to one core
keeps each round trip there: on 2 cores the engines' cost per agent step fell 12%, the workers'
15%, and training ran 13% faster (perf/log/RESULTS.md, "rollout workers on one core each"). The
policy workers and learners stay free, so the scheduler fills the cores around the workers. A
worker whose envs start no process (CartPole, ale-py, MuJoCo) stays free under ``auto``: it has
no round trip to keep on a core, and pinned it could not move to an idle one (CartPole trained
3-7% slower pinned).

**Keep freed memory** in the process for reuse (glibc malloc), so that big tensors do not
page-fault on every allocation.

glibc serves an allocation larger than its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and gives it back to the kernel on ``free``. A learner step on doom_basic allocates
many such blocks (the float copy of 1,056 images alone is 117 MB), so every step pays for
page faults on memory it has just freed. Serving everything from the heap and never trimming
it removes that: the ``Learner.train`` micro-benchmark (32 x 32 samples, conv + GRU 512, one
CPU thread) went from 540-760 ms to 390-480 ms per step (perf/log/RESULTS.md). The price is that a
process keeps its peak heap size until it exits. ``FASTRL_KEEP_FREED_MEMORY=0`` in the
environment turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random

import numpy as np
import torch

from fastrl.config.settings import Config

AFFINITIES = ("auto", "on", "off")  # --worker_cpu_affinity


def rollout_cores(setting: str, processes: int, workers: int,
                  cores: list[int] | None = None) -> list[int] | None:
    """The core of each of ``workers`` rollout workers (worker w on the w-th of ``cores``,
    round the list: default, those this process may use), or None where they stay free:
    ``setting`` "off"; "auto" with fewer ``processes`` (the run's rollout and policy workers
    and learners on the machine) than cores, where several runs side by side would otherwise
    pile their workers onto the first cores while the others idle."""
    if setting not in AFFINITIES:
        raise ValueError(f"--worker_cpu_affinity={setting!r}: must be one of {AFFINITIES}")
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if setting == "off" or not cores or (setting == "auto" and processes < len(cores)):
        return None
    return [cores[w % len(cores)] for w in range(workers)]


def machine_processes(cfg: Config) -> tuple[int, int]:
    """The run's busy processes on the machine that samples (rollout and policy workers, and
    the learners where they share it), and how many sampler nodes share it (node k's workers
    come after those of nodes 0 to k-1)."""
    sampling = cfg.num_workers + cfg.num_policy_workers
    learners = cfg.num_policies * cfg.num_learners
    if not cfg.num_sampler_nodes:
        return sampling + learners, 1
    if cfg.start_sampler_nodes:
        return sampling * cfg.num_sampler_nodes + learners, cfg.num_sampler_nodes
    return sampling, 1  # a node on a machine of its own, as far as the run knows


def worker_core(cfg: Config, node: int, worker_id: int) -> int | None:
    """The core rollout worker ``worker_id`` (of sampler node ``node``; 0 without nodes) may
    keep to under ``--worker_cpu_affinity``, or None (always in serial mode, whose one process
    is the whole run)."""
    if cfg.serial_mode:
        return None
    processes, nodes = machine_processes(cfg)
    first = node * cfg.num_workers if nodes > 1 else 0
    cores = rollout_cores(cfg.worker_cpu_affinity, processes, first + worker_id + 1)
    return None if cores is None else cores[-1]


def descendants(pid: int) -> list[int]:
    """Every process ``pid`` started that still runs, and theirs (empty where /proc does not
    list children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            found += kids
            todo += kids
    return found


def keep_on_core(core: int, always: bool) -> tuple[int, str | None]:
    """Keep this process and the processes it has started (VizDoom's engines) on ``core``,
    and so every process it starts from now on; unless ``always``, only where it has started
    some (an env that runs in the worker's own process gains nothing: the worker could no
    longer move to an idle core). Return how many processes were pinned besides this one (-1:
    none, not even this one), and why not where the call failed (no such call on this OS, a
    core outside the allowed set)."""
    started = descendants(os.getpid())
    if not (always or started):
        return -1, None
    try:
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError, ValueError) as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    pinned = 0
    for pid in started:
        try:
            os.sched_setaffinity(pid, {core})
            pinned += 1
        except OSError:  # (one that has just exited)
            pass
    return pinned, None


# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Tune this process's malloc as described above; False where it is not glibc's or
    ``FASTRL_KEEP_FREED_MEMORY=0`` is set."""
    if os.environ.get("FASTRL_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_MAX, 0)  # no mmap for big blocks: they come from the heap
    ok &= mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # never give the heap's top back
    ok &= mallopt(_M_TOP_PAD, 256 << 20)  # grow the heap in big steps
    return bool(ok)


# ``seed_everything`` streams: the kinds of process that draw random numbers of their own.
POLICY_STREAM = 1
LEARNER_STREAM = 2  # the learners of policies 1, 2, ... (policy 0 seeds from --seed itself)
ROLLOUT_STREAM = 3  # envs that draw from numpy's or Python's global generator


def seed_everything(seed: int | None, *stream: int) -> None:
    """Seed Python's, numpy's and torch's generators of this process.

    Without ``stream``, from ``seed`` itself (nothing when it is None). With ``stream`` (the
    process's place: a kind, an id, a restart count), from ``seed`` and ``stream`` mixed, so
    that no two processes of a run, nor two incarnations of one, draw the same numbers; and
    from OS entropy when ``seed`` is None, since a child forked from the fork server otherwise
    starts from the fork server's state, the same in every child."""
    if seed is None and not stream:
        return
    if stream:
        entropy = None if seed is None else [seed, *stream]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
