"""What runs in float32 under bf16 autocast: the action and value heads, and the recurrent
core (on a GPU all of it; on a CPU its state and gates, with bf16 operands in its matrix
products). CPU autocast rounds what the heads compute to bf16 as GPU autocast does, so the
CPU shows the defect; the CUDA case of the core test runs cuDNN's kernels where a GPU is
present."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.policy import recurrent
from fastrl.policy.model import ActorCritic
from fastrl.policy.recurrent import RNN_TYPES, make_rnn, rnn_step, rnn_unroll, state_size
from tests.test_model import small_settings

VEC = spaces.Box(-np.inf, np.inf, (7,), np.float32)
BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
HEADS = {
    "discrete": (spaces.Discrete(5), {}),
    "multidiscrete": (spaces.MultiDiscrete([3, 2, 4]), {}),
    "box": (BOX, {}),
    "box, state-dependent log-std": (BOX, {"action_log_std": "state_dependent"}),
    "mixed": (spaces.Dict({"move": spaces.Discrete(3), "aim": BOX}), {}),
}


def bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_the_heads_under_bf16_autocast_equal_the_fp32_heads(name):
    action_space, settings = HEADS[name]
    model = ActorCritic(VEC, action_space, small_settings(use_rnn=False, **settings))
    # What the encoders hand the heads under autocast: bf16 features.
    core = torch.randn(64, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    want = model._heads(core.float())
    with bf16_autocast():
        got = model._heads(core)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0.0, atol=1e-5)


def test_separate_critic_encoders_feed_a_float32_critic_under_autocast():
    model = ActorCritic(VEC, spaces.Discrete(4),
                        small_settings(use_rnn=False, actor_critic_share_weights=False))
    g = torch.Generator().manual_seed(2)
    core, critic_in = (torch.randn(32, 16, generator=g).bfloat16() for _ in range(2))
    want = model._heads(core.float(), critic_in=critic_in.float())
    with bf16_autocast():
        got = model._heads(core, critic_in=critic_in)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("rnn_type", RNN_TYPES)
def test_the_core_under_bf16_autocast_is_float32_and_equals_the_fp32_core(rnn_type, device):
    g = torch.Generator().manual_seed(3)
    rnn = make_rnn(rnn_type, 8, 16).to(device)
    b, t, size = 6, 10, state_size(rnn_type, 16)
    # What the encoders hand the core under autocast: bf16 features.
    xs = torch.randn(b, t, 8, generator=g).bfloat16().to(device)
    state = torch.randn(b, size, generator=g).to(device)
    resets = torch.zeros(b, t, device=device)
    resets[1, 4] = resets[3, 7] = 1.0
    capture = torch.tensor([-1, 5, 2, -1, 9, 0], device=device)

    want_step = rnn_step(rnn, xs[:, 0].float(), state)
    want_unroll = rnn_unroll(rnn, xs.float(), state, resets, capture)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        got_step = rnn_step(rnn, xs[:, 0], state)
        got_unroll = rnn_unroll(rnn, xs, state, resets, capture)
    for got, want in zip((*got_step, *got_unroll), (*want_step, *want_unroll), strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6)


@pytest.fixture
def lowp_anywhere(monkeypatch):
    """The bf16 core on any CPU and at the tests' small sizes (a CPU without native bf16
    computes bf16 GEMMs too, slowly)."""
    monkeypatch.setattr(recurrent, "LOWP_MIN_HIDDEN", 0)
    monkeypatch.setattr(recurrent, "cpu_has_native_bf16", lambda: True)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().double()


def _reference_core(rnn, xs, state, resets, capture):
    """The core step by step, in float64 but for bf16-rounded products' operands and results:
    what the CPU's bf16 core computes, written the slow obvious way."""
    w_ih, w_hh = _bf16(rnn.weight_ih_l0), _bf16(rnn.weight_hh_l0)
    b_ih, b_hh = rnn.bias_ih_l0.double(), rnn.bias_hh_l0.double()
    lstm = isinstance(rnn, torch.nn.LSTM)
    state = state.double()
    outs, captured = [], torch.zeros_like(state)
    for t in range(xs.shape[1]):
        state = state * (1.0 - resets[:, t:t + 1].double())
        h = state[:, :w_hh.shape[1]]
        gx = _bf16(_bf16(xs[:, t]) @ w_ih.T) + b_ih
        gh = _bf16(_bf16(h) @ w_hh.T) + b_hh
        if lstm:
            c = state[:, w_hh.shape[1]:]
            i, f, g, o = (gx + gh).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            state = torch.cat([h, c], dim=1)
        else:
            (xr, xz, xn), (hr, hz, hn) = gx.chunk(3, dim=1), gh.chunk(3, dim=1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            n = torch.tanh(xn + r * hn)
            h = state = (1 - z) * n + z * h
        outs.append(h)
        captured = torch.where((capture == t).unsqueeze(1), state, captured)
    return torch.stack(outs, dim=1), captured


@pytest.mark.parametrize("rnn_type", RNN_TYPES)
def test_on_a_cpu_the_core_under_bf16_autocast_takes_bf16_operands_and_keeps_float32(
        rnn_type, lowp_anywhere):
    """--precision bf16 on a CPU: the core's products take bf16 operands (3.5-4.7x faster
    GEMMs there), its state, gates and biases stay float32; step and unroll agree, resets
    and captures included."""
    g = torch.Generator().manual_seed(5)
    rnn = make_rnn(rnn_type, 24, 32)
    with torch.no_grad():
        for p in rnn.parameters():  # non-zero biases, so that their dtype shows
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    b, t, size = 6, 9, state_size(rnn_type, 32)
    xs = torch.randn(b, t, 24, generator=g)
    state = torch.randn(b, size, generator=g)
    resets = torch.zeros(b, t)
    resets[1, 4] = resets[3, 7] = resets[0, 1] = 1.0
    capture = torch.tensor([-1, 5, 2, -1, 8, 0])

    want_out, want_captured = _reference_core(rnn, xs, state, resets, capture)
    fp32_out, _ = rnn_unroll(rnn, xs, state, resets, capture)
    with bf16_autocast():
        out, captured = rnn_unroll(rnn, xs, state, resets, capture)
        step_out, step_state = rnn_step(rnn, xs[:, 0], state)
    assert out.dtype == captured.dtype == step_out.dtype == step_state.dtype == torch.float32
    # Within a bf16 step of one product (its float32 sums' order is MKL's) of the reference,
    # and not the float32 core's function.
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=2e-3)
    torch.testing.assert_close(captured.double(), want_captured, rtol=0, atol=2e-3)
    assert (out - fp32_out).abs().max() > 1e-4
    assert (captured[[0, 3]] == 0).all()  # no capture asked for those rows
    torch.testing.assert_close(step_out, out[:, 0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("rnn_type", RNN_TYPES)
def test_on_a_cpu_the_bf16_core_trains_every_parameter_like_the_float32_core(
        rnn_type, lowp_anywhere):
    g = torch.Generator().manual_seed(6)
    rnn = make_rnn(rnn_type, 24, 32)
    b, t, size = 5, 12, state_size(rnn_type, 32)
    xs = torch.randn(b, t, 24, generator=g, requires_grad=True)
    state = torch.randn(b, size, generator=g)
    resets = torch.zeros(b, t)
    resets[2, 6] = 1.0
    weights = torch.randn(b, t, 32, generator=g)

    def grads(lowp: bool) -> list[torch.Tensor]:
        rnn.zero_grad()
        xs.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=lowp):
            out, _ = rnn_unroll(rnn, xs, state, resets)
        (out * weights).sum().backward()
        return [xs.grad.clone(), *(p.grad.clone() for p in rnn.parameters())]

    for got, want in zip(grads(True), grads(False), strict=True):
        assert got.dtype == torch.float32
        assert (got - want).norm() <= 0.03 * want.norm()


def test_the_bf16_core_sums_the_state_weights_gradient_over_the_steps_in_float32(
        lowp_anywhere):
    """Review 50: every step's product used one bf16 copy of W_hh, so autograd added the
    steps' gradients of it in bf16: 1.15% off a float64 reference at 81 steps (0.42% for one
    rounding of each step's)."""
    g = torch.Generator().manual_seed(8)
    rnn = make_rnn("gru", 128, 128)
    b, t = 32, 81
    xs = torch.randn(b, t, 128, generator=g)
    weights = torch.randn(b, t, 128, generator=g)
    ref = make_rnn("gru", 128, 128).double()
    ref.load_state_dict({k: v.double() for k, v in rnn.state_dict().items()})
    out, _ = ref(xs.double(), torch.zeros(1, b, 128, dtype=torch.float64))
    (out * weights.double()).sum().backward()
    with bf16_autocast():
        out, _ = rnn_unroll(rnn, xs, torch.zeros(b, 128), torch.zeros(b, t))
    (out * weights).sum().backward()
    for name in ("weight_hh_l0", "weight_ih_l0", "bias_hh_l0"):
        want = getattr(ref, name).grad.float()
        got = getattr(rnn, name).grad
        assert got.dtype == torch.float32
        assert (got - want).norm() <= 0.006 * want.norm(), name


@pytest.mark.parametrize("rnn_type", RNN_TYPES)
def test_the_bf16_core_takes_no_rows_and_no_steps(rnn_type, lowp_anywhere):
    rnn = make_rnn(rnn_type, 8, 16)
    size = state_size(rnn_type, 16)
    with bf16_autocast():
        out, captured = rnn_unroll(rnn, torch.randn(0, 5, 8), torch.zeros(0, size),
                                   torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64))
        assert out.shape == (0, 5, 16) and captured.shape == (0, size)
        out, _ = rnn_unroll(rnn, torch.randn(3, 0, 8), torch.zeros(3, size), torch.zeros(3, 0))
        assert out.shape == (3, 0, 16)


@pytest.mark.parametrize("why", ["small core", "no native bf16"])
def test_the_core_stays_float32_on_a_cpu_where_bf16_would_not_pay(why, monkeypatch):
    """Review 50: below 256 units a step's small ops cost more than the bf16 GEMMs save
    (LSTM 128 2.6x slower in a serial CartPole run), and on a CPU without native bf16 the
    GEMMs themselves are slower (1.5x at doom's sizes with oneDNN held to AVX512)."""
    hidden = 128 if why == "small core" else 256
    monkeypatch.setattr(recurrent, "cpu_has_native_bf16", lambda: why != "no native bf16")
    rnn = make_rnn("gru", 8, hidden)
    xs = torch.randn(4, 6, 8).bfloat16()
    state = torch.randn(4, hidden)
    resets = torch.zeros(4, 6)
    want = rnn_unroll(rnn, xs.float(), state, resets)[0]
    with bf16_autocast():
        assert not recurrent.lowp_core(rnn, xs)
        got = rnn_unroll(rnn, xs, state, resets)[0]
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6)
    assert not recurrent.lowp_acting_core(rnn, torch.device("cpu"))
    assert rnn.weight_hh_l0.dtype == torch.float32


def test_a_recurrent_model_under_autocast_hands_back_a_float32_state():
    model = ActorCritic(VEC, spaces.Discrete(4), small_settings(rnn_type="lstm"))
    obs = torch.randn(5, 7)
    with bf16_autocast():
        _, _, state = model.forward_step(obs, model.initial_rnn_state(5))
    assert state.dtype == torch.float32
