"""How the parallel runner starts its children, and starting that machinery early.

Children start from multiprocessing's ``forkserver``: a server that has imported torch and
fastrl once (``FORKSERVER_PRELOAD``), has started no threads and touched no GPU, so a child
is as clean as under spawn and starts in a fraction of the time. ``FASTRL_START_METHOD=spawn``
starts every child afresh instead (slower), for a library that misbehaves in a forked child.

:func:`start_helpers` starts the fork server and multiprocessing's resource tracker with the
launcher's signals blocked (neither may die of a Ctrl-C to the group). ``train.py`` calls it
as soon as it knows the run is parallel, before it imports torch itself: the server's imports
(about a second of CPU) then run beside the launcher's instead of after them. This module
imports nothing heavy for that reason.

:func:`run_command` is what every command line enters by (``fastrl-train``, ``python -m
fastrl.train``, ``train.py``; the same for enjoy): it checks that ``envs`` is fastrl's own,
runs the command and exits with its status.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from fastrl.errors import StartMethodError
from fastrl.transport.signals import held

# What the fork server imports once, so that no child it forks imports torch again (under
# spawn every child spends 1.5-2 s of CPU on that, which on a 2-core machine delays the start
# of a run and every restart of a worker).
# torch._dynamo too: torch's optimizers import it the first time a parameter group is added
# (1-2 s of CPU in every learner); it starts no thread.
# fastrl.transport.server_exit last: it makes the server's own exit quick.
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "fastrl.runner.parallel",
                      "fastrl.runner.sampler_node", "envs", "fastrl.transport.server_exit"]
START_METHODS = ("forkserver", "spawn")


def start_method() -> str:
    """The start method ``FASTRL_START_METHOD`` asks for (default ``forkserver``)."""
    method = os.environ.get("FASTRL_START_METHOD", "forkserver")
    if method not in START_METHODS:
        raise StartMethodError(f"FASTRL_START_METHOD={method!r} is not a start method fastrl "
                               "supports: use 'forkserver' (the default) or 'spawn'")
    return method


def start_helpers(method: str) -> None:
    """Start the resource tracker and, for ``forkserver``, the fork server (with its preload)
    now, with the launcher's signals blocked; a no-op for what already runs."""
    import multiprocessing
    from multiprocessing import forkserver, resource_tracker

    with held():
        resource_tracker.ensure_running()
    if method == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
        # A block of its own: starting the tracker unblocks SIGINT and SIGTERM in this thread
        # (multiprocessing does so on its way out), and the fork server must begin with them
        # blocked, or a SIGTERM to the group kills it and with it every child's exit status.
        with held():
            forkserver.ensure_running()


def exit_command(code: int) -> NoReturn:
    """End a command-line entry (train.py, enjoy.py, a sampler node) with ``code``.

    Everything the run opened is closed by now; what is left is the interpreter's own
    teardown, whose garbage collections walk every object torch and the run created: 0.5-0.8 s
    of CPU after a short parallel run here (the suite starts about a hundred). Frozen objects
    are left out of those collections; finalisers and ``atexit`` handlers run as before. Only
    for a process that is about to end: frozen garbage is never collected."""
    gc.freeze()
    sys.exit(code)


def own_envs_problem() -> str | None:
    """Why ``import envs`` would not give fastrl's env package, or None when it would.

    fastrl's envs install as the top-level package ``envs`` beside ``fastrl``. A package or
    module of that name earlier on ``sys.path`` (a project's own ``envs/`` in the folder
    ``python -m`` starts in, which it puts first; one on ``PYTHONPATH``) would be imported in
    its place, by the fork server's preload too, and fail deep in the env registry."""
    import importlib.util

    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        spec = importlib.util.find_spec("envs")
    except (ImportError, ValueError):  # a broken module of that name, or one without a spec
        spec = None
    if spec is None:
        return f"fastrl's env package 'envs' cannot be imported (it belongs in {home})"
    if spec.origin is None or spec.origin == "namespace":  # a folder without __init__.py
        where = ", ".join(spec.submodule_search_locations or ())
    else:
        where = spec.origin
        parent = os.path.dirname(spec.origin)
        if spec.submodule_search_locations is not None:  # a package: .../envs/__init__.py
            parent = os.path.dirname(parent)
        if os.path.realpath(parent) == os.path.realpath(home):
            return None
    return (f"'import envs' finds {where}, not fastrl's env package beside fastrl in {home}: "
            "a folder or module named envs in the current folder or on PYTHONPATH hides it; "
            "run from another folder")


def run_command(main: Callable[..., int], prog: str | None = None) -> NoReturn:
    """Run a command-line entry, ``main(prog=prog)``, and exit with its status. ``prog`` names
    the command in its messages (none: the name it was started by, ``fastrl-train``)."""
    prog = prog or os.path.basename(sys.argv[0])
    problem = own_envs_problem()
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        exit_command(1)
    exit_command(main(prog=prog))


def process_context():
    """The multiprocessing context for the parallel runner's children (see
    ``fastrl.transport.startup``), with the fork server and the resource tracker running.

    A child's parent is the fork server, not the runner, and the fork server can outlive a
    killed runner; children therefore watch the runner itself (``Wiring.parent``, a
    :class:`fastrl.transport.procs.Lifeline`), not their parent pid."""
    import torch.multiprocessing as tmp

    method = start_method()
    start_helpers(method)
    return tmp.get_context(method)
