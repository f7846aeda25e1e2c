"""A CountingEnv that writes down where it runs, at its 60th step (after the start-up's random
steps, which come before a rollout worker keeps to its core), into
``$FASTRL_TEST_AFFINITY_DIR``: the cores of every thread of its process, those of a process it
starts then, and with ``engine=True`` those of every thread of a process it started when made
(as VizDoom starts its engine; this one runs a second thread, as an engine does)."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym

from tests.counting_env import CountingEnv

WRITE_AT = 60
CHILD = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"
ENGINE = ("import threading, time; threading.Thread(target=time.sleep, args=(600,), "
          "daemon=True).start(); time.sleep(600)")


def thread_cores(pid: int | str) -> str:
    """The cores of each thread of ``pid``, the distinct ones joined by '|'."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        found.add(",".join(map(str, sorted(os.sched_getaffinity(int(tid))))))
    return "|".join(sorted(found))


class CoreCountingEnv(CountingEnv):
    def __init__(self, engine: bool = False, lazy: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.engine = None
        self.lazy = engine and lazy  # start the engine at the first reset, not when made
        if engine and not lazy:
            self.engine = subprocess.Popen([sys.executable, "-c", ENGINE])
        self.written = False

    def reset(self, *, seed=None, options=None):
        if self.lazy and self.engine is None:
            self.engine = subprocess.Popen([sys.executable, "-c", ENGINE])
        return super().reset(seed=seed, options=options)

    def step(self, action):
        folder = os.environ.get("FASTRL_TEST_AFFINITY_DIR")
        if folder and not self.written and self.global_step >= WRITE_AT:
            self.written = True
            new = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
            engine = "-" if self.engine is None else thread_cores(self.engine.pid)
            with open("/proc/self/cmdline") as f:  # the title setproctitle gave it
                name = f.read().split("\0")[0].strip() or "?"
            with open(os.path.join(folder, f"{os.getpid()}-{id(self)}"), "w") as f:
                f.write(f"{name}\n{thread_cores('self')}\n{new}\n{engine}\n")
        return super().step(action)

    def close(self):
        if self.engine is not None:
            self.engine.kill()
            self.engine.wait()
            self.engine = None
        super().close()


gym.register("CoreCountingEnv-v0", entry_point=CoreCountingEnv)
gym.register("CoreEngineCountingEnv-v0", entry_point=CoreCountingEnv, kwargs={"engine": True})
gym.register("CoreLazyEngineCountingEnv-v0", entry_point=CoreCountingEnv,
             kwargs={"engine": True, "lazy": True})
