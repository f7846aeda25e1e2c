"""Who answers which signal.

A scheduler stops a job differently from a terminal: Slurm (``scancel``, a time limit,
preemption), GNU ``timeout`` and systemd send SIGTERM to every process of the job at once; a
closed terminal or a dropped ssh session sends SIGHUP to the group. Only the launcher (the
process the user started: ``train.py``, ``enjoy.py``, ``python -m fastrl.node``) may act on
them, because only it knows the order in which a run stops (the learner finishes its step
and writes the checkpoint, the workers close their engines, the queues go last).

* ``STOP_SIGNALS`` (SIGINT, SIGTERM, SIGHUP): the first stops the run as Ctrl-C does; a
  second quits at once (every child killed, their engines' shared memory removed).
* ``SAVE_SIGNAL`` (SIGUSR1, what Slurm's ``--signal=USR1@120`` sends before a time limit or a
  preemption): write a checkpoint now and keep training.
* ``STACKS_SIGNAL`` (SIGUSR2): print where every thread is (launcher and children), for a run
  that seems stuck.

Every other process ignores the launcher's signals. A process the launcher starts (a child,
the fork server, the resource tracker, an env engine) is started while they are blocked
(:func:`held`), so it cannot die of one before it has set itself up; a child then ignores
them and unblocks them (:func:`leave_to_launcher`). The fork server, the resource tracker and
the engines never unblock them: to them these signals never arrive.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fastrl.transport.procs import kill_descendants

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SAVE_SIGNAL = signal.SIGUSR1
STACKS_SIGNAL = signal.SIGUSR2
LAUNCHER_SIGNALS = (*STOP_SIGNALS, SAVE_SIGNAL)


@contextmanager
def held() -> Iterator[None]:
    """Block the launcher's signals in this thread for the duration, so that what this
    thread starts inherits them blocked. (One sent to the process meanwhile may still be
    handled, through another thread of it; one sent to this thread waits until the end.)"""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, LAUNCHER_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def leave_to_launcher() -> None:
    """In a child: ignore the launcher's signals (what it starts inherits that), print the
    stacks on ``STACKS_SIGNAL``, then unblock what :func:`held` blocked."""
    for signum in LAUNCHER_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    _print_stacks_on_signal()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LAUNCHER_SIGNALS)


class LauncherSignals:
    """The launcher's handlers, installed for the duration of a ``with`` block (in the main
    thread only: Python runs handlers there; elsewhere this does nothing).

    The first stop signal raises ``KeyboardInterrupt`` in the main thread, which every mode
    already handles as Ctrl-C (save, then stop in order); ``stopped_by`` names it. A second
    calls ``quit_now(signum)``, which must not return (kill what is left and ``os._exit``).
    ``SAVE_SIGNAL`` only raises a flag that the run loop takes with :meth:`take_save_request`.

    With ``on_stop``, the first stop signal calls ``on_stop()`` instead of raising: for a main
    loop that must not be cut in the middle of what it does (a sampler node halfway through
    sending a message would leave the link unreadable), and that polls a flag instead.
    """

    def __init__(self, quit_now: Callable[[int], None] | None = None,
                 on_stop: Callable[[], None] | None = None):
        self.quit_now = quit_now or quit_alone
        self.on_stop = on_stop
        self.stopped_by: str | None = None
        self._save = threading.Event()
        self._stopping = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> LauncherSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in LAUNCHER_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            _print_stacks_on_signal()
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def take_save_request(self) -> bool:
        """Whether ``SAVE_SIGNAL`` came since the last call."""
        if self._save.is_set():
            self._save.clear()
            return True
        return False

    def _on_signal(self, signum: int, frame) -> None:
        if signum == SAVE_SIGNAL:
            self._save.set()
            return
        if self.stopped_by is not None:
            self.quit_now(signum)
            return
        self.stopped_by = signal.Signals(signum).name
        if self._stopping:  # already stopping in order (the last checkpoint, the shutdown)
            print(f"{self.stopped_by}: already stopping; a second signal quits at once",
                  file=sys.stderr, flush=True)
            return
        if self.on_stop is not None:
            self.on_stop()
            return
        raise KeyboardInterrupt(self.stopped_by)

    def stopping(self) -> None:
        """The run is stopping in order: from now on the first stop signal lets it finish
        (it raises nothing), and a second quits at once."""
        self._stopping = True


def _print_stacks_on_signal() -> None:
    """``STACKS_SIGNAL`` prints every thread's stack to the process's standard error (where
    there is one with a descriptor)."""
    try:
        faulthandler.register(STACKS_SIGNAL, file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass


def quit_status(signum: int) -> int:
    """The exit status of a run quit at once by a second ``signum``: 128 + its number, the
    shell's convention for a process ended by a signal (130 for Ctrl-C)."""
    return 128 + signum


def quit_alone(signum: int) -> None:
    """``quit_now`` of a launcher that runs everything itself (serial mode, ``enjoy.py``):
    kill what it started (env engines, whose shared memory is removed) and exit."""
    print(f"{signal.Signals(signum).name} again: quitting now", file=sys.stderr, flush=True)
    kill_descendants()
    os._exit(quit_status(signum))
