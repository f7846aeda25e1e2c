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

**Where it lives.** With one learner, in the learner's process (in parallel mode, the
learner child), its one writer and reader. With ``--num_learners N > 1`` its tensors (the
*columns*: observations, actions, rewards...) are made once in shared memory by the runner
(:meth:`ReplayStore.columns` of a store built with ``shared=True``) and every rank binds a
store to them (``columns=``): rank 0 writes them and keeps the sum tree, the counters and
the rate limiter; every rank reads the transitions or sequences rank 0 draws for its share
of a batch (``fastrl/runner/replay_station.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fastrl.algo.replay.sumtree import SumTree, importance_weights, stratified_prefixes
from fastrl.algo.replay.targets import nstep_returns

# Added to |TD error| so that no transition's priority falls to 0 (never sampled again).
PRIORITY_EPS = 1e-6


def annealed_beta(beta0: float, done_fraction: float) -> float:
    """Beta from ``beta0`` (nothing trained) linearly to 1 (``done_fraction`` >= 1)."""
    return beta0 + (1.0 - beta0) * min(1.0, max(0.0, done_fraction))


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


# A column's shape, dtype and initial value (None: left uninitialised).
ColumnSpec = tuple[tuple[int, ...], torch.dtype, Any]


def columns_nbytes(specs: dict[str, ColumnSpec]) -> int:
    """Bytes the columns of ``specs`` hold."""
    return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
               for shape, dtype, _ in specs.values())


def empty_tensor(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised tensor; with ``shared``, in shared memory made for it (untouched pages
    cost nothing until written, where ``Tensor.share_memory_`` would copy the whole tensor)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(max(1, math.prod(shape) * itemsize))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


class ReplayStore:
    """Rows of whole trajectories (see the module docstring) with a priority per transition.

    Args:
        obs_shapes, obs_dtypes: per observation key, as in ``BufferLayout``.
        rollout: ``T``, steps per row.
        action_dims, action_dtype: a stored action's columns and dtype.
        capacity: transitions held (``capacity // rollout`` rows).
        alpha: priority exponent (0: uniform sampling).
        shared: make the columns in shared memory (see the module docstring).
        columns: bind to these columns instead of making them (another store's
            :meth:`columns`, of the same sizes).
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]],
                 obs_dtypes: dict[str, torch.dtype], rollout: int, action_dims: int,
                 action_dtype: torch.dtype, capacity: int, alpha: float, seed: int | None = None,
                 shared: bool = False, columns: dict[str, torch.Tensor] | None = None):
        self.rollout = t = int(rollout)
        self.num_rows = rows = int(capacity) // t
        if rows < 1:
            raise ValueError(f"--replay_capacity={capacity}: must hold at least one trajectory "
                             f"of --rollout={rollout}")
        self.capacity = rows * t
        self.alpha = float(alpha)
        self._obs_shapes, self._obs_dtypes = dict(obs_shapes), dict(obs_dtypes)
        self._action_dims, self._action_dtype = int(action_dims), action_dtype
        self._bind(columns if columns is not None else self._make_columns(shared))
        self.tree = SumTree(self.capacity)
        self.next_row = 0
        self.rows_filled = 0
        self.max_priority = 1.0  # of |TD error| + eps, before the exponent
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def column_specs(obs_shapes: dict[str, tuple[int, ...]], obs_dtypes: dict[str, torch.dtype],
                     rows: int, rollout: int, action_dims: int, action_dtype: torch.dtype
                     ) -> dict[str, ColumnSpec]:
        """Each column's shape, dtype and initial value (None: left uninitialised), for
        ``rows`` rows of ``rollout`` steps: observations as ``obs/KEY`` and
        ``final_obs/KEY``, every other column under its attribute's name."""
        t = rollout
        specs: dict[str, ColumnSpec] = {}
        for key, shape in obs_shapes.items():
            specs[f"obs/{key}"] = ((rows, t + 1, *shape), obs_dtypes[key], None)
            specs[f"final_obs/{key}"] = ((rows, *shape), obs_dtypes[key], None)
        specs["final_step"] = ((rows,), torch.int64, -1)
        specs["actions"] = ((rows, t, action_dims), action_dtype, 0)
        specs["rewards"] = ((rows, t), torch.float32, 0.0)
        specs["dones"] = ((rows, t), torch.bool, True)
        return specs

    def _column_specs(self) -> dict[str, ColumnSpec]:
        return ReplayStore.column_specs(self._obs_shapes, self._obs_dtypes, self.num_rows,
                                        self.rollout, self._action_dims, self._action_dtype)

    def _make_columns(self, shared: bool) -> dict[str, torch.Tensor]:
        columns = {}
        for name, (shape, dtype, fill) in self._column_specs().items():
            columns[name] = empty_tensor(shape, dtype, shared)
            if fill is not None:
                columns[name].fill_(fill)
        return columns

    def _bind(self, columns: dict[str, torch.Tensor]) -> None:
        """Take ``columns`` as this store's tensors (checked against the sizes)."""
        for name, (shape, dtype, _) in self._column_specs().items():
            have = columns.get(name)
            if have is None or tuple(have.shape) != shape or have.dtype != dtype:
                got = None if have is None else (tuple(have.shape), have.dtype)
                raise ValueError(f"replay column {name!r}: expected {(shape, dtype)}, got {got}")
        self._columns = dict(columns)
        self.obs = {k: columns[f"obs/{k}"] for k in self._obs_shapes}
        self.final_obs = {k: columns[f"final_obs/{k}"] for k in self._obs_shapes}
        # The per-row tensors besides the observations, as attributes and in checkpoints.
        self._other_columns = [name for name in columns if "/" not in name]
        for name in self._other_columns:
            setattr(self, name, columns[name])

    def columns(self) -> dict[str, torch.Tensor]:
        """The store's tensors by name (to bind another store to them)."""
        return dict(self._columns)

    @staticmethod
    def nbytes_for(obs_shapes: dict[str, tuple[int, ...]], obs_dtypes: dict[str, torch.dtype],
                   rollout: int, action_dims: int, action_dtype: torch.dtype,
                   capacity: int) -> int:
        """Bytes a store of these sizes holds (contents and sum tree)."""
        rows = capacity // rollout
        tree = 2 * (1 << max(0, math.ceil(math.log2(max(1, rows * rollout))))) * 8
        return columns_nbytes(ReplayStore.column_specs(
            obs_shapes, obs_dtypes, rows, rollout, action_dims, action_dtype)) + tree

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

    def state_dict(self, contents: bool) -> dict:
        state = {"priorities": self.tree.leaves().copy(), "next_row": self.next_row,
                 "rows_filled": self.rows_filled, "max_priority": self.max_priority,
                 "rng": self.rng.bit_generator.state, "contents": contents}
        if contents:
            state.update(obs=self.obs, final_obs=self.final_obs,
                         **{name: getattr(self, name) for name in self._other_columns})
        return state

    def mismatch(self, state: dict) -> str | None:
        """Why the contents saved in ``state`` do not fit this store (another ``--rollout``
        or ``--replay_capacity``, observations or recurrent states of other shapes), in
        words; None when they fit."""
        rows, t = state["rewards"].shape
        if (rows, t) != (self.num_rows, self.rollout):
            return (f"it holds {rows} rows of --rollout {t}, this run's {self.num_rows} rows "
                    f"of --rollout {self.rollout} (--replay_capacity {self.capacity})")
        saved = {name: state[name] for name in self._other_columns if name in state}
        for key in ("obs", "final_obs"):
            saved.update({f"{key}/{k}": v for k, v in state[key].items()})
        if set(saved) != set(self._columns):
            return f"its columns are {sorted(saved)}, this run's {sorted(self._columns)}"
        for name, (shape, dtype, _) in self._column_specs().items():
            have = saved[name]
            if (tuple(have.shape), have.dtype) != (shape, dtype):
                return (f"its {name} is {tuple(have.shape)} {have.dtype}, this run's "
                        f"{shape} {dtype}")
        return None

    def load_state_dict(self, state: dict) -> bool:
        """Restore; returns whether the contents came back (without them, or when they do
        not fit: :meth:`mismatch`, the store starts empty: priorities without their data
        mean nothing)."""
        self.max_priority = float(state["max_priority"])
        self.rng.bit_generator.state = state["rng"]
        if not state["contents"] or self.mismatch(state) is not None:
            self.tree.rebuild(np.zeros(self.tree.capacity))
            self.next_row = self.rows_filled = 0
            return False
        for key in self.obs:
            self.obs[key].copy_(state["obs"][key])
            self.final_obs[key].copy_(state["final_obs"][key])
        for name in self._other_columns:
            getattr(self, name).copy_(state[name])
        self.tree.rebuild(np.asarray(state["priorities"], dtype=np.float64))
        self.next_row = int(state["next_row"])
        self.rows_filled = int(state["rows_filled"])
        return True
