"""The queue-lock repair of fastrl.transport.procs on the pinned faster-fifo: the layout probe
finds the mutex, a lock left held by a killed process is released, and a live holder's lock
is not."""

import ctypes
import multiprocessing as mp
import os
import signal
from importlib.metadata import version
from pathlib import Path

import pytest
from faster_fifo import Queue

from fastrl.transport.procs import (
    CHECKED_FASTER_FIFO,
    _queue_mutex,
    check_queue_layout,
    release_queue_locks,
)

ROOT = Path(__file__).resolve().parents[1]
_OWNER = 8  # offset of glibc's __owner (the holder's thread id) in pthread_mutex_t


def test_constraints_pin_the_checked_faster_fifo():
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [line.split("==")[1].strip() for line in lines if line.startswith("faster-fifo==")]
    assert pins and pins[0] in CHECKED_FASTER_FIFO
    assert version("faster-fifo") == pins[0]


def test_layout_probe_finds_the_mutex():
    q = Queue(1000)
    addr = _queue_mutex(q)
    assert addr is not None
    check_queue_layout(q)  # does not raise
    # The probe points at a real, currently free mutex: locking it from here records our pid.
    libc = ctypes.CDLL(None)
    assert libc.pthread_mutex_lock(ctypes.c_void_p(addr)) == 0
    try:
        assert ctypes.c_int.from_address(addr + _OWNER).value == os.getpid()
    finally:
        libc.pthread_mutex_unlock(ctypes.c_void_p(addr))
    assert ctypes.c_int.from_address(addr + _OWNER).value == 0


def test_layout_check_fails_loudly_on_unknown_memory():
    class NotAQueue:
        queue_obj_buffer = (ctypes.c_char * 200)()

    with pytest.raises(RuntimeError, match="faster-fifo .*constraints.txt"):
        check_queue_layout(NotAQueue())


def _hold_lock(q, ready):
    ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(_queue_mutex(q)))
    ready.set()
    signal.pause()


@pytest.mark.slow
def test_lock_of_killed_holder_is_released_and_live_holder_kept():
    ctx = mp.get_context("fork")
    q = Queue(1000)
    ready = ctx.Event()
    child = ctx.Process(target=_hold_lock, args=(q, ready), daemon=True)
    child.start()
    try:
        assert ready.wait(10)
        addr = _queue_mutex(q)
        assert ctypes.c_int.from_address(addr + _OWNER).value == child.pid
        # The holder still runs: asking for any other pid releases nothing.
        assert release_queue_locks([q], os.getpid()) == 0
        assert ctypes.c_int.from_address(addr + _OWNER).value == child.pid
    finally:
        child.kill()
        child.join(5)
    assert release_queue_locks([q], child.pid) == 1
    assert release_queue_locks([q], child.pid) == 0  # a second repair finds nothing to do
    q.put("after", timeout=1)
    assert q.get(timeout=1) == "after"
