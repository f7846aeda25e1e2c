"""Each process's own set-up, first thing: its random numbers (:func:`seed_everything`, one
stream per process), its allocator (:func:`keep_freed_memory`) and, for a rollout worker, its
core (:func:`worker_core`, :func:`keep_on_core`).

**A rollout worker on one core.** A VizDoom env's step is a round trip between the worker and
the env's engine process: the worker wakes the engine and sleeps until it answers. When the two
may run on any core, the wake-up often lands on another core, which then preempts whatever ran
there (an inter-processor interrupt, costly in a VM) and starts cold. A ``perf record`` of a
rollout worker in a 2-core doom_basic run found 44% of its CPU in the kernel's context switches
and wake-ups. Pinning worker w and the engines it starts (they inherit the affinity) to one core
keeps each round trip there: on 2 cores the engines' cost per agent step fell 2-12%, the
workers' 8-18%, and doom_basic trained 10% faster (perf/log/RESULTS.md, 2026-11-28, "rollout
workers on one core each"). The policy workers and learners stay free, so the scheduler fills
the cores around the workers. A worker whose envs start no process (CartPole, ale-py, MuJoCo)
stays free under ``auto``: it has no round trip to keep on a core, and pinned it could not
move to an idle one (CartPole trained 3-7% slower pinned).

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


def allowed_cores() -> list[int]:
    """The cores this process may run on, in order (empty where the OS cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no such call off Linux)
        return []


def rollout_cores(setting: str, workers: int, cores: list[int] | None = None
                  ) -> tuple[list[int] | None, str]:
    """The core of each of the machine's ``workers`` rollout workers (worker w on the w-th of
    ``cores``, round the list: default, those this process may use), or None where they stay
    free; and why, in words. ``setting`` "off": never; "on": always; "auto": only where the
    workers are a whole multiple of the cores, so that every core holds as many of them: with
    fewer, several runs side by side would pile their workers and engines onto the first
    cores while the others idle; with a remainder, some cores hold one worker more, which the
    others then wait for (3 workers on 2 cores in sync mode trained 5-7% slower pinned)."""
    if setting not in AFFINITIES:
        raise ValueError(f"--worker_cpu_affinity={setting!r}: must be one of {AFFINITIES}")
    cores = allowed_cores() if cores is None else sorted(cores)
    if setting == "off":
        return None, "--worker_cpu_affinity off"
    if not cores:
        return None, "this OS does not say which cores a process may use"
    if setting == "auto" and (workers < len(cores) or workers % len(cores)):
        return None, (f"--worker_cpu_affinity auto: {workers} rollout worker(s) on "
                      f"{len(cores)} cores, not a whole multiple of them")
    return [cores[w % len(cores)] for w in range(workers)], ""


def machine_workers(cfg: Config) -> tuple[int, int]:
    """The rollout workers on the machine that samples, and how many sampler nodes share it
    (node k's workers come after those of nodes 0 to k-1)."""
    if cfg.num_sampler_nodes and cfg.start_sampler_nodes:
        return cfg.num_workers * cfg.num_sampler_nodes, cfg.num_sampler_nodes
    return cfg.num_workers, 1  # (a node started elsewhere: a machine of its own, as far as
    # the run knows)


def worker_core(cfg: Config, node: int, worker_id: int, cores: list[int] | None = None
                ) -> tuple[int | None, str]:
    """The core rollout worker ``worker_id`` (of sampler node ``node``; 0 without nodes) may
    keep to under ``--worker_cpu_affinity``, among ``cores`` (default: those this process may
    use), or None and why not (always None in serial mode, whose one process is the whole
    run)."""
    if cfg.serial_mode:
        return None, "serial mode: one process"
    workers, nodes = machine_workers(cfg)
    cores, why = rollout_cores(cfg.worker_cpu_affinity, workers, cores)
    if cores is None:
        return None, why
    return cores[(node * cfg.num_workers if nodes > 1 else 0) + worker_id], ""


def _parent(pid: str) -> int | None:
    """The parent of process ``pid``; None for one that is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else int(fields[1])


def descendants(pid: int) -> list[int]:
    """Every live process that ``pid`` started, and theirs (from each process's parent in
    /proc; empty where there is no /proc)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for p in pids:
        parent = _parent(p)
        if parent is not None:
            children.setdefault(parent, []).append(int(p))
    found, todo, seen = [], [pid], {pid}
    while todo:
        kids = [k for k in children.get(todo.pop(), []) if k not in seen]  # (a reused pid
        seen.update(kids)  # read mid-scan could make a cycle)
        found += kids
        todo += kids
    return found


def _pin_process(pid: int, cores: set[int]) -> OSError | None:
    """Every thread of process ``pid`` on ``cores`` (an affinity is a thread's own: the threads
    a process already runs do not follow its main thread's); the first refusal, if any (the
    other threads are moved all the same)."""
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    refused = None
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # (one that has just ended)
            pass
        except OSError as exc:
            refused = refused or exc
    return refused


def keep_on_core(core: int, always: bool) -> tuple[int, str | None]:
    """Keep this process and the processes it has started (VizDoom's engines), every thread
    of each, on ``core``, and so every process and thread they start from now on; unless
    ``always``, only where it has started some (an env that runs in the worker's own process
    gains nothing: the worker could no longer move to an idle core). Return how many
    processes were pinned besides this one (-1: none, not even this one), and why not where
    the call failed (no such call on this OS, a core outside the allowed set)."""
    started = descendants(os.getpid())
    if not (always or started):
        return -1, None
    try:
        before = os.sched_getaffinity(0)
        refused = _pin_process(os.getpid(), {core})
    except (AttributeError, OSError, ValueError) as exc:
        refused = exc
        before = None
    if refused is not None:  # all of it back as it was: no thread half moved
        if before is not None:
            _pin_process(os.getpid(), before)
        return -1, f"{type(refused).__name__}: {refused}"
    pinned = 0
    for pid in started:
        if _pin_process(pid, {core}) is None:
            pinned += 1
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
