"""Each process's own set-up, first thing: its random numbers (:func:`seed_everything`, one
stream per process) and its allocator (:func:`keep_freed_memory`).

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
