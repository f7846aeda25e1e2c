"""What counts as an env fault for the rollout worker: an env call that raises, or that runs
past ``--env_timeout`` (:class:`CallTimer`)."""

from __future__ import annotations

import signal
import threading

__all__ = ["CallTimer", "EnvBroken", "EnvTimeout"]


class EnvTimeout(Exception):
    """An env call ran past ``env_timeout`` seconds."""


class EnvBroken(RuntimeError):
    """An env kept failing while it was being recreated."""


class CallTimer:
    """Runs a call with a SIGALRM deadline of ``seconds`` (0: no deadline, or not in the
    main thread, where signals cannot be used)."""

    def __init__(self, seconds: float):
        in_main = threading.current_thread() is threading.main_thread()
        self.seconds = seconds if seconds > 0 and in_main else 0.0
        self._armed = False
        if self.seconds:
            signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum, frame) -> None:
        if self._armed:  # a late alarm after the call returned is ignored
            self._armed = False
            raise EnvTimeout(f"env call took longer than {self.seconds:g} s")

    def call(self, fn, *args, **kwargs):
        if not self.seconds:
            return fn(*args, **kwargs)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
