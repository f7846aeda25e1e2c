"""fastrl.transport.signals and the stale shared-memory sweep, in this process: what the
launcher does with each signal, what a started process inherits, which /dev/shm files count
as stale. The runs that receive real signals are in tests/test_faults.py."""

from __future__ import annotations

import mmap
import os
import signal
import threading
import uuid

import pytest

from fastrl.transport.procs import SHM_DIR, remove_stale_shm
from fastrl.transport.signals import (
    LAUNCHER_SIGNALS,
    SAVE_SIGNAL,
    LauncherSignals,
    held,
    quit_status,
)


class _Quit(Exception):
    pass


def _quit(signum):
    raise _Quit(signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_first_stop_signal_interrupts_and_the_second_quits(signum):
    with LauncherSignals(_quit) as signals:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
        assert signals.stopped_by == signal.Signals(signum).name
        with pytest.raises(_Quit) as quit_:
            os.kill(os.getpid(), signal.SIGTERM)
        assert quit_.value.args == (signal.SIGTERM,)
    assert signal.getsignal(signum) is not signals._on_signal  # handlers given back


def test_while_stopping_the_first_signal_lets_the_stop_finish(capsys):
    with LauncherSignals(_quit) as signals:
        signals.stopping()
        os.kill(os.getpid(), signal.SIGTERM)  # raises nothing
        assert "SIGTERM: already stopping" in capsys.readouterr().err
        with pytest.raises(_Quit):
            os.kill(os.getpid(), signal.SIGHUP)


def test_with_on_stop_the_first_signal_only_raises_the_flag():
    """A sampler node's loop must not be cut halfway through a message: the first signal
    calls ``on_stop`` (the loop polls the flag); the second still quits."""
    flag = threading.Event()
    with LauncherSignals(_quit, on_stop=flag.set) as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # raises nothing
        assert flag.is_set() and signals.stopped_by == "SIGTERM"
        with pytest.raises(_Quit):
            os.kill(os.getpid(), signal.SIGINT)


def test_the_save_signal_asks_for_one_checkpoint_and_stops_nothing():
    with LauncherSignals(_quit) as signals:
        assert not signals.take_save_request()
        os.kill(os.getpid(), SAVE_SIGNAL)
        os.kill(os.getpid(), SAVE_SIGNAL)
        assert signals.take_save_request()
        assert not signals.take_save_request()
        assert signals.stopped_by is None


def test_signals_are_blocked_while_held_and_handled_after():
    with LauncherSignals(_quit) as signals:
        with held():
            assert set(LAUNCHER_SIGNALS) <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
            # To this thread: one sent to the process may reach another thread, unblocked.
            signal.pthread_kill(threading.get_ident(), SAVE_SIGNAL)
            assert not signals.take_save_request()  # pending, not delivered
        assert signals.take_save_request()
        assert not set(LAUNCHER_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_second_signal_exits_with_the_shell_convention():
    assert quit_status(signal.SIGINT) == 130
    assert quit_status(signal.SIGTERM) == 143


def test_stale_shared_memory_is_only_what_no_process_holds():
    tag = uuid.uuid4().hex[:8]
    names = {kind: f"ViZDoomSMfastrltest{kind}{tag}" for kind in ("free", "open", "mapped")}
    other = f"fastrltest-not-vizdoom-{tag}"
    paths = {k: os.path.join(SHM_DIR, n) for k, n in names.items()}
    for path in [*paths.values(), os.path.join(SHM_DIR, other)]:
        with open(path, "wb") as fh:
            fh.write(b"\0" * mmap.PAGESIZE)
    held_open = open(paths["open"], "rb")  # noqa: SIM115 - held across the sweep
    with open(paths["mapped"], "r+b") as fh:
        mapped = mmap.mmap(fh.fileno(), mmap.PAGESIZE)  # mapped, with no descriptor left
    try:
        assert remove_stale_shm() >= 1
        assert not os.path.exists(paths["free"])
        assert os.path.exists(paths["open"]) and os.path.exists(paths["mapped"])
        assert os.path.exists(os.path.join(SHM_DIR, other))  # not an engine's: never touched
    finally:
        held_open.close()
        mapped.close()
        for path in [*paths.values(), os.path.join(SHM_DIR, other)]:
            if os.path.exists(path):
                os.unlink(path)
