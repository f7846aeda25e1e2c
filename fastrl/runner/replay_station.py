"""The learner station of ``--algo apex`` and ``r2d2``: the same messages as APPO's, another
use of them.

Trajectory slots that arrive go into the replay store as soon as the rate limiter lets them
(copied out, then freed to their worker at once); the slots it does not yet let in stay
waiting, so that their rollout worker waits for free slots: that is how the store refuses
to run ahead of the learner. The learner takes one step per poll while the limiter allows
(enough data, not ahead of the samples-per-insert ratio), publishing its weights after each
step. Fences, checkpoints and reports are the APPO station's.

With ``--num_learners N`` rank 0 runs this station and hands every other rank its share of
each batch it draws (:class:`~fastrl.transport.messages.ReplayShare`: indices into the shared
store, importance weights, the learning rate); ranks 1.. run :class:`ReplayRankStation`,
which trains on each share in step with rank 0 (``ApexLearner.train_share``).
"""

from __future__ import annotations

import time

from fastrl.algo.replay.apex import ApexLearner
from fastrl.algo.replay.exploration import ape_x_epsilons
from fastrl.runner.stations import LearnerRankStation, LearnerStation
from fastrl.runner.wiring import Wiring
from fastrl.transport.messages import ReplayShare


class ReplayLearnerStation(LearnerStation):
    """:class:`LearnerStation` over an :class:`ApexLearner`."""

    learner: ApexLearner

    def __init__(self, wiring: Wiring, learner: ApexLearner, report_every: float):
        super().__init__(wiring, learner, report_every)
        cfg = wiring.cfg
        eps = ape_x_epsilons(wiring.num_envs, cfg.apex_epsilon, cfg.apex_epsilon_alpha)
        self._epsilons = {"epsilon_min": float(eps.min()), "epsilon_max": float(eps.max())}

    def _send_share(self, rank: int, share: ReplayShare) -> None:
        self.rank_queues[rank - 1].put(share)

    def _ready(self) -> bool:
        learner = self.learner
        return learner.can_train() or (len(self.pending) > 0 and learner.insertable(1) > 0)

    def _work(self) -> int:
        w, learner = self.wiring, self.learner
        if w.cfg.sampling_only:
            return super()._work()  # every slot freed as it comes
        start = time.perf_counter()
        work = 0
        k = learner.insertable(len(self.pending)) if len(self.pending) else 0
        if k:
            slots = self.pending.take(k)
            batch = w.buffers.gather(slots)
            batch["traj_ids"] = w.buffers.traj_ids[slots].numpy()  # r2d2's sequence links
            self._free(slots)
            self._samples += learner.insert(batch)
            work += 1
        if not w.should_stop() and learner.can_train():
            send = self._send_share if learner.group is not None else None
            self._stats = {**learner.train(send), **self._epsilons}
            w.weights.publish(learner.model, learner.version)
            work += 1
        if work:
            self._busy += time.perf_counter() - start
        return work


class ReplayRankStation:
    """Learner rank r > 0 of ``--algo apex|r2d2``: trains on the shares rank 0 draws."""

    def __init__(self, wiring: Wiring, learner: ApexLearner, rank: int, policy: int = 0):
        self.learner = learner
        self.inbox = wiring.rank_queues_of(policy)[rank - 1]

    def poll(self, timeout: float) -> int:
        msgs = self.inbox.get_many(timeout)
        for msg in msgs:
            if not isinstance(msg, ReplayShare):
                raise TypeError(f"replay learner rank: unexpected message {msg!r}")
            self.learner.train_share(msg)
        return len(msgs)


def make_rank_station(wiring: Wiring, learner, rank: int, policy: int = 0):
    """The station of learner rank ``rank`` > 0 for the run's ``--algo``."""
    if isinstance(learner, ApexLearner):
        return ReplayRankStation(wiring, learner, rank, policy)
    return LearnerRankStation(wiring, learner, rank, policy)


def make_learner_station(wiring: Wiring, learner, report_every: float,
                         policy: int = 0) -> LearnerStation:
    """The learner station for the run's ``--algo`` (of ``policy``: ``--num_policies``,
    APPO only)."""
    if isinstance(learner, ApexLearner):
        return ReplayLearnerStation(wiring, learner, report_every)
    return LearnerStation(wiring, learner, report_every, policy)
