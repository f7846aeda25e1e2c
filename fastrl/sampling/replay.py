"""The replay store of ``--algo apex``: trajectories kept for many updates, sampled by priority.

The learner station fills it from the trajectory slots it already receives
(``TrajectoryBuffers.gather``), so every mode that feeds the APPO learner feeds it unchanged.

**Layout.** A row holds one trajectory slot as it came: ``T + 1`` observations (``T`` =
``--rollout``), ``T`` actions, rewards, dones, which steps were acted (``valid``) and the
time-limit observation (``final_obs``, ``final_step``). An observation is stored once per row,
the one after the last step (for bootstrapping) once more: ``(T + 1) / T`` copies in all, not
``n + 1`` as with transitions stored whole. A row is also the unit R2D2 needs later (a
sequence; its recurrent state would be one more column). Rows are overwritten oldest first
(FIFO); capacity counts transitions, ``capacity // T`` rows.

**Transitions.** Transition ``j = row * T + t`` is step ``t`` of a row. Its n-step target
(:func:`nstep_returns`) sums the rewards of steps ``t .. t + m - 1``, where ``m <= n`` stops
at the first done and at the row's end, and bootstraps from observation ``t + m`` (the row
stores it) with discount ``gamma ** m``; not at all after a termination; from ``final_obs``
after a time limit. Near a row's end the target is thus a shorter-step one, still a correct
target for Q-learning.

**Priorities** are ``(|TD error| + eps) ** alpha`` in a :class:`SumTree` over every
transition; new rows come in at the highest priority seen so far; steps no policy acted
(``valid`` False) have priority 0 and are never sampled. Sampling is stratified (one draw
per equal slice of the total), importance weights are ``(N * P(j)) ** -beta`` divided by
the batch's largest (:func:`importance_weights`).

**Rate.** :class:`RateLimiter` keeps sampled transitions per inserted transition near
``--replay_samples_per_insert``: the learner station inserts only what the ratio allows
(the rest waits in its slots, so the rollout workers wait for free slots) and trains only
while it does not run ahead of the data.

The store lives in the learner's process (in parallel mode, the learner child): the learner
is its one writer and reader.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Added to |TD error| so that no transition's priority falls to 0 (never sampled again).
PRIORITY_EPS = 1e-6


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


def annealed_beta(beta0: float, done_fraction: float) -> float:
    """Beta from ``beta0`` (nothing trained) linearly to 1 (``done_fraction`` >= 1)."""
    return beta0 + (1.0 - beta0) * min(1.0, max(0.0, done_fraction))


def nstep_returns(rewards: torch.Tensor, dones: torch.Tensor, final_step: torch.Tensor,
                  t: torch.Tensor, n: int, gamma: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n-step part of the targets of transitions at step ``t`` ``[B]`` of rows whose
    ``rewards``, ``dones`` are ``[B, T]`` and ``final_step`` ``[B]`` (-1: no time limit).

    Returns ``(returns [B], discounts [B], next_t [B], from_final [B])``: the discounted
    rewards of the ``m`` steps taken (up to ``n``, to the first done, to the row's end); the
    bootstrap's discount ``gamma ** m`` (0 after a termination); the observation
    ``t + m`` to bootstrap from; and whether it is ``final_obs`` instead (a time limit ended
    the episode at the last step taken)."""
    b, horizon = rewards.shape
    steps = t.unsqueeze(1) + torch.arange(n, device=t.device).unsqueeze(0)  # [B, n]
    inside = steps < horizon
    cols = steps.clamp(max=horizon - 1)
    r = rewards.gather(1, cols) * inside
    d = dones.gather(1, cols) & inside
    # A step is taken when it is inside the row and no earlier step of the window ended.
    before = torch.cat([torch.zeros((b, 1), dtype=torch.bool, device=t.device), d[:, :-1]], 1)
    taken = inside & (torch.cumsum(before.int(), 1) == 0)
    powers = gamma ** torch.arange(n, device=t.device, dtype=rewards.dtype)
    returns = (r * taken * powers).sum(1)
    m = taken.sum(1)
    last = t + m - 1
    ended = (d & taken).any(1)
    from_final = ended & (final_step == last)
    discounts = torch.where(ended & ~from_final, 0.0, gamma ** m.to(rewards.dtype))
    return returns, discounts.to(rewards.dtype), t + m, from_final


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RateLimiter:
    """Keeps ``samples`` (transitions sampled) near ``samples_per_insert`` x (``inserts`` -
    ``min_size``), within ``slack`` either way. Sampling needs ``min_size`` transitions in the
    store. ``slack`` is at least one insert plus one batch, so that one of the two is always
    allowed: the learner can never wait on itself."""

    def __init__(self, samples_per_insert: float, min_size: int, batch: int, insert_unit: int,
                 slack: float = 0.0):
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = int(min_size)
        self.slack = max(float(slack), self.samples_per_insert * insert_unit + batch)
        self.inserts = 0
        self.samples = 0

    def owed(self) -> float:
        """Samples the learner is behind the ratio (negative: ahead)."""
        return self.samples_per_insert * (self.inserts - self.min_size) - self.samples

    def can_sample(self, batch: int, size: int) -> bool:
        return size >= self.min_size and self.owed() - batch >= -self.slack

    def insertable(self, unit: int, count: int) -> int:
        """How many of ``count`` inserts of ``unit`` transitions may go in now."""
        if self.samples_per_insert <= 0:
            return count
        k = 0
        while k < count:
            before = self.inserts + k * unit
            if before >= self.min_size and self.samples_per_insert * (
                    before + unit - self.min_size) - self.samples > self.slack:
                break
            k += 1
        return k

    def ratio(self) -> float:
        return self.samples / max(1, self.inserts)


def check_fits(nbytes: int, capacity: int) -> None:
    """A one-line ``MemoryError`` when a store of ``nbytes`` cannot be held in memory."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise MemoryError(
            f"--replay_capacity={capacity:,}: the replay store needs {nbytes / 2**30:.2f} GiB, "
            f"more than the {free / 2**30:.2f} GiB of memory available; lower --replay_capacity")


class ReplayStore:
    """Rows of whole trajectories (see the module docstring) with a priority per transition.

    Args:
        obs_shapes, obs_dtypes: per observation key, as in ``BufferLayout``.
        rollout: ``T``, steps per row.
        action_dims, action_dtype: a stored action's columns and dtype.
        capacity: transitions held (``capacity // rollout`` rows).
        alpha: priority exponent (0: uniform sampling).
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]],
                 obs_dtypes: dict[str, torch.dtype], rollout: int, action_dims: int,
                 action_dtype: torch.dtype, capacity: int, alpha: float, seed: int | None = None):
        self.rollout = t = int(rollout)
        self.num_rows = rows = int(capacity) // t
        if rows < 1:
            raise ValueError(f"--replay_capacity={capacity}: must hold at least one trajectory "
                             f"of --rollout={rollout} steps")
        self.capacity = rows * t
        self.alpha = float(alpha)
        self.obs = {k: torch.empty((rows, t + 1, *s), dtype=obs_dtypes[k])
                    for k, s in obs_shapes.items()}
        self.final_obs = {k: torch.empty((rows, *s), dtype=obs_dtypes[k])
                          for k, s in obs_shapes.items()}
        self.final_step = torch.full((rows,), -1, dtype=torch.int64)
        self.actions = torch.zeros((rows, t, action_dims), dtype=action_dtype)
        self.rewards = torch.zeros((rows, t), dtype=torch.float32)
        self.dones = torch.ones((rows, t), dtype=torch.bool)
        self.tree = SumTree(self.capacity)
        self.next_row = 0
        self.rows_filled = 0
        self.max_priority = 1.0  # of |TD error| + eps, before the exponent
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def nbytes_for(obs_shapes: dict[str, tuple[int, ...]], obs_dtypes: dict[str, torch.dtype],
                   rollout: int, action_dims: int, action_dtype: torch.dtype,
                   capacity: int) -> int:
        """Bytes a store of these sizes holds (contents and sum tree)."""
        rows = capacity // rollout
        per_row = rollout * (action_dims * torch.empty((), dtype=action_dtype).element_size()
                             + 4 + 1) + 8
        for key, shape in obs_shapes.items():
            size = torch.empty((), dtype=obs_dtypes[key]).element_size() * int(np.prod(shape))
            per_row += (rollout + 2) * size
        tree = 2 * (1 << max(0, math.ceil(math.log2(max(1, rows * rollout))))) * 8
        return rows * per_row + tree

    @property
    def size(self) -> int:
        """Transitions held (acted or not)."""
        return self.rows_filled * self.rollout

    def insert(self, batch: dict, priorities: np.ndarray | None = None) -> int:
        """Store trajectories ``batch`` (as ``TrajectoryBuffers.gather`` gives them, on the
        CPU: ``obs`` dict of ``[K, T + 1, ...]``, ``actions`` ``[K, T, D]``, ``rewards``,
        ``dones``, ``policy_versions`` ``[K, T]``, ``final_obs``, ``final_step``) over the
        oldest rows, at ``priorities`` ``[K, T]`` (|TD error|; default: the highest so far).
        Returns the transitions stored (``K * T``)."""
        k = batch["rewards"].shape[0]
        keep = slice(max(0, k - self.num_rows), k)  # more rows than the store: the newest
        k = keep.stop - keep.start
        rows = torch.remainder(torch.arange(self.next_row, self.next_row + k), self.num_rows)
        self._write_rows(rows, batch, keep)
        valid = (batch["policy_versions"][keep] >= 0).numpy()
        if priorities is None:
            prio = self.max_priority ** self.alpha
        else:
            raw = np.asarray(priorities, dtype=np.float64)[keep] + PRIORITY_EPS
            self.max_priority = max(self.max_priority, float(raw.max()))
            prio = raw ** self.alpha
        self._set_new_priorities(rows.numpy(), valid, prio)
        self.next_row = (self.next_row + k) % self.num_rows
        self.rows_filled = min(self.num_rows, self.rows_filled + k)
        return k * self.rollout

    def _write_rows(self, rows: torch.Tensor, batch: dict, keep: slice) -> None:
        """Rows ``rows`` take the trajectories ``keep`` of ``batch`` (see :meth:`insert`)."""
        for key, store in self.obs.items():
            store[rows] = batch["obs"][key][keep]
            self.final_obs[key][rows] = batch["final_obs"][key][keep]
        self.final_step[rows] = batch["final_step"][keep]
        self.actions[rows] = batch["actions"][keep].to(self.actions.dtype)
        self.rewards[rows] = batch["rewards"][keep].float()
        self.dones[rows] = batch["dones"][keep]

    def _set_new_priorities(self, rows: np.ndarray, valid: np.ndarray, prio) -> None:
        """The tree's items of the new ``rows`` take ``prio`` (a number, or one per item);
        the steps no policy acted (``valid`` ``[K, T]`` False) take 0."""
        idx = rows[:, None] * self.rollout + np.arange(self.rollout)[None]
        self.tree.update(idx.reshape(-1), np.where(valid, prio, 0.0).reshape(-1))

    def sample(self, batch: int, beta: float, nstep: int, gamma: float
               ) -> tuple[dict, np.ndarray, np.ndarray]:
        """``batch`` transitions drawn by priority: (data, indices ``[B]``, importance weights
        ``[B]`` float32). ``data``: ``obs`` and ``next_obs`` (dicts of ``[B, ...]``),
        ``actions`` ``[B, D]``, ``returns`` and ``discounts`` ``[B]`` (:func:`nstep_returns`).
        """
        idx, weights = self.draw(batch, beta)
        return self.transitions(idx, nstep, gamma), idx, weights

    def items_held(self) -> int:
        """The tree's items that hold data: transitions (acted or not)."""
        return self.size

    def draw(self, batch: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` of the tree's items drawn by priority (stratified) and their importance
        weights ``[B]`` float32."""
        total = self.tree.total
        if total <= 0:
            raise RuntimeError("sampling an empty replay store")
        idx = self.tree.find(stratified_prefixes(total, batch, self.rng))
        probs = self.tree.leaves()[idx] / total
        return idx, importance_weights(probs, max(1, self.items_held()), beta)

    def transitions(self, idx: np.ndarray, nstep: int, gamma: float) -> dict:
        """The transitions ``idx`` ``[B]`` as :meth:`sample` gives them."""
        rows_np, t_np = np.divmod(idx, self.rollout)
        rows, t = torch.from_numpy(rows_np), torch.from_numpy(t_np)
        returns, discounts, next_t, from_final = nstep_returns(
            self.rewards[rows], self.dones[rows], self.final_step[rows], t, nstep, gamma)
        obs, next_obs = {}, {}
        for key, store in self.obs.items():
            obs[key] = store[rows, t]
            nxt = store[rows, next_t]
            final = self.final_obs[key][rows]
            mask = from_final.view(-1, *([1] * (nxt.dim() - 1)))
            next_obs[key] = torch.where(mask, final, nxt)
        return {"obs": obs, "next_obs": next_obs, "actions": self.actions[rows, t],
                "returns": returns, "discounts": discounts}

    def newest(self, k: int) -> np.ndarray:
        """The transitions of the ``k`` rows written last, that were acted (priority > 0)."""
        rows = np.remainder(np.arange(self.next_row - k, self.next_row), self.num_rows)
        idx = (rows[:, None] * self.rollout + np.arange(self.rollout)[None]).reshape(-1)
        return idx[self.tree.leaves()[idx] > 0]

    def update_priorities(self, idx: np.ndarray, td_abs: np.ndarray) -> None:
        """New priorities ``(|TD error| + eps) ** alpha`` for the transitions ``idx``."""
        raw = np.asarray(td_abs, dtype=np.float64) + PRIORITY_EPS
        self.max_priority = max(self.max_priority, float(raw.max()))
        self.tree.update(idx, raw ** self.alpha)

    def priority_mean(self) -> float:
        """The mean of the stored priorities (after the exponent) over the items held."""
        return self.tree.total / max(1, self.items_held())

    # The per-row tensors besides the observations, as checkpoints hold them.
    COLUMNS = ("final_step", "actions", "rewards", "dones")

    def state_dict(self, contents: bool) -> dict:
        state = {"priorities": self.tree.leaves().copy(), "next_row": self.next_row,
                 "rows_filled": self.rows_filled, "max_priority": self.max_priority,
                 "rng": self.rng.bit_generator.state, "contents": contents}
        if contents:
            state.update(obs=self.obs, final_obs=self.final_obs,
                         **{name: getattr(self, name) for name in self.COLUMNS})
        return state

    def load_state_dict(self, state: dict) -> bool:
        """Restore; returns whether the contents came back (without them the store starts
        empty: priorities without their data mean nothing)."""
        self.max_priority = float(state["max_priority"])
        self.rng.bit_generator.state = state["rng"]
        if not state["contents"] or len(state["priorities"]) != self.tree.capacity:
            self.tree.rebuild(np.zeros(self.tree.capacity))
            self.next_row = self.rows_filled = 0
            return False
        for key in self.obs:
            self.obs[key].copy_(state["obs"][key])
            self.final_obs[key].copy_(state["final_obs"][key])
        for name in self.COLUMNS:
            getattr(self, name).copy_(state[name])
        self.tree.rebuild(np.asarray(state["priorities"], dtype=np.float64))
        self.next_row = int(state["next_row"])
        self.rows_filled = int(state["rows_filled"])
        return True
