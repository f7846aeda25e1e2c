"""What the replay learners (``ApexLearner``, ``R2D2Learner``) and their store read: the
replay family's fields of ``Config``, copied once by :meth:`ReplaySettings.from_config`
where the learner or the store is made (``fastrl/runner/cores.py``, ``wiring.py``,
``run_start.py``), so that neither sees the whole config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastrl.config.settings import CopiedFromConfig
from fastrl.policy.recurrent import state_size

if TYPE_CHECKING:
    from fastrl.config.settings import Config

__all__ = ["ReplaySettings"]


@dataclass(frozen=True)
class ReplaySettings(CopiedFromConfig):
    """Each field as the ``Config`` field of the same name (``--help``); no defaults of its
    own. ``rnn_state_size``: the width of the recurrent state R2D2's store keeps per step
    (``fastrl.policy.recurrent.state_size`` of ``--rnn_type`` and ``--rnn_size``)."""

    algo: str  # "apex" or "r2d2"
    # the optimizer and its schedule
    learning_rate: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    max_grad_norm: float  # 0: no clipping
    lr_schedule: str  # "constant" or "linear_decay"
    train_for_env_steps: int
    precision: str
    # the targets
    batch_size: int  # transitions (apex) or sequences (r2d2) per learner step
    rollout: int
    nstep: int
    gamma: float
    target_update_every: int
    r2d2_value_rescaling: bool
    r2d2_eta: float
    r2d2_burn_in: bool
    normalize_input: bool
    value_bootstrap: bool
    # the store and its rate limiter
    replay_capacity: int
    replay_alpha: float
    replay_beta: float
    replay_min_size: int
    replay_samples_per_insert: float
    replay_initial_priority: str  # "max", "actor" or "td"
    replay_save_contents: bool
    seed: int | None
    rnn_state_size: int

    @classmethod
    def from_config(cls, cfg: Config) -> ReplaySettings:
        """Each field read by name (a field missing from ``cfg`` raises AttributeError)."""
        return super().from_config(cfg, rnn_state_size=state_size(cfg.rnn_type, cfg.rnn_size))
