"""Slow CountingEnvs: slow to make, slow to step at first (as highway-v0 is: 10-20 ms a step),
or busy in Python for a long time in a step (an env call that a stop must interrupt)."""

from __future__ import annotations

import time

import gymnasium as gym

from tests.counting_env import CountingEnv


class SlowStartCountingEnv(CountingEnv):
    """A CountingEnv that takes ``make_seconds`` to make and whose first ``slow_steps`` steps
    take ``slow_step_seconds`` each (the random start-up steps fall on them); from global step
    ``busy_from`` on, each step works in Python for ``busy_seconds``."""

    def __init__(self, make_seconds: float = 0.0, slow_steps: int = 0,
                 slow_step_seconds: float = 0.0, busy_from: int | None = None,
                 busy_seconds: float = 0.0, **kwargs):
        time.sleep(make_seconds)
        super().__init__(**kwargs)
        self.slow_steps, self.slow_step_seconds = slow_steps, slow_step_seconds
        self.busy_from, self.busy_seconds = busy_from, busy_seconds

    def step(self, action):
        if self.global_step < self.slow_steps:
            time.sleep(self.slow_step_seconds)
        if self.busy_from is not None and self.global_step >= self.busy_from:
            end = time.monotonic() + self.busy_seconds
            while time.monotonic() < end:  # Python code, not one native call
                time.sleep(0.01)
        return super().step(action)


class ClockedCountingEnv(CountingEnv):
    """A CountingEnv whose every step moves ``clock`` (a :class:`FakeClock`) on by
    ``step_seconds``, without sleeping: a slow env for in-process tests."""

    def __init__(self, clock: FakeClock, step_seconds: float, **kwargs):
        super().__init__(**kwargs)
        self.clock, self.step_seconds = clock, step_seconds

    def step(self, action):
        self.clock.now += self.step_seconds
        return super().step(action)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# For worker processes ("tests.slow_env:SlowStartCountingEnv-v0" imports this module).
gym.register("SlowStartCountingEnv-v0", entry_point=SlowStartCountingEnv,
             kwargs={"make_seconds": 0.5, "slow_steps": 60, "slow_step_seconds": 0.06})
gym.register("BusyCountingEnv-v0", entry_point=SlowStartCountingEnv,
             kwargs={"busy_from": 60, "busy_seconds": 60.0})
