"""What the model is built from: the dozen model fields of ``Config``, read once by whoever
builds the model (``fastrl.runner.run_start.build_model``), so that the model, its encoders
and its core never see the whole config.

The fields have no defaults of their own: ``ModelSettings.from_config`` copies each from
``Config`` (whose defaults, and ``ADDED_LATER`` for old experiments, are the only ones), and a
test builds one with ``ModelSettings.from_config(Config(...))`` or ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastrl.config.settings import CopiedFromConfig

if TYPE_CHECKING:
    from fastrl.config.settings import Config

__all__ = ["ModelSettings"]


@dataclass(frozen=True)
class ModelSettings(CopiedFromConfig):
    """The settings ``ActorCritic`` and its parts read; each named and described as the
    ``Config`` field of the same name (``--help``, group "model")."""

    encoder_fc_size: int  # the image encoder's last linear layer
    encoder_mlp_layers: tuple[int, ...]  # the vector encoder's hidden sizes
    nonlinearity: str  # "elu", "relu" or "tanh"
    normalize_input: bool  # running whitening of image and vector inputs
    use_rnn: bool
    rnn_type: str  # "gru" or "lstm"
    rnn_size: int
    normalize_returns: bool  # a ReturnNormalizer in the model; the critic in normalised units
    actor_critic_share_weights: bool  # False: the critic has encoders of its own
    action_log_std: str  # "state_independent", "state_dependent" or "sde"
    action_init_log_std: float
    action_bounds: str  # "clip" or "tanh"

    @classmethod
    def from_config(cls, cfg: Config) -> ModelSettings:
        """The model's fields of ``cfg``, each read by name (a field missing from ``cfg``
        raises AttributeError: there is no fallback value here)."""
        return super().from_config(
            cfg, encoder_mlp_layers=tuple(int(n) for n in cfg.encoder_mlp_layers))
