"""Which policy acts for each env slot (``--num_policies``): :class:`PolicyAssignment`, drawn
per episode, taking over at the slot's next trajectory boundary; :func:`by_policy`.

**Which policy a slot draws.** Slots of one split are drawn together: the slots' episode
numbers index a permutation of the ``P`` policies, one per episode number, drawn from a seed
that every rollout worker of the run shares, and a slot of the run's split ``s`` (worker
``w``'s split ``i`` is ``w * --worker_num_splits + i``) takes the permutation's entry ``(s
* A + a) mod P``, where ``a`` is the slot's agent in its env and ``A`` the env's agents.
The envs of a split usually begin their episodes together (fixed-length matches,
fixed-length resets), so a split's request is acted by ``A`` policies rather than by up to
all ``P``: the policy worker runs fewer models on more rows each, which is what several
policies cost on a few cores. While the run's envs are in step, the splits spread over the
policies as evenly as the permutation allows (with 4 splits and 4 policies, one each);
over episodes every policy acts for every slot with the same probability; the agents of one
env are acted by different policies where ``A <= P`` (self-play meets other policies).
Slots whose episodes drift apart (a restarted worker, episodes of varying length) draw from
different permutations, each one still uniform.

**When a new policy takes over** (``--num_policies P > 1``). Every trajectory is acted by
one policy, so that it can go whole to that policy's learner. When a slot's episode ends
(or is cut short by an env fault), the slot draws the policy of its next episode (above).
The draw takes effect at the slot's next trajectory boundary
(:meth:`PolicyAssignment.begin`, when the worker begins the split's next trajectories):
the steps of the new episode taken before that boundary are acted by the previous policy
and go, in its trajectory, to the previous policy's learner. A slot whose policy changes
starts the new policy's trajectory with a zero recurrent state. An episode is attributed
(``EpisodeStats.policy``) to the policy that acted its last step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class PolicyAssignment:
    """The policy of each of ``num_slots`` env slots (the worker's local slot indices): the
    one acting now (``current``) and the one drawn for the slot's next episode (``next``),
    which takes over at the slot's next trajectory boundary (the module's docstring).
    ``splits``: the slots of each of the worker's splits (``Split.local``; default: one split
    of every slot); ``agents`` slots in a row are one env's agents.

    With one policy nothing is drawn and every method is a constant."""

    _KEEP = 64  # permutations kept behind the newest episode number drawn
    _STREAM = 0x9011C7  # keeps the permutations apart from whatever else the seed seeds

    def __init__(self, num_slots: int, num_policies: int = 1, seed=None,
                 splits: Sequence[Sequence[int]] = (), agents: int = 1, first_split: int = 0):
        """``seed``: an int or a list of ints, the same for every worker of a run (None:
        random, this worker's own); ``first_split``: the run's index of this worker's first
        split."""
        if num_policies < 1:
            raise ValueError(f"num_policies={num_policies}: must be >= 1")
        self.num_policies = num_policies
        self._seed = ([np.random.SeedSequence().entropy] if seed is None
                      else [int(x) for x in np.atleast_1d(seed)])
        split = np.full(num_slots, first_split, dtype=np.int64)  # each slot's, in the run
        for i, local in enumerate(splits):
            split[list(local)] += i
        # each slot's entry in an episode number's permutation
        self._entry = (split * agents + np.arange(num_slots) % agents) % num_policies
        self._episode = np.zeros(num_slots, dtype=np.int64)  # each slot's episode number
        self._perms: dict[int, np.ndarray] = {}
        self.current = (self._perm(0)[self._entry] if num_policies > 1
                        else np.zeros(num_slots, dtype=np.int64))
        self.next = self.current.copy()
        self.changes = 0  # slots whose policy changed at a trajectory boundary

    def _perm(self, n: int) -> np.ndarray:
        """The policies' permutation of episode number ``n`` (the same in every worker)."""
        perm = self._perms.get(n)
        if perm is None:
            rng = np.random.default_rng([*self._seed, self._STREAM, n])
            perm = self._perms[n] = rng.permutation(self.num_policies)
            for old in [m for m in self._perms if m < n - self._KEEP]:
                del self._perms[old]
        return perm

    def episode_ended(self, j: int) -> int:
        """Slot ``j``'s episode ended (or was cut short): draw its next episode's policy;
        return the policy that acted the ended episode's last step."""
        if self.num_policies == 1:
            return 0
        self._episode[j] += 1
        self.next[j] = self._perm(int(self._episode[j]))[self._entry[j]]
        return int(self.current[j])

    def begin(self, local: list[int], env_ids: list[int], rnn_state: np.ndarray) -> tuple[int, ...]:
        """Slots ``local`` (global ids ``env_ids``) begin a trajectory: each takes the policy
        drawn for it; a slot whose policy changes gets a zero recurrent state (its row of
        ``rnn_state``). Returns the slots' policies."""
        current, nxt = self.current, self.next
        for j, e in zip(local, env_ids):
            if nxt[j] != current[j]:
                current[j] = nxt[j]
                rnn_state[e] = 0.0
                self.changes += 1
        return tuple(int(current[j]) for j in local)


def by_policy(buffers: list[int], policies: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """``buffers`` grouped by the policy (``policies[i]`` for ``buffers[i]``) that filled
    them, each group in its original order."""
    groups: dict[int, list[int]] = {}
    for b, k in zip(buffers, policies, strict=True):
        groups.setdefault(k, []).append(b)
    return {k: tuple(bufs) for k, bufs in sorted(groups.items())}
