"""Every gymnasium observation space through the plan, the shared buffers and the encoders
(in-process), against plain numpy references; the image layout rule; the adapter around real
and fake envs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.errors import EnvSettingsError
from fastrl.policy.encoders import ImageEncoder, OneHotEncoder, conv_stack
from fastrl.policy.model import ActorCritic
from fastrl.policy.spaces import ObsPlan, image_layout, storage
from fastrl.run_config import parse_config
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.env_setup import EnvSettings, ObsAdapter, create_env, env_info
from fastrl.sampling.rollout import RolloutWorker
from tests.spaces_env import EverySpace, every_space, hwc_frame
from tests.test_model import small_settings
from tests.test_rollout import drive, worker_flags

SETTINGS = small_settings(rnn_size=8, encoder_fc_size=16, encoder_mlp_layers=[8],
                          normalize_input=True)


@pytest.mark.parametrize(("shape", "layout"), [
    ((96, 96, 3), "hwc"),  # CarRacing
    ((7, 7, 3), "hwc"),  # MiniGrid
    ((84, 84, 4), "hwc"), ((84, 84, 1), "hwc"), ((64, 64, 12), "hwc"), ((210, 160, 3), "hwc"),
    ((3, 72, 128), "chw"),  # doom_basic
    ((4, 84, 84), "chw"), ((1, 84, 84), "chw"), ((12, 72, 128), "chw"),
    ((3, 3, 3), "chw"), ((5, 7, 5), "chw"), ((4, 2, 3), "chw"),  # ties and odd shapes: CHW
])
def test_layout_rule(shape, layout):
    assert image_layout(shape) == layout
    assert image_layout(shape, "chw") == "chw" and image_layout(shape, "hwc") == "hwc"


def test_layout_override_decides_an_ambiguous_shape():
    box = spaces.Box(0, 255, (3, 3, 3), np.uint8)
    frame = np.arange(27, dtype=np.uint8).reshape(3, 3, 3)
    assert ObsPlan(box).identity  # channels first by the rule: taken as it is
    plan = ObsPlan(box, "hwc")
    assert not plan.identity
    np.testing.assert_array_equal(plan.convert(frame)["obs"], frame.transpose(2, 0, 1))
    with pytest.raises(ValueError, match="env_obs_layout 'whc'"):
        ObsPlan(box, "whc")


def _reference(name: str, value) -> np.ndarray:
    """What the buffers must hold for ``every_space``'s key ``name``, with plain numpy."""
    value = np.asarray(value)
    if name in ("pixels_hwc", "float_image"):
        return value.transpose(2, 0, 1)
    if name == "gray":
        return value[None]
    if name in ("matrix", "scalar", "multi_discrete", "nested.pair.1"):
        return value.reshape(-1)
    return value


def test_every_space_goes_through_the_buffers_and_the_encoders():
    space = every_space()
    plan = ObsPlan(space)
    assert sorted(d.split(" ")[0] for d in plan.dropped) == ["graph", "one_of", "sequence", "text"]
    model_space = plan.model_space()
    layout = BufferLayout.from_spaces(model_space, spaces.Discrete(3), num_buffers=3, rollout=2,
                                      rnn_size=8)
    # Integers stay integers, in the smallest dtype that holds them; nothing is one-hot.
    assert layout.obs_dtypes["discrete"] == torch.int16  # Discrete(5, start=-2)
    assert layout.obs_shapes["discrete"] == ()
    assert layout.obs_dtypes["nested.pair.0"] == torch.uint8
    assert layout.obs_shapes["multi_discrete"] == (4,)
    assert layout.obs_dtypes["multi_binary"] == torch.uint8
    assert layout.obs_shapes["pixels_hwc"] == (3, 9, 8)
    assert layout.obs_shapes["matrix"] == (24,) and layout.obs_shapes["scalar"] == (1,)
    buffers = TrajectoryBuffers(layout)
    arrays = {k: v.numpy() for k, v in buffers.obs.items()}
    space.seed(3)
    samples = [[space.sample() for _ in range(3)] for _ in range(3)]
    for b in range(3):
        for t in range(3):
            converted = plan.convert(samples[b][t])
            for key, arr in arrays.items():
                arr[b, t] = converted[key]  # the rollout worker's write
    for b in range(3):
        for t in range(3):
            raw = samples[b][t]
            for key, arr in arrays.items():
                value = raw
                for part in key.split("."):
                    value = value[int(part) if part.isdigit() else part]
                ref = _reference(key, value).astype(arr.dtype)
                np.testing.assert_array_equal(arr[b, t], ref, err_msg=key)
    model = ActorCritic(model_space, spaces.Discrete(3), SETTINGS)
    model.update_normalizers({k: v.flatten(0, 1) for k, v in buffers.obs.items()})
    logits, values, _ = model.forward_step({k: v[:, 0] for k, v in buffers.obs.items()},
                                           model.initial_rnn_state(3))
    assert logits.shape == (3, 3) and torch.isfinite(logits).all() and torch.isfinite(values).all()
    logits, values = model.forward_sequence({k: v[:, :2] for k, v in buffers.obs.items()},
                                            model.initial_rnn_state(3), torch.zeros(3, 2))
    assert logits.shape == (3, 2, 3) and torch.isfinite(values).all()
    kinds = model.describe_encoders()
    assert "convnet_small" in kinds["pixels_hwc"] and "one-hot [14]" in kinds["multi_discrete"]


@pytest.mark.parametrize(("nvec", "start"), [([5], [0]), ([5], [-2]), ([2, 3, 4], [0, 1, -1])])
def test_one_hot_matches_numpy(nvec, start):
    rng = np.random.default_rng(0)
    x = np.stack([rng.integers(s, s + n, size=6) for n, s in zip(nvec, start)], axis=1)
    ref = np.concatenate([np.eye(n)[x[:, k] - s] for k, (n, s) in enumerate(zip(nvec, start))],
                         axis=1)
    enc = OneHotEncoder(nvec, start, [], "elu")  # no MLP layers: the one-hot itself
    got = enc(torch.as_tensor(x.astype(np.int16)))
    np.testing.assert_array_equal(got.numpy(), ref)
    if len(nvec) == 1:  # a Discrete is stored as [B]
        np.testing.assert_array_equal(enc(torch.as_tensor(x[:, 0])).numpy(), ref)


def test_flattening_matches_numpy():
    space = spaces.Dict({"m": spaces.Box(-1, 1, (2, 3, 4)), "b": spaces.MultiBinary((3, 2)),
                         "d": spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]))})
    plan = ObsPlan(space)
    obs = space.sample()
    out = plan.convert(obs)
    for key in ("m", "b", "d"):
        np.testing.assert_array_equal(out[key], np.asarray(obs[key]).reshape(-1))
    assert plan.model_space()["d"] == spaces.MultiDiscrete([2, 3, 4, 5])


def test_storage_dtypes():
    assert storage(spaces.Discrete(4)) == ((), np.dtype(np.uint8))
    assert storage(spaces.Discrete(300)) == ((), np.dtype(np.int16))
    assert storage(spaces.Discrete(3, start=-1)) == ((), np.dtype(np.int16))
    assert storage(spaces.MultiDiscrete([2, 70000])) == ((2,), np.dtype(np.int32))
    assert storage(spaces.MultiBinary(5)) == ((5,), np.dtype(np.uint8))
    with pytest.raises(ValueError, match="unsupported space Text"):
        storage(spaces.Text(4))


def test_image_encoder_sized_to_the_input():
    assert conv_stack(72, 128)[0] == "convnet_simple"
    assert conv_stack(36, 36)[0] == "convnet_simple"
    for h, w in [(7, 7), (1, 1), (2, 5), (35, 100), (20, 64)]:
        name, layers = conv_stack(h, w)
        assert name == "convnet_small"
        enc = ImageEncoder("obs", spaces.Box(0, 255, (3, h, w), np.uint8), 16, "elu", False)
        assert enc(torch.zeros(2, 3, h, w, dtype=torch.uint8)).shape == (2, 16)


def test_float_image_in_unit_range_reads_like_pixels():
    torch.manual_seed(0)
    as_uint8 = ImageEncoder("obs", spaces.Box(0, 255, (3, 8, 8), np.uint8), 16, "elu", True)
    as_float = ImageEncoder("obs", spaces.Box(0.0, 1.0, (3, 8, 8), np.float32), 16, "elu", True)
    as_float.load_state_dict(as_uint8.state_dict())
    pixels = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    as_uint8.update_statistics(pixels)
    as_float.update_statistics(pixels.float() / 255.0)
    torch.testing.assert_close(as_float(pixels.float() / 255.0), as_uint8(pixels))


def test_top_level_space_that_cannot_be_encoded_is_one_line():
    with pytest.raises(ValueError, match=r"observation space Text\(.*\) cannot be encoded"):
        ObsPlan(spaces.Text(5))
    with pytest.raises(ValueError, match="cannot be encoded"):
        ObsPlan(spaces.Dict({"mission": spaces.Text(5)}))


def test_obs_keys_choose_keys_and_keep_the_action_mask():
    space = spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(-1, 1, (2,)),
                         "c": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(4))),
                         "action_mask": spaces.Box(0, 1, (3,), np.uint8)})
    plan = ObsPlan(space, keys=["c.1", "b"])
    assert sorted(plan.model_space().spaces) == ["action_mask", "b", "c.1"]
    assert plan.left_out() == ["observation keys left out by --obs_keys: a, c.0"]
    with pytest.raises(ValueError, match="obs_keys zz: no such observation key; the env has a, "):
        ObsPlan(space, keys=["zz"])


def test_leaf_and_flat_dict_spaces_need_no_adapter():
    assert ObsPlan(spaces.Discrete(16)).identity
    assert ObsPlan(spaces.Box(0, 255, (3, 72, 128), np.uint8)).identity
    assert ObsPlan(spaces.Dict({"obs": spaces.Box(0, 255, (3, 72, 128), np.uint8),
                                "measurements": spaces.Box(-1, 1, (4,))})).identity
    assert not ObsPlan(spaces.Tuple((spaces.Discrete(2),))).identity


def _settings(env: str, *extra: str) -> EnvSettings:
    return EnvSettings.from_config(
        parse_config(["--env", env, "--train_dir", "/nonexistent", *extra]))


def test_create_env_adapts_only_what_needs_it():
    cartpole = create_env(_settings("CartPole-v1"))
    assert not any(isinstance(w, ObsAdapter) for w in _wrappers(cartpole))
    blackjack = create_env(_settings("Blackjack-v1"))
    info = env_info(blackjack)
    assert sorted(info.obs_space.spaces) == ["obs.0", "obs.1", "obs.2"]
    obs, _ = blackjack.reset(seed=0)
    assert sorted(obs) == ["obs.0", "obs.1", "obs.2"]
    frozen = create_env(_settings("FrozenLake-v1"))
    assert isinstance(env_info(frozen).obs_space["obs"], spaces.Discrete)


def _wrappers(env):
    while hasattr(env, "env"):
        yield env
        env = env.env


def test_create_env_names_a_space_it_cannot_encode(monkeypatch):
    env = EverySpace()
    env.observation_space = spaces.Text(5)
    monkeypatch.setattr("fastrl.sampling.env_setup.make_env", lambda name, **kw: env)
    with pytest.raises(EnvSettingsError, match=r"env 'x': observation space Text\(.*cannot be"):
        create_env(_settings("x"))


def test_channels_last_frames_land_transposed_in_the_buffers():
    settings = _settings("tests.spaces_env:PixelsHWC-v0")
    envs = [create_env(settings) for _ in range(2)]
    info = env_info(envs[0])
    assert info.obs_space["obs"].shape == (3, 40, 44)
    layout = BufferLayout.from_spaces(info.obs_space, info.action_space, 6, 5, 0)
    buffers = TrajectoryBuffers(layout)
    worker = RolloutWorker(0, envs, buffers, torch.zeros(2, 0), list(range(6)), 2,
                           **worker_flags())
    completed, _ = drive(worker, buffers, steps=30)
    assert completed
    for group in completed:
        for _, traj in group:
            for frame in traj["obs"]["obs"][0].numpy():  # [T + 1, 3, 40, 44]
                step = int(frame[0, 0, 0])
                expected = hwc_frame(step, (40, 44, 3)).transpose(2, 0, 1)
                np.testing.assert_array_equal(frame, expected)
