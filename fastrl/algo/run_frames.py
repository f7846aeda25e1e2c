"""The run's trained env frames, every policy's together: the clock of ``--lr_schedule
linear_decay``, which reaches 0 when they reach ``--train_for_env_steps`` (the run stops on
the same sum: ``fastrl/runner/run_loop.py``).

Envs draw a policy per episode, so the policies' shares of the frames differ (one whose
episodes last longer acts more of them): a decay over each policy's own frames against a
1/P share of the budget took one policy to 0 at 55% of the run and left another at 0.83 at
its end. So each policy's learner decays on the sum.

One slot per policy, in shared memory in parallel mode (``fastrl/runner/wiring.py`` builds
it before the learners start; serial mode's learners share the in-process one). A policy's
learner station sets its slot to its learner's count (``samples_trained`` x frameskip, which
the checkpoint holds; set, never added, so nothing is counted twice) after each batch and
reads the sum before each. With ``--num_learners`` rank 0 does so and hands its reading to
the other ranks with their shares (``TrainShare``), so that every rank takes the same step.
A resumed learner sets its checkpoint's count before any policy's first batch (the policy
workers act only once every learner has published its weights), however old that
checkpoint is beside the other policies'.
"""

from __future__ import annotations

import torch


class RunFrames:
    """Trained env frames per policy ``[P]`` (int64): :meth:`count` one, read the sum."""

    def __init__(self, policies: int, shared: bool = False):
        self.frames = torch.zeros(policies, dtype=torch.int64)
        if shared:
            self.frames.share_memory_()

    def count(self, policy: int, learner) -> int:
        """Set ``policy``'s slot to what its ``learner`` (a ``Learner`` or ``ApexLearner``)
        has trained on in all, in env frames; return the run's (every policy's)."""
        self.frames[policy] = learner.samples_trained * learner.frameskip
        return self.total()

    def total(self) -> int:
        return int(self.frames.sum())
