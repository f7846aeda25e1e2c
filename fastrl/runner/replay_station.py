"""The learner station of ``--algo apex`` and ``r2d2``: the same messages as APPO's, another
use of them.

Trajectory slots that arrive go into the replay store as soon as the rate limiter lets them
(copied out, then freed to their worker at once); the slots it does not yet let in stay
waiting, so that their rollout worker waits for free slots: that is how the store refuses
to run ahead of the learner. The learner takes one step per poll while the limiter allows
(enough data, not ahead of the samples-per-insert ratio), publishing its weights after each
step. Fences, checkpoints and reports are the APPO station's.
"""

from __future__ import annotations

import time

from fastrl.algo.apex import ApexLearner
from fastrl.runner.stations import LearnerStation
from fastrl.runner.wiring import Wiring
from fastrl.sampling.inference import ape_x_epsilons


class ReplayLearnerStation(LearnerStation):
    """:class:`LearnerStation` over an :class:`ApexLearner`."""

    learner: ApexLearner

    def __init__(self, wiring: Wiring, learner: ApexLearner, report_every: float):
        super().__init__(wiring, learner, report_every)
        cfg = wiring.cfg
        eps = ape_x_epsilons(wiring.num_envs, cfg.apex_epsilon, cfg.apex_epsilon_alpha)
        self._epsilons = {"epsilon_min": float(eps.min()), "epsilon_max": float(eps.max())}

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
            self._stats = {**learner.train(), **self._epsilons}
            w.weights.publish(learner.model, learner.version)
            work += 1
        if work:
            self._busy += time.perf_counter() - start
        return work


def make_learner_station(wiring: Wiring, learner, report_every: float,
                         policy: int = 0) -> LearnerStation:
    """The learner station for the run's ``--algo`` (of ``policy``: ``--num_policies``,
    APPO only)."""
    if isinstance(learner, ApexLearner):
        return ReplayLearnerStation(wiring, learner, report_every)
    return LearnerStation(wiring, learner, report_every, policy)
