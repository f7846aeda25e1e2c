"""How a busy child stops in time.

The runner stops its children with a flag (``Wiring.stop``), gives them a few seconds to exit
and then kills them (``fastrl.runner.supervisor``). A child notices the flag between two
polls of its station, but not while it is busy: an env step or reset that takes long, the
start of slow envs, a learner step on a large batch on the CPU. Such a child was killed,
its envs left unclosed, with "did not stop in time". Now:

* code that may run long checks the flag itself and raises :class:`StopRequested` (the
  rollout worker's heartbeat during env creation and start-up steps);
* :func:`interrupt_when_stopped`, a thread of every child, raises :class:`StopInterrupt` in
  the main thread when it has not noticed the flag within a grace time. It takes effect at
  the main thread's next Python instruction (a call into native code finishes first), and
  unwinds through the ``finally`` blocks that close the child's envs.

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

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fastrl/


class StopRequested(BaseException):
    """The run is stopping: unwind to the child's entry point, closing what it holds."""


class StopInterrupt(StopRequested):
    """Raised into a child's main thread that was still busy after the stop's grace time."""


def interrupt_when_stopped(stop, noticed: Callable[[], bool], grace: float,
                           poll: float = 0.25) -> None:
    """Run in a daemon thread of a child: once ``stop`` (an Event) is set, give the main
    thread ``grace`` seconds to notice it (``noticed()``), else raise :class:`StopInterrupt`
    in the main thread.

    It polls the flag: a child waiting in ``stop.wait()`` that is killed (as hung) leaves the
    event's condition counting a sleeper that never wakes, and the runner's ``stop.set()``
    then waits for it forever."""
    while not stop.is_set():
        time.sleep(poll)
    time.sleep(grace)
    if not noticed():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(threading.main_thread().ident), ctypes.py_object(StopInterrupt))


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
