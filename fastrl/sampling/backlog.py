"""The bound on policy lag in async mode (``--max_batches_waiting``): a split does not begin
new trajectories while about two learner batches of trajectories wait for the learner.

Why: when the learner is the bottleneck, the rollout workers fill every trajectory slot and
the learner trains on the oldest data, so the policy lag grows with the number of envs (async
CartPole with 2 x 16 envs: 50-64 SGD steps, and 2 of 12 runs unlearned;
perf/log/RESULTS.md, "async CartPole falling back"). Two batches waiting is all the learner can
use: the one it takes next and the one that fills meanwhile.

**What is counted.** Each rollout worker owns two cells of a small shared array
(``Wiring.backlog``, int64 ``[2, num_workers]``): row 0, its trajectories handed to the
learner and not yet freed (the learner frees the slots as soon as it has copied them into a
batch); row 1, its *reserved* trajectories (below). A worker writes only its own cells,
from what it already knows (the trajectories it hands in, the ``BuffersFreed`` it receives),
and reads the whole array once per decision: no lock, no message, nothing for the learner
to do.

**The rule** (:meth:`Backlog.holds_back`). A split whose trajectories are complete begins the
next ones unless the run's waiting trajectories reach ``limit``; then it is *held*. A held
split begins again once the waiting trajectories *plus the reserved ones* are below the
limit, and its new trajectories stay reserved until it hands them in. Without the
reservation every held split of the run would begin at once as soon as one batch is taken,
and the backlog would again grow with the env count. A split that was not held ignores the
reservations, so that a run whose learner keeps up (fewer than two batches ever wait) is
never held, however many envs it has: no cost where the envs are the bottleneck.

Held splits are looked at again when their worker gets slots back and at every poll of its
station (every 50 ms at most when nothing else happens). Every split held means at least
``limit`` trajectories wait for a learner, which trains and frees some: no deadlock.
"""

from __future__ import annotations

import math

import numpy as np

from fastrl.sampling.rollout_records import Split


def backlog_limit(max_batches: float, trajectories_per_batch: int, split_size: int,
                  num_policies: int = 1) -> int | None:
    """Trajectories allowed to wait for the learners: ``max_batches`` batches for each policy
    (each policy's learner waits for whole batches of its own), or None for no bound
    (``max_batches`` 0). Never less than one batch plus one split (``split_size`` env slots):
    a split hands its trajectories in all at once, and they alone must not hold it back
    while the learner keeps up (fewer than a batch waiting before they came)."""
    if max_batches <= 0:
        return None
    batch = trajectories_per_batch * num_policies
    return max(math.ceil(max_batches * batch), batch + split_size)


def backlog_cells(raw, num_workers: int) -> np.ndarray:
    """The ``[2, num_workers]`` int64 view of ``Wiring.backlog`` (a shared ``RawArray``)."""
    return np.frombuffer(raw, dtype=np.int64).reshape(2, num_workers)


class Backlog:
    """Rollout worker ``worker``'s part of the count, and its decisions.

    ``cells``: :func:`backlog_cells`; ``limit``: :func:`backlog_limit` (None: never hold, and
    nothing is counted). ``holds`` and ``starts`` count splits held and splits begun since
    :meth:`take_counts`."""

    def __init__(self, cells: np.ndarray | None, worker: int, limit: int | None):
        self.limit = limit if cells is not None else None
        self.cells = cells
        self.worker = worker
        self.waiting = 0  # this worker's handed-in trajectories not yet freed
        self.reserved = 0  # this worker's trajectories begun after a hold, being acted
        self.holds = 0
        self.starts = 0
        if self.limit is not None:
            cells[:, worker] = 0  # a restarted worker's predecessor left its counts here

    def holds_back(self, split: Split) -> bool:
        """Whether ``split`` must wait rather than begin trajectories now (it is then marked
        held); one read of the shared array."""
        if self.limit is None:
            return False
        count = self.cells.sum() if split.held else self.cells[0].sum()
        if int(count) < self.limit:
            return False
        self.holds += not split.held
        split.held = True
        return True

    def began(self, split: Split, n: int) -> None:
        """``split`` began ``n`` trajectories (reserved if it was held)."""
        self.starts += 1
        split.reserved, split.held = split.held, False
        if split.reserved and self.limit is not None:
            self.reserved += n
            self.cells[1, self.worker] = self.reserved

    def handed_in(self, split: Split, n: int) -> None:
        """``split``'s ``n`` complete trajectories went to the learner."""
        if self.limit is None:
            return
        self.waiting += n
        self.cells[0, self.worker] = self.waiting
        if split.reserved:
            self.reserved -= n
            self.cells[1, self.worker] = self.reserved

    def freed(self, n: int) -> None:
        """The learner freed ``n`` of them."""
        if self.limit is not None:
            self.waiting = max(0, self.waiting - n)
            self.cells[0, self.worker] = self.waiting

    def take_counts(self) -> tuple[int, int]:
        """(splits held, splits begun) since the last call."""
        counts, self.holds, self.starts = (self.holds, self.starts), 0, 0
        return counts
