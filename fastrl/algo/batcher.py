"""The learner's batcher: the trajectory slots waiting for it, in arrival order, taken a batch
at a time, freed back to their workers, and what a dead rollout worker left behind. (A
sampler node's gateway, the learner's stand-in on that node, keeps its waiting slots the
same way.)

Every slot belongs to one rollout worker (slots ``w * per_worker`` to ``(w + 1) * per_worker
- 1``). A slot reaches the learner in a :class:`TrajectoriesReady` message and goes back to
its worker in a :class:`BuffersFreed` message once its data is copied out. When a worker
dies, the runner sends a fence: the dead incarnation's waiting slots are dropped (their
data may be half-written) and belong to the next incarnation, and anything the dead one
sent later is refused by its generation.
"""

from __future__ import annotations

from fastrl.transport.messages import BuffersFreed, TrajectoriesReady


class PendingSlots:
    """Trajectory slots delivered to the learner and not yet trained on, in arrival order."""

    def __init__(self, per_worker: int, generations: list[int]):
        self.per_worker = per_worker
        self.generations = list(generations)  # the live incarnation of each rollout worker
        self.waiting: list[int] = []

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, msg: TrajectoriesReady) -> bool:
        """Queue ``msg``'s slots; refuse (False) those of a fenced-off incarnation."""
        if msg.generation != self.generations[msg.worker_id]:
            return False
        self.waiting.extend(msg.buffers)
        return True

    def fence(self, worker_id: int, generation: int) -> int:
        """Worker ``worker_id`` died and its next incarnation is ``generation``: forget its
        waiting slots. Returns how many were dropped (one slot holds one trajectory)."""
        kept = [b for b in self.waiting if b // self.per_worker != worker_id]
        dropped = len(self.waiting) - len(kept)
        self.waiting = kept
        self.generations[worker_id] = generation
        return dropped

    def take(self, n: int) -> list[int] | None:
        """The ``n`` oldest waiting slots, or None while fewer than ``n`` wait."""
        if len(self.waiting) < n:
            return None
        taken, self.waiting = self.waiting[:n], self.waiting[n:]
        return taken

    def take_all(self, limit: int | None = None) -> list[int]:
        """Every waiting slot (at most ``limit``, the oldest first)."""
        if limit is None:
            taken, self.waiting = self.waiting, []
        else:
            taken, self.waiting = self.waiting[:limit], self.waiting[limit:]
        return taken

    def freed(self, slots: list[int]) -> list[tuple[int, BuffersFreed]]:
        """The messages that hand ``slots`` back: (worker id, message) per owning worker."""
        by_worker: dict[int, list[int]] = {}
        for b in slots:
            by_worker.setdefault(b // self.per_worker, []).append(b)
        return [(w, BuffersFreed(tuple(bufs), self.generations[w]))
                for w, bufs in by_worker.items()]
