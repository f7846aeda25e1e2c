"""Imported by the fork server alone (it is the last name of ``FORKSERVER_PRELOAD``): the
server ends without the interpreter's teardown.

The server holds the launcher's stdout and stderr, so whatever reads them to their end (a
pipe to ``tee``, a test's ``capture_output``) waits for it. It ends when the launcher does,
and its teardown, garbage collections over everything torch imported, took 0.4-0.8 s on a
2-core machine after the launcher had gone. It has nothing to flush or save. Its children do
not run ``atexit`` handlers (they end with ``os._exit``), and the pid check keeps it so.
"""

from __future__ import annotations

import atexit
import os
import sys


def _in_fork_server() -> bool:
    """Whether this import runs inside multiprocessing's fork server, preloading."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(
                os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back
    return False


def _end_now(pid: int) -> None:
    if os.getpid() == pid:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(0)


if _in_fork_server():  # imported anywhere else (a test, a user's script) it does nothing
    atexit.register(_end_now, os.getpid())
