"""How a busy child stops in time.

The runner stops its children with a flag (``Wiring.stop``, a :class:`StopFlag`), gives them a
few seconds to exit and then kills them (``fastrl.runner.supervisor``). A child notices the
flag between two polls of its station, but not while it is busy: an env step or reset that
takes long, the start of slow envs, a learner step on a large batch on the CPU. Such a child
was killed, its envs left unclosed, with "did not stop in time". Now:

* code that may run long checks the flag itself and raises :class:`StopRequested` (the
  rollout worker's heartbeat during env creation and start-up steps);
* :func:`interrupt_when_stopped`, a thread of every child, raises :class:`StopInterrupt` in
  the main thread when it has not noticed the flag within a grace time. It takes effect at
  the main thread's next Python instruction (a call into native code finishes first), and
  unwinds through the ``finally`` blocks that close the child's envs.

The interrupt lands only inside :func:`interruptible` calls (a rollout worker's env
creation, its start, its steps of a split's envs; a learner step). Raised anywhere, it could
land in a lock shared with the other processes after the lock is taken and before a ``with``
can release it (the stop flag was an Event whose ``is_set()`` takes one: a third of the
interrupts of a loop that polled it left it held, and every other child hung at the stop),
or half-way through a queue operation, a checkpoint write or the closing of the envs. The
stop flag itself takes no lock.

Both are ``BaseException`` subclasses, so that no ``except Exception`` of an env's fault
handling takes them for env faults.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import sharedctypes
from typing import Any

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fastrl/


class StopRequested(BaseException):
    """The run is stopping: unwind to the child's entry point, closing what it holds."""


class StopInterrupt(StopRequested):
    """Raised into a child's main thread that was still busy after the stop's grace time."""


class StopFlag:
    """Set once when the children must stop; read by every child in its hot loops. One byte,
    in shared memory when ``shared`` (parallel mode), written and read without a lock, so that
    neither an interrupt nor a killed reader can leave anything held (a
    ``multiprocessing.Event`` takes a lock shared by all processes at every ``is_set()``)."""

    def __init__(self, shared: bool = True):
        self._cell = sharedctypes.RawValue(ctypes.c_bool, False) if shared else ctypes.c_bool()

    def set(self) -> None:
        self._cell.value = True

    def is_set(self) -> bool:
        return self._cell.value


class _Interruptible:
    """Whether the main thread is inside :func:`interruptible` calls (``depth`` of them). The
    main thread alone counts them up; it counts one down, and :func:`interrupt_when_stopped`
    raises into it, only under ``gate``: an interrupt raised while ``depth`` > 0 therefore
    lands inside the call, or at the latest as the count-down releases the gate."""

    __slots__ = ("depth", "gate", "main")

    def __init__(self):
        self.reset(threading.main_thread().ident)

    def reset(self, main: int | None) -> None:  # (anew in a forked child, by its one thread)
        self.depth = 0
        self.gate = threading.Lock()
        self.main = main


_region = _Interruptible()
os.register_at_fork(after_in_child=lambda: _region.reset(threading.get_ident()))


def interruptible(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, where the stop's interrupt may land: only code that holds
    nothing shared with other processes (env calls, a learner step; no queue operation)."""
    region = _region
    if threading.get_ident() != region.main:
        return fn(*args, **kwargs)
    region.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        with region.gate:  # (a C lock's ``with``: no interrupt between taking and releasing)
            region.depth -= 1


def interrupt_when_stopped(stop, noticed: Callable[[], bool], grace: float,
                           poll: float = 0.25, retry: float = 0.01) -> None:
    """Run in a daemon thread of a child: once ``stop`` (a :class:`StopFlag`) is set, give the
    main thread ``grace`` seconds to notice it (``noticed()``), else raise
    :class:`StopInterrupt` in the main thread as soon as it is inside an :func:`interruptible`
    call (looking every ``retry`` seconds); again a second later if it is in one again without
    having noticed (an interrupt that landed in a finalizer is printed and lost)."""
    while not stop.is_set():
        time.sleep(poll)
    time.sleep(grace)
    region, next_try = _region, 0.0
    while not noticed():
        time.sleep(retry)
        if time.monotonic() < next_try:
            continue
        with region.gate:
            if region.depth and not noticed():
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(region.main), ctypes.py_object(StopInterrupt))
                next_try = time.monotonic() + 1.0


def busy_in(exc: BaseException) -> str:
    """Where ``exc`` interrupted the main thread: its innermost frame, and the innermost in
    fastrl's code when that is another, as ``function (path:line)``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    ours = [f for f in frames if f.filename.startswith(_PACKAGE + os.sep)]
    where = [frames[-1]] + ([ours[-1]] if ours and ours[-1] is not frames[-1] else [])
    return ", from ".join(f"{f.name} ({_short(f.filename)}:{f.lineno})" for f in where)


def _short(path: str) -> str:
    root = os.path.dirname(_PACKAGE) + os.sep
    return path[len(root):] if path.startswith(root) else path
