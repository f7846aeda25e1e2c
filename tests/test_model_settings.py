"""``ModelSettings``: the model's fields of ``Config``, read from it with no defaults of their
own, and all that ``ActorCritic`` and its encoders read."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium import spaces

from fastrl.config.settings import MODEL_DEFINING, Config
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings

NAMES = [f.name for f in dataclasses.fields(ModelSettings)]
# Settings that only set initial values: a checkpoint's model does not depend on them.
INITIAL_VALUES_ONLY = {"action_init_log_std"}


def test_every_field_has_no_default_and_is_config_s_value():
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(ModelSettings))
    cfg = Config()
    settings = ModelSettings.from_config(cfg)
    for name in NAMES:
        want = getattr(cfg, name)
        assert getattr(settings, name) == (tuple(want) if isinstance(want, list) else want), name
    # The model's old fallback (getattr(cfg, "normalize_returns", False)) differed from Config.
    assert settings.normalize_returns is True
    model = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), settings)
    assert model.returns_normalizer is not None
    off = ModelSettings.from_config(Config(normalize_returns=False))
    assert ActorCritic(spaces.Box(-1, 1, (3,)), spaces.Discrete(2), off).returns_normalizer is None


def test_a_config_without_one_of_the_fields_is_refused_by_name():
    values = {name: getattr(Config(), name) for name in NAMES}
    del values["rnn_type"]
    with pytest.raises(AttributeError, match="rnn_type"):
        ModelSettings.from_config(SimpleNamespace(**values))


class _Reads:
    """A ModelSettings that records which of its fields are read."""

    def __init__(self, settings: ModelSettings) -> None:
        self._settings, self.read = settings, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._settings, name)


def test_the_model_reads_every_field_and_nothing_else():
    read: set[str] = set()
    box, image = spaces.Box(-1, 1, (2,), np.float32), spaces.Box(0, 255, (3, 36, 36), np.uint8)
    for overrides, obs in [({}, spaces.Dict({"obs": image, "v": box})),
                           ({"use_rnn": False, "actor_critic_share_weights": False}, box)]:
        spy = _Reads(dataclasses.replace(ModelSettings.from_config(Config()), **overrides))
        ActorCritic(obs, box, spy)  # a Box action: the log-std fields are read
        read |= spy.read
    assert read == set(NAMES)


def test_every_field_that_shapes_the_model_is_checked_on_resume():
    assert set(NAMES) - INITIAL_VALUES_ONLY <= set(MODEL_DEFINING)
