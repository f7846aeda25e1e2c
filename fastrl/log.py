"""The console logger: one timestamped line per call, named after the process's node.

A leaf module: everything may import it, it imports nothing of fastrl's."""

from __future__ import annotations

import os
import time


def log(msg: str) -> None:
    # A sampler node's processes name their node (fastrl/runner/sampler_node.py sets the variable).
    who = os.environ.get("FASTRL_LOG_PREFIX", "fastrl")
    print(f"[{who} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
