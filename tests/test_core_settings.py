"""Each core's settings, built from ``Config`` with no defaults of their own: ``ModelSettings``
(all that ``ActorCritic`` and its encoders read), ``LearnerSettings`` (the APPO learner's and
its loss's), ``ReplaySettings`` (the replay learners' and their store's), ``EnvSettings``
(what making the run's env reads), and the run's records beside the runner: ``PbtSettings``
(the population's), ``StatsSettings`` with its ``BottleneckSettings`` (the statistics' and the
bottleneck report's) and ``ReportSettings`` (the reporter's)."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium import spaces

from fastrl.algo.appo import LossParams
from fastrl.algo.learner import LearnerSettings
from fastrl.algo.pbt.population import PbtSettings
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.config.settings import MODEL_DEFINING, Config
from fastrl.experiment.bottleneck import BottleneckSettings
from fastrl.experiment.reporter import ReportSettings
from fastrl.experiment.stats import StatsSettings
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.sampling.env_setup import EnvSettings, create_env, env_options, reward_scale
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.rollout import RolloutWorker

NAMES = [f.name for f in dataclasses.fields(ModelSettings)]
# Settings that only set initial values: a checkpoint's model does not depend on them.
INITIAL_VALUES_ONLY = {"action_init_log_std"}
# LearnerSettings' fields that are not copied from a Config field of the same name.
LEARNER_RESOLVED = {"loss", "reward_scale"}


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
    small = dataclasses.replace(settings, rnn_size=8, encoder_mlp_layers=(8,))
    model = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), small)
    assert model.returns_normalizer is not None
    off = ModelSettings.from_config(Config(normalize_returns=False, rnn_size=8))
    assert ActorCritic(spaces.Box(-1, 1, (3,)), spaces.Discrete(2), off).returns_normalizer is None


def test_a_config_without_one_of_the_fields_is_refused_by_name():
    values = {name: getattr(Config(), name) for name in NAMES}
    del values["rnn_type"]
    with pytest.raises(AttributeError, match="rnn_type"):
        ModelSettings.from_config(SimpleNamespace(**values))


class _Reads:
    """Settings (a ModelSettings, an EnvSettings) that record which of their fields are read."""

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
        small = Config(rnn_size=8, encoder_fc_size=8, encoder_mlp_layers=[8])
        spy = _Reads(dataclasses.replace(ModelSettings.from_config(small), **overrides))
        ActorCritic(obs, box, spy)  # a Box action: the log-std fields are read
        read |= spy.read
    assert read == set(NAMES)


def test_every_field_that_shapes_the_model_is_checked_on_resume():
    assert set(NAMES) - INITIAL_VALUES_ONLY <= set(MODEL_DEFINING)


def test_the_learner_s_settings_and_its_loss_s_are_config_s_values():
    for f in (*dataclasses.fields(LearnerSettings), *dataclasses.fields(LossParams)):
        assert f.name in LEARNER_RESOLVED or hasattr(Config, f.name), f.name
    cfg = Config(gamma=0.97, ratio_clamp=3.0, vtrace_c=0.5, gae_lambda=0.9, reward_scale=0.1,
                 num_epochs=3)
    settings = LearnerSettings.from_config(cfg)
    # LossParams' defaults (vtrace_c 1.0, ...) are its own, for direct callers of the loss:
    # every one of them is replaced by the flag's value.
    assert vars(settings.loss) == {f.name: getattr(cfg, f.name)
                                   for f in dataclasses.fields(LossParams)}
    assert {f.name: getattr(settings, f.name) for f in dataclasses.fields(LearnerSettings)
            if f.name not in LEARNER_RESOLVED} == {
        f.name: getattr(cfg, f.name) for f in dataclasses.fields(LearnerSettings)
        if f.name not in LEARNER_RESOLVED}
    assert settings.trajectories_per_batch == cfg.trajectories_per_batch
    assert settings.reward_scale == 0.1
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(LearnerSettings))


def test_the_learner_s_reward_scale_is_the_env_s_when_the_flag_is_unset():
    from fastrl.env_registry import recommended_settings

    scale = recommended_settings("CartPole-v1")["reward_scale"]
    assert LearnerSettings.from_config(Config(env="CartPole-v1")).reward_scale == scale != 1.0


def test_the_replay_settings_are_config_s_values():
    cfg = Config(algo="r2d2", rnn_type="lstm", rnn_size=16, nstep=5, replay_alpha=0.5, seed=3)
    settings = ReplaySettings.from_config(cfg)
    for f in dataclasses.fields(ReplaySettings):
        assert f.default is dataclasses.MISSING, f.name
        if f.name != "rnn_state_size":
            assert getattr(settings, f.name) == getattr(cfg, f.name), f.name
    assert settings.rnn_state_size == 32  # an LSTM's hidden and cell state


def test_the_env_settings_are_config_s_values():
    cfg = Config(env="CartPole-v1", env_frameskip=2, env_framestack=3, obs_keys="a, b",
                 env_recycle_mb=7, reward_scale=0.5, env_atari_rgb=True)
    settings = EnvSettings.from_config(cfg)
    for f in dataclasses.fields(EnvSettings):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert getattr(settings, f.name) == getattr(cfg, f.name), f.name
    assert env_options(settings) == {"frameskip": 2, "rgb": True}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.env = "x"


def test_making_the_env_reads_every_env_setting():
    spy = _Reads(EnvSettings.from_config(Config(env="CartPole-v1", reward_scale=None)))
    create_env(spy).close()
    assert reward_scale(spy) == 0.1  # CartPole's recommended scale
    assert spy.read == {f.name for f in dataclasses.fields(EnvSettings)}


def _defaults(cls) -> dict:
    return {name: p.default for name, p in inspect.signature(cls).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_the_workers_take_the_flags_values_without_defaults_of_their_own():
    rollout, policy = _defaults(RolloutWorker), _defaults(PolicyWorker)
    assert not {"reward_scale", "reward_clip", "action_bounds", "env_check"} & set(rollout)
    assert not {"precision", "cuda_graphs", "action_noise_every"} & set(policy)
    # What keeps a default is the feature off (unseeded, no time limit, one policy, ...),
    # never a flag's value of its own: a new one named like a flag has to be added here.
    assert {k: v for k, v in rollout.items() if hasattr(Config, k)} == {
        "seed": None, "env_timeout": 0.0, "num_policies": 1}
    assert not {k for k in policy if hasattr(Config, k)}


# The records' settings: each field but these is the Config field of the same name.
RECORDS = {PbtSettings: set(), StatsSettings: {"bottleneck"}, BottleneckSettings: set(),
           ReportSettings: set()}


def _changed(value):
    """Another value of the same kind than ``value`` (a Config default)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 3
    if isinstance(value, str):
        return {"appo": "apex", "auto": "cpu"}.get(value, value + "_x")
    return 17  # None: an optional count (env_max_episode_steps, seed)


@pytest.mark.parametrize("settings_class", list(RECORDS), ids=lambda c: c.__name__)
def test_the_records_settings_are_config_s_values_with_no_defaults_of_their_own(settings_class):
    resolved = RECORDS[settings_class]
    copied = [f.name for f in dataclasses.fields(settings_class) if f.name not in resolved]
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(settings_class))
    # Every copied field given a value other than Config's default, so that a field read
    # from the wrong place (or a default of its own) shows.
    cfg = Config(**{name: _changed(getattr(Config(), name)) for name in copied})
    settings = settings_class.from_config(cfg)
    assert {name: getattr(settings, name) for name in copied} == {
        name: getattr(cfg, name) for name in copied}
    values = {name: getattr(cfg, name) for name in copied}
    del values[copied[0]]
    with pytest.raises(AttributeError, match=copied[0]):
        settings_class.from_config(SimpleNamespace(**values))


def test_the_statistics_hold_the_bottleneck_report_s_settings():
    cfg = Config(num_workers=5, serial_mode=True, algo="apex")
    assert StatsSettings.from_config(cfg).bottleneck == BottleneckSettings.from_config(cfg)
