"""The log lines of a rollout worker's env faults (``fastrl/runner/stations.py``)."""

from __future__ import annotations

import time
from collections import Counter

from fastrl.log import log
from fastrl.sampling.env_faults import EnvFault

# An env that fails all the time must not flood the log: a worker logs the first fault of
# each kind in full, the later ones as counts, at most one line this often (seconds).
FAULT_COUNTS_EVERY = 30.0


class FaultLog:
    """The log lines of one worker's env faults: the first of each kind (of an exception: of
    each exception type) in full, naming the env and what went wrong; the others as counts by
    kind, at most one line every ``every`` seconds."""

    def __init__(self, name: str, every: float = FAULT_COUNTS_EVERY):
        self.name = name
        self.every = every
        self.total = 0
        self._seen: set[tuple[str, str]] = set()
        self._unlogged: Counter[str] = Counter()
        self._last = time.monotonic()

    def add(self, fault: EnvFault) -> None:
        self.total += 1
        if (fault.kind, fault.cause) in self._seen:
            self._unlogged[fault.kind] += 1
            return
        self._seen.add((fault.kind, fault.cause))
        log(f"{self.name}: {fault}; recreating it (the first {fault.kind} fault of this worker; "
            "later ones are counted)")

    def flush(self, force: bool = False) -> None:
        """Log the counts not logged yet, if ``every`` seconds have passed (or ``force``)."""
        now = time.monotonic()
        if not self._unlogged or (not force and now - self._last < self.every):
            return
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(self._unlogged.items()))
        log(f"{self.name}: {sum(self._unlogged.values())} more env faults ({counts}), each env "
            f"recreated; {self.total} in all from this worker")
        self._unlogged.clear()
        self._last = now
