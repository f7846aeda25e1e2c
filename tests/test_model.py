"""Tests for fastrl.policy.model: encoders, GRU core, heads and ActionDistribution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.policy.obs import as_dict_space, obs_to_dict

IMG = spaces.Box(0, 255, (3, 36, 36), np.uint8)  # the smallest image convnet_simple accepts
VEC = spaces.Box(-np.inf, np.inf, (7,), np.float32)
OBS_SPACES = {
    "image": IMG,
    "vector": VEC,
    "dict": spaces.Dict({"obs": IMG, "measurements": VEC}),
}
ACTION_SPACES = {
    "discrete": spaces.Discrete(5),
    "multidiscrete": spaces.MultiDiscrete([3, 2, 4]),
}


def small_settings(**overrides) -> ModelSettings:
    """A small model's settings: ``Config``'s, with small layers and no normalisers, then
    ``overrides`` (any of ``ModelSettings``' fields)."""
    fields = dict(
        use_rnn=True,
        rnn_size=16,
        encoder_fc_size=32,
        encoder_mlp_layers=[16, 16],
        nonlinearity="elu",
        normalize_input=False,
        normalize_returns=False,
    )
    fields.update(overrides)
    return ModelSettings.from_config(Config(**fields))


FIXED = small_settings(use_rnn=False)  # pixels to [-1, 1] by the fixed x / 127.5 - 1
WHITENED = small_settings(use_rnn=False, normalize_input=True)  # by running statistics


def random_obs(space: spaces.Space, lead: tuple[int, ...], gen: torch.Generator) -> dict:
    """Random observations of shape [*lead, ...] for every key of ``space``."""
    out = {}
    for key, sub in as_dict_space(space).spaces.items():
        shape = (*lead, *sub.shape)
        if sub.dtype == np.uint8:
            out[key] = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        else:
            out[key] = torch.randn(shape, generator=gen)
    return out


def num_logits(action_space: spaces.Space) -> int:
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    return int(np.sum(action_space.nvec))


def test_as_dict_space_and_obs_to_dict():
    d = as_dict_space(IMG)
    assert isinstance(d, spaces.Dict) and list(d.spaces) == ["obs"] and d["obs"] is IMG
    dict_space = OBS_SPACES["dict"]
    assert as_dict_space(dict_space) is dict_space
    discrete = spaces.Discrete(3)
    assert as_dict_space(discrete)["obs"] is discrete

    t = torch.zeros(2, 3)
    assert obs_to_dict(t)["obs"] is t
    a = np.zeros(3)
    assert obs_to_dict(a)["obs"] is a
    obs = {"obs": t, "measurements": t}
    assert obs_to_dict(obs) == obs


@pytest.mark.parametrize("use_rnn", [True, False])
@pytest.mark.parametrize("act_name", list(ACTION_SPACES))
@pytest.mark.parametrize("obs_name", list(OBS_SPACES))
def test_output_shapes(obs_name, act_name, use_rnn):
    gen = torch.Generator().manual_seed(0)
    obs_space, act_space = OBS_SPACES[obs_name], ACTION_SPACES[act_name]
    model = ActorCritic(obs_space, act_space, small_settings(use_rnn=use_rnn))
    h = 16 if use_rnn else 0
    a = num_logits(act_space)
    assert model.rnn_state_size == h

    b, t = 3, 4
    state = model.initial_rnn_state(b)
    assert state.shape == (b, h) and state.dtype == torch.float32 and not state.any()
    logits, values, new_state = model.forward_step(random_obs(obs_space, (b,), gen), state)
    assert logits.shape == (b, a) and values.shape == (b,) and new_state.shape == (b, h)
    if not use_rnn:
        assert new_state is state

    resets = torch.zeros(b, t)
    logits, values = model.forward_sequence(random_obs(obs_space, (b, t), gen), state, resets)
    assert logits.shape == (b, t, a) and values.shape == (b, t)
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()


def test_bare_box_obs_tensor_is_accepted():
    gen = torch.Generator().manual_seed(0)
    model = ActorCritic(VEC, spaces.Discrete(3), small_settings())
    obs = random_obs(VEC, (2,), gen)
    state = model.initial_rnn_state(2)
    from_dict = model.forward_step(obs, state)
    from_tensor = model.forward_step(obs["obs"], state)
    for x, y in zip(from_dict, from_tensor, strict=True):
        torch.testing.assert_close(x, y)


def test_real_doom_observation_batch_4():
    gen = torch.Generator().manual_seed(0)
    obs_space = spaces.Dict(
        {
            "obs": spaces.Box(0, 255, (3, 72, 128), np.uint8),
            "measurements": spaces.Box(-np.inf, np.inf, (4,), np.float32),
        }
    )
    act_space = spaces.MultiDiscrete([3, 3, 2, 2])
    settings = small_settings(rnn_size=512, encoder_fc_size=512, encoder_mlp_layers=[256, 256])
    model = ActorCritic(obs_space, act_space, settings)
    obs = random_obs(obs_space, (4,), gen)
    assert obs["obs"].dtype == torch.uint8
    with torch.no_grad():
        logits, values, state = model.forward_step(obs, model.initial_rnn_state(4))
    assert logits.shape == (4, 10) and values.shape == (4,) and state.shape == (4, 512)
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()
    actions = ActionDistribution(logits, act_space).sample()
    assert actions.shape == (4, 4) and actions.dtype == torch.int64


def stepwise_reference(model, obs, h0, resets):
    """forward_step for t = 0..T-1, zeroing the state where resets == 1."""
    h = h0
    logits, values = [], []
    for t in range(resets.shape[1]):
        h = h * (1.0 - resets[:, t : t + 1])
        step_obs = {k: v[:, t] for k, v in obs.items()}
        lg, v, h = model.forward_step(step_obs, h)
        logits.append(lg)
        values.append(v)
    return torch.stack(logits, 1), torch.stack(values, 1)


@pytest.mark.parametrize("use_rnn", [True, False])
@pytest.mark.parametrize("reset_kind", ["none", "some", "every_step"])
def test_forward_sequence_matches_stepwise(use_rnn, reset_kind):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    obs_space = OBS_SPACES["dict"]
    model = ActorCritic(obs_space, ACTION_SPACES["multidiscrete"], small_settings(use_rnn=use_rnn))
    b, t = 4, 7
    obs = random_obs(obs_space, (b, t), gen)
    h0 = torch.randn(b, model.rnn_state_size, generator=gen)
    resets = torch.zeros(b, t)
    if reset_kind == "some":
        resets[0, 0] = 1.0  # reset before the very first step
        resets[1, 3] = 1.0
        resets[2, 3] = 1.0
        resets[2, 5] = 1.0
        resets[3, 6] = 1.0  # last step
    elif reset_kind == "every_step":
        resets = (torch.rand(b, t, generator=gen) < 0.5).float()
        resets[0] = 1.0

    with torch.no_grad():
        seq_logits, seq_values = model.forward_sequence(obs, h0, resets)
        ref_logits, ref_values = stepwise_reference(model, obs, h0, resets)
    torch.testing.assert_close(seq_logits, ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(seq_values, ref_values, atol=1e-5, rtol=0)

    if use_rnn and reset_kind == "some":
        # The resets matter: without them the result is different.
        with torch.no_grad():
            no_reset_logits, _ = model.forward_sequence(obs, h0, torch.zeros(b, t))
        assert not torch.allclose(no_reset_logits[1, 3:], seq_logits[1, 3:], atol=1e-6)


@pytest.mark.parametrize("use_rnn", [True, False])
def test_gradient_reaches_every_parameter(use_rnn):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    obs_space = OBS_SPACES["dict"]
    act_space = ACTION_SPACES["multidiscrete"]
    model = ActorCritic(obs_space, act_space, small_settings(use_rnn=use_rnn))
    b, t = 3, 5
    resets = torch.zeros(b, t)
    resets[1, 2] = 1.0
    logits, values = model.forward_sequence(
        random_obs(obs_space, (b, t), gen), model.initial_rnn_state(b), resets
    )
    dist = ActionDistribution(logits, act_space)
    loss = (logits**2).sum() + values.sum() - dist.entropy().sum()
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_uint8_images_are_scaled_inside_the_model():
    model = ActorCritic(IMG, spaces.Discrete(4), FIXED)
    state = model.initial_rnn_state(2)
    black = torch.zeros(2, *IMG.shape, dtype=torch.uint8)
    white = torch.full((2, *IMG.shape), 255, dtype=torch.uint8)
    with torch.no_grad():
        logits_black, values_black, _ = model.forward_step({"obs": black}, state)
        logits_white, values_white, _ = model.forward_step({"obs": white}, state)
        # Documented: float images are read as pixel values in [0, 255], like uint8.
        logits_float, values_float, _ = model.forward_step({"obs": white.float()}, state)
    assert not torch.allclose(logits_black, logits_white)
    assert not torch.allclose(values_black, values_white)
    torch.testing.assert_close(logits_float, logits_white)
    torch.testing.assert_close(values_float, values_white)
    assert white.dtype == torch.uint8 and int(white.max()) == 255  # input not modified

    float_input = white.float()
    with torch.no_grad():
        model.forward_step({"obs": float_input}, state)
    assert float(float_input.max()) == 255.0  # a float input is not scaled in place


def test_bad_nonlinearity_raises():
    with pytest.raises(ValueError, match=r"unknown nonlinearity 'gelu'.*elu.*relu.*tanh"):
        ActorCritic(IMG, spaces.Discrete(3), small_settings(nonlinearity="gelu"))


@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_every_nonlinearity_builds(nonlinearity):
    model = ActorCritic(VEC, spaces.Discrete(3), small_settings(nonlinearity=nonlinearity))
    logits, _, _ = model.forward_step({"obs": torch.zeros(1, 7)}, model.initial_rnn_state(1))
    assert logits.shape == (1, 3)


@pytest.mark.parametrize(
    "bad_space",
    [
        spaces.Box(-5, 5, (3, 36, 36), np.float32),  # rank 3, not an image (ObsPlan flattens it)
        spaces.Box(0, 1, (4, 4), np.float32),  # 2-D (ObsPlan flattens it)
        spaces.Text(3),
    ],
)
def test_bad_observation_space_raises(bad_space):
    obs_space = spaces.Dict({"obs": IMG, "weird": bad_space})
    with pytest.raises(ValueError, match=r"observation key 'weird': unsupported space"):
        ActorCritic(obs_space, spaces.Discrete(3), small_settings())


def test_small_image_gets_the_small_conv_stack():
    small = spaces.Box(0, 255, (3, 20, 64), np.uint8)
    model = ActorCritic(small, spaces.Discrete(3), small_settings())
    assert "convnet_small" in model.describe_encoders()["obs"]
    assert "convnet_simple" in ActorCritic(IMG, spaces.Discrete(3),
                                           small_settings()).describe_encoders()["obs"]


@pytest.mark.parametrize("bad", [spaces.Box(-1, 1, (2,), np.int64), spaces.Text(5),
                                 spaces.MultiBinary(3)])
def test_bad_action_space_raises(bad):
    with pytest.raises(ValueError, match="Discrete, MultiDiscrete, a float Box|must be floating"):
        ActorCritic(VEC, bad, small_settings())


# ---- ActionDistribution ----


def reference_categoricals(logits: torch.Tensor, nvec: list[int]):
    return [torch.distributions.Categorical(logits=chunk) for chunk in logits.split(nvec, -1)]


@pytest.mark.parametrize(
    "act_space, nvec",
    [
        (spaces.Discrete(5), [5]),
        (spaces.MultiDiscrete([3, 2, 4]), [3, 2, 4]),  # unequal: padded internally
        (spaces.MultiDiscrete([3, 3]), [3, 3]),  # equal: no padding
    ],
)
def test_distribution_matches_torch_reference(act_space, nvec):
    gen = torch.Generator().manual_seed(0)
    b = 6
    logits = torch.randn(b, sum(nvec), generator=gen) * 3
    dist = ActionDistribution(logits, act_space)
    refs = reference_categoricals(logits, nvec)

    torch.manual_seed(0)
    actions = dist.sample()
    assert actions.shape == (b, len(nvec)) and actions.dtype == torch.int64
    for d, n in enumerate(nvec):
        assert ((actions[:, d] >= 0) & (actions[:, d] < n)).all()

    log_prob = dist.log_prob(actions)
    assert log_prob.shape == (b,) and torch.isfinite(log_prob).all()
    ref_log_prob = sum(ref.log_prob(actions[:, d]) for d, ref in enumerate(refs))
    torch.testing.assert_close(log_prob, ref_log_prob)

    torch.testing.assert_close(dist.entropy(), sum(ref.entropy() for ref in refs))

    mode = dist.mode()
    assert mode.dtype == torch.int64
    expected_mode = torch.stack([chunk.argmax(-1) for chunk in logits.split(nvec, -1)], -1)
    torch.testing.assert_close(mode, expected_mode)


def test_sample_frequencies_follow_probabilities():
    nvec = [3, 2]
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, 1.0]])
    dist = ActionDistribution(logits.expand(20000, -1), spaces.MultiDiscrete(nvec))
    torch.manual_seed(0)
    actions = dist.sample()
    for d, chunk in enumerate(logits[0].split(nvec)):
        freq = torch.bincount(actions[:, d], minlength=len(chunk)).float() / actions.shape[0]
        torch.testing.assert_close(freq, chunk.softmax(-1), atol=0.015, rtol=0)


def test_distribution_keeps_leading_batch_shape():
    gen = torch.Generator().manual_seed(0)
    act_space = spaces.MultiDiscrete([3, 2, 4])
    logits = torch.randn(2, 5, 9, generator=gen)
    dist = ActionDistribution(logits, act_space)
    actions = dist.sample()
    assert actions.shape == (2, 5, 3)
    assert dist.mode().shape == (2, 5, 3)
    assert dist.entropy().shape == (2, 5)
    log_prob = dist.log_prob(actions)
    assert log_prob.shape == (2, 5)
    flat = ActionDistribution(logits.reshape(10, 9), act_space)
    torch.testing.assert_close(log_prob.reshape(10), flat.log_prob(actions.reshape(10, 3)))


def test_entropy_gradient_is_finite_with_padding():
    logits = torch.randn(4, 9, requires_grad=True)
    dist = ActionDistribution(logits, spaces.MultiDiscrete([3, 2, 4]))
    (dist.entropy().sum() + dist.log_prob(dist.sample()).sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_distribution_rejects_wrong_logit_count():
    with pytest.raises(ValueError, match="needs 9"):
        ActionDistribution(torch.zeros(2, 8), spaces.MultiDiscrete([3, 2, 4]))


def test_uniform_logits_entropy():
    dist = ActionDistribution(torch.zeros(1, 9), spaces.MultiDiscrete([3, 2, 4]))
    expected = math.log(3) + math.log(2) + math.log(4)
    assert abs(float(dist.entropy()) - expected) < 1e-6


# ------------------------------------------------------------------ input normalisation


def test_pixel_statistics_match_numpy_over_everything_seen():
    model = ActorCritic(IMG, spaces.Discrete(4), WHITENED)
    gen = np.random.default_rng(0)
    # Batches of different sizes and different brightness, so that a wrong merge shows.
    batches = [gen.integers(lo, hi, (n, *IMG.shape), dtype=np.uint8)
               for n, lo, hi in ((5, 0, 256), (1, 100, 120), (17, 200, 256), (3, 0, 10))]
    for batch in batches:
        model.update_normalizers({"obs": torch.from_numpy(batch)})
    seen = np.concatenate(batches).astype(np.float64) / 255.0
    enc = model.encoders[0]
    np.testing.assert_allclose(enc.pixel_mean[0].numpy(), seen.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(enc.pixel_var[0].numpy(), seen.var(axis=0), atol=1e-6)
    assert float(enc.pixel_count) == len(seen)


def _conv_input(model: ActorCritic, obs: torch.Tensor) -> torch.Tensor:
    seen = []
    handle = model.encoders[0].convs.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].clone()))
    with torch.no_grad():
        model.forward_step({"obs": obs}, model.initial_rnn_state(obs.shape[0]))
    handle.remove()
    return seen[0]


def test_before_any_update_normalisation_equals_the_fixed_one():
    img = torch.from_numpy(
        np.random.default_rng(1).integers(0, 256, (4, *IMG.shape), dtype=np.uint8))
    fixed = ActorCritic(IMG, spaces.Discrete(4), FIXED)
    running = ActorCritic(IMG, spaces.Discrete(4), WHITENED)
    torch.testing.assert_close(_conv_input(running, img), _conv_input(fixed, img))
    torch.testing.assert_close(_conv_input(fixed, img), img.float() / 127.5 - 1.0)


def test_pixels_are_whitened_and_clipped_after_an_update():
    model = ActorCritic(IMG, spaces.Discrete(4), WHITENED)
    gen = np.random.default_rng(2)
    seen = gen.integers(60, 70, (50, *IMG.shape), dtype=np.uint8)
    model.update_normalizers({"obs": torch.from_numpy(seen)})
    mean = seen.astype(np.float64).mean(axis=0) / 255.0
    std = np.sqrt(seen.astype(np.float64).var(axis=0) / 255.0**2 + 1e-4)
    probe = np.stack([seen[0], np.full(IMG.shape, 255, np.uint8)])
    expected = np.clip((probe / 255.0 - mean) / std, -5.0, 5.0)
    got = _conv_input(model, torch.from_numpy(probe)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert got[1].min() == 5.0  # white is far outside what was seen: clipped


def test_without_normalize_input_update_is_a_no_op_and_there_are_no_buffers():
    model = ActorCritic(IMG, spaces.Discrete(4), FIXED)
    model.update_normalizers({"obs": torch.zeros(2, *IMG.shape, dtype=torch.uint8)})
    assert not any("pixel" in name for name in model.state_dict())


def test_learner_updates_the_statistics_and_shared_weights_carry_them():
    import multiprocessing

    from fastrl.algo.learner import Learner, LearnerSettings
    from fastrl.sampling.weights import SharedWeights

    b, t = 4, 8
    cfg = Config(rollout=t, batch_size=b * t, use_rnn=False, encoder_fc_size=32, device="cpu",
                 precision="fp32")
    assert cfg.normalize_input  # the default
    model = ActorCritic(IMG, spaces.Discrete(4), ModelSettings.from_config(cfg))
    learner = Learner(LearnerSettings.from_config(cfg), model, spaces.Discrete(4),
                      torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    batch = {
        "obs": {"obs": torch.randint(0, 256, (b, t + 1, *IMG.shape), dtype=torch.uint8,
                                     generator=gen)},
        "actions": torch.randint(0, 4, (b, t, 1), generator=gen),
        "log_probs": torch.full((b, t), -math.log(4.0)),
        "values": torch.zeros(b, t),
        "rewards": torch.randn(b, t, generator=gen),
        "dones": torch.zeros(b, t, dtype=torch.bool),
        "policy_versions": torch.zeros(b, t, dtype=torch.long),
        "rnn_states": torch.zeros(b, 0),
    }
    learner.train(batch)
    enc = model.encoders[0]
    acted = batch["obs"]["obs"][:, :t].reshape(-1, *IMG.shape).double() / 255.0
    assert float(enc.pixel_count) == b * t  # fewer frames than NORMALIZER_FRAMES: all of them
    np.testing.assert_allclose(enc.pixel_mean[0].numpy(), acted.mean(0).numpy(), atol=1e-6)

    shared = SharedWeights(model, multiprocessing.get_context("spawn"))
    shared.publish(model, learner.version)
    reader = ActorCritic(IMG, spaces.Discrete(4), ModelSettings.from_config(cfg))
    assert shared.load_into(reader) == learner.version
    for key, value in model.state_dict().items():
        read = reader.state_dict()[key]
        torch.testing.assert_close(read, value.to(read.dtype))


@pytest.mark.parametrize("shape", [(3, 72, 128), (3, 16, 16)], ids=["convnet_simple", "small"])
def test_the_image_encoders_last_map_is_nchw_before_its_nonlinearity(shape):
    """The gradient Flatten hands back is NCHW; the nonlinearity's backward against a
    channels-last saved output took 40x as long (perf/log/RESULTS.md). The parameters keep
    their names, so checkpoints saved before still load."""
    from fastrl.policy.encoders import ImageEncoder

    enc = ImageEncoder("obs", spaces.Box(0, 255, shape, np.uint8), 32, "elu", normalize=True)
    convs = [name for name, _ in enc.named_parameters() if name.startswith("convs.")]
    assert convs[0] == "convs.0.weight" and convs[2] == "convs.2.weight"
    assert all(int(name.split(".")[1]) % 2 == 0 for name in convs)
    seen = []
    last = [m for m in enc.convs if isinstance(m, torch.nn.ELU)][-1]
    last.register_forward_hook(lambda m, inp, out: seen.append((inp[0].is_contiguous(),
                                                                 out.is_contiguous())))
    x = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    enc(x).sum().backward()
    assert seen == [(True, True)]
    assert all(p.grad is not None for p in enc.parameters())
