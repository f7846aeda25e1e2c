"""The stop's interrupt (fastrl/transport/stopping.py), in this process: it lands only inside
``interruptible`` calls (a rollout worker's env calls, a learner step), never in code that
holds a lock, and the stop flag it is polled with takes no lock. The real processes are in
tests/test_slow_start.py (slow tier)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from fastrl.run_config import parse_config
from fastrl.runner.run_start import build_model
from fastrl.runner.stations import RolloutStation
from fastrl.runner.wiring import build_wiring
from fastrl.sampling.env_setup import EnvSettings, probe_env
from fastrl.transport.stopping import (
    StopFlag,
    StopInterrupt,
    interrupt_when_stopped,
    interruptible,
)
from tests.slow_env import SlowStartCountingEnv


class PythonLock:
    """A lock taken in Python code, as a ``multiprocessing.Event``'s ``is_set()`` takes its
    condition's: an exception raised as ``acquire()`` returns leaves it held."""

    def __init__(self):
        self.lock = threading.Lock()

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def spin(n: int = 200) -> int:  # busy in Python: an env step, a learner step
    return sum(range(n))


def busy_step(seconds: float = 10.0) -> None:
    """An env step busy in Python for ``seconds`` (a stop should interrupt it long before)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin()


def poll_forever(stop) -> None:
    while True:
        stop.is_set()


class Interrupter:
    """``interrupt_when_stopped`` in a thread, with the stop set; ``done()`` ends it (the
    main thread noticed the stop)."""

    def __init__(self, grace: float = 0.0, stop=None):
        self.seen = False
        self.stop = stop if stop is not None else StopFlag(shared=False)
        self.thread = threading.Thread(target=interrupt_when_stopped,
                                       args=(self.stop, lambda: self.seen, grace, 0.001),
                                       daemon=True)
        self.thread.start()
        self.stop.set()

    def done(self) -> None:
        self.seen = True
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_the_interrupt_never_leaves_a_lock_held():
    """The reviewer's reproduction: a main thread that takes a lock in Python code (polling
    the stop flag, a queue) between its busy calls. Interrupted anywhere, a third of the
    stops left the lock held, and every other child hung on it."""
    for trial in range(30):
        lock = PythonLock()
        watch = Interrupter()
        with pytest.raises(StopInterrupt):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                interruptible(spin, 2000)
                for _ in range(100):
                    with lock:
                        pass
        watch.done()
        assert not lock.lock.locked(), f"stop {trial}: the interrupt left the lock held"


def test_the_stop_flag_takes_no_lock_that_an_interrupt_could_leave_held():
    """Code inside an interruptible call may poll the stop flag (a worker's heartbeat does):
    interrupted there, the flag is still readable by everyone (the others' should_stop())."""
    for trial in range(30):
        stop = StopFlag(shared=True)
        watch = Interrupter(stop=stop)

        with pytest.raises(StopInterrupt):
            interruptible(poll_forever, stop)
        watch.done()
        other = threading.Thread(target=stop.is_set, daemon=True)  # another child's poll
        other.start()
        other.join(2)
        assert not other.is_alive(), f"stop {trial}: the stop flag was left locked"


def test_the_interrupt_waits_until_the_main_thread_is_in_an_interruptible_call():
    """Busy past the grace time outside any interruptible call (writing a checkpoint, closing
    the envs, a queue operation): not interrupted there; then interrupted in an env step."""
    watch = Interrupter(grace=0.01)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        spin()
    with pytest.raises(StopInterrupt):
        interruptible(busy_step)
    watch.done()


def test_a_rollout_worker_busy_in_its_start_up_steps_is_interrupted(tmp_path):
    """An env whose every step is busy in Python for 10 s, in the random start-up steps of
    the worker's start: interrupted there, and its envs are closed after."""
    cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--train_dir",
                        str(tmp_path), "--device", "cpu", "--num_workers", "1",
                        "--num_envs_per_worker", "2", "--worker_num_splits", "1",
                        "--recipe", "pixels", "--use_rnn", "False", "--rollout", "8",
                        "--batch_size", "16", "--decorrelate_envs_on_one_worker", "True"])
    info = probe_env(EnvSettings.from_config(cfg))
    wiring = build_wiring(cfg, info, build_model(cfg, info, torch.device("cpu")), 1, 2)
    station = RolloutStation(wiring, 0, 1.0)
    envs = [SlowStartCountingEnv(busy_from=0, busy_seconds=10.0, env_tag=i) for i in range(2)]
    closed = []
    for env in envs:
        env.close = lambda env=env: closed.append(env)
    watch = Interrupter(grace=0.05)
    try:
        with pytest.raises(StopInterrupt):
            station.start(envs)
    finally:
        watch.done()
        station.close()
    assert envs[1].global_step == 0  # interrupted in its first random step
    assert closed == envs


def test_another_threads_interruptible_call_does_not_expose_the_main_thread():
    """Only the main thread's calls count: a helper thread's env call leaves the main
    thread, busy elsewhere, alone."""
    release = threading.Event()
    helper = threading.Thread(target=interruptible, args=(release.wait, 5), daemon=True)
    helper.start()
    watch = Interrupter()
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        spin()
    release.set()
    helper.join(5)
    watch.done()


def test_a_main_thread_that_saw_the_stop_is_left_alone():
    stop = StopFlag(shared=False)
    watch = threading.Thread(target=interrupt_when_stopped, args=(stop, lambda: True, 0.01),
                             daemon=True)
    watch.start()
    stop.set()
    watch.join(5)
    assert not watch.is_alive()
    interruptible(time.sleep, 0.05)  # an interrupt would land here
