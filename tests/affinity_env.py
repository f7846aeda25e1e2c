"""A CountingEnv that writes down where it runs, at its first step: the cores its process may
use and those of a process it starts then, into ``$FASTRL_TEST_AFFINITY_DIR``; with
``engine=True`` it also starts a long-lived process when made (as VizDoom starts its engine)
and writes that one's cores too."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym

from tests.counting_env import CountingEnv

CHILD = "import os; print(' '.join(map(str, sorted(os.sched_getaffinity(0)))))"


def cores_of(pid: int) -> str:
    return " ".join(map(str, sorted(os.sched_getaffinity(pid))))


class CoreCountingEnv(CountingEnv):
    def __init__(self, engine: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.engine = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                       if engine else None)
        self.written = False

    def step(self, action):
        folder = os.environ.get("FASTRL_TEST_AFFINITY_DIR")
        if folder and not self.written:
            self.written = True
            new = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
            engine = "-" if self.engine is None else cores_of(self.engine.pid)
            with open("/proc/self/cmdline") as f:  # the title setproctitle gave it
                name = f.read().split("\0")[0].strip() or "?"
            with open(os.path.join(folder, f"{os.getpid()}-{id(self)}"), "w") as f:
                f.write(f"{name}\n{cores_of(0)}\n{new}\n{engine}\n")
        return super().step(action)

    def close(self):
        if self.engine is not None:
            self.engine.kill()
            self.engine.wait()
            self.engine = None
        super().close()


gym.register("CoreCountingEnv-v0", entry_point=CoreCountingEnv)
gym.register("CoreEngineCountingEnv-v0", entry_point=CoreCountingEnv, kwargs={"engine": True})
