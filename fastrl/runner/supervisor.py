"""Supervision of the parallel runner's children: start them, notice a death or a hang,
restart workers with their stale data fenced off, and repair what a killed child left.

Fencing (docs/reliability.md has the whole story): ``wiring.worker_gen[w]`` counts restarts
of rollout worker ``w``. Before its successor starts, the learner is told (``Fence``) to drop
the dead incarnation's untrained trajectories, policy workers drop its requests by their
generation, and the successor ignores answers meant for its predecessor.
``wiring.policy_epoch`` counts policy worker restarts: requests of an older epoch are
dropped, and every rollout worker asks again (``Reissue``) for the splits still waiting.

A child killed inside a queue call may die holding the queue's lock. The lock watchdog, a
thread of this process, is the only code that repairs such locks (``fastrl.transport.procs``): it
must not wait for the main loop, which may itself be blocked on that lock.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastrl.log import log
from fastrl.runner.process_setup import keep_freed_memory
from fastrl.runner.wiring import Wiring
from fastrl.sampling.backlog import backlog_cells
from fastrl.sampling.startup import (
    CREATING,
    DECORRELATING,
    RESETTING,
    STEPPING,
    WAITING,
    describe_activity,
)
from fastrl.transport.messages import ChildFailed, Fence, Fenced, Reissue
from fastrl.transport.procs import (
    Lifeline,
    exit_when_orphaned,
    kill_group,
    kill_session,
    release_queue_locks,
)
from fastrl.transport.signals import held, leave_to_launcher
from fastrl.transport.stopping import (
    StopInterrupt,
    StopRequested,
    busy_in,
    interrupt_when_stopped,
)

LOCK_WATCH_INTERVAL = 0.1  # seconds between the watchdog's looks at the children
# Seconds the children have to exit once told to stop, after which they are killed; a child
# still busy STOP_GRACE seconds after the stop is interrupted (fastrl.transport.stopping),
# which leaves it the rest to finish its native call (an env step, a layer of a learner
# step) and close its envs.
STOP_TIME = 10.0
STOP_GRACE = 3.0


def _rank_signalled(child: Child) -> bool:
    """``child`` is a learner rank that has ended, killed by a signal."""
    code = None if child.proc is None else child.proc.exitcode
    return child.kind == "learner" and code is not None and code < 0


class ChildError(RuntimeError):
    """A worker process failed; the message names it and its exception."""


@dataclass
class Child:
    """A child process the runner supervises, and how to start it again."""

    name: str
    kind: str  # "learner", "policy", "rollout" or "node" (a sampler node on this machine)
    index: int
    threads: int
    target: Callable[[Wiring, int], None]
    proc: Any = None
    failures: deque = field(default_factory=deque)  # times of its past crashes

    @property
    def session(self) -> bool:
        """Whether it leads a session (a sampler node, whose workers lead groups in it)
        rather than a process group."""
        return self.kind == "node"

    def kill(self, wait: float = 2.0) -> None:
        """Kill what is left of it: its group, or its whole session."""
        (kill_session if self.session else kill_group)(self.proc.pid, wait)


ORPHAN_GRACE = 5.0  # seconds a child whose runner died has to exit on its own (closing its
# engines takes well under one)


def _child_setup(name: str, threads: int, session: bool, parent: Lifeline) -> None:
    # Children ignore Ctrl-C, SIGTERM, SIGHUP and SIGUSR1, and so do the engines they start:
    # the runner stops them with a message and joins them, so that every checkpoint and
    # engine is closed in order (fastrl.transport.signals). `kill -USR2 <pid>` prints where a
    # worker is. A new process group also keeps the terminal's signals away from them.
    leave_to_launcher()
    try:
        if session:
            os.setsid()
        else:
            os.setpgrp()
    except OSError:
        pass
    try:
        from setproctitle import setproctitle

        setproctitle(name)
    except ImportError:
        pass
    torch.set_num_threads(threads)
    keep_freed_memory()
    threading.Thread(target=exit_when_orphaned, args=(parent, ORPHAN_GRACE),
                     name="fastrl-orphan-watch", daemon=True).start()


def run_child(name: str, threads: int, target, wiring: Wiring, index: int,
              session: bool = False) -> None:
    """A child process's entry point: set up, run ``target``, report a failure and exit 1.
    A stop that found it busy ends it quietly (a sampler node stops its own children)."""
    _child_setup(name, threads, session, wiring.parent)
    if not session:
        threading.Thread(target=interrupt_when_stopped,
                         args=(wiring.stop, lambda: wiring.stop_seen, STOP_GRACE),
                         name="fastrl-stop-watch", daemon=True).start()
    try:
        _profiled(name, target)(wiring, index)
    except StopInterrupt as exc:
        log(f"{name} was still busy {STOP_GRACE:g} s after the stop, in {busy_in(exc)}: "
            "interrupted it")
    except StopRequested:
        pass
    except BaseException as exc:  # noqa: BLE001 - report everything, then exit non-zero
        wiring.stop_seen = True  # (a stop meanwhile must not interrupt the report)
        try:
            wiring.runner_queue.put(ChildFailed(name, f"{type(exc).__name__}: {exc}",
                                                traceback.format_exc()), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        raise SystemExit(1) from None


def _profiled(name: str, target):
    """``target``, under cProfile when ``FASTRL_PROFILE_DIR`` is set (a perf instrument, not a
    setting): the child's statistics go to ``<dir>/<name>-<pid>.prof`` when it ends, however it
    ends (``python -m pstats`` reads them)."""
    folder = os.environ.get("FASTRL_PROFILE_DIR")
    if not folder:
        return target

    def run(*args):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
        try:
            return target(*args)
        finally:
            profile.disable()
            path = os.path.join(folder, f"{name}-{os.getpid()}.prof")
            try:  # never in place of the child's own end
                os.makedirs(folder, exist_ok=True)
                profile.dump_stats(path)
            except OSError as exc:
                log(f"{name}: FASTRL_PROFILE_DIR: could not write {path} ({exc})")

    return run


def hung_message(code: int | None, doing: str, worker_timeout: float,
                 env_timeout: float) -> str:
    """Why a child was killed as hung: ``doing`` (an Activity's ``code`` and words, or None and
    "" for a child that records none), and the flag that would help."""
    limit = f"--worker_timeout (now {worker_timeout:g} s)"
    if code == CREATING:
        hint = f"an env this slow to make needs a longer {limit}"
    elif code == DECORRELATING:
        hint = (f"--decorrelate_envs_on_one_worker False skips the random start-up steps; an "
                f"env this slow needs a longer {limit}")
    elif code in (STEPPING, RESETTING) and 0 < env_timeout < worker_timeout:
        hint = (f"the env call outlasted --env_timeout ({env_timeout:g} s) without returning to "
                f"Python, so nothing could stop it; a slow env needs a longer {limit}")
    elif code in (STEPPING, RESETTING):
        hint = f"a slow env needs a longer {limit}; --env_timeout recreates a stuck one"
    elif code == WAITING:
        hint = f"it was in no env call; {limit} allows longer waits"
    else:
        hint = f"{limit} allows longer"
    return (f"sent no heartbeat for {worker_timeout:.0f} s (hung" + (f", {doing}" if doing else "")
            + f") and was killed ({hint})")


class Supervisor:
    """Starts children, watches their exit codes and heartbeats, restarts workers.

    ``pump(timeout)`` is the runner's: it reads the runner queue once and hands every
    message to :meth:`note` (failure reports and fence confirmations) and to the statistics.
    """

    def __init__(self, wiring: Wiring, ctx, pump: Callable[[float], None]):
        self.wiring = wiring
        self.cfg = wiring.cfg
        self.ctx = ctx
        self.pump = pump
        self.children: dict[str, Child] = {}
        self.restart_workers = False  # on only while the training loop runs
        self.restarts = 0
        self._failures: dict[str, ChildFailed] = {}
        self._fenced: dict[int, int] = {}
        # (worker, generation) -> the policies whose learners confirmed that fence so far
        self._fence_answers: dict[tuple[int, int], set[int]] = {}
        # Dead processes (the objects, not their pids, which the system may reuse) whose queue
        # locks the watchdog has checked.
        self._repaired: set = set()
        self._repaired_cond = threading.Condition()
        self._watchdog_stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch_locks, name="fastrl-lock-watchdog",
                                          daemon=True)
        self._watchdog.start()

    # -- messages from the runner queue ---------------------------------------------------

    def note(self, msg) -> None:
        if isinstance(msg, ChildFailed):
            log(f"{msg.name} failed; its traceback:\n{msg.traceback.rstrip()}")
            self._failures[msg.name] = msg
        elif isinstance(msg, Fenced):  # done when every policy's learner confirmed it
            answers = self._fence_answers.setdefault((msg.worker_id, msg.generation), set())
            answers.add(msg.policy)
            if len(answers) == self.wiring.num_policies:
                del self._fence_answers[(msg.worker_id, msg.generation)]
                self._fenced[msg.worker_id] = msg.generation

    # -- starting -------------------------------------------------------------------------

    def slot(self, child: Child) -> int:
        """Its heartbeat slot (a sampler node's link beats for it on the learner node)."""
        if child.kind in ("rollout", "node"):
            return child.index
        return self.wiring.policy_slot(child.index)

    def fenced(self, worker_id: int) -> int | None:
        """The generation of ``worker_id`` whose fence the learner last confirmed."""
        return self._fenced.get(worker_id)

    def start(self, child: Child) -> None:
        if child.kind != "learner":
            self.wiring.beat(self.slot(child))  # its clock starts now, not at its first beat
        child.proc = self.ctx.Process(
            target=run_child, name=child.name, daemon=False,
            args=(child.name, child.threads, child.target, self.wiring, child.index,
                  child.session))
        with held():  # it (and the fork server, when this starts it) begins with them blocked
            child.proc.start()
        self.children[child.name] = child

    # -- watching -------------------------------------------------------------------------

    def check_children(self) -> None:
        """Notice dead or hung children; restart workers or stop the run (raises ChildError)."""
        now = time.monotonic()
        timeout = self.cfg.worker_timeout
        # A learner rank killed by a signal first: the other ranks' failures (their collective
        # broken by its death) follow from it, and the first death handled is the one the run
        # reports. Only ranks: a worker's signal does not outrank a learner's own exception.
        for child in sorted(self.children.values(), key=lambda c: not _rank_signalled(c)):
            if self.check_exit(child):
                continue
            if child.kind != "learner" and now - self.wiring.heartbeat[self.slot(child)] > timeout:
                how = self.hung(child)  # (read before the kill, which a restart follows)
                child.kill()
                child.proc.join(timeout=5)
                self._on_death(child, how, reported=False)

    def doing(self, child: Child) -> tuple[int | None, str]:
        """What a rollout worker is doing (its Activity code and words); (None, "") for the
        other children."""
        w = self.wiring
        if child.kind != "rollout" or w.activity is None:
            return None, ""
        return describe_activity(w.activity[child.index],
                                 child.index * (w.envs_per_worker // w.info.num_agents))

    def hung(self, child: Child) -> str:
        """How ``child`` was found hung: what it was doing, and the flag that would help."""
        return hung_message(*self.doing(child), self.cfg.worker_timeout, self.cfg.env_timeout)

    def check_exit(self, child: Child) -> bool:
        """If ``child`` has exited, handle its death (raises, or restarts it); say whether
        it had."""
        code = child.proc.exitcode
        if code is None:
            return False
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        # Only a child that exited by itself (code 1 after an exception) sends a report.
        self._on_death(child, f"died unexpectedly ({how})", reported=code > 0)
        return True

    def _watch_locks(self) -> None:
        """The lock watchdog thread: when a child has died, release the queue locks it held."""
        while not self._watchdog_stop.wait(LOCK_WATCH_INTERVAL):
            for child in list(self.children.values()):
                proc = child.proc
                if proc is None or proc.exitcode is None or proc in self._repaired:
                    continue
                if release_queue_locks([getattr(q, "q", q) for q in self.wiring.queues()],
                                       proc.pid):
                    log(f"released a queue lock that {child.name} held when it died")
                with self._repaired_cond:
                    self._repaired.add(proc)
                    self._repaired_cond.notify_all()

    def _await_lock_repair(self, proc, timeout: float = 5.0) -> None:
        with self._repaired_cond:
            self._repaired_cond.wait_for(lambda: proc in self._repaired, timeout)

    def _on_death(self, child: Child, how: str, reported: bool) -> None:
        self._await_lock_repair(child.proc)
        failure = self._take_failure(child.name, wait=1.0 if reported else 0.0)
        # What it left outside Python: env engines in its process group, their shared memory.
        child.kill()
        cause = f"failed: {failure.error}" if failure is not None else how
        if child.kind == "learner" or not self.restart_workers:
            raise ChildError(f"{child.name} {cause}")
        cfg = self.cfg
        now = time.monotonic()
        child.failures.append(now)
        while child.failures and now - child.failures[0] > cfg.restart_window:
            child.failures.popleft()
        if len(child.failures) > cfg.max_worker_restarts:
            raise ChildError(f"{child.name} {cause} ({len(child.failures)} failures within "
                             f"{cfg.restart_window:.0f} s; "
                             f"--max_worker_restarts={cfg.max_worker_restarts})")
        log(f"{child.name} {cause}; restarting it (restart {len(child.failures)} of at most "
            f"{cfg.max_worker_restarts} within {cfg.restart_window:.0f} s)")
        start = time.monotonic()
        if child.kind == "rollout":
            self._restart_rollout(child)
        elif child.kind == "node":
            self.start(child)  # its link fences the lost node's data off by itself
        else:
            self._restart_policy(child)
        self.restarts += 1
        log(f"{child.name} restarted in {time.monotonic() - start:.1f} s")

    # -- restarting -----------------------------------------------------------------------

    def _restart_rollout(self, child: Child) -> None:
        w, worker_id = self.wiring, child.index
        generation = w.worker_gen[worker_id] + 1
        w.worker_gen[worker_id] = generation  # from now on policy workers drop its old requests
        ticks = list(w.policy_ticks)
        for q in w.learner_queues:  # every policy's learner may hold its slots
            q.put(Fence(worker_id, generation))
        self.pump_until(lambda: self._fenced.get(worker_id) == generation, 120,
                        f"the learner{'s' if w.num_policies > 1 else ''} to release "
                        f"{child.name}'s buffers")
        if w.backlog is not None:  # its trajectories no longer wait: others' splits go on
            backlog_cells(w.backlog, w.num_workers)[:, worker_id] = 0
        self._wait_policy_ticks(ticks)
        self.start(child)

    def _restart_policy(self, child: Child) -> None:
        w = self.wiring
        epoch = w.policy_epoch.value + 1
        w.policy_epoch.value = epoch  # requests from before are dropped from now on
        self._wait_policy_ticks(list(w.policy_ticks), exclude=child.index)
        self.start(child)
        for q in w.worker_queues:
            q.put(Reissue(epoch))

    def _wait_policy_ticks(self, ticks: list[int], exclude: int | None = None) -> None:
        """Wait until every live policy worker finished the batch it was in at ``ticks``: a
        batch begun before a restart has then been written out."""
        for p, tick in enumerate(ticks):
            child = self.children.get(f"fastrl-policy-{p}")
            if p == exclude or child is None:
                continue
            deadline = time.monotonic() + 10
            while (self.wiring.policy_ticks[p] < tick + 2 and child.proc.is_alive()
                   and time.monotonic() < deadline):
                time.sleep(0.005)

    def pump_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Read the runner queue until ``done()``; only a learner's death interrupts."""
        deadline = time.monotonic() + timeout
        learners = [c for c in self.children.values() if c.kind == "learner"]
        while not done():
            if time.monotonic() > deadline:
                raise ChildError(f"timed out after {timeout:.0f} s waiting for {what}")
            self.pump(0.05)
            for learner in learners:
                self.check_exit(learner)

    def _take_failure(self, name: str, wait: float) -> ChildFailed | None:
        """The failure report of ``name``, waiting up to ``wait`` seconds for it to arrive."""
        deadline = time.monotonic() + wait
        while name not in self._failures and time.monotonic() < deadline:
            self.pump(0.05)
        return self._failures.pop(name, None)

    # -- stopping -------------------------------------------------------------------------

    def kill_all(self) -> None:
        for child in self.children.values():
            if child.proc is not None and child.proc.pid is not None:
                child.kill(wait=0.5)

    def stop_all(self) -> None:
        """Stop every child: the stop flag, a join with a timeout, then kill; then clear what
        each left behind (engines in its process group and their shared memory)."""
        self._watchdog_stop.set()
        self._watchdog.join(timeout=2)
        if not self.children:
            return
        self.wiring.stop.set()
        deadline = time.monotonic() + STOP_TIME
        children = list(self.children.values())
        for child in children:
            child.proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for child in children:
            if child.proc.is_alive():
                doing = self.doing(child)[1]
                log(f"{child.name} did not stop within {STOP_TIME:g} s"
                    + (f" ({doing})" if doing else "") + "; killing it")
            child.kill()
            child.proc.join(timeout=3)
        self.children = {}
