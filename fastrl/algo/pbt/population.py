"""Population-based training (``--with_pbt``): the runner's side, the same in serial and
parallel mode.

:class:`Population` sees every finished episode (through the run loop), keeps each policy's
objective over its recent episodes, and once the run has trained ``--pbt_period_env_steps``
more frames ranks the policies that have ``--pbt_min_episodes`` episodes since the last
exchange. The worst ``--pbt_replace_fraction`` are replaced, each by a donor drawn from the
same fraction at the top, when the donor beats it by more than ``--pbt_min_gap``: the
replaced policy's learner gets a :class:`PbtReplace` message (the donor's weights are read
from the donor's published weights by that learner: ``LearnerStation._replace``) with the
donor's hyperparameters perturbed (:func:`perturb`). Each exchange is logged, appended to
``pbt.jsonl`` in the experiment folder and written to TensorBoard (``policy_{k}/pbt/...``).

A replaced policy's new weights are ranked only on episodes they acted whole: episodes in
flight at the exchange (reports buffered by the rollout workers, steps acted before the
policy workers loaded the donor's weights) are the old weights'. An episode's report carries
the oldest version that acted it (``EpisodeStats.version``); until the learner confirms the
replacement none counts, then those from the new weights' version (``PbtReplaced.version``)
on.

The population reads :class:`PbtSettings`, copied from ``Config`` once by the runner.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from fastrl.algo.learner import PBT_HYPERPARAMS
from fastrl.config.settings import CopiedFromConfig
from fastrl.errors import EnvSettingsError
from fastrl.log import log
from fastrl.transport.messages import LearnerReady, PbtReplace, PbtReplaced

HISTORY = "pbt.jsonl"
SEED_STREAM = 24  # the exchanges' random draws: [--seed, SEED_STREAM, ranking number]
REPLACING = sys.maxsize  # a replaced policy's version floor until its learner confirms


def perturb(values: dict[str, float], rng: np.random.Generator, low: float,
            high: float) -> dict[str, float]:
    """Each hyperparameter (``PBT_HYPERPARAMS``, then the reward-shaping weights
    ``reward/<term>`` of an env that names its terms: ``reward_weights.py``) multiplied
    or divided (at random) by a factor drawn from ``[low, high]``; gamma through its horizon
    ``1 - gamma``, so that it stays in [0, 1]."""
    out = {}
    for name in values:
        factor = float(rng.uniform(low, high))
        if rng.random() < 0.5:
            factor = 1.0 / factor
        value = float(values[name])
        if name == "gamma":
            out[name] = min(1.0, max(0.0, 1.0 - (1.0 - value) * factor))
        else:
            out[name] = value * factor
    return out


def choose(objectives: dict[int, float], fraction: float, min_gap: float,
           rng: np.random.Generator) -> list[tuple[int, int]]:
    """``(replaced, donor)`` pairs: the worst ``fraction`` of the ranked policies (at least
    one, at most half), each with a donor drawn from as many at the top, kept only where the
    donor's objective beats the replaced one's by more than ``min_gap`` times the larger of
    their absolute values (and by more than 0). Ties rank the lower policy number first."""
    ranked = sorted(objectives, key=lambda k: (-objectives[k], k))
    n = min(max(1, int(fraction * len(ranked))), len(ranked) // 2)
    if n == 0:
        return []
    top, bottom = ranked[:n], ranked[len(ranked) - n:]
    pairs = []
    for worst in bottom:
        donor = top[int(rng.integers(n))]
        gap = objectives[donor] - objectives[worst]
        if gap > 0 and gap > min_gap * max(abs(objectives[donor]), abs(objectives[worst])):
            pairs.append((worst, donor))
    return pairs


@dataclass(frozen=True)
class PbtSettings(CopiedFromConfig):
    """What the population reads: each field as the ``Config`` field of the same name
    (``--help``, group "pbt")."""

    num_policies: int
    stats_avg: int  # the objective's window, in episodes
    env: str  # named in the line about an objective the env does not report
    seed: int | None  # the exchanges' draws: [seed, SEED_STREAM, ranking number]
    pbt_objective: str
    pbt_start_env_steps: int
    pbt_period_env_steps: int
    pbt_min_episodes: int
    pbt_replace_fraction: float
    pbt_min_gap: float
    pbt_perturb_min: float
    pbt_perturb_max: float


class Population:
    """The population's state as the runner keeps it: each policy's hyperparameters (from its
    learner's ``LearnerReady``, then as exchanges set them), objective window, episodes since
    the last exchange and stale trajectories dropped; the exchange counters (saved with the
    checkpoints' run counters, restored from policy 0's)."""

    def __init__(self, settings: PbtSettings, exp_dir: str, learner_queues: list,
                 readies: list[LearnerReady], writer=None):
        self.settings = settings
        self.queues = learner_queues
        self.writer = writer
        self.path = os.path.join(exp_dir, HISTORY)
        p = settings.num_policies
        self.hyperparams = [dict(r.hyperparams) for r in readies]
        self.windows: list[deque[float]] = [deque(maxlen=settings.stats_avg) for _ in range(p)]
        self.since = [0] * p  # episodes since the last exchange (with the objective)
        self.stale = [0] * p  # trajectories of replaced weights dropped untrained
        self.replaced = [0] * p  # times each policy was replaced
        # an episode acted (in any step) by a version below this is not the current weights'
        self.floor = [0] * p
        self.old_episodes = [0] * p  # episodes of replaced weights, left out of the ranking
        self.rankings = 0  # rankings done (each draws from its own seed)
        self.exchanges = 0  # rankings that replaced at least one policy
        self.next_at = max(settings.pbt_start_env_steps, settings.pbt_period_env_steps)
        self._episodes = 0
        self._metric_names: set[str] = set()
        self._objective_seen = settings.pbt_objective == "return"
        self._waiting_logged = False
        saved = (readies[0].counters or {}).get("pbt") if readies else None
        if saved:
            self.rankings, self.exchanges = int(saved["rankings"]), int(saved["exchanges"])
            self.next_at = int(saved["next_at"])
            self.replaced = list(saved.get("replaced", self.replaced))
        self._record({"event": "resume" if saved else "start", **self.counters(),
                      "objective": settings.pbt_objective, "hyperparams": self.hyperparams})
        log(f"pbt: {p} policies ranked by {self._objective_text()}, an exchange every "
            f"{settings.pbt_period_env_steps:,} frames from {self.next_at:,} on, perturbing "
            + ", ".join(self.hyperparams[0] if self.hyperparams else PBT_HYPERPARAMS)
            + (f" (resumed after {self.exchanges} exchanges)" if saved else ""))
        self._write_scalars(0, [])

    # --- what the run loop feeds in ---------------------------------------------------------

    def add_episode(self, policy: int, episode_return: float, metrics: dict | None,
                    version: int = 0) -> None:
        """An episode of ``policy``, ``version`` the oldest of its weights that acted it."""
        s = self.settings
        name = s.pbt_objective
        self._episodes += 1
        if name == "return":
            value = episode_return
        else:
            self._metric_names.update(metrics or ())
            value = (metrics or {}).get(name)
            if value is None or not math.isfinite(value):
                if not self._objective_seen and self._episodes >= s.pbt_min_episodes:
                    reported = ", ".join(["return", *sorted(self._metric_names)])
                    raise EnvSettingsError(
                        f"--pbt_objective={name}: env {s.env!r} reports no episode "
                        f"metric of that name in {self._episodes} episodes; it reports: "
                        f"{reported}")
                return
            self._objective_seen = True
        if version < self.floor[policy]:
            self.old_episodes[policy] += 1
            return
        self.windows[policy].append(float(value))
        self.since[policy] += 1

    def add_stale(self, policy: int, trajectories: int) -> None:
        self.stale[policy] += trajectories

    def confirmed(self, msg: PbtReplaced) -> None:
        """The replaced policy's learner took the donor's weights."""
        self.stale[msg.policy] += msg.dropped
        self.floor[msg.policy] = msg.version
        self._record({"event": "replaced", "exchange": msg.exchange, "policy": msg.policy,
                      "donor": msg.donor, "version": msg.version,
                      "waiting_trajectories_dropped": msg.dropped})

    # --- the exchange -----------------------------------------------------------------------

    def objectives(self) -> dict[int, float]:
        """The mean objective of each policy with enough episodes since the last exchange."""
        return {k: float(np.mean(w)) for k, w in enumerate(self.windows)
                if self.since[k] >= self.settings.pbt_min_episodes and w}

    def maybe_exchange(self, frames: int) -> list[tuple[int, int]]:
        """Rank and exchange if due at ``frames`` (run-wide); the ``(replaced, donor)`` pairs.
        A due ranking waits (checked again at every call) until two policies can be ranked."""
        s = self.settings
        if frames < self.next_at:
            return []
        objectives = self.objectives()
        if len(objectives) < 2:
            if not self._waiting_logged:
                log(f"pbt: an exchange is due at {frames:,} frames, but only "
                    f"{len(objectives)} policies have {s.pbt_min_episodes} episodes since "
                    "the last one; waiting")
                self._waiting_logged = True
            return []
        self._waiting_logged = False
        seed = None if s.seed is None else [s.seed, SEED_STREAM, self.rankings]
        rng = np.random.default_rng(seed)
        self.rankings += 1
        self.next_at = frames + s.pbt_period_env_steps
        pairs = choose(objectives, s.pbt_replace_fraction, s.pbt_min_gap, rng)
        ranked = sorted(objectives, key=lambda k: (-objectives[k], k))
        if not pairs:
            log(f"pbt: no exchange at {frames:,} frames: ranking {self._ranking_text(objectives)}"
                f"; no donor beats the worst by more than --pbt_min_gap {s.pbt_min_gap}")
            self._record({"event": "ranking", "frames": frames, "objectives": objectives,
                          "ranking": ranked, "replaced": []})
            self.since = [0] * s.num_policies
            return []
        self.exchanges += 1
        changes = []
        for worst, donor in pairs:
            old, new = self.hyperparams[worst], perturb(
                self.hyperparams[donor], rng, s.pbt_perturb_min, s.pbt_perturb_max)
            self.queues[worst].put(PbtReplace(donor, new, self.exchanges))
            self.hyperparams[worst] = new
            self.windows[worst].clear()  # the old weights' episodes rank them no more
            self.floor[worst] = REPLACING
            self.replaced[worst] += 1
            changes.append({"policy": worst, "donor": donor, "old": old, "new": new})
            log(f"pbt exchange {self.exchanges} at {frames:,} frames: policy {worst} "
                f"({objectives[worst]:.3f}) takes the weights of policy {donor} "
                f"({objectives[donor]:.3f}); " + ", ".join(
                    f"{name} {old[name]:.4g} -> {new[name]:.4g}" for name in new))
        self.since = [0] * s.num_policies
        self._record({"event": "exchange", "exchange": self.exchanges, "frames": frames,
                      "objective": s.pbt_objective, "objectives": objectives,
                      "ranking": ranked, "replaced": changes})
        self._write_scalars(frames, [w for w, _ in pairs], objectives)
        return pairs

    # --- history, counters, summaries ---------------------------------------------------------

    def counters(self) -> dict:
        return {"rankings": self.rankings, "exchanges": self.exchanges, "next_at": self.next_at,
                "replaced": list(self.replaced)}

    def summary(self) -> dict:
        return {**self.counters(), "objective": self.settings.pbt_objective,
                "hyperparams": self.hyperparams, "stale_trajectories_dropped": list(self.stale),
                "episodes_of_replaced_weights": list(self.old_episodes)}

    def _record(self, entry: dict) -> None:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **entry}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def _write_scalars(self, frames: int, replaced: list[int],
                       objectives: dict[int, float] | None = None) -> None:
        w = self.writer
        if w is None:
            return
        for k, values in enumerate(self.hyperparams):
            prefix = f"policy_{k}/pbt/"
            for name, value in values.items():
                w.add_scalar(prefix + name, value, frames)
            w.add_scalar(prefix + "replaced", float(k in replaced), frames)
            w.add_scalar(prefix + "stale_trajectories_dropped", self.stale[k], frames)
            if objectives and k in objectives:
                w.add_scalar(prefix + "objective", objectives[k], frames)
        w.flush()

    def _objective_text(self) -> str:
        name = self.settings.pbt_objective
        return "mean episode return" if name == "return" else f"the episode metric {name!r}"

    @staticmethod
    def _ranking_text(objectives: dict[int, float]) -> str:
        return ", ".join(f"{k}: {objectives[k]:.3f}"
                         for k in sorted(objectives, key=lambda k: (-objectives[k], k)))
