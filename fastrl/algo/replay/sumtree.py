"""The sum tree of the replay stores' priorities, and the sampling by it
(``fastrl/algo/replay/store.py`` says how the stores use them)."""

from __future__ import annotations

import math

import numpy as np


class SumTree:
    """Non-negative priorities of ``capacity`` items; sums of every subtree kept in one flat
    array (node ``i``'s children are ``2i`` and ``2i + 1``, the leaves ``size .. 2 size - 1``).
    Updates and searches of a batch move level by level, one numpy operation per level."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"sum tree capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.size = 1 << max(0, math.ceil(math.log2(capacity)))
        self.depth = int(math.log2(self.size))
        self.nodes = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def leaves(self) -> np.ndarray:
        """The priorities ``[capacity]`` (a view)."""
        return self.nodes[self.size:self.size + self.capacity]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set the priorities of items ``idx`` ``[K]`` to ``values`` ``[K]`` (a repeated index
        takes its last value)."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if idx.size == 0:
            return
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("priorities must be finite and >= 0")
        nodes = idx + self.size
        self.nodes[nodes] = values  # numpy assigns in order: the last of a repeat wins
        # A parent named twice gets the same sum twice: cheaper than making them unique.
        parents = nodes >> 1
        for _ in range(self.depth):
            self.nodes[parents] = self.nodes[2 * parents] + self.nodes[2 * parents + 1]
            parents >>= 1

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each prefix sum in ``prefix`` ``[K]`` (in ``[0, total)``), the item whose
        cumulative interval holds it. Never an item of priority 0: a subtree whose sum is 0 is
        never entered, whatever the rounding."""
        prefix = np.asarray(prefix, dtype=np.float64).copy()
        node = np.ones(prefix.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self.nodes[left]
            right = (prefix >= left_sum) & (self.nodes[left + 1] > 0)
            prefix = np.where(right, prefix - left_sum, prefix)
            node = np.where(right, left + 1, left)
        return node - self.size

    def rebuild(self, leaves: np.ndarray) -> None:
        """Set every priority at once (restoring a checkpoint)."""
        self.nodes[:] = 0.0
        self.nodes[self.size:self.size + self.capacity] = leaves
        for level in range(self.depth - 1, -1, -1):
            lo, hi = 1 << level, 1 << (level + 1)
            self.nodes[lo:hi] = self.nodes[2 * lo:2 * hi:2] + self.nodes[2 * lo + 1:2 * hi:2]


def stratified_prefixes(total: float, batch: int, rng: np.random.Generator) -> np.ndarray:
    """One uniform draw in each of ``batch`` equal slices of ``[0, total)``."""
    return (np.arange(batch) + rng.random(batch)) * (total / batch)


def importance_weights(probs: np.ndarray, size: int, beta: float) -> np.ndarray:
    """``(size * probs) ** -beta`` divided by its largest value (so at most 1)."""
    w = (size * np.asarray(probs, dtype=np.float64)) ** (-beta)
    return (w / w.max()).astype(np.float32)
