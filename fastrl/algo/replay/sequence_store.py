"""The replay store of ``--algo r2d2``: whole trajectories kept as sequences for a recurrent
Q-network, sampled by priority.

**A sequence** is one row of :class:`~fastrl.algo.replay.store.ReplayStore` (one trajectory
slot as it came: ``T = --rollout`` steps, ``T + 1`` observations) with one more column, the
actor's recurrent state at the row's first step (what the rollout worker wrote into the
slot: R2D2's *stored state*). Each frame is stored once.

**Overlap and burn-in.** The rollout worker tags every trajectory with its env slot and its
number in that env's run of trajectories (``TrajectoryBuffers.traj_ids``,
:func:`fastrl.sampling.rollout_records.traj_id`), so the store knows, for each row, the row that
holds the same env's trajectory just before it (``prev_row``, -1 when that one is not, or no
longer, in the store).
The learner unrolls a sampled row's predecessor first, from the predecessor's stored state,
with no gradient (the *burn-in*: it refreshes a state that the actor computed with older
weights), then the row itself from the state the burn-in reached. A sequence is therefore
``2 T`` steps of which the last ``T`` are trained, and consecutive sequences of an env
overlap by ``T`` steps; ``--rollout 40`` gives R2D2's 80 steps with an overlap of 40 and a
burn-in of 40, without storing any frame twice. A row whose predecessor is missing (an env's
first trajectory, or one evicted) starts from its own stored state.

**Priorities** are per sequence: ``eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|``
over its trained steps (:func:`sequence_priorities`), raised to ``alpha`` in a sum tree over
rows; new rows come in at the highest priority seen so far.
"""

from __future__ import annotations

import numpy as np
import torch

from fastrl.algo.replay.store import ColumnSpec, ReplayStore, SumTree, columns_nbytes


def sequence_priorities(td_abs: torch.Tensor, mask: torch.Tensor, eta: float) -> torch.Tensor:
    """R2D2's priority of each sequence ``[B]`` from ``|TD error|`` ``[B, T]`` over the steps
    ``mask`` ``[B, T]`` holds: ``eta * max + (1 - eta) * mean`` (0 for a sequence without one
    masked-in step)."""
    m = mask.to(td_abs.dtype)
    count = m.sum(1)
    mean = (td_abs * m).sum(1) / count.clamp(min=1)
    top = (td_abs * m).amax(1)
    return torch.where(count > 0, eta * top + (1.0 - eta) * mean, torch.zeros_like(mean))


class SequenceStore(ReplayStore):
    """Rows of trajectories with their stored recurrent states and predecessor links, one
    priority per row (see the module docstring). Arguments as :class:`ReplayStore`'s, and
    ``rnn_size``: the recurrent state's size. :meth:`insert` also takes ``rnn_states``
    ``[K, S]`` and ``traj_ids`` ``[K]`` (numpy) from the batch, and ``priorities`` ``[K]``,
    one per sequence."""

    def __init__(self, obs_shapes, obs_dtypes, rollout: int, action_dims: int,
                 action_dtype: torch.dtype, capacity: int, alpha: float, rnn_size: int,
                 seed: int | None = None, shared: bool = False,
                 columns: dict[str, torch.Tensor] | None = None):
        self._rnn_size = int(rnn_size)
        super().__init__(obs_shapes, obs_dtypes, rollout, action_dims, action_dtype, capacity,
                         alpha, seed, shared, columns)
        rows = self.num_rows
        self.tree = SumTree(rows)  # one priority per sequence, not per transition
        self.traj_ids = np.full(rows, -1, dtype=np.int64)
        self.prev_row = np.full(rows, -1, dtype=np.int64)
        self._row_of: dict[int, int] = {}  # trajectory id -> the row that holds it

    @staticmethod
    def nbytes_for(obs_shapes, obs_dtypes, rollout: int, action_dims: int,
                   action_dtype: torch.dtype, capacity: int, rnn_size: int = 0) -> int:
        rows = capacity // rollout
        return (ReplayStore.nbytes_for(obs_shapes, obs_dtypes, rollout, action_dims,
                                       action_dtype, capacity)
                + columns_nbytes(SequenceStore.sequence_specs(rows, rollout, rnn_size))
                + rows * 16)  # traj_ids and prev_row, numpy int64

    @staticmethod
    def sequence_specs(rows: int, rollout: int, rnn_size: int) -> dict[str, ColumnSpec]:
        """The columns a sequence store holds beyond a transition store's."""
        return {"rnn_states": ((rows, rnn_size), torch.float32, 0.0),
                "valid": ((rows, rollout), torch.bool, False)}

    def items_held(self) -> int:
        """Sequences held: one tree item per row."""
        return self.rows_filled

    def _column_specs(self) -> dict[str, ColumnSpec]:
        return {**super()._column_specs(),
                **self.sequence_specs(self.num_rows, self.rollout, self._rnn_size)}

    def _write_rows(self, rows: torch.Tensor, batch: dict, keep: slice) -> None:
        """Also the stored states, the acted steps, and each row's link to its predecessor
        (a link to a row overwritten later is caught when sampled: see :meth:`links`)."""
        super()._write_rows(rows, batch, keep)
        self.rnn_states[rows] = batch["rnn_states"][keep].float()
        self.valid[rows] = batch["policy_versions"][keep] >= 0
        rows_np = rows.numpy()
        for row, old in zip(rows_np.tolist(), self.traj_ids[rows_np].tolist(), strict=True):
            if self._row_of.get(old) == row:  # an overwritten row leaves the id table
                del self._row_of[old]
        ids = np.asarray(batch["traj_ids"], dtype=np.int64)[keep]
        self.traj_ids[rows_np] = ids
        for row, tid in zip(rows_np.tolist(), ids.tolist(), strict=True):
            self.prev_row[row] = self._row_of.get(tid - 1, -1) if tid >= 0 else -1
            if tid >= 0:
                self._row_of[tid] = row

    def _set_new_priorities(self, rows: np.ndarray, valid: np.ndarray, prio) -> None:
        """One item per row: 0 for a row without one acted step."""
        self.tree.update(rows, np.where(valid.any(1), prio, 0.0))

    def links(self, rows: np.ndarray) -> np.ndarray:
        """``prev_row`` of ``rows``, -1 where the predecessor has been overwritten since."""
        prev = self.prev_row[rows]
        ok = (prev >= 0) & (self.traj_ids[np.maximum(prev, 0)] == self.traj_ids[rows] - 1)
        return np.where(ok, prev, -1)

    def sample_sequences(self, batch: int, beta: float, burn_in: bool = True
                         ) -> tuple[dict, np.ndarray, np.ndarray]:
        """``batch`` sequences drawn by priority: (data, rows ``[B]``, importance weights
        ``[B]``); ``data`` as :meth:`sequences` gives it."""
        rows, weights = self.draw(batch, beta)
        return self.sequences(rows, burn_in), rows, weights

    def sequences(self, rows: np.ndarray, burn_in: bool = True) -> dict:
        """The sequences of ``rows`` ``[B]``: the row's ``obs`` (dicts of ``[B, T + 1, ...]``),
        ``actions`` ``[B, T, D]``, ``rewards``, ``dones``, ``valid`` ``[B, T]``,
        ``final_step`` ``[B]``, ``rnn_states`` ``[B, S]`` (the row's stored state); and for
        the burn-in, ``has_prev`` ``[B]`` bool, with ``prev_obs`` (dicts of ``[B, T, ...]``),
        ``prev_dones`` ``[B, T]`` and ``prev_rnn_states`` ``[B, S]`` of the predecessor
        (rows without one repeat their own row there: ignored)."""
        rows = np.asarray(rows, dtype=np.int64)
        prev = self.links(rows) if burn_in else np.full(len(rows), -1)
        return self.gather_sequences(rows, prev)

    def gather_sequences(self, rows: np.ndarray, prev: np.ndarray) -> dict:
        """:meth:`sequences` of ``rows`` whose predecessors are ``prev`` ``[B]`` (-1: none),
        read from the columns alone (a learner rank without the store's bookkeeping)."""
        rows = np.asarray(rows, dtype=np.int64)
        t_rows = torch.from_numpy(rows)
        out = {"obs": {k: v[t_rows] for k, v in self.obs.items()},
               "actions": self.actions[t_rows], "rewards": self.rewards[t_rows],
               "dones": self.dones[t_rows], "valid": self.valid[t_rows],
               "final_step": self.final_step[t_rows], "rnn_states": self.rnn_states[t_rows]}
        has_prev = torch.from_numpy(prev >= 0)
        out["has_prev"] = has_prev
        if bool(has_prev.any()):
            src = torch.from_numpy(np.where(prev >= 0, prev, rows))
            t = self.rollout
            out["prev_obs"] = {k: v[src, :t] for k, v in self.obs.items()}
            out["prev_dones"] = self.dones[src]
            out["prev_rnn_states"] = self.rnn_states[src]
        return out

    def newest_rows(self, k: int) -> np.ndarray:
        """The ``k`` rows written last that hold an acted step (priority > 0)."""
        rows = np.remainder(np.arange(self.next_row - k, self.next_row), self.num_rows)
        return rows[self.tree.leaves()[rows] > 0]

    def state_dict(self, contents: bool) -> dict:
        state = super().state_dict(contents)
        state["traj_ids"] = self.traj_ids.copy()
        state["prev_row"] = self.prev_row.copy()
        return state

    def load_state_dict(self, state: dict) -> bool:
        """Restore (see ReplayStore's); the id table is rebuilt from the rows held."""
        self._row_of.clear()
        if not super().load_state_dict(state):
            self.traj_ids[:] = -1
            self.prev_row[:] = -1
            return False
        self.traj_ids[:] = state["traj_ids"]
        self.prev_row[:] = state["prev_row"]
        filled = np.remainder(np.arange(self.next_row - self.rows_filled, self.next_row),
                              self.num_rows)
        for row in filled.tolist():  # oldest first: a repeated id maps to its newest row
            if self.traj_ids[row] >= 0:
                self._row_of[int(self.traj_ids[row])] = row
        return True
